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
	"time"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/internal/d1test"
)

// manualBeats drives a ledger's heartbeats by hand: every lease's ticker is
// a channel the test sends on, and every renewal is reported.
type manualBeats struct {
	tickers chan chan time.Time // one per heartbeat started
	beats   chan beat           // one per renewal
}

type beat struct {
	r       *idem.Reservation
	renewed bool
	err     error
}

func newManualBeats(l *idem.Ledger) *manualBeats {
	m := &manualBeats{tickers: make(chan chan time.Time, 256), beats: make(chan beat, 256)}
	idem.SetTestHooks(l, func(time.Duration) (<-chan time.Time, func()) {
		c := make(chan time.Time)
		m.tickers <- c
		return c, func() {}
	}, func(r *idem.Reservation, renewed bool, err error) {
		m.beats <- beat{r, renewed, err}
	})
	return m
}

// ticker waits for the next heartbeat to start and returns its ticker.
func (m *manualBeats) ticker(t *testing.T) chan time.Time {
	t.Helper()
	select {
	case c := <-m.tickers:
		return c
	case <-time.After(time.Minute):
		t.Fatal("no heartbeat started")
		return nil
	}
}

// beat ticks c and waits for the renewal it causes.
func (m *manualBeats) beat(t *testing.T, c chan time.Time) beat {
	t.Helper()
	c <- time.Now()
	select {
	case b := <-m.beats:
		return b
	case <-time.After(time.Minute):
		t.Fatal("the tick caused no renewal")
		return beat{}
	}
}

