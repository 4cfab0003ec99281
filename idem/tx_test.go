package idem_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/internal/d1test"
)

func businessTable(t *testing.T, db *d1client.Client) {
	t.Helper()
	if _, err := db.Query(bg, "CREATE TABLE orders (key TEXT NOT NULL, owner TEXT NOT NULL, UNIQUE (key, owner))"); err != nil {
		t.Fatal(err)
	}
}

func insertOrder(key, owner string) d1client.Statement {
	return d1client.Statement{SQL: "INSERT INTO orders (key, owner) VALUES (?, ?)", Params: []any{key, owner}}
}

func orders(t *testing.T, db *d1client.Client, key string) []string {
	t.Helper()
	res, err := db.Query(bg, "SELECT owner FROM orders WHERE key = ? ORDER BY owner", key)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range res.Rows {
		s, _ := r[0].Text()
		out = append(out, s)
	}
	return out
}

// Under transactional completion a fenced-out owner's business write never
// lands: exactly one business write per key, even across a takeover.
func TestTransactionalCompletionAcrossTakeover(t *testing.T) {
	d1test.ForEach(t, func(t *testing.T, b *d1test.Backend) {
		db := b.NewClientSchema(t)
		businessTable(t, db)
		clk := newClock()
		l := newLedger(t, db, idem.Config{Clock: clk.Now, Heartbeat: -1})
		a := begin(t, l, "p", "k", "fp").Reservation
		// A stalls past the TTL; B takes over and commits its order.
		clk.Advance(idem.DefaultTTL + time.Second)
		d := begin(t, l, "p", "k", "fp")
		if d.Outcome != idem.Execute || !d.Reservation.Takeover {
			t.Fatalf("%+v", d)
		}
		cb, err := l.CompleteTx(bg, d.Reservation, idem.Response{Status: 201, Body: []byte("B")}, []d1client.Statement{insertOrder("k", "B")})
		if err != nil || !cb.Stored {
			t.Fatalf("B: %+v %v", cb, err)
		}
		// A wakes up and tries to commit its own order with its completion.
		ca, err := l.CompleteTx(bg, a, idem.Response{Status: 201, Body: []byte("A")}, []d1client.Statement{insertOrder("k", "A")})
		if err != nil || ca.Stored {
			t.Fatalf("A: %+v %v", ca, err)
		}
		if got := orders(t, db, "k"); len(got) != 1 || got[0] != "B" {
			t.Fatalf("orders = %v, want only B's", got)
		}
		if d := begin(t, l, "p", "k", "fp"); d.Outcome != idem.Replay || string(d.Response.Body) != "B" {
			t.Fatalf("replay: %+v", d)
		}
		// The opposite order: A completes before B's takeover could happen.
		a2 := begin(t, l, "p", "k2", "fp").Reservation
		if c, err := l.CompleteTx(bg, a2, idem.Response{Status: 201}, []d1client.Statement{insertOrder("k2", "A")}); err != nil || !c.Stored {
			t.Fatalf("%+v %v", c, err)
		}
		clk.Advance(time.Hour)
		if d := begin(t, l, "p", "k2", "fp"); d.Outcome != idem.Replay {
			t.Fatalf("completed keys are never taken over: %+v", d)
		}
		if got := orders(t, db, "k2"); len(got) != 1 {
			t.Fatalf("orders = %v", got)
		}
	})
}

// An answer lost after the guarded batch committed is recognised on the
// retry (the guard trips, the row holds our response): stored once, written
// once. A transient failure before the commit is retried and lands once.
func TestTransactionalCompletionRetries(t *testing.T) {
	b := d1test.Local(t)
	db := b.NewClientSchema(t, func(c *d1client.Config) {
		c.Retry = d1client.RetryPolicy{BaseDelay: time.Millisecond, MaxDelay: 2 * time.Millisecond}
	})
	businessTable(t, db)
	l := newLedger(t, db, idem.Config{Heartbeat: -1})
	for i, f := range []d1local.Fault{{LoseResponse: true}, {Internal: true, AfterCommit: true}, {Internal: true}, {BadGateway: true}} {
		key := fmt.Sprintf("k%d", i)
		r := begin(t, l, "p", key, "fp").Reservation
		b.Local.Inject(f)
		c, err := l.CompleteTx(bg, r, idem.Response{Status: 201, Body: []byte("ok")}, []d1client.Statement{insertOrder(key, "me")})
		if err != nil || !c.Stored {
			t.Errorf("%+v: stored=%v err=%v", f, c.Stored, err)
		}
		if got := orders(t, db, key); len(got) != 1 {
			t.Errorf("%+v: orders = %v", f, got)
		}
	}
}

