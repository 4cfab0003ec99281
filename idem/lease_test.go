package idem_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/internal/d1test"
)

// The lease tests run in fake time (testing/synctest), on a d1local
// reached in process: heartbeats are real tickers of the bubble's clock,
// and the ledger's clock is the bubble's too (D1's own clock, SQLite's, is
// the machine's, so it is injected).

// fakeTimeLedger returns a ledger on a fresh in-process d1local database,
// for use inside a bubble, with the bubble's clock as its Clock.
func fakeTimeLedger(t *testing.T, cfg idem.Config, faults d1local.FaultFunc, mod ...func(*d1client.Config)) (*idem.Ledger, *d1client.Client) {
	t.Helper()
	db := d1test.InProcess(t, d1local.Config{Faults: faults}).NewClientSchema(t, mod...)
	cfg.Clock = time.Now
	return newLedger(t, db, cfg), db
}

// A slow but live owner is never taken over: its heartbeats renew the lease
// every TTL/3, so retries long after the TTL still get InProgress; the same
// wait without a heartbeat is a takeover.
func TestHeartbeatKeepsSlowOwner(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, _ := fakeTimeLedger(t, idem.Config{TTL: 30 * time.Second}, nil)
		r := begin(t, l, "p", "slow", "fp").Reservation
		err := l.Hold(bg, r, func(ctx context.Context) error {
			for i := range 6 { // 6 x 25 s: five TTLs
				time.Sleep(25 * time.Second)
				if d := begin(t, l, "p", "slow", "fp"); d.Outcome != idem.InProgress {
					t.Fatalf("after %v: %v, want in progress", time.Duration(i+1)*25*time.Second, d.Outcome)
				}
			}
			return context.Cause(ctx)
		})
		if err != nil {
			t.Fatalf("cause = %v", err)
		}
		if c := complete(t, l, r, 201, "slow but alive"); !c.Stored {
			t.Fatal("the live owner's completion was fenced out")
		}
		// Without a heartbeat the same wait past the TTL is a takeover.
		begin(t, l, "p", "dead", "fp")
		time.Sleep(31 * time.Second)
		if d := begin(t, l, "p", "dead", "fp"); d.Outcome != idem.Execute || !d.Reservation.Takeover {
			t.Fatalf("no heartbeat: %+v", d)
		}
	})
}

// When a heartbeat finds the reservation gone, the handler's context is
// cancelled with ErrLeaseLost, and a log line says so.
func TestLeaseLostCancelsHandler(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs bytes.Buffer
		var mu sync.Mutex
		l, db := fakeTimeLedger(t, idem.Config{Logger: slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, nil))}, nil)
		r := begin(t, l, "p", "stolen", "fp").Reservation
		start := time.Now()
		err := l.Hold(bg, r, func(ctx context.Context) error {
			// An operator releases the key (or a takeover happens) meanwhile.
			if _, err := db.Query(bg, "UPDATE idempotency_keys SET generation = generation + 1 WHERE key = 'stolen'"); err != nil {
				t.Error(err)
			}
			<-ctx.Done()
			return context.Cause(ctx)
		})
		if !errors.Is(err, idem.ErrLeaseLost) || time.Since(start) != idem.DefaultTTL/3 {
			t.Fatalf("cause = %v after %v, want ErrLeaseLost at the first heartbeat", err, time.Since(start))
		}
		mu.Lock()
		out := logs.String()
		mu.Unlock()
		if !strings.Contains(out, "lease lost") || !strings.Contains(out, "generation=1") {
			t.Errorf("log: %s", out)
		}
	})
}

// A handler that runs past MaxLease is cancelled with ErrMaxLease, though
// its heartbeats renewed the lease; once they stop, the reservation can be
// taken over a TTL later.
func TestMaxLeaseBoundsRunawayHandlers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, _ := fakeTimeLedger(t, idem.Config{TTL: 30 * time.Second, MaxLease: time.Minute}, nil)
		r := begin(t, l, "p", "runaway", "fp").Reservation
		start := time.Now()
		err := l.Hold(bg, r, func(ctx context.Context) error {
			<-ctx.Done()
			return context.Cause(ctx)
		})
		if !errors.Is(err, idem.ErrMaxLease) || time.Since(start) != time.Minute {
			t.Fatalf("cause = %v after %v, want ErrMaxLease at 1m", err, time.Since(start))
		}
		if d := begin(t, l, "p", "runaway", "fp"); d.Outcome != idem.InProgress {
			t.Fatalf("just after max lease (renewed 0s ago): %+v", d)
		}
		time.Sleep(31 * time.Second)
		if d := begin(t, l, "p", "runaway", "fp"); d.Outcome != idem.Execute || !d.Reservation.Takeover {
			t.Fatalf("a TTL after max lease: %+v", d)
		}
	})
}

// Heartbeats of many concurrent reservations share D1 calls: the leases'
// tickers fire together, their renewals queue behind one call in flight
// (Coalesce.MaxInFlight 1), which d1local holds until every lease has
// ticked, and travel together.
func TestHeartbeatsAreCoalesced(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const leases = 40
		var (
			calls, renewals, inFlight, maxInFlight atomic.Int64
			first                                  atomic.Bool
		)
		hold := make(chan struct{})
		l, _ := fakeTimeLedger(t, idem.Config{}, func(r d1local.Request) d1local.Fault {
			n := 0
			for _, s := range r.Statements {
				if strings.HasPrefix(s, "UPDATE idempotency_keys SET updated_at") {
					n++
				}
			}
			if n == 0 {
				return d1local.Fault{}
			}
			calls.Add(1)
			renewals.Add(int64(n))
			now := inFlight.Add(1)
			for m := maxInFlight.Load(); now > m && !maxInFlight.CompareAndSwap(m, now); m = maxInFlight.Load() {
			}
			if first.CompareAndSwap(false, true) {
				<-hold
			}
			inFlight.Add(-1)
			return d1local.Fault{}
		}, func(c *d1client.Config) { c.Coalesce.MaxInFlight = 1 })
		release := make(chan struct{})
		var wg sync.WaitGroup
		for i := range leases {
			r := begin(t, l, "p", "hb-"+string(rune('A'+i)), "fp").Reservation
			wg.Go(func() {
				_ = l.Hold(bg, r, func(ctx context.Context) error { <-release; return nil })
			})
		}
		time.Sleep(idem.DefaultTTL / 3) // every ticker fires; the first renewal is held
		synctest.Wait()
		close(hold)
		synctest.Wait()
		close(release)
		wg.Wait()
		if renewals.Load() != leases || calls.Load() >= leases || maxInFlight.Load() != 1 {
			t.Fatalf("%d renewals in %d calls, at most %d in flight at once: want %d renewals sharing calls, never two calls in flight",
				renewals.Load(), calls.Load(), maxInFlight.Load(), leases)
		}
		t.Logf("%d renewals in %d D1 calls", renewals.Load(), calls.Load())
	})
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}
