// Package textcache remembers what was computed from a text (a statement's
// classification in d1client, its split into statements in d1local), for
// the texts a client sends again and again.
package textcache

import (
	"strings"
	"sync"
)

// Cache remembers up to a bound of values by their texts, none computed
// from a text longer than a bound, dropping an arbitrary one to make room.
// It is safe for concurrent use. A nil *Cache remembers nothing: it
// computes every value.
//
// Its values are shared by every caller that asks for the same text: they
// are read, never changed.
type Cache[V any] struct {
	entries, maxText int

	mu sync.Mutex
	m  map[string]V
}

// New returns a Cache of at most entries values, computed from texts of at
// most maxText bytes.
func New[V any](entries, maxText int) *Cache[V] {
	return &Cache[V]{entries: entries, maxText: maxText}
}

// Get returns the value of text: the one remembered, or compute(text).
func (c *Cache[V]) Get(text string, compute func(string) V) V {
	if c == nil || len(text) > c.maxText {
		return compute(text)
	}
	c.mu.Lock()
	v, ok := c.m[text]
	c.mu.Unlock()
	if ok {
		return v
	}
	return c.add(strings.Clone(text), compute)
}

// GetBytes returns the value of text as Get does, without copying text when
// the value is remembered. text is not kept: it may be a scratch buffer.
func (c *Cache[V]) GetBytes(text []byte, compute func(string) V) V {
	if c == nil || len(text) > c.maxText {
		return compute(string(text))
	}
	c.mu.Lock()
	v, ok := c.m[string(text)]
	c.mu.Unlock()
	if ok {
		return v
	}
	return c.add(string(text), compute)
}

// add computes the value of text, a string of its own, and remembers it.
func (c *Cache[V]) add(text string, compute func(string) V) V {
	v := compute(text)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = make(map[string]V, c.entries)
	}
	if _, ok := c.m[text]; !ok && len(c.m) >= c.entries {
		for k := range c.m {
			delete(c.m, k)
			break
		}
	}
	c.m[text] = v
	return v
}

// Len returns the number of values remembered.
func (c *Cache[V]) Len() int {
	if c == nil {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.m)
}
