package idem_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/internal/d1test"
	"github.com/d1idem/d1idem/internal/oteltest"
)

// The secret of the telemetry tests: no metric may show it.
const telPrincipal = "acct_secret_principal_42"

// telEnv is a ledger and its D1 client, both reporting to one in-memory
// SDK, on a d1local reached in process (so that a test may run in fake
// time).
type telEnv struct {
	rec    *oteltest.Recorder
	b      *d1test.Backend
	db     *d1client.Client
	ledger *idem.Ledger
}

func newTelEnv(t *testing.T, cfg idem.Config, faults ...d1local.FaultFunc) *telEnv {
	t.Helper()
	var lc d1local.Config
	if len(faults) > 0 {
		lc.Faults = faults[0]
	}
	return newTelEnvWith(t, cfg, lc)
}

// newTelEnvWith is newTelEnv on a d1local configured by lc, its client's
// configuration adjusted by mods.
func newTelEnvWith(t *testing.T, cfg idem.Config, lc d1local.Config, mods ...func(*d1client.Config)) *telEnv {
	t.Helper()
	rec := oteltest.New()
	b := d1test.InProcess(t, lc)
	db := b.NewClientSchema(t, append([]func(*d1client.Config){func(c *d1client.Config) {
		c.MeterProvider, c.TracerProvider = rec.MeterProvider, rec.TracerProvider
		c.Retry = d1client.NoRetry()
	}}, mods...)...)
	cfg.MeterProvider, cfg.TracerProvider = rec.MeterProvider, rec.TracerProvider
	if cfg.Heartbeat == 0 {
		cfg.Heartbeat = -1
	}
	rec.Spans.Reset() // the schema's
	return &telEnv{rec: rec, b: b, db: db, ledger: newLedger(t, db, cfg)}
}

// shortSHA256 is the principal_sha256 of the logs: 12 hex digits of s's
// SHA-256.
func shortSHA256(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])[:12]
}

// What becomes of reservations is counted: completions stored and fenced
// out, takeovers, renewals, lost leases and releases; and the sweep's
// deletions and Admin.Stats's counts.
func TestTelemetryLedgerWrites(t *testing.T) {
	synctest.Test(t, testTelemetryLedgerWrites)
}

// testTelemetryLedgerWrites runs in fake time: the heartbeats tick by the
// bubble's clock, the ledger's own clock (clk) moves only when the test
// moves it.
func testTelemetryLedgerWrites(t *testing.T) {
	clk := newClock()
	e := newTelEnv(t, idem.Config{Clock: clk.Now, SweepInterval: time.Nanosecond, Heartbeat: time.Second})
	l := e.ledger
	resp := idem.Response{Status: 201, Body: []byte(`{}`)}

	// A takeover fences the first owner out; its heartbeat finds the lease
	// lost.
	first := begin(t, l, telPrincipal, "key-secret-1", "fp").Reservation
	lost := make(chan error, 1)
	go func() {
		lost <- l.Hold(bg, first, func(ctx context.Context) error {
			<-ctx.Done()
			return context.Cause(ctx)
		})
	}()
	time.Sleep(time.Second) // a heartbeat renews the lease
	synctest.Wait()
	clk.Advance(idem.DefaultTTL + time.Millisecond)
	second := begin(t, l, telPrincipal, "key-secret-1", "fp")
	if second.Outcome != idem.Execute || !second.Reservation.Takeover {
		t.Fatalf("takeover: %+v", second)
	}
	time.Sleep(time.Second) // the next finds the lease lost
	if err := <-lost; !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("Hold = %v", err)
	}
	if done, err := l.Complete(bg, first, resp); err != nil || done.Stored {
		t.Fatalf("fenced completion: %+v, %v", done, err)
	}
	if done, err := l.Complete(bg, second.Reservation, resp); err != nil || !done.Stored {
		t.Fatalf("completion: %+v, %v", done, err)
	}
	// A release, and a second one that finds the row gone on.
	r := begin(t, l, telPrincipal, "key-secret-2", "fp").Reservation
	for _, want := range []bool{true, false} {
		if ok, err := l.Release(bg, r); ok != want || err != nil {
			t.Fatalf("Release = %v, %v; want %v", ok, err, want)
		}
	}
	// Rows past the retention: the next completion's sweep deletes them,
	// then Admin.Sweep the rest.
	clk.Advance(idem.DefaultRetention + time.Minute)
	time.Sleep(time.Millisecond) // the sweep interval passes (by the monotonic clock)
	third := begin(t, l, telPrincipal, "key-secret-3", "fp").Reservation
	if _, err := l.Complete(bg, third, resp); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Admin().Sweep(bg); err != nil {
		t.Fatal(err)
	}
	begin(t, l, telPrincipal, "key-secret-4", "fp")
	clk.Advance(time.Hour)
	if _, err := l.Admin().Stats(bg); err != nil {
		t.Fatal(err)
	}

	m := e.rec.Collect(t)
	db := attribute.String("db.namespace", e.db.DatabaseID())
	for _, tc := range []struct {
		metric string
		kv     attribute.KeyValue
		want   float64
	}{
		{"d1idem.takeovers", attribute.KeyValue{}, 1},
		{"d1idem.completions", attribute.String("d1idem.completion.result", "stored"), 2},
		{"d1idem.completions", attribute.String("d1idem.completion.result", "fenced_out"), 1},
		{"d1idem.lease.renewals", attribute.String("d1idem.renewal.result", "renewed"), 1},
		{"d1idem.lease.renewals", attribute.String("d1idem.renewal.result", "not_held"), 1},
		{"d1idem.lease.lost", attribute.String("d1idem.lease.cause", "superseded"), 1},
		{"d1idem.releases", attribute.String("d1idem.release.result", "released"), 1},
		{"d1idem.releases", attribute.String("d1idem.release.result", "not_held"), 1},
		{"d1idem.sweep.deleted", attribute.String("d1idem.sweep.source", "completion"), 2},
		{"d1idem.keys", attribute.String("d1idem.key.status", "pending"), 1},
		{"d1idem.keys", attribute.String("d1idem.key.status", "completed"), 1},
		{"d1idem.keys.stuck", db, 1},
		{"d1idem.sweep.backlog", db, 0},
	} {
		var got float64
		if tc.kv.Key == "" {
			got = m.Value(tc.metric)
		} else {
			got = m.Value(tc.metric, tc.kv)
		}
		if got != tc.want {
			t.Errorf("%s{%s=%s} = %g, want %g", tc.metric, tc.kv.Key, tc.kv.Value.String(), got, tc.want)
		}
	}
	if n := m.Count("d1idem.d1.operation.duration", attribute.String("d1idem.d1.operation", "renew")); n != 2 {
		t.Errorf("renew operations = %d:\n%s", n, m)
	}
	if t.Failed() {
		t.Logf("metrics:\n%s", m)
	}
	e.rec.NoSecrets(t, m, telPrincipal, "key-secret")
}

