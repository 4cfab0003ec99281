package idem

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/internal/d1test"
)

var ctx = context.Background()

// The sweep's rowid subquery uses the updated_at index, on both backends and
// with both clocks.
func TestSweepUsesUpdatedAtIndex(t *testing.T) {
	d1test.ForEach(t, func(t *testing.T, b *d1test.Backend) {
		db := b.NewClientSchema(t)
		for _, injected := range []bool{false, true} {
			s := buildSQL(injected)
			st := s.sweep(DefaultRetention, DefaultSweepBatch, time.UnixMilli(1_767_225_600_000))
			res, err := db.Query(ctx, "EXPLAIN QUERY PLAN "+st.SQL, st.Params...)
			if err != nil {
				t.Fatal(err)
			}
			var plan []string
			for i := range res.Rows {
				v := res.Map(i)["detail"]
				d, _ := v.Text()
				plan = append(plan, d)
			}
			joined := strings.Join(plan, " | ")
			if !strings.Contains(joined, "USING COVERING INDEX idx_idempotency_keys_updated_at (updated_at<?)") &&
				!strings.Contains(joined, "USING INDEX idx_idempotency_keys_updated_at (updated_at<?)") {
				t.Errorf("injected clock %v: the sweep does not search the updated_at index: %s", injected, joined)
			}
			if strings.Contains(joined, "SCAN idempotency_keys") && !strings.Contains(joined, "INDEX") {
				t.Errorf("the sweep scans the table: %s", joined)
			}
		}
	})
}

// sweepCounter is a d1local fault hook that counts calls carrying a sweep.
type sweepCounter struct{ sweeps, calls atomic.Int64 }

func (s *sweepCounter) hook(r d1local.Request) d1local.Fault {
	s.calls.Add(1)
	for _, sql := range r.Statements {
		if strings.Contains(sql, "DELETE FROM idempotency_keys\nWHERE rowid IN") {
			s.sweeps.Add(1)
		}
	}
	return d1local.Fault{}
}

func seedOld(t *testing.T, db *d1client.Client, n int, updated int64) {
	t.Helper()
	for i := 0; i < n; i += 50 {
		var stmts []d1client.Statement
		for j := i; j < min(i+50, n); j++ {
			stmts = append(stmts, d1client.Statement{SQL: `INSERT INTO idempotency_keys (principal, key, fingerprint, status, created_at, updated_at) VALUES ('old', ?, 'fp', 'completed', ?, ?)`,
				Params: []any{fmt.Sprintf("old-%05d", j), updated, updated}})
		}
		if _, err := db.Exec(ctx, stmts); err != nil {
			t.Fatal(err)
		}
	}
}

func countRows(t *testing.T, db *d1client.Client, where string) int64 {
	t.Helper()
	res, err := db.Query(ctx, "SELECT count(*) FROM idempotency_keys WHERE "+where)
	if err != nil {
		t.Fatal(err)
	}
	n, _ := res.Rows[0][0].Int64()
	return n
}

