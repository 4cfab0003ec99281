package idem

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/internal/d1test"
)

// oneCallClient returns a client of an in-process d1local database with the
// schema, whose group commit has one call in flight at a time, never
// refused for the queue, and on which a call carrying "'slow'" takes slow.
func oneCallClient(t *testing.T, slow time.Duration) *d1client.Client {
	t.Helper()
	b := d1test.InProcess(t, d1local.Config{Faults: func(r d1local.Request) d1local.Fault {
		if slices.ContainsFunc(r.Statements, func(s string) bool { return strings.Contains(s, "'slow'") }) {
			return d1local.Fault{Latency: slow}
		}
		return d1local.Fault{}
	}})
	return b.NewClientSchema(t, func(c *d1client.Config) { c.Coalesce.MaxInFlight, c.Coalesce.MaxQueueWait = 1, -1 })
}

// With D1's clock a lease starts when the call carrying its claim (or its
// renewal) is sent, not when the claim was queued: a claim that waited 5 s
// behind group commit's one call in flight, with a TTL of 1 s, still has
// its lease. Counted from the queueing, it was over before the claim was
// sent: heartbeats gave up at once, the handler's context was cancelled,
// and Hold's maximum lease fired early.
func TestLeaseCountsFromTheSend(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const slow = 5 * time.Second
		db := oneCallClient(t, slow)
		l, err := New(db, Config{TTL: time.Second, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		busy := func() chan error {
			done := make(chan error, 1)
			go func() {
				_, err := db.Exec(ctx, []d1client.Statement{{SQL: "SELECT 'slow'"}}, d1client.Coalesce())
				done <- err
			}()
			synctest.Wait() // in flight
			return done
		}

		if _, err := l.Begin(ctx, "acct_1", "k0", "fp"); err != nil { // what a first claim reads once
			t.Fatal(err)
		}
		slowDone := busy()
		queued := time.Now()
		d, err := l.Begin(ctx, "acct_1", "k1", "fp")
		if err != nil || d.Outcome != Execute {
			t.Fatalf("Begin: %+v, %v", d, err)
		}
		if err := <-slowDone; err != nil {
			t.Fatal(err)
		}
		r := d.Reservation
		if got := r.leaseStart().Sub(queued); got < slow {
			t.Errorf("the lease starts %v after the claim was queued, before its call was sent (%v after)", got, slow)
		}

		slowDone = busy()
		queued = time.Now()
		if ok, err := l.Renew(ctx, r); !ok || err != nil {
			t.Fatalf("Renew: %v, %v", ok, err)
		}
		if err := <-slowDone; err != nil {
			t.Fatal(err)
		}
		if got := r.leaseStart().Sub(queued); got < slow {
			t.Errorf("the renewed lease starts %v after the renewal was queued, before its call was sent (%v after)", got, slow)
		}
		time.Sleep(time.Minute) // group commit's runners go idle
	})
}

// A fenced transactional completion among many that share a call aborts
// the whole call; the checks find it in one more call and the others are
// sent again together in one: three calls, where halving took one more
// per halving. The fenced one is not stored, with no lookup of its own;
// the others are, and their statements committed once. A completion sent
// again after it was stored (an answer lost) aborts the call too, and its
// check reads that the stored response is its own: it is stored.
func TestFencedTxCompletionCostsThreeCalls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 16
		db := oneCallClient(t, time.Second)
		ctx := context.Background()
		if _, err := db.Exec(ctx, []d1client.Statement{{SQL: "CREATE TABLE biz (k TEXT PRIMARY KEY)"}}); err != nil {
			t.Fatal(err)
		}
		l, err := New(db, Config{TTL: time.Minute, Heartbeat: -1, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		var rs []*Reservation
		for i := range n {
			d, err := l.Begin(ctx, "acct_1", fmt.Sprintf("k%d", i), "fp")
			if err != nil || d.Outcome != Execute {
				t.Fatalf("Begin: %+v, %v", d, err)
			}
			rs = append(rs, d.Reservation)
		}
		fenced, again := rs[n/2], rs[n/4]
		if ok, err := l.Release(ctx, fenced); !ok || err != nil {
			t.Fatalf("Release: %v, %v", ok, err)
		}
		resp := Response{Status: 201, Body: []byte(`{}`)}
		insert := func(r *Reservation) []d1client.Statement {
			return []d1client.Statement{{SQL: "INSERT INTO biz (k) VALUES (?) ON CONFLICT DO NOTHING", Params: []any{r.Key}}}
		}
		if done, err := l.CompleteTx(ctx, again, resp, insert(again)); err != nil || !done.Stored {
			t.Fatalf("CompleteTx: %+v, %v", done, err)
		}
		slowDone := make(chan error, 1)
		go func() {
			_, err := db.Exec(ctx, []d1client.Statement{{SQL: "SELECT 'slow'"}}, d1client.Coalesce())
			slowDone <- err
		}()
		synctest.Wait()
		before := db.Stats().Calls
		dones := make([]chan Completion, n)
		for i, r := range rs {
			dones[i] = make(chan Completion, 1)
			go func() {
				done, err := l.CompleteTx(ctx, r, resp, insert(r))
				if err != nil {
					t.Errorf("%s: %v", r.Key, err)
				}
				dones[i] <- done
			}()
		}
		if err := <-slowDone; err != nil {
			t.Fatal(err)
		}
		for i, r := range rs {
			if done := <-dones[i]; done.Stored != (r != fenced) {
				t.Errorf("%s: stored %v", r.Key, done.Stored)
			}
		}
		if calls := db.Stats().Calls - before; calls != 3 {
			t.Errorf("the completions took %d calls; want 3: the shared one, the checks, the others again", calls)
		}
		res, err := db.Exec(ctx, []d1client.Statement{{SQL: "SELECT count(*) FROM biz"}})
		if err != nil {
			t.Fatal(err)
		}
		var count int64
		if err := res[0].Rows[0].Scan(&count); err != nil || count != n-1 {
			t.Errorf("%d business rows (%v), want %d", count, err, n-1)
		}
		time.Sleep(time.Minute) // group commit's runners go idle
	})
}
