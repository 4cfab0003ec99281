package idem_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/internal/oteltest"
)

func beginTTL(t *testing.T, l *idem.Ledger, key string, ttl time.Duration) idem.Decision {
	t.Helper()
	d, err := l.Begin(bg, "p", key, "fp", idem.BeginOptions{TTL: ttl})
	if err != nil {
		t.Fatalf("Begin(%s, TTL %v): %v", key, ttl, err)
	}
	return d
}

// A reservation made with BeginOptions.TTL is stale after its own TTL, not
// the ledger's: a retry with the same TTL takes it over then, and an
// in-progress answer waits for the rest of that lease at most.
func TestBeginOptionsTTLTakeover(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, _ := fakeTimeLedger(t, idem.Config{TTL: 30 * time.Second, Heartbeat: -1}, nil)
		first := beginTTL(t, l, "short", 5*time.Second)
		if first.Outcome != idem.Execute {
			t.Fatalf("first: %v", first.Outcome)
		}
		time.Sleep(2 * time.Second)
		d := beginTTL(t, l, "short", 5*time.Second)
		if d.Outcome != idem.InProgress || d.RetryAfter > 3*time.Second+time.Millisecond {
			t.Fatalf("at 2 s: %v, Retry-After %v; want in progress within the rest of a 5 s lease", d.Outcome, d.RetryAfter)
		}
		time.Sleep(3*time.Second + 2*time.Millisecond)
		if d := beginTTL(t, l, "short", 5*time.Second); d.Outcome != idem.Execute || !d.Reservation.Takeover {
			t.Fatalf("after the route's TTL: %+v, want a takeover", d)
		}
		// The ledger's TTL would still call the first owner alive.
		beginTTL(t, l, "long", 0)
		time.Sleep(5*time.Second + 2*time.Millisecond)
		if d := beginTTL(t, l, "long", 0); d.Outcome != idem.InProgress {
			t.Fatalf("ledger TTL: %v, want in progress", d.Outcome)
		}
	})
}

// Heartbeats keep their ratio to the reservation's TTL: with the default
// (TTL/3 of the ledger's 30 s, every 10 s), a 3 s reservation renews every
// second, so a live owner is never taken over by a retry with its TTL; 20
// seconds of it are 20 renewals (or 19).
func TestBeginOptionsTTLScalesHeartbeat(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := oteltest.New()
		l, _ := fakeTimeLedger(t, idem.Config{TTL: 30 * time.Second, MeterProvider: rec.MeterProvider}, nil)
		r := beginTTL(t, l, "hb", 3*time.Second).Reservation
		err := l.Hold(bg, r, func(ctx context.Context) error {
			for i := range 10 {
				time.Sleep(2 * time.Second)
				if d := beginTTL(t, l, "hb", 3*time.Second); d.Outcome != idem.InProgress {
					t.Fatalf("after %v: %v, want in progress", time.Duration(i+1)*2*time.Second, d.Outcome)
				}
			}
			return context.Cause(ctx)
		})
		if err != nil {
			t.Fatalf("cause = %v", err)
		}
		if c := complete(t, l, r, 201, "done"); !c.Stored {
			t.Fatal("the live owner was fenced out")
		}
		// The 20th falls at the instant the handler returns: it may not run.
		if n := rec.Collect(t).Value("d1idem.lease.renewals", attribute.String("d1idem.renewal.result", "renewed")); n < 19 || n > 20 {
			t.Fatalf("%v renewals in 20 s, want 19 or 20 (one a second)", n)
		}
	})
}

// A release by a reservation with its own TTL backdates the row past that
// TTL, so the retry (with the same TTL) takes it over at once.
func TestBeginOptionsTTLRelease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, _ := fakeTimeLedger(t, idem.Config{TTL: 30 * time.Second, Heartbeat: -1}, nil)
		r := beginTTL(t, l, "rel", 2*time.Second).Reservation
		if ok, err := l.Release(bg, r); !ok || err != nil {
			t.Fatalf("Release = %v, %v", ok, err)
		}
		if d := beginTTL(t, l, "rel", 2*time.Second); d.Outcome != idem.Execute || !d.Reservation.Takeover {
			t.Fatalf("retry after release: %+v", d)
		}
	})
}

// A TTL over the ledger's (which the retention and the administrative
// API's stuck keys are reckoned with) or under 10 ms is refused, naming the
// field.
func TestBeginOptionsValidation(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, _ := fakeTimeLedger(t, idem.Config{TTL: 30 * time.Second}, nil)
		for _, ttl := range []time.Duration{31 * time.Second, time.Millisecond, -time.Second} {
			o := idem.BeginOptions{TTL: ttl}
			_, err := l.Begin(bg, "p", "k", "fp", o)
			var ce *idem.ConfigError
			if !errors.As(err, &ce) || ce.Field != "BeginOptions.TTL" || !strings.Contains(err.Error(), "Config.TTL (30s)") {
				t.Errorf("TTL %v: Begin error %v", ttl, err)
			}
			if cerr := l.CheckBeginOptions(o); cerr == nil || cerr.Error() != err.Error() {
				t.Errorf("TTL %v: CheckBeginOptions = %v, Begin %v", ttl, cerr, err)
			}
		}
		for _, ttl := range []time.Duration{0, 10 * time.Millisecond, 30 * time.Second} {
			if err := l.CheckBeginOptions(idem.BeginOptions{TTL: ttl}); err != nil {
				t.Errorf("TTL %v refused: %v", ttl, err)
			}
		}
	})
}
