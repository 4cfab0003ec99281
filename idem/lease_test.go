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

	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/internal/d1test"
)

// A slow but live owner is never taken over: its heartbeats keep renewing
// the lease, so retries long after the TTL still get InProgress.
func TestHeartbeatKeepsSlowOwner(t *testing.T) {
	d1test.ForEach(t, func(t *testing.T, b *d1test.Backend) {
		l := newLedger(t, b.NewClientSchema(t), idem.Config{TTL: 600 * time.Millisecond, Heartbeat: 150 * time.Millisecond})
		r := begin(t, l, "p", "slow", "fp").Reservation
		var takeovers, inProgress atomic.Int64
		err := l.Hold(bg, r, func(ctx context.Context) error {
			deadline := time.Now().Add(1800 * time.Millisecond) // three TTLs
			for time.Now().Before(deadline) {
				switch d := begin(t, l, "p", "slow", "fp"); d.Outcome {
				case idem.Execute:
					takeovers.Add(1)
				case idem.InProgress:
					inProgress.Add(1)
				}
				time.Sleep(100 * time.Millisecond)
			}
			return context.Cause(ctx)
		})
		if err != nil || takeovers.Load() != 0 || inProgress.Load() < 5 {
			t.Fatalf("cause=%v takeovers=%d in_progress=%d", err, takeovers.Load(), inProgress.Load())
		}
		if c := complete(t, l, r, 201, "slow but alive"); !c.Stored {
			t.Fatal("the live owner's completion was fenced out")
		}
	})
}

// When a heartbeat finds the reservation gone, the handler's context is
// cancelled at once with ErrLeaseLost, and a log line says so.
func TestLeaseLostCancelsHandler(t *testing.T) {
	var logs bytes.Buffer
	var mu sync.Mutex
	b := d1test.Local(t)
	db := b.NewClientSchema(t)
	l := newLedger(t, db, idem.Config{TTL: 300 * time.Millisecond, Heartbeat: 50 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, nil))})
	r := begin(t, l, "p", "stolen", "fp").Reservation
	start := time.Now()
	err := l.Hold(bg, r, func(ctx context.Context) error {
		// An operator releases the key (or a takeover happens) meanwhile.
		if _, err := db.Query(bg, "UPDATE idempotency_keys SET generation = generation + 1 WHERE key = 'stolen'"); err != nil {
			t.Error(err)
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(5 * time.Second):
			return errors.New("never cancelled")
		}
	})
	if !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("cause = %v", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("cancelled after %v", took)
	}
	mu.Lock()
	out := logs.String()
	mu.Unlock()
	if !strings.Contains(out, "lease lost") || !strings.Contains(out, "generation=1") {
		t.Errorf("log: %s", out)
	}
}

// A handler that runs past MaxLease is cancelled with ErrMaxLease.
func TestMaxLeaseBoundsRunawayHandlers(t *testing.T) {
	l := newLedger(t, d1test.Local(t).NewClientSchema(t), idem.Config{TTL: 300 * time.Millisecond, Heartbeat: 50 * time.Millisecond, MaxLease: 400 * time.Millisecond})
	r := begin(t, l, "p", "runaway", "fp").Reservation
	err := l.Hold(bg, r, func(ctx context.Context) error {
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(5 * time.Second):
			return errors.New("never cancelled")
		}
	})
	if !errors.Is(err, idem.ErrMaxLease) {
		t.Fatalf("cause = %v", err)
	}
	// Without renewals the reservation then expires and can be taken over.
	time.Sleep(350 * time.Millisecond)
	if d := begin(t, l, "p", "runaway", "fp"); d.Outcome != idem.Execute || !d.Reservation.Takeover {
		t.Fatalf("after max lease: %+v", d)
	}
}

// Heartbeats of many concurrent reservations share D1 calls.
func TestHeartbeatsAreCoalesced(t *testing.T) {
	var renewCalls, renewals atomic.Int64
	b := d1test.LocalConfig(t, d1local.Config{Faults: func(r d1local.Request) d1local.Fault {
		n := 0
		for _, s := range r.Statements {
			if strings.HasPrefix(s, "UPDATE idempotency_keys SET updated_at") {
				n++
			}
		}
		if n > 0 {
			renewCalls.Add(1)
			renewals.Add(int64(n))
		}
		return d1local.Fault{Latency: 5 * time.Millisecond}
	}})
	l := newLedger(t, b.NewClientSchema(t), idem.Config{TTL: 300 * time.Millisecond, Heartbeat: 50 * time.Millisecond})
	var wg sync.WaitGroup
	for i := 0; i < 40; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := begin(t, l, "p", "hb-"+string(rune('A'+i)), "fp").Reservation
			_ = l.Hold(bg, r, func(ctx context.Context) error { time.Sleep(400 * time.Millisecond); return nil })
		}()
	}
	wg.Wait()
	// Each of the 40 leases beats several times in 400 ms (fewer on a busy
	// machine); what matters is that the beats share calls.
	if renewals.Load() < 40 || renewCalls.Load()*4 > renewals.Load() {
		t.Fatalf("%d renewals in %d calls: not coalesced", renewals.Load(), renewCalls.Load())
	}
	t.Logf("%d renewals in %d D1 calls", renewals.Load(), renewCalls.Load())
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
