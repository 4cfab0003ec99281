package d1local

import (
	"slices"

	"github.com/d1idem/d1idem/internal/textcache"
)

// Bounds of a Server's cache of split SQL texts.
const (
	splitCacheEntries = 256     // texts remembered
	splitCacheMaxSQL  = 8 << 10 // bytes of the longest text remembered
)

// splitCache remembers splitSQL's results by SQL text, for the texts a
// client sends again and again. A nil *splitCache remembers nothing.
type splitCache = textcache.Cache[splitEntry]

// newSplitCache returns an empty splitCache of the default bounds.
func newSplitCache() *splitCache {
	return textcache.New[splitEntry](splitCacheEntries, splitCacheMaxSQL)
}

// splitEntry is one SQL text split by splitSQL. Its pieces are shared by
// every request that sends the text: they are read, never changed.
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
