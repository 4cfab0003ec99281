package idem

import (
	"bytes"
	"container/list"
	"net/http"
	"sync"
	"time"
)

// replayCache keeps completed responses in memory, so that a replay this
// process can answer costs no D1 call. A completed row never changes until
// it is swept (or an operator force-releases it), so an entry is good until
// its row's retention ends, which it never outlives. Entries are keyed by
// principal and key, and served only to a request with the fingerprint they
// were stored under: never a pending key, never another payload's. The
// least recently used entries go first once the cache holds more than its
// bytes. Safe for concurrent use.
type replayCache struct {
	max int // bytes

	mu      sync.Mutex
	size    int
	entries map[cacheKey]*list.Element // of *cacheEntry
	lru     list.List                  // most recently used at the front
}

type cacheKey struct{ principal, key string }

type cacheEntry struct {
	id          cacheKey
	fingerprint string
	resp        Response // the replay's: stored headers only, no body for null-body statuses
	expires     time.Time
	size        int
}

// cacheOverhead approximates what an entry costs beyond its strings.
const cacheOverhead = 256

func newReplayCache(maxBytes int) *replayCache {
	if maxBytes <= 0 {
		return nil
	}
	return &replayCache{max: maxBytes, entries: map[cacheKey]*list.Element{}}
}

// get returns a copy of the response stored for principal's key under
// fingerprint, if the cache holds one that has not expired.
func (c *replayCache) get(principal, key, fingerprint string) (*Response, bool) {
	if c == nil {
		return nil, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.entries[cacheKey{principal, key}]
	if !ok {
		return nil, false
	}
	e := el.Value.(*cacheEntry)
	if !time.Now().Before(e.expires) {
		c.remove(el)
		return nil, false
	}
	if e.fingerprint != fingerprint {
		return nil, false // another request's key: D1 answers it
	}
	c.lru.MoveToFront(el)
	resp := Response{Status: e.resp.Status, Header: e.resp.Header.Clone(), Body: bytes.Clone(e.resp.Body)}
	if resp.Header == nil {
		resp.Header = http.Header{}
	}
	return &resp, true
}

// put keeps resp, the replay of principal's completed key under
// fingerprint, until expires.
func (c *replayCache) put(principal, key, fingerprint string, resp *Response, expires time.Time) {
	if c == nil || !time.Now().Before(expires) {
		return
	}
	e := &cacheEntry{id: cacheKey{principal, key}, fingerprint: fingerprint, expires: expires,
		resp: Response{Status: resp.Status, Header: resp.Header.Clone(), Body: bytes.Clone(resp.Body)}}
	e.size = cacheOverhead + len(principal) + len(key) + len(fingerprint) + len(resp.Body)
	for name, vs := range resp.Header {
		e.size += len(name)
		for _, v := range vs {
			e.size += len(v)
		}
	}
	if e.size > c.max {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.entries[e.id]; ok {
		c.remove(old)
	}
	c.entries[e.id] = c.lru.PushFront(e)
	c.size += e.size
	for c.size > c.max {
		c.remove(c.lru.Back())
	}
}

// forget drops principal's key, whatever its fingerprint.
func (c *replayCache) forget(principal, key string) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.entries[cacheKey{principal, key}]; ok {
		c.remove(el)
	}
}

// remove drops el, with c.mu held.
func (c *replayCache) remove(el *list.Element) {
	e := c.lru.Remove(el).(*cacheEntry)
	delete(c.entries, e.id)
	c.size -= e.size
}

// len returns the number of entries and the bytes they count for.
func (c *replayCache) len() (int, int) {
	if c == nil {
		return 0, 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries), c.size
}
