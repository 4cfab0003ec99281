package d1local

import "container/list"

// maxCachedStmts bounds each connection's statement cache.
const maxCachedStmts = 128

// stmtCache holds a connection's prepared user statements for reuse, by
// exact SQL text, as workerd caches its own: at most maxCachedStmts of
// them, the least recently used finalized first. A statement in use is not
// in the cache: take removes it and put returns it once it is reset. The
// zero value is an empty cache.
type stmtCache struct {
	lru   list.List                // of *cachedStmt, most recently used first
	bySQL map[string]*list.Element // the elements of lru
}

// cachedStmt is one entry of a stmtCache.
type cachedStmt struct {
	sql string
	s   *stmt
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

// take removes the statement cached for sql from the cache and returns
// it, or nil when there is none.
func (c *stmtCache) take(sql string) *stmt {
	e := c.bySQL[sql]
	if e == nil {
		return nil
	}
	delete(c.bySQL, sql)
	return c.lru.Remove(e).(*cachedStmt).s
}

// put caches s, reset, as the statement of sql, finalizing the least
// recently used statement when the cache is full.
func (c *stmtCache) put(sql string, s *stmt) {
	if old := c.take(sql); old != nil {
		old.finalize()
	}
	if c.bySQL == nil {
		c.bySQL = make(map[string]*list.Element)
	}
	for c.lru.Len() >= maxCachedStmts {
		oldest := c.lru.Back().Value.(*cachedStmt)
		c.take(oldest.sql).finalize()
	}
	c.bySQL[sql] = c.lru.PushFront(&cachedStmt{sql: sql, s: s})
}

// len returns the number of statements cached.
func (c *stmtCache) len() int { return c.lru.Len() }

// clear finalizes every cached statement, as must be done before the
// connection closes.
func (c *stmtCache) clear() {
	for c.lru.Len() > 0 {
		c.take(c.lru.Front().Value.(*cachedStmt).sql).finalize()
	}
}