// When one of the caller's statements fails, CompleteTx commits nothing:
// the error wraps ErrTxNotCommitted and the SQL error, and the reservation
// is released, so the retry takes it over at once.
func TestCompleteTxStatementFails(t *testing.T) {
	db := d1test.Local(t).NewClientSchema(t)
	l := newLedger(t, db, idem.Config{Heartbeat: -1})
	res := begin(t, l, "p", "k-direct", "fp").Reservation
	_, err := l.CompleteTx(bg, res, idem.Response{Status: 200}, []d1client.Statement{{SQL: "INSERT INTO nowhere VALUES (1)"}})
	if !errors.Is(err, idem.ErrTxNotCommitted) || !errors.Is(err, d1client.ErrSQL) {
		t.Errorf("err = %v", err)
	}
	if d := begin(t, l, "p", "k-direct", "fp"); d.Outcome != idem.Execute || d.Reservation.Generation != 3 {
		t.Errorf("after a failed transactional completion: %+v", d)
	}
}

// Transactional completions share D1 calls with concurrent requests'
// statements, as plain ones do: the calls a budget keeps for completions
// count on it. A guard that fails by design (a fenced-out owner's) aborts
// the shared call, and the callers are sent again in halves until it is
// alone: nobody else's completion or business write is lost or doubled,
// and the fenced-out owner's write never lands.
func TestGuardedBatchesShareCalls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		shared := 0 // calls carrying the guards of several requests
		b := d1test.InProcess(t, d1local.Config{Faults: func(r d1local.Request) d1local.Fault {
			if n := strings.Count(strings.Join(r.Statements, "\n"), "WHERE NOT EXISTS"); n > 1 {
				mu.Lock()
				shared++
				mu.Unlock()
			}
			return d1local.Fault{Latency: 20 * time.Millisecond}
		}})
		db := b.NewClientSchema(t)
		businessTable(t, db)
		l := newLedger(t, db, idem.Config{TTL: time.Second, Clock: time.Now, Heartbeat: -1})
		// The owner of "late" stalls past the TTL; a retry takes over and commits.
		late := begin(t, l, "p", "late", "fp").Reservation
		time.Sleep(2 * time.Second)
		d := begin(t, l, "p", "late", "fp")
		if d.Outcome != idem.Execute || !d.Reservation.Takeover {
			t.Fatalf("%+v", d)
		}
		if c, err := l.CompleteTx(bg, d.Reservation, idem.Response{Status: 201}, []d1client.Statement{insertOrder("late", "B")}); err != nil || !c.Stored {
			t.Fatalf("B: %+v %v", c, err)
		}
		var rs []*idem.Reservation
		for i := range 30 {
			rs = append(rs, begin(t, l, "p", fmt.Sprintf("g%d", i), "fp").Reservation)
		}
		var wg sync.WaitGroup
		for i, r := range rs {
			wg.Go(func() {
				var c idem.Completion
				var err error
				if i%2 == 0 {
					c, err = l.CompleteTx(bg, r, idem.Response{Status: 201}, []d1client.Statement{insertOrder(r.Key, "me")})
				} else {
					c, err = l.Complete(bg, r, idem.Response{Status: 201})
				}
				if err != nil || !c.Stored {
					t.Errorf("%s: %+v %v", r.Key, c, err)
				}
			})
			if i == 10 { // the stalled owner wakes up amid them
				wg.Go(func() {
					c, err := l.CompleteTx(bg, late, idem.Response{Status: 201}, []d1client.Statement{insertOrder("late", "A")})
					if err != nil || c.Stored {
						t.Errorf("the fenced-out owner: %+v %v", c, err)
					}
				})
			}
		}
		wg.Wait()
		if shared == 0 {
			t.Error("no call carried the guarded completions of several requests")
		}
		if got := orders(t, db, "late"); len(got) != 1 || got[0] != "B" {
			t.Errorf("orders of late = %v, want only B's", got)
		}
		for i := 0; i < 30; i += 2 {
			if got := orders(t, db, fmt.Sprintf("g%d", i)); len(got) != 1 {
				t.Errorf("orders of g%d = %v", i, got)
			}
		}
	})
}