// The sweep piggybacks on completion batches: at most once per interval, no
// D1 call of its own, repeating while full batches come back, and never
// deleting a row inside retention.
func TestSweepPiggybacksAndKeepsUpWithBacklog(t *testing.T) {
	var sc sweepCounter
	b := d1test.LocalConfig(t, d1local.Config{Faults: sc.hook})
	db := b.NewClientSchema(t)
	now := time.UnixMilli(1_767_225_600_000)
	retention := 24 * time.Hour
	seedOld(t, db, 95, now.Add(-retention-time.Second).UnixMilli())
	// Rows exactly at, and inside, the retention boundary are never deleted.
	seedOld2 := func(key string, updated int64) {
		if _, err := db.Query(ctx, `INSERT INTO idempotency_keys (principal, key, fingerprint, status, created_at, updated_at) VALUES ('keep', ?, 'fp', 'completed', ?, ?)`, key, updated, updated); err != nil {
			t.Fatal(err)
		}
	}
	seedOld2("boundary", now.Add(-retention).UnixMilli())
	seedOld2("inside", now.Add(-retention+time.Millisecond).UnixMilli())

	l, err := New(db, Config{Clock: func() time.Time { return now }, SweepInterval: time.Hour, Heartbeat: -1})
	if err != nil {
		t.Fatal(err)
	}
	request := func(i int) {
		d, err := l.Begin(ctx, "p", fmt.Sprintf("k%d", i), "fp")
		if err != nil || d.Outcome != Execute {
			t.Fatalf("%v %v", d, err)
		}
		if _, err := l.Complete(ctx, d.Reservation, Response{Status: 200}); err != nil {
			t.Fatal(err)
		}
	}
	sc.calls.Store(0)
	// 95 old rows, batches of 20: five full-or-partial sweeps on five
	// consecutive completions (20, 20, 20, 20, 15), then the interval rules.
	for i := 0; i < 8; i++ {
		request(i)
	}
	if got := sc.calls.Load(); got != 16 {
		t.Errorf("%d D1 calls for 8 first executions, want 16: the sweep must not add calls", got)
	}
	if got := sc.sweeps.Load(); got != 5 {
		t.Errorf("%d sweeps, want 5 (four full batches keep it going, the fifth is partial)", got)
	}
	if n := countRows(t, db, "principal = 'old'"); n != 0 {
		t.Errorf("%d expired rows left", n)
	}
	if n := countRows(t, db, "principal = 'keep'"); n != 2 {
		t.Errorf("%d rows inside retention left, want 2", n)
	}
	// Manual Sweep reports deletions and respects retention too.
	if n, err := l.Admin().Sweep(ctx); err != nil || n != 0 {
		t.Errorf("Sweep = %d, %v", n, err)
	}
}

// With D1's clock (the default) the timestamps come from the database; with
// an injected clock they are the clock's milliseconds, as in the spec.
func TestClocks(t *testing.T) {
	d1test.ForEach(t, func(t *testing.T, b *d1test.Backend) {
		db := b.NewClientSchema(t)
		before := time.Now().Add(-2 * time.Second).UnixMilli()
		l, _ := New(db, Config{Heartbeat: -1})
		d, err := l.Begin(ctx, "p", "d1clock", "fp")
		if err != nil {
			t.Fatal(err)
		}
		after := time.Now().Add(2 * time.Second).UnixMilli()
		res, err := db.Query(ctx, "SELECT created_at, updated_at, typeof(created_at) FROM idempotency_keys WHERE key = 'd1clock'")
		if err != nil {
			t.Fatal(err)
		}
		var created, updated int64
		var typ string
		if err := res.Rows[0].Scan(&created, &updated, &typ); err != nil {
			t.Fatal(err)
		}
		if created < before || created > after || created != updated || typ != "integer" {
			t.Errorf("D1 clock: created_at=%d updated_at=%d (%s), want integer ms within [%d, %d]", created, updated, typ, before, after)
		}
		if _, err := l.Complete(ctx, d.Reservation, Response{Status: 200}); err != nil {
			t.Fatal(err)
		}

		fixed := time.UnixMilli(1_767_225_600_123)
		li, _ := New(db, Config{Clock: func() time.Time { return fixed }, Heartbeat: -1})
		if _, err := li.Begin(ctx, "p", "injected", "fp"); err != nil {
			t.Fatal(err)
		}
		res, _ = db.Query(ctx, "SELECT created_at, updated_at, typeof(updated_at) FROM idempotency_keys WHERE key = 'injected'")
		if err := res.Rows[0].Scan(&created, &updated, &typ); err != nil || created != fixed.UnixMilli() || updated != created || typ != "integer" {
			t.Errorf("injected clock: %d %d %s %v", created, updated, typ, err)
		}
	})
}

// The Retry outcome (the row vanished between claim and lookup) cannot
// arise within one transaction, but the decision keeps the spec's branch.
func TestDecideRetryWhenRowVanished(t *testing.T) {
	l := &Ledger{cfg: Config{TTL: DefaultTTL}}
	d, err := l.decide([]d1client.Result{{}, {}}, "p", "k", "fp", time.Now(), l.cfg.TTL)
	if err != nil || d.Outcome != Retry {
		t.Fatalf("%+v %v", d, err)
	}
}