// A slow but live owner is never taken over: each heartbeat renews the
// lease, so retries long after the TTL (by the ledger's clock) still get
// InProgress; the same wait without a heartbeat is a takeover.
func TestHeartbeatKeepsSlowOwner(t *testing.T) {
	d1test.ForEach(t, func(t *testing.T, b *d1test.Backend) {
		clk := newClock()
		l := newLedger(t, b.NewClientSchema(t), idem.Config{Clock: clk.Now, TTL: 30 * time.Second})
		beats := newManualBeats(l)
		r := begin(t, l, "p", "slow", "fp").Reservation
		err := l.Hold(bg, r, func(ctx context.Context) error {
			tick := beats.ticker(t)
			for i := 0; i < 6; i++ { // 6 x 25s: five TTLs
				clk.Advance(25 * time.Second)
				if d := begin(t, l, "p", "slow", "fp"); d.Outcome != idem.InProgress {
					t.Fatalf("beat %d: %v after 25s without an update, want in progress", i, d.Outcome)
				}
				if b := beats.beat(t, tick); !b.renewed || b.err != nil {
					t.Fatalf("beat %d: renewed=%v err=%v", i, b.renewed, b.err)
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
		clk.Advance(31 * time.Second)
		if d := begin(t, l, "p", "dead", "fp"); d.Outcome != idem.Execute || !d.Reservation.Takeover {
			t.Fatalf("no heartbeat: %+v", d)
		}
	})
}

// When a heartbeat finds the reservation gone, the handler's context is
// cancelled with ErrLeaseLost, and a log line says so.
func TestLeaseLostCancelsHandler(t *testing.T) {
	var logs bytes.Buffer
	var mu sync.Mutex
	db := d1test.Local(t).NewClientSchema(t)
	l := newLedger(t, db, idem.Config{Logger: slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, nil))})
	beats := newManualBeats(l)
	r := begin(t, l, "p", "stolen", "fp").Reservation
	err := l.Hold(bg, r, func(ctx context.Context) error {
		tick := beats.ticker(t)
		// An operator releases the key (or a takeover happens) meanwhile.
		if _, err := db.Query(bg, "UPDATE idempotency_keys SET generation = generation + 1 WHERE key = 'stolen'"); err != nil {
			t.Error(err)
		}
		if b := beats.beat(t, tick); b.renewed || b.err != nil {
			t.Errorf("renewal after the release: renewed=%v err=%v", b.renewed, b.err)
		}
		<-ctx.Done()
		return context.Cause(ctx)
	})
	if !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("cause = %v", err)
	}
	mu.Lock()
	out := logs.String()
	mu.Unlock()
	if !strings.Contains(out, "lease lost") || !strings.Contains(out, "generation=1") {
		t.Errorf("log: %s", out)
	}
}

// A panic in fn leaves Hold with the heartbeat stopped and fn's context
// cancelled (no renewal can race the release that follows), and goes on
// to Hold's caller.
func TestHoldStopsOnPanic(t *testing.T) {
	l := newLedger(t, d1test.Local(t).NewClientSchema(t), idem.Config{})
	beats := newManualBeats(l)
	r := begin(t, l, "p", "panics", "fp").Reservation
	var fnCtx context.Context
	func() {
		defer func() {
			if v := recover(); v != "boom" {
				t.Errorf("recovered %v, want the handler's panic", v)
			}
		}()
		_ = l.Hold(bg, r, func(ctx context.Context) error {
			fnCtx = ctx
			if b := beats.beat(t, beats.ticker(t)); !b.renewed {
				t.Errorf("renewal: %+v", b)
			}
			panic("boom")
		})
	}()
	if fnCtx.Err() == nil {
		t.Fatal("fn's context is still live after the panic: the heartbeat was not stopped")
	}
	if cause := context.Cause(fnCtx); cause != context.Canceled {
		t.Errorf("cause = %v, want the plain cancellation of a stopped lease", cause)
	}
	select {
	case b := <-beats.beats:
		t.Errorf("a renewal after the panic: %+v", b)
	default:
	}
}

// A handler that runs past MaxLease is cancelled with ErrMaxLease, and its
// reservation, no longer renewed, can then be taken over.
func TestMaxLeaseBoundsRunawayHandlers(t *testing.T) {
	l := newLedger(t, d1test.Local(t).NewClientSchema(t), idem.Config{TTL: 300 * time.Millisecond, MaxLease: 400 * time.Millisecond})
	newManualBeats(l) // no ticks: nothing renews the lease
	r := begin(t, l, "p", "runaway", "fp").Reservation
	err := l.Hold(bg, r, func(ctx context.Context) error {
		<-ctx.Done()
		return context.Cause(ctx)
	})
	if !errors.Is(err, idem.ErrMaxLease) {
		t.Fatalf("cause = %v", err)
	}
	// MaxLease (400ms) is past the TTL (300ms) since the claim, the row's
	// last update.
	if d := begin(t, l, "p", "runaway", "fp"); d.Outcome != idem.Execute || !d.Reservation.Takeover {
		t.Fatalf("after max lease: %+v", d)
	}
}

// Heartbeats of many concurrent reservations share D1 calls: while one
// renewal call is in flight, the others queue behind it and travel together
// (d1client's group commit). The first call is held at D1 until every lease
// has taken its tick. The client keeps one call in flight at most
// (Coalesce.MaxInFlight 1): by default group commit may start a parallel
// call once the held one is overdue, which depends on the machine's speed.
func TestHeartbeatsAreCoalesced(t *testing.T) {
	const leases = 40
	var (
		calls, renewals, inFlight, maxInFlight atomic.Int64
		first                                  atomic.Bool
	)
	hold := make(chan struct{})
	b := d1test.LocalConfig(t, d1local.Config{Faults: func(r d1local.Request) d1local.Fault {
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
	}})
	l := newLedger(t, b.NewClientSchema(t, func(c *d1client.Config) { c.Coalesce.MaxInFlight = 1 }), idem.Config{})
	beats := newManualBeats(l)
	release := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < leases; i++ {
		r := begin(t, l, "p", "hb-"+string(rune('A'+i)), "fp").Reservation
		wg.Go(func() {
			_ = l.Hold(bg, r, func(ctx context.Context) error { <-release; return nil })
		})
	}
	var tickers []chan time.Time
	for range leases {
		tickers = append(tickers, beats.ticker(t))
	}
	for _, c := range tickers {
		c <- time.Now()
	}
	close(hold)
	for range leases {
		if b := <-beats.beats; !b.renewed || b.err != nil {
			t.Errorf("renewed=%v err=%v", b.renewed, b.err)
		}
	}
	close(release)
	wg.Wait()
	if renewals.Load() != leases || calls.Load() >= leases || maxInFlight.Load() != 1 {
		t.Fatalf("%d renewals in %d calls, at most %d in flight at once: want %d renewals sharing calls, never two calls in flight",
			renewals.Load(), calls.Load(), maxInFlight.Load(), leases)
	}
	t.Logf("%d renewals in %d D1 calls", renewals.Load(), calls.Load())
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
