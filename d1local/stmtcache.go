package d1local

import "container/list"

// maxCachedStmts bounds each connection's statement cache.
const maxCachedStmts = 128

// stmtCache holds a connection's prepared user statements for reuse, by
// exact SQL text, as workerd caches its own: at most maxCachedStmts of
// them, the least recently used finalized first. A statement in use stays
// in the cache, marked, so that taking it and putting it back changes no
// map (a batch runs the same few texts over and over); it is not handed
// out twice meanwhile. The zero value is an empty cache.
type stmtCache struct {
	lru   list.List                // of *cachedStmt, most recently used first
	bySQL map[string]*list.Element // the elements of lru
}

// cachedStmt is one entry of a stmtCache.
type cachedStmt struct {
	sql   string
	s     *stmt
	inUse bool // taken and not yet put back
}

// cacheable reports whether a statement starting with keyword may be
// cached: data statements only, never DDL, PRAGMA, transaction control,
// ATTACH and the like, whose effect is in the compiling.
func cacheable(keyword string) bool {
	switch keyword {
	case "SELECT", "INSERT", "UPDATE", "DELETE", "REPLACE", "WITH":
		return true
	}
	return false
}

// take returns the statement cached for sql, marked in use until put
// returns it, or nil when none is cached or it is in use.
func (c *stmtCache) take(sql string) *stmt {
	e := c.bySQL[sql]
	if e == nil {
		return nil
	}
	cs := e.Value.(*cachedStmt)
	if cs.inUse {
		return nil
	}
	cs.inUse = true
	c.lru.MoveToFront(e)
	return cs.s
}

// put caches s, reset, as the statement of sql: the one take returned is
// marked free again; another replaces a free one (finalizing it), and is
// finalized itself while the cached one is in use. A new entry finalizes
// the least recently used free statement when the cache is full.
func (c *stmtCache) put(sql string, s *stmt) {
	if e := c.bySQL[sql]; e != nil {
		cs := e.Value.(*cachedStmt)
		switch {
		case cs.s == s:
			cs.inUse = false
		case cs.inUse:
			s.finalize()
		default:
			cs.s.finalize()
			cs.s = s
			c.lru.MoveToFront(e)
		}
		return
	}
	if c.bySQL == nil {
		c.bySQL = make(map[string]*list.Element)
	}
	for e := c.lru.Back(); e != nil && c.lru.Len() >= maxCachedStmts; {
		prev := e.Prev()
		if cs := e.Value.(*cachedStmt); !cs.inUse {
			c.lru.Remove(e)
			delete(c.bySQL, cs.sql)
			cs.s.finalize()
		}
		e = prev
	}
	c.bySQL[sql] = c.lru.PushFront(&cachedStmt{sql: sql, s: s})
}

// len returns the number of statements cached.
func (c *stmtCache) len() int { return c.lru.Len() }

// clear finalizes every cached statement, as must be done before the
// connection closes.
func (c *stmtCache) clear() {
	for e := c.lru.Front(); e != nil; e = e.Next() {
		e.Value.(*cachedStmt).s.finalize()
	}
	c.lru.Init()
	c.bySQL = nil
}