// A completion that cannot reach D1 in time is counted as failed, its
// retries by their class; one past its write window as expired, unsent.
func TestTelemetryCompletionFailures(t *testing.T) {
	clk := newClock()
	var overloaded atomic.Bool
	e := newTelEnv(t, idem.Config{Clock: clk.Now}, func(d1local.Request) d1local.Fault {
		return d1local.Fault{Overloaded: overloaded.Load()}
	})
	l := e.ledger
	resp := idem.Response{Status: 201, Body: []byte(`{}`)}
	r := begin(t, l, telPrincipal, "key-secret-1", "fp").Reservation
	overloaded.Store(true)
	ctx, cancel := context.WithTimeout(bg, 300*time.Millisecond)
	defer cancel()
	if _, err := l.Complete(ctx, r, resp); err == nil {
		t.Fatal("a completion through overloaded D1 succeeded")
	}
	overloaded.Store(false)
	r2 := begin(t, l, telPrincipal, "key-secret-2", "fp")
	clk.Advance(idem.DefaultRetention)
	if _, err := l.Complete(bg, r2.Reservation, resp); !errors.Is(err, idem.ErrReservationExpired) {
		t.Fatalf("late completion: %v", err)
	}
	m := e.rec.Collect(t)
	for _, res := range []string{"failed", "expired"} {
		if n := m.Value("d1idem.completions", attribute.String("d1idem.completion.result", res)); n != 1 {
			t.Errorf("completions %s = %g:\n%s", res, n, m)
		}
	}
	complete := attribute.String("d1idem.d1.operation", "complete")
	if n := m.Value("d1idem.d1.retries", complete, attribute.String("d1idem.d1.result", "overloaded")); n < 1 {
		t.Errorf("completion retries = %g:\n%s", n, m)
	}
	e.rec.NoSecrets(t, m, telPrincipal, "key-secret")
}

// The replay cache's look-ups are counted by result, with no principal or key.
func TestReplayCacheMetrics(t *testing.T) {
	e := newTelEnv(t, idem.Config{ReplayCache: 1 << 20})
	l := e.ledger
	r := begin(t, l, telPrincipal, "key-secret-1", "fp").Reservation // a miss
	complete(t, l, r, 201, "ok")
	begin(t, l, telPrincipal, "key-secret-1", "fp") // hits
	begin(t, l, telPrincipal, "key-secret-1", "fp")
	begin(t, l, telPrincipal, "key-secret-1", "other") // a miss: another request
	m := e.rec.Collect(t)
	for result, want := range map[string]float64{"hit": 2, "miss": 2} {
		if got := m.Value("d1idem.replay_cache.lookups", attribute.String("d1idem.replay_cache.result", result)); got != want {
			t.Errorf("%s = %g, want %g\n%s", result, got, want, m)
		}
	}
	e.rec.NoSecrets(t, m, telPrincipal, "key-secret")
}
