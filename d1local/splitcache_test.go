package d1local

import (
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
)

// TestSplitCacheHit: a text decoded again comes from the cache, equal to
// what splitSQL gives, and what callers do with it does not change the
// cache.
func TestSplitCacheHit(t *testing.T) {
	cache := newSplitCache()
	const sql = "SELECT 1; SELECT 2;"
	body := []byte(`{"batch":[{"sql":"SELECT 1; SELECT 2;"},{"sql":"SELECT 3"},{"sql":"SELECT 1; SELECT 2;"}]}`)
	first, err := decodeBody(body, cache)
	if err != nil {
		t.Fatal(err)
	}
	if n := cache.Len(); n != 2 {
		t.Fatalf("%d texts cached, want 2", n)
	}
	second, err := decodeBody(body, cache)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := decodeJSON(body, nil)
	if !reflect.DeepEqual(first, want) || !reflect.DeepEqual(second, want) {
		t.Fatalf("decoded %#v then %#v, want %#v", first, second, want)
	}
	if &first[0].pieces[0] != &second[0].pieces[0] || &first[0].pieces[0] != &second[2].pieces[0] {
		t.Error("the second decoding split the text again")
	}
	// The general path shares the cache.
	third, err := decodeBody([]byte(`{"sql":"SELECT 1; SELECT 2;","x":1}`), cache)
	if err != nil {
		t.Fatal(err)
	}
	if &third[0].pieces[0] != &first[0].pieces[0] {
		t.Error("the general path split the text again")
	}

	// Callers only read the pieces; one that appended would get a copy.
	if _, err := compile(second); err != nil {
		t.Fatal(err)
	}
	_ = statementTexts(second)
	_ = append(second[0].pieces, piece{sql: "changed"})
	pieces, emptyTail := splitSQL(sql)
	e := cache.Get(sql, newSplitEntry)
	if !reflect.DeepEqual(e.pieces, pieces) || e.emptyTail != emptyTail || cap(e.pieces) != len(e.pieces) {
		t.Fatalf("cached %#v (cap %d), want %#v", e, cap(e.pieces), pieces)
	}
}

// TestSplitCacheBound: the cache holds at most splitCacheEntries texts and
// none longer than splitCacheMaxSQL.
func TestSplitCacheBound(t *testing.T) {
	cache := newSplitCache()
	for i := range 3 * splitCacheEntries {
		sql := fmt.Sprintf("SELECT %d", i)
		if e := cache.GetBytes([]byte(sql), newSplitEntry); e.sql != sql || len(e.pieces) != 1 || e.pieces[0].sql != sql {
			t.Fatalf("split %q = %#v", sql, e)
		}
		if n := cache.Len(); n > splitCacheEntries {
			t.Fatalf("%d texts cached, the bound is %d", n, splitCacheEntries)
		}
	}
	if n := cache.Len(); n != splitCacheEntries {
		t.Fatalf("%d texts cached, want %d", n, splitCacheEntries)
	}
	long := "SELECT '" + strings.Repeat("x", splitCacheMaxSQL) + "'"
	before := cache.Len()
	splits := 0
	split := func(sql string) splitEntry { splits++; return newSplitEntry(sql) }
	cache.Get(long, split)
	cache.GetBytes([]byte(long), split)
	cache.Get(long, split)
	if splits != 3 || cache.Len() != before {
		t.Fatalf("a text of %d bytes was cached (split %d times in 3 asks)", len(long), splits)
	}
	var none *splitCache
	if e := none.Get("SELECT 1", newSplitEntry); len(e.pieces) != 1 {
		t.Fatalf("a nil cache split %#v", e)
	}
}

// TestSplitCacheConcurrent: requests decoded at once share the cache
// safely (run with -race) and each gets what encoding/json gives.
func TestSplitCacheConcurrent(t *testing.T) {
	cache := newSplitCache()
	bodies := make([][]byte, 64)
	wants := make([][]parsedQuery, len(bodies))
	for i := range bodies {
		var batch []string
		for j := range 8 {
			batch = append(batch, fmt.Sprintf(`{"sql":"SELECT %d; SELECT ?","params":[%d]}`, (i*8+j)%(2*splitCacheEntries), j))
		}
		bodies[i] = []byte(`{"batch":[` + strings.Join(batch, ",") + `]}`)
		var err error
		if wants[i], err = decodeJSON(bodies[i], nil); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for round := range 20 {
				for k := range bodies {
					i := (k + g*7 + round) % len(bodies)
					got, err := decodeBody(bodies[i], cache)
					if err != nil {
						t.Error(err)
						return
					}
					if !reflect.DeepEqual(got, wants[i]) {
						t.Errorf("decodeBody(%q) = %#v, want %#v", bodies[i], got, wants[i])
						return
					}
				}
			}
		})
	}
	wg.Wait()
	if n := cache.Len(); n > splitCacheEntries {
		t.Fatalf("%d texts cached, the bound is %d", n, splitCacheEntries)
	}
}
