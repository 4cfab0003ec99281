package d1local

import (
	"slices"
	"sync"
)

// Bounds of a splitCache.
const (
	splitCacheEntries = 256     // texts remembered
	splitCacheMaxSQL  = 8 << 10 // bytes of the longest text remembered
)

// splitCache remembers splitSQL's results by SQL text, for the texts a
// client sends again and again. It holds at most splitCacheEntries texts of
// at most splitCacheMaxSQL bytes each, dropping an arbitrary one to make
// room. It is safe for concurrent use; the zero value is an empty cache and
// a nil *splitCache remembers nothing.
//
// The pieces it returns are shared by every caller: they are read, never
// changed.
type splitCache struct {
	mu sync.Mutex
	m  map[string]splitEntry
}

// splitEntry is one SQL text split by splitSQL.
type splitEntry struct {
	sql       string
	pieces    []piece // cap(pieces) == len(pieces): an append copies them
	emptyTail bool
}

// newSplitEntry splits sql.
func newSplitEntry(sql string) splitEntry {
	pieces, emptyTail := splitSQL(sql)
	return splitEntry{sql: sql, pieces: slices.Clip(pieces), emptyTail: emptyTail}
}

// splitBytes returns sql as a string, split. sql is not kept: it may be a
// scratch buffer.
func (c *splitCache) splitBytes(sql []byte) splitEntry {
	if c == nil || len(sql) > splitCacheMaxSQL {
		return newSplitEntry(string(sql))
	}
	c.mu.Lock()
	e, ok := c.m[string(sql)]
	c.mu.Unlock()
	if ok {
		return e
	}
	return c.add(string(sql))
}

// splitString returns sql split.
func (c *splitCache) splitString(sql string) splitEntry {
	if c == nil || len(sql) > splitCacheMaxSQL {
		return newSplitEntry(sql)
	}
	c.mu.Lock()
	e, ok := c.m[sql]
	c.mu.Unlock()
	if ok {
		return e
	}
	return c.add(sql)
}

// add splits sql and remembers it, dropping an arbitrary entry when the
// cache is full.
func (c *splitCache) add(sql string) splitEntry {
	e := newSplitEntry(sql)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = make(map[string]splitEntry, splitCacheEntries)
	}
	if _, ok := c.m[sql]; !ok && len(c.m) >= splitCacheEntries {
		for k := range c.m {
			delete(c.m, k)
			break
		}
	}
	c.m[sql] = e
	return e
}

// len returns the number of texts remembered.
func (c *splitCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.m)
}
