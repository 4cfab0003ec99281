package idem_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
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

// A guarded batch never shares a D1 call with other requests' statements:
// its guard may fail by design, and a failing statement aborts the whole
// batch. Concurrent plain requests around it are coalesced as usual.
func TestGuardedBatchesTravelAlone(t *testing.T) {
	var mu sync.Mutex
	var guarded [][]string
	b := d1test.LocalConfig(t, d1local.Config{Faults: func(r d1local.Request) d1local.Fault {
		for _, s := range r.Statements {
			if strings.Contains(s, "WHERE NOT EXISTS") {
				mu.Lock()
				guarded = append(guarded, r.Statements)
				mu.Unlock()
				break
			}
		}
		return d1local.Fault{Latency: 2 * time.Millisecond}
	}})
	db := b.NewClientSchema(t)
	businessTable(t, db)
	l := newLedger(t, db, idem.Config{Heartbeat: -1})
	var wg sync.WaitGroup
	for i := 0; i < 30; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("g%d", i)
			r := begin(t, l, "p", key, "fp").Reservation
			var err error
			if i%2 == 0 {
				_, err = l.CompleteTx(bg, r, idem.Response{Status: 201}, []d1client.Statement{insertOrder(key, "me")})
			} else {
				_, err = l.Complete(bg, r, idem.Response{Status: 201})
			}
			if err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if len(guarded) != 15 {
		t.Fatalf("%d guarded calls, want 15", len(guarded))
	}
	for _, stmts := range guarded {
		// guard, the order INSERT, the fenced completion, and at most the
		// sweep: one request's statements, nobody else's.
		if len(stmts) < 3 || len(stmts) > 4 || !strings.Contains(stmts[1], "INSERT INTO orders") {
			t.Fatalf("a guarded call carried %d statements: %q", len(stmts), stmts)
		}
	}
}
