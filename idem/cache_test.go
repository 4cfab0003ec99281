package idem_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/internal/d1test"
)

// With the replay cache on, a replay this process can answer costs no D1
// call, and answers exactly what the ledger would (the stored headers only,
// not the handler's others); it is never served to another principal, to
// another request under the key, nor for a pending key.
func TestReplayCacheAnswersWithoutD1(t *testing.T) {
	db := d1test.Local(t).NewClientSchema(t)
	cached := newLedger(t, db, idem.Config{ReplayCache: 1 << 20})
	plain := newLedger(t, db, idem.Config{})

	r := begin(t, cached, "acct_1", "k", "fpA").Reservation
	if d := begin(t, cached, "acct_1", "k", "fpA"); d.Outcome != idem.InProgress {
		t.Fatalf("pending: %v, want in progress from D1", d.Outcome)
	}
	_, err := cached.Complete(bg, r, idem.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}, "X-Other": {"x"}}, Body: []byte(`{"order":1}`)})
	if err != nil {
		t.Fatal(err)
	}
	want := begin(t, plain, "acct_1", "k", "fpA") // what D1 replays
	before := db.Stats().Calls
	for range 3 {
		d := begin(t, cached, "acct_1", "k", "fpA")
		if d.Outcome != idem.Replay || d.Response.Status != want.Response.Status || string(d.Response.Body) != string(want.Response.Body) ||
			fmt.Sprint(d.Response.Header) != fmt.Sprint(want.Response.Header) {
			t.Fatalf("cached replay %+v, want %+v", d.Response, want.Response)
		}
		d.Response.Body[0] = 'X' // the caller's copy
		d.Response.Header.Set("X-Mutated", "1")
	}
	if n := db.Stats().Calls - before; n != 0 {
		t.Errorf("%d D1 calls for 3 cached replays, want 0", n)
	}
	// Another principal, another request: D1 answers.
	if d := begin(t, cached, "acct_2", "k", "fpA"); d.Outcome != idem.Execute {
		t.Errorf("another principal's key: %v, want execute", d.Outcome)
	}
	if d := begin(t, cached, "acct_1", "k", "fpB"); d.Outcome != idem.Reused {
		t.Errorf("another request under the key: %v, want reused", d.Outcome)
	}
	if n := db.Stats().Calls - before; n != 2 {
		t.Errorf("%d D1 calls, want 2 (neither answered from the cache)", n)
	}
	// A replay read from D1 is cached too.
	r2 := begin(t, plain, "acct_1", "k2", "fp").Reservation
	complete(t, plain, r2, 200, "ok")
	begin(t, cached, "acct_1", "k2", "fp")
	before = db.Stats().Calls
	if d := begin(t, cached, "acct_1", "k2", "fp"); d.Outcome != idem.Replay || db.Stats().Calls != before {
		t.Errorf("a replay read from D1, again: %v, %d calls", d.Outcome, db.Stats().Calls-before)
	}
	// An operator's forced release is seen at once by this process.
	k, _ := cached.Admin().Get(bg, "acct_1", "k2")
	if _, err := cached.Admin().Release(bg, "acct_1", "k2", k.Generation, idem.ReleaseOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	if d := begin(t, cached, "acct_1", "k2", "fp"); d.Outcome != idem.Execute {
		t.Errorf("after a forced release: %v, want execute", d.Outcome)
	}
}

// A cached entry never outlives its row's retention: once the sweep may
// have deleted the row, D1 answers (and a swept key runs again).
func TestReplayCacheNeverOutlivesRetention(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := idem.Config{ReplayCache: 1 << 20, TTL: time.Second, MaxLease: time.Second, Retention: 2 * time.Minute, Heartbeat: -1}
		l, db := fakeTimeLedger(t, cfg, nil)
		complete(t, l, begin(t, l, "p", "k", "fp").Reservation, 201, "first")
		time.Sleep(2*time.Minute - time.Second)
		before := db.Stats().Calls
		if d := begin(t, l, "p", "k", "fp"); d.Outcome != idem.Replay || db.Stats().Calls != before {
			t.Fatalf("within the retention: %v, %d calls", d.Outcome, db.Stats().Calls-before)
		}
		time.Sleep(2 * time.Second)
		if _, err := l.Admin().Sweep(bg); err != nil {
			t.Fatal(err)
		}
		if d := begin(t, l, "p", "k", "fp"); d.Outcome != idem.Execute {
			t.Fatalf("past the retention, swept: %v, want execute", d.Outcome)
		}
	})
}

// The cache holds at most its bytes, dropping the least recently used.
func TestReplayCacheBounded(t *testing.T) {
	db := d1test.InProcess(t, d1local.Config{}).NewClientSchema(t)
	l := newLedger(t, db, idem.Config{ReplayCache: 8 << 10})
	body := string(make([]byte, 1000))
	for i := range 20 {
		complete(t, l, begin(t, l, "p", fmt.Sprint("k", i), "fp").Reservation, 200, body)
	}
	entries, size := idem.CacheLen(l)
	if size > 8<<10 || entries < 5 || entries > 8 {
		t.Fatalf("%d entries of %d bytes, want at most 8 KiB", entries, size)
	}
	before := db.Stats().Calls
	begin(t, l, "p", "k19", "fp") // the newest: cached
	begin(t, l, "p", "k0", "fp")  // the oldest: dropped
	if n := db.Stats().Calls - before; n != 1 {
		t.Errorf("%d D1 calls, want 1 (for the dropped entry)", n)
	}
}

// Many goroutines completing and replaying through the cache at once.
func TestReplayCacheConcurrent(t *testing.T) {
	l := newLedger(t, d1test.Local(t).NewClientSchema(t), idem.Config{ReplayCache: 64 << 10})
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for i := range 10 {
				key := fmt.Sprint("k", (g*7+i)%20)
				d, err := l.Begin(context.Background(), "p", key, "fp")
				switch {
				case err != nil:
					t.Error(err)
				case d.Outcome == idem.Execute:
					if _, err := l.Complete(context.Background(), d.Reservation, idem.Response{Status: 200, Body: []byte(key)}); err != nil {
						t.Error(err)
					}
				case d.Outcome == idem.Replay && string(d.Response.Body) != key:
					t.Errorf("%s replayed %q", key, d.Response.Body)
				}
			}
		})
	}
	wg.Wait()
}
