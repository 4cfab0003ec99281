package textcache

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// counter computes a text's length and counts its calls.
type counter struct{ calls atomic.Int64 }

func (c *counter) compute(text string) int {
	c.calls.Add(1)
	return len(text)
}

// TestHit: a text asked for again, as a string or as bytes, is computed
// once, and a hit by bytes allocates nothing.
func TestHit(t *testing.T) {
	c := New[int](4, 64)
	var n counter
	for range 3 {
		if v := c.Get("SELECT 1", n.compute); v != 8 {
			t.Fatalf("Get = %d, want 8", v)
		}
		if v := c.GetBytes([]byte("SELECT 1"), n.compute); v != 8 {
			t.Fatalf("GetBytes = %d, want 8", v)
		}
	}
	if got := n.calls.Load(); got != 1 || c.Len() != 1 {
		t.Fatalf("computed %d times, %d remembered: want 1, 1", got, c.Len())
	}
	text := []byte("SELECT 1")
	if allocs := testing.AllocsPerRun(100, func() { c.GetBytes(text, n.compute) }); allocs != 0 {
		t.Errorf("a hit by bytes allocates %v times", allocs)
	}
}

// TestBytesNotKept: GetBytes keeps its own copy of the text, so a scratch
// buffer reused afterwards changes nothing remembered.
func TestBytesNotKept(t *testing.T) {
	c := New[string](4, 64)
	buf := []byte("SELECT 1")
	c.GetBytes(buf, strings.Clone)
	copy(buf, "SELECT 2")
	if v := c.Get("SELECT 1", func(string) string { return "recomputed" }); v != "SELECT 1" {
		t.Fatalf("remembered %q for SELECT 1", v)
	}
}

// TestBounds: at most entries values are remembered, and none of a text
// longer than maxText; a nil Cache computes every time.
func TestBounds(t *testing.T) {
	c := New[int](8, 16)
	var n counter
	for i := range 100 {
		c.Get(fmt.Sprintf("SELECT %d", i), n.compute)
		if c.Len() > 8 {
			t.Fatalf("%d remembered, the bound is 8", c.Len())
		}
	}
	if c.Len() != 8 {
		t.Fatalf("%d remembered, want 8", c.Len())
	}
	long := strings.Repeat("x", 17)
	n.calls.Store(0)
	c.Get(long, n.compute)
	c.GetBytes([]byte(long), n.compute)
	if n.calls.Load() != 2 || c.Len() != 8 {
		t.Fatalf("a text over the bound: computed %d times in 2 asks, %d remembered", n.calls.Load(), c.Len())
	}
	var none *Cache[int]
	n.calls.Store(0)
	none.Get("a", n.compute)
	none.GetBytes([]byte("a"), n.compute)
	if n.calls.Load() != 2 || none.Len() != 0 {
		t.Fatalf("a nil cache computed %d times in 2 asks", n.calls.Load())
	}
}

// TestConcurrent: goroutines asking at once get the right values (run
// with -race), and the bound holds.
func TestConcurrent(t *testing.T) {
	c := New[int](16, 64)
	var n counter
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 200 {
				text := fmt.Sprintf("SELECT %d", (i+g)%40)
				var v int
				if i%2 == 0 {
					v = c.Get(text, n.compute)
				} else {
					v = c.GetBytes([]byte(text), n.compute)
				}
				if v != len(text) {
					t.Errorf("%q: %d", text, v)
					return
				}
			}
		})
	}
	wg.Wait()
	if c.Len() > 16 {
		t.Fatalf("%d remembered, the bound is 16", c.Len())
	}
}
