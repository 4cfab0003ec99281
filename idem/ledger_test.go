package idem_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
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

var bg = context.Background()

// clock is an injectable test clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.UnixMilli(1_767_225_600_000)} }

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// newLedger returns a ledger on db; its logs are discarded unless cfg has a
// Logger.
func newLedger(t testing.TB, db d1client.Executor, cfg idem.Config) *idem.Ledger {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	l, err := idem.New(db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func begin(t testing.TB, l *idem.Ledger, principal, key, fp string) idem.Decision {
	t.Helper()
	d, err := l.Begin(bg, principal, key, fp)
	if err != nil {
		t.Fatalf("Begin(%s, %s): %v", principal, key, err)
	}
	return d
}

func complete(t testing.TB, l *idem.Ledger, r *idem.Reservation, status int, body string) idem.Completion {
	t.Helper()
	c, err := l.Complete(bg, r, idem.Response{Status: status, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(body)})
	if err != nil {
		t.Fatalf("Complete: %v", err)
	}
	return c
}

// Every branch of the state machine, on both backends, with D1's clock.
func TestStateMachine(t *testing.T) {
	d1test.ForEach(t, func(t *testing.T, b *d1test.Backend) {
		db := b.NewClientSchema(t)
		l := newLedger(t, db, idem.Config{TTL: 400 * time.Millisecond, Heartbeat: -1})
		freshPendingCompleted(t, l, "k1")
		takeoverAfterTTL(t, l, "k2")
		releaseIsFenced(t, l, "k3")
	})
}

// freshPendingCompleted walks key through the branches of a fresh key
// (its TTL 400ms): Execute, then InProgress and Reused while pending, then
// Replay and Reused once completed, and a second completion fenced.
func freshPendingCompleted(t *testing.T, l *idem.Ledger, key string) {
	t.Helper()
	// A fresh key: Execute, generation 1, not a takeover.
	d := begin(t, l, "acct_1", key, "fpA")
	if d.Outcome != idem.Execute || d.Reservation.Generation != 1 || d.Reservation.Takeover {
		t.Fatalf("fresh: %+v", d)
	}
	r1 := d.Reservation

	// The same request while pending: InProgress, with a Retry-After
	// within the owner's lease (and the millisecond a takeover needs).
	d = begin(t, l, "acct_1", key, "fpA")
	if d.Outcome != idem.InProgress || d.RetryAfter <= 0 || d.RetryAfter > 401*time.Millisecond {
		t.Fatalf("pending: %+v", d)
	}
	// Another request with the same key while pending: Reused.
	if d = begin(t, l, "acct_1", key, "fpB"); d.Outcome != idem.Reused {
		t.Fatalf("pending, other fingerprint: %+v", d)
	}

	// Completion stores; the same request replays.
	if c := complete(t, l, r1, 201, `{"id":1}`); !c.Stored {
		t.Fatal("completion not stored")
	}
	d = begin(t, l, "acct_1", key, "fpA")
	if d.Outcome != idem.Replay || d.Response.Status != 201 || string(d.Response.Body) != `{"id":1}` ||
		d.Response.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("replay: %+v", d)
	}
	// A different request with a completed key: Reused, never replayed.
	if d = begin(t, l, "acct_1", key, "fpB"); d.Outcome != idem.Reused || d.Response != nil {
		t.Fatalf("completed, other fingerprint: %+v", d)
	}
	// Completing twice is fenced (status is no longer pending).
	if c := complete(t, l, r1, 500, "again"); c.Stored {
		t.Fatal("a second completion was stored")
	}
}

// takeoverAfterTTL checks the takeover of key after the TTL (400ms): only
// by the same request; the old owner's completion is fenced out, the new
// owner's is stored.
func takeoverAfterTTL(t *testing.T, l *idem.Ledger, key string) {
	t.Helper()
	old := begin(t, l, "acct_1", key, "fpA").Reservation
	time.Sleep(450 * time.Millisecond)
	if d := begin(t, l, "acct_1", key, "fpB"); d.Outcome != idem.Reused {
		t.Fatalf("stale pending, other fingerprint must not take over: %+v", d)
	}
	d := begin(t, l, "acct_1", key, "fpA")
	if d.Outcome != idem.Execute || !d.Reservation.Takeover || d.Reservation.Generation != 2 {
		t.Fatalf("takeover: %+v", d)
	}
	if c := complete(t, l, old, 200, "old owner"); c.Stored {
		t.Fatal("the superseded owner's completion was stored")
	}
	if c := complete(t, l, d.Reservation, 200, "new owner"); !c.Stored {
		t.Fatal("the new owner's completion was not stored")
	}
	if d = begin(t, l, "acct_1", key, "fpA"); d.Outcome != idem.Replay || string(d.Response.Body) != "new owner" {
		t.Fatalf("after takeover: %+v", d)
	}
}

// releaseIsFenced checks that Release is fenced: it releases only our
// own pending row, which moves one generation on with a stale lease: the
// same request takes it over at once, the generation never repeats, and a
// different request is still refused.
func releaseIsFenced(t *testing.T, l *idem.Ledger, key string) {
	t.Helper()
	r3 := begin(t, l, "acct_1", key, "fpA").Reservation
	stale := *r3
	stale.Generation = 7
	if ok, err := l.Release(bg, &stale); err != nil || ok {
		t.Fatalf("release of another generation: %v %v", ok, err)
	}
	if ok, err := l.Release(bg, r3); err != nil || !ok {
		t.Fatalf("release: %v %v", ok, err)
	}
	if d := begin(t, l, "acct_1", key, "fpB"); d.Outcome != idem.Reused {
		t.Fatalf("after release, another request: %+v", d)
	}
	d := begin(t, l, "acct_1", key, "fpA")
	if d.Outcome != idem.Execute || !d.Reservation.Takeover || d.Reservation.Generation != 3 {
		t.Fatalf("after release: %+v", d)
	}
	if c := complete(t, l, r3, 200, "released owner"); c.Stored {
		t.Fatal("the released owner's completion was stored")
	}
}

func TestBeginRejectsBadInput(t *testing.T) {
	l := newLedger(t, d1test.Local(t).NewClientSchema(t), idem.Config{})
	if _, err := l.Begin(bg, "", "k", "fp"); err != idem.ErrNoPrincipal {
		t.Errorf("empty principal: %v", err)
	}
	if _, err := l.Begin(bg, "p", "bad\nkey", "fp"); err != idem.ErrInvalidKey {
		t.Errorf("invalid key: %v", err)
	}
	if _, err := l.Begin(bg, "p", strings.Repeat("k", 256), "fp"); err != idem.ErrInvalidKey {
		t.Errorf("long key: %v", err)
	}
	if _, err := idem.New(nil, idem.Config{}); err == nil {
		t.Error("nil client accepted")
	}
}

// Every duration and size of Config is validated, and the error names the
// field and the accepted range.
func TestConfigValidation(t *testing.T) {
	db := d1test.Local(t).NewClient(t)
	for _, tc := range []struct {
		cfg   idem.Config
		field string
		want  string
	}{
		{idem.Config{TTL: time.Millisecond}, "Config.TTL", "use 10ms to 24h0m0s"},
		{idem.Config{TTL: -time.Second}, "Config.TTL", "use 10ms to 24h0m0s"},
		{idem.Config{TTL: 25 * time.Hour}, "Config.TTL", "use 10ms to 24h0m0s"},
		{idem.Config{Heartbeat: time.Minute}, "Config.Heartbeat", "up to (not including) the TTL (30s)"},
		{idem.Config{Heartbeat: time.Nanosecond}, "Config.Heartbeat", "use 1ms up to"},
		{idem.Config{MaxLease: -time.Minute}, "Config.MaxLease", "use the TTL (30s) to 168h0m0s"},
		{idem.Config{MaxLease: time.Millisecond}, "Config.MaxLease", "use the TTL (30s) to 168h0m0s"},
		{idem.Config{MaxLease: 8 * 24 * time.Hour}, "Config.MaxLease", "to 168h0m0s"},
		{idem.Config{Retention: time.Second, TTL: 2 * time.Second}, "Config.Retention", "MaxLease (10m0s) + TTL (2s) + 1m0s = 11m2s"},
		{idem.Config{Retention: 10 * time.Minute}, "Config.Retention", "= 11m30s to 87600h0m0s"},
		{idem.Config{Retention: -time.Hour}, "Config.Retention", "= 11m30s"},
		{idem.Config{MaxLease: 24 * time.Hour}, "Config.Retention", "MaxLease (24h0m0s)"},
		{idem.Config{SweepBatch: -1}, "Config.SweepBatch", "use 1 to 1000"},
		{idem.Config{SweepBatch: 1001}, "Config.SweepBatch", "use 1 to 1000"},
		{idem.Config{SweepInterval: -time.Second}, "Config.SweepInterval", "a positive duration up to 24h0m0s"},
		{idem.Config{SweepInterval: 48 * time.Hour}, "Config.SweepInterval", "up to 24h0m0s"},
		{idem.Config{MaxStoredBody: -1}, "Config.MaxStoredBody", "use 1 to 1048576 bytes"},
		{idem.Config{MaxStoredBody: 2 << 20}, "Config.MaxStoredBody", "use 1 to 1048576 bytes"},
		{idem.Config{ReplayableHeaders: []string{"content-type", "Set-Cookie"}}, "Config.ReplayableHeaders[1]", "never be replayed"},
		{idem.Config{FingerprintHeaders: []string{"bad header"}}, "Config.FingerprintHeaders[0]", "use a header name"},
	} {
		_, err := idem.New(db, tc.cfg)
		var ce *idem.ConfigError
		if !errors.As(err, &ce) || ce.Field != tc.field || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%+v: %v, want %s and %q", tc.cfg, err, tc.field, tc.want)
		}
	}
	// The limits themselves are accepted, and a long TTL raises the default
	// lease with it.
	for _, cfg := range []idem.Config{
		{TTL: 10 * time.Millisecond, Heartbeat: -1},
		{TTL: 5 * time.Hour},
		{MaxLease: 30 * time.Second, Retention: 30*time.Second + 30*time.Second + idem.RetentionMargin},
		{SweepBatch: idem.MaxSweepBatch, MaxStoredBody: 1 << 20, SweepInterval: time.Nanosecond},
	} {
		l, err := idem.New(db, cfg)
		if err != nil {
			t.Errorf("%+v refused: %v", cfg, err)
			continue
		}
		if c := l.Config(); c.MaxLease < c.TTL || c.Retention < c.MaxLease+c.TTL+idem.RetentionMargin {
			t.Errorf("%+v: defaults %+v break the retention rule", cfg, c)
		}
	}
}

// Two principals with the same key are two executions and never replay
// each other.
func TestPrincipalIsolation(t *testing.T) {
	d1test.ForEach(t, func(t *testing.T, b *d1test.Backend) {
		l := newLedger(t, b.NewClientSchema(t), idem.Config{Heartbeat: -1})
		a := begin(t, l, "alice", "same-key", "fp")
		bb := begin(t, l, "bob", "same-key", "fp")
		if a.Outcome != idem.Execute || bb.Outcome != idem.Execute {
			t.Fatalf("outcomes %v %v", a.Outcome, bb.Outcome)
		}
		complete(t, l, a.Reservation, 201, "alice's order")
		// Bob's reservation is untouched by Alice's completion.
		if d := begin(t, l, "bob", "same-key", "fp"); d.Outcome != idem.InProgress {
			t.Fatalf("bob after alice completed: %v", d.Outcome)
		}
		complete(t, l, bb.Reservation, 201, "bob's order")
		for who, want := range map[string]string{"alice": "alice's order", "bob": "bob's order"} {
			if d := begin(t, l, who, "same-key", "fp"); d.Outcome != idem.Replay || string(d.Response.Body) != want {
				t.Errorf("%s replays %+v", who, d)
			}
		}
	})
}

// 200 goroutines race on one key: exactly one executes, every other gets a
// replay or in-progress, and exactly one completion is stored.
func TestRaceOnOneKey(t *testing.T) {
	d1test.ForEach(t, func(t *testing.T, b *d1test.Backend) {
		db := b.NewClientSchema(t)
		l := newLedger(t, db, idem.Config{Heartbeat: -1})
		const n = 200
		var executes, replays, inProgress, stored atomic.Int64
		var wg sync.WaitGroup
		start := make(chan struct{})
		errs := make(chan error, n)
		for i := 0; i < n; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				d, err := l.Begin(bg, "acct", "contested", "fp")
				if err != nil {
					errs <- err
					return
				}
				switch d.Outcome {
				case idem.Execute:
					executes.Add(1)
					c, err := l.Complete(bg, d.Reservation, idem.Response{Status: 201, Body: []byte("once")})
					if err != nil {
						errs <- err
					} else if c.Stored {
						stored.Add(1)
					}
				case idem.Replay:
					if string(d.Response.Body) != "once" {
						errs <- fmt.Errorf("replayed %q", d.Response.Body)
					}
					replays.Add(1)
				case idem.InProgress:
					inProgress.Add(1)
				default:
					errs <- fmt.Errorf("outcome %v", d.Outcome)
				}
			}()
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		if executes.Load() != 1 || stored.Load() != 1 || executes.Load()+replays.Load()+inProgress.Load() != n {
			t.Fatalf("executes=%d stored=%d replays=%d in_progress=%d", executes.Load(), stored.Load(), replays.Load(), inProgress.Load())
		}
		var rows int64
		res, err := db.Query(bg, "SELECT count(*), sum(status = 'completed') FROM idempotency_keys")
		if err != nil {
			t.Fatal(err)
		}
		var completed int64
		if err := res.Rows[0].Scan(&rows, &completed); err != nil || rows != 1 || completed != 1 {
			t.Fatalf("rows=%d completed=%d err=%v", rows, completed, err)
		}
	})
}

// The response rules of the spec: the body cap, null-body statuses and the
// response_headers JSON that a Worker writes and reads.
func TestResponseRules(t *testing.T) {
	d1test.ForEach(t, func(t *testing.T, b *d1test.Backend) {
		db := b.NewClientSchema(t)
		l := newLedger(t, db, idem.Config{MaxStoredBody: 10, Heartbeat: -1})

		// Over the cap: stored as null body, status 500, and the caller gets
		// the same.
		r := begin(t, l, "p", "big", "fp").Reservation
		c, err := l.Complete(bg, r, idem.Response{Status: 201, Header: http.Header{"Content-Type": {"text/plain"}, "X-Other": {"x"}}, Body: []byte("01234567890")})
		if err != nil || !c.Stored || c.Response.Status != 500 || c.Response.Body != nil || c.Response.Header.Get("X-Other") != "" {
			t.Fatalf("oversized: %+v %v", c, err)
		}
		d := begin(t, l, "p", "big", "fp")
		if d.Outcome != idem.Replay || d.Response.Status != 500 || len(d.Response.Body) != 0 || d.Response.Header.Get("Content-Type") != "text/plain" {
			t.Fatalf("oversized replay: %+v", d.Response)
		}
		// Exactly at the cap is stored.
		r = begin(t, l, "p", "cap", "fp").Reservation
		complete(t, l, r, 200, "0123456789")
		if d = begin(t, l, "p", "cap", "fp"); string(d.Response.Body) != "0123456789" {
			t.Fatalf("at the cap: %+v", d.Response)
		}
		// Not valid UTF-8: cannot be stored unaltered, so the sentinel.
		r = begin(t, l, "p", "binary", "fp").Reservation
		c, _ = l.Complete(bg, r, idem.Response{Status: 200, Body: []byte{0xff, 0xfe}})
		if c.Response.Status != 500 {
			t.Fatalf("binary body: %+v", c)
		}
		// 204 replays with no body.
		r = begin(t, l, "p", "nocontent", "fp").Reservation
		complete(t, l, r, 204, "")
		if d = begin(t, l, "p", "nocontent", "fp"); d.Response.Status != 204 || d.Response.Body != nil {
			t.Fatalf("204: %+v", d.Response)
		}
		// response_headers is the spec's JSON object, allowlisted headers in
		// allowlist order, Fetch-joined values.
		r = begin(t, l, "p", "headers", "fp").Reservation
		h := http.Header{"Location": {"/v1/orders/1"}, "Content-Type": {"application/json"}, "Set-Cookie": {"s=1"}, "X-Trace": {"t"}}
		h.Add("Content-Type", "charset=utf-8")
		if _, err := l.Complete(bg, r, idem.Response{Status: 201, Header: h, Body: []byte("{}")}); err != nil {
			t.Fatal(err)
		}
		res, err := db.Query(bg, "SELECT response_headers FROM idempotency_keys WHERE key = 'headers'")
		if err != nil {
			t.Fatal(err)
		}
		var js string
		_ = res.Rows[0].Scan(&js)
		if want := `{"content-type":"application/json, charset=utf-8","location":"/v1/orders/1"}`; js != want {
			t.Errorf("response_headers = %s, want %s", js, want)
		}
		// A row written by a Worker (spec's code) replays here, and a
		// set-cookie smuggled into it is never replayed.
		if _, err := db.Query(bg, `INSERT INTO idempotency_keys (principal, key, fingerprint, status, generation, response_status, response_body, response_headers, created_at, updated_at)
VALUES ('p', 'from-worker', 'fp', 'completed', 1, 201, '{"id":7}', '{"content-type":"application/json","location":"/o/7","set-cookie":"a=b"}', 1, 1)`); err != nil {
			t.Fatal(err)
		}
		d = begin(t, l, "p", "from-worker", "fp")
		if d.Outcome != idem.Replay || d.Response.Header.Get("Location") != "/o/7" || d.Response.Header.Get("Set-Cookie") != "" || string(d.Response.Body) != `{"id":7}` {
			t.Fatalf("worker row: %+v", d.Response)
		}
		// A row with unreadable headers fails loudly rather than replaying.
		if _, err := db.Query(bg, `INSERT INTO idempotency_keys (principal, key, fingerprint, status, generation, response_status, response_body, response_headers, created_at, updated_at)
VALUES ('p', 'corrupt', 'fp', 'completed', 1, 200, 'x', 'not json', 1, 1)`); err != nil {
			t.Fatal(err)
		}
		if _, err := l.Begin(bg, "p", "corrupt", "fp"); err == nil || !strings.Contains(err.Error(), "unreadable") {
			t.Fatalf("corrupt row: %v", err)
		}
	})
}

// A completion that fails transiently is retried until it lands; one whose
// answer was lost after the commit is recognised as stored.
func TestCompletionRetries(t *testing.T) {
	b := d1test.Local(t)
	db := b.NewClientSchema(t, func(c *d1client.Config) {
		c.Retry = d1client.RetryPolicy{BaseDelay: time.Millisecond, MaxDelay: 5 * time.Millisecond}
	})
	l := newLedger(t, db, idem.Config{Heartbeat: -1})
	for _, f := range []d1local.Fault{
		{Internal: true},
		{BadGateway: true},
		{Overloaded: true},
		{LoseResponse: true},
		{Internal: true, AfterCommit: true},
	} {
		key := fmt.Sprintf("k-%+v", f)
		r := begin(t, l, "p", key, "fp").Reservation
		// Three failed attempts, then success (or, after commit, a retry that
		// finds the row already completed).
		b.Local.Inject(f, f, f)
		before := b.Local.Calls()
		c, err := l.Complete(bg, r, idem.Response{Status: 201, Body: []byte("ok")})
		if err != nil || !c.Stored {
			t.Errorf("%+v: stored=%v err=%v", f, c.Stored, err)
			continue
		}
		if n := b.Local.Calls() - before; n < 2 {
			t.Errorf("%+v: %d calls: not retried", f, n)
		}
		if d := begin(t, l, "p", key, "fp"); d.Outcome != idem.Replay || string(d.Response.Body) != "ok" {
			t.Errorf("%+v: %+v", f, d)
		}
	}
}

// A fenced-out completion is logged with the principal's digest, a
// truncated key and the generation; never an error.
func TestFencedOutIsLogged(t *testing.T) {
	var logs bytes.Buffer
	clk := newClock()
	db := d1test.Local(t).NewClientSchema(t)
	l := newLedger(t, db, idem.Config{Clock: clk.Now, Heartbeat: -1, Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	old := begin(t, l, "secret-principal", "a-very-long-idempotency-key-0001", "fp").Reservation
	clk.Advance(31 * time.Second)
	if d := begin(t, l, "secret-principal", "a-very-long-idempotency-key-0001", "fp"); d.Outcome != idem.Execute || !d.Reservation.Takeover {
		t.Fatalf("%+v", d)
	}
	c, err := l.Complete(bg, old, idem.Response{Status: 200})
	if err != nil || c.Stored {
		t.Fatalf("stored=%v err=%v", c.Stored, err)
	}
	out := logs.String()
	for _, want := range []string{"fenced out", `"generation":1`, `"key":"a-very-long-idem…"`, `"principal_sha256":"`} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q: %s", want, out)
		}
	}
	if strings.Contains(out, "secret-principal") || strings.Contains(out, "key-0001") {
		t.Errorf("log carries the principal or the full key: %s", out)
	}
}

// Through the ledger directly, a status outside 200-599 is stored as the
// sentinel; a row holding one (written by anything else) is unreadable.
func TestLedgerStatusOutsideReplayableRange(t *testing.T) {
	db := d1test.Local(t).NewClientSchema(t)
	l := newLedger(t, db, idem.Config{Heartbeat: -1})
	for _, status := range []int{1000, 103, 101, 600, 999, -5} {
		key := fmt.Sprint("s", status)
		r := begin(t, l, "p", key, "fp").Reservation
		c, err := l.Complete(bg, r, idem.Response{Status: status, Body: []byte("x")})
		if err != nil || !c.Stored || c.Response.Status != 500 || c.Response.Body != nil {
			t.Errorf("status %d: %+v %v", status, c, err)
		}
		if d := begin(t, l, "p", key, "fp"); d.Outcome != idem.Replay || d.Response.Status != 500 {
			t.Errorf("status %d replay: %+v", status, d)
		}
	}
	if _, err := db.Query(bg, `INSERT INTO idempotency_keys (principal, key, fingerprint, status, generation, response_status, response_body, response_headers, created_at, updated_at)
VALUES ('p', 'foreign', 'fp', 'completed', 1, 1000, 'x', '{}', 1, 1)`); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Begin(bg, "p", "foreign", "fp"); !errors.Is(err, idem.ErrUnreadableRecord) {
		t.Errorf("a row with status 1000: %v", err)
	}
	// response_headers: SQL NULL reads as no headers, as the spec's Worker
	// reads it (?? "{}"); anything but a JSON object of strings is
	// unreadable, as JSON.parse or Headers refuse it there.
	for key, headers := range map[string]any{"null-sql": nil, "empty": "", "null-json": "null", "array": "[]", "number": "1", "nested": `{"a":{"b":"c"}}`} {
		if _, err := db.Query(bg, `INSERT INTO idempotency_keys (principal, key, fingerprint, status, generation, response_status, response_body, response_headers, created_at, updated_at)
VALUES ('p', ?, 'fp', 'completed', 1, 200, 'x', ?, 1, 1)`, key, headers); err != nil {
			t.Fatal(err)
		}
		d, err := l.Begin(bg, "p", key, "fp")
		if unreadable := errors.Is(err, idem.ErrUnreadableRecord); unreadable != (key != "null-sql") || (!unreadable && (d.Outcome != idem.Replay || len(d.Response.Header) != 0)) {
			t.Errorf("response_headers %q: %+v %v", headers, d, err)
		}
	}
}

// A Reservation logs as its principal's digest, its key's first 16
// characters and the key's digest, and its generation: inline under an
// empty key, as a group under any other. Never the principal or the full
// key.
func TestReservationLogValue(t *testing.T) {
	l := newLedger(t, d1test.Local(t).NewClientSchema(t), idem.Config{Heartbeat: -1})
	r := begin(t, l, "secret-principal", "a-very-long-idempotency-key-0001", "fp").Reservation
	var logs bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&logs, nil))
	log.Info("inline", slog.Any("", r), slog.String("reason", "test"))
	log.Info("group", slog.Any("reservation", r))
	log.LogAttrs(bg, slog.LevelInfo, "spliced", append(r.LogValue().Group(), slog.String("reason", "test"))...)
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("log: %s", logs.String())
	}
	want := map[string]any{"principal_sha256": shortSHA256("secret-principal"), "key": "a-very-long-idem…",
		"key_sha256": shortSHA256("a-very-long-idempotency-key-0001"), "generation": float64(1)}
	for i, line := range lines {
		var got map[string]any
		if err := json.Unmarshal([]byte(line), &got); err != nil {
			t.Fatal(err)
		}
		if i == 1 {
			got, _ = got["reservation"].(map[string]any)
		}
		for k, v := range want {
			if got[k] != v {
				t.Errorf("%s: %s = %v, want %v", line, k, got[k], v)
			}
		}
	}
	if out := logs.String(); strings.Contains(out, "secret-principal") || strings.Contains(out, "key-0001") {
		t.Errorf("log carries the principal or the full key: %s", out)
	}
}

// Completion.Sentinel is set when the response stored is the spec's
// sentinel in place of one a replay could not reproduce, and only then: a
// handler's own 500 is stored as it is.
func TestCompletionSentinel(t *testing.T) {
	l := newLedger(t, d1test.Local(t).NewClientSchema(t), idem.Config{Heartbeat: -1, MaxStoredBody: 8})
	h := http.Header{"Content-Type": {"text/plain"}, "X-Other": {"x"}}
	for _, tc := range []struct {
		name     string
		resp     idem.Response
		sentinel bool
	}{
		{"created", idem.Response{Status: 201, Header: h, Body: []byte("ok")}, false},
		{"own 500", idem.Response{Status: 500, Header: h, Body: []byte("failed")}, false},
		{"body over the cap", idem.Response{Status: 201, Header: h, Body: []byte("123456789")}, true},
		{"body not UTF-8", idem.Response{Status: 201, Header: h, Body: []byte{0xff}}, true},
		{"status 799", idem.Response{Status: 799, Header: h, Body: []byte("ok")}, true},
	} {
		r := begin(t, l, "p", tc.name, "fp").Reservation
		c, err := l.Complete(bg, r, tc.resp)
		if err != nil || !c.Stored || c.Sentinel != tc.sentinel {
			t.Errorf("%s: %+v, %v; want Sentinel %v", tc.name, c, err, tc.sentinel)
			continue
		}
		if tc.sentinel && (c.Response.Status != 500 || c.Response.Body != nil || c.Response.Header.Get("X-Other") != "" ||
			c.Response.Header.Get("Content-Type") != "text/plain") {
			t.Errorf("%s: the sentinel is %+v, want 500, no body, the stored headers only", tc.name, c.Response)
		}
	}
}

// Config returns copies of the header lists: a caller changing them does
// not change what the ledger fingerprints and replays.
func TestConfigReturnsACopy(t *testing.T) {
	l := newLedger(t, d1test.Local(t).NewClient(t), idem.Config{})
	c := l.Config()
	c.FingerprintHeaders[0] = "x-changed"
	c.ReplayableHeaders[0] = "set-cookie"
	if c := l.Config(); c.FingerprintHeaders[0] != "content-type" || c.ReplayableHeaders[0] != "content-type" {
		t.Errorf("Config's lists are the ledger's own: %v %v", c.FingerprintHeaders, c.ReplayableHeaders)
	}
	if idem.DefaultFingerprintHeaders[0] != "content-type" || idem.DefaultReplayableHeaders[0] != "content-type" {
		t.Errorf("the defaults changed: %v %v", idem.DefaultFingerprintHeaders, idem.DefaultReplayableHeaders)
	}
}

// Remedy names the fix of the ledger failures an operator can fix, through
// any wrapping, and nothing for the others.
func TestRemedy(t *testing.T) {
	sqlErr := func(msg string) error { return fmt.Errorf("idem: claim: %w: %s", d1client.ErrSQL, msg) }
	for _, tc := range []struct {
		err  error
		want string
	}{
		{sqlErr("no such table: idempotency_keys: SQLITE_ERROR"), "run `d1idem schema apply`"},
		{sqlErr("table idempotency_keys has no column named x"), ""},
		{sqlErr("no such column: generation"), "run `d1idem schema verify`"},
		{fmt.Errorf("wrapped: %w", idem.ErrNoRing), "Admin.InitRing"},
		{fmt.Errorf("wrapped: %w", idem.ErrRingConflict), "conflicting rings"},
		{fmt.Errorf("wrapped: %w", idem.ErrHomeMismatch), "same Home IDs"},
		{fmt.Errorf("wrapped: %w", idem.ErrUnknownHome), "every database of the ring"},
		{fmt.Errorf("wrapped: %w", d1client.ErrAuth), "give it the Account > D1 > Edit permission"},
		{fmt.Errorf("wrapped: %w", d1client.ErrNoDatabase), "check the database ID"},
		{fmt.Errorf("wrapped: %w", idem.ErrSchemaDrift), "run `d1idem schema apply`"},
		{fmt.Errorf("wrapped: %w", d1client.ErrOverloaded), ""},
		{errors.New("anything else"), ""},
		{nil, ""},
	} {
		got := idem.Remedy(tc.err)
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("Remedy(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}

// recordingExecutor is an Executor of its own: it counts the calls it
// passes on to another.
type recordingExecutor struct {
	next  d1client.Executor
	calls atomic.Int64
}

func (e *recordingExecutor) Exec(ctx context.Context, stmts []d1client.Statement, opts ...d1client.ExecOption) ([]d1client.Result, error) {
	e.calls.Add(1)
	return e.next.Exec(ctx, stmts, opts...)
}

// The ledger runs on any d1client.Executor, not only on *d1client.Client:
// here one that wraps a client, on one database and as a home of a sharded
// ledger (whose ID must then be given: such an Executor does not say which
// database it reaches).
func TestLedgerOnAnyExecutor(t *testing.T) {
	db := d1test.Local(t).NewClientSchema(t)
	ex := &recordingExecutor{next: db}
	l := newLedger(t, ex, idem.Config{Heartbeat: -1})
	d := begin(t, l, "p", "k", "fp")
	if c := complete(t, l, d.Reservation, 201, "done"); !c.Stored {
		t.Fatal("not stored")
	}
	if d := begin(t, l, "p", "k", "fp"); d.Outcome != idem.Replay {
		t.Fatalf("replay: %v", d.Outcome)
	}
	if n := ex.calls.Load(); n != 3 {
		t.Errorf("%d calls through the Executor, want 3 (claim, completion, replay)", n)
	}
	if _, err := idem.NewSharded([]idem.Home{{DB: ex}}, idem.Config{}); err == nil || !strings.Contains(err.Error(), "home ID") {
		t.Errorf("a home without an ID on an Executor that names no database: %v", err)
	}
	if _, err := idem.NewSharded([]idem.Home{{ID: "a", DB: ex}}, idem.Config{}); err != nil {
		t.Error(err)
	}
}

// An in-progress answer's Retry-After says when asking again is useful:
// the typical time from claim to stored completion (1 s before any was
// measured) less the owner's age; once the owner is older than that, the
// rest of its lease (its last write plus the TTL, and the millisecond a
// takeover needs), never a short floor that a client would poll at.
func TestInProgressRetryAfterEstimate(t *testing.T) {
	clk := newClock()
	l := newLedger(t, d1test.Local(t).NewClientSchema(t), idem.Config{Clock: clk.Now, TTL: time.Minute, Heartbeat: -1})
	begin(t, l, "p", "a", "fp")
	clk.Advance(400 * time.Millisecond)
	if d := begin(t, l, "p", "a", "fp"); d.Outcome != idem.InProgress || d.RetryAfter != 600*time.Millisecond {
		t.Errorf("before any handler was timed: %v %v, want 1s - 400ms", d.Outcome, d.RetryAfter)
	}
	clk.Advance(2 * time.Second)
	if d := begin(t, l, "p", "a", "fp"); d.RetryAfter != time.Minute-2400*time.Millisecond+time.Millisecond {
		t.Errorf("an owner past the typical time: %v, want the rest of its lease, 57.601s", d.RetryAfter)
	}
	clk.Advance(950 * time.Millisecond)
	if d := begin(t, l, "p", "a", "fp"); d.RetryAfter != time.Minute-3350*time.Millisecond+time.Millisecond {
		t.Errorf("asked again: %v, want the rest of its lease, 56.651s", d.RetryAfter)
	}

	// Handlers measured: the estimate is no longer than the longest.
	var longest time.Duration
	for i := range 5 {
		start := time.Now()
		d := begin(t, l, "p", fmt.Sprint("fast-", i), "fp")
		complete(t, l, d.Reservation, 201, "ok")
		longest = max(longest, time.Since(start))
	}
	begin(t, l, "p", "b", "fp")
	if d := begin(t, l, "p", "b", "fp"); d.RetryAfter > max(longest, 100*time.Millisecond) {
		t.Errorf("after handlers of at most %v: %v", longest, d.RetryAfter)
	}

	// The lease bounds it: with a short TTL, the rest of the lease.
	short := newLedger(t, d1test.Local(t).NewClientSchema(t), idem.Config{Clock: clk.Now, TTL: 500 * time.Millisecond, Heartbeat: -1})
	begin(t, short, "p", "c", "fp")
	clk.Advance(300 * time.Millisecond)
	if d := begin(t, short, "p", "c", "fp"); d.RetryAfter != 201*time.Millisecond {
		t.Errorf("300ms into a 500ms lease: %v, want the 200ms left and 1ms", d.RetryAfter)
	}
}

// A takeover's owner is as old as its own claim, not the row: 200 ms into
// its run, a client is told to wait the typical time less 200 ms, not a
// short floor counted from the first owner's claim (created_at, which a
// takeover leaves alone).
func TestInProgressRetryAfterCountsFromTheTakeover(t *testing.T) {
	clk := newClock()
	l := newLedger(t, d1test.Local(t).NewClientSchema(t), idem.Config{Clock: clk.Now, TTL: 30 * time.Second, Heartbeat: -1})
	begin(t, l, "p", "k", "fp") // the first owner dies
	clk.Advance(31 * time.Second)
	if d := begin(t, l, "p", "k", "fp"); d.Outcome != idem.Execute || d.Reservation.Generation != 2 {
		t.Fatalf("the retry: %v, want a takeover at generation 2", d.Outcome)
	}
	clk.Advance(200 * time.Millisecond)
	d := begin(t, l, "p", "k", "fp")
	if d.Outcome != idem.InProgress || d.RetryAfter != 800*time.Millisecond {
		t.Errorf("200ms into the takeover's run: %v %v, want in progress, 1s - 200ms", d.Outcome, d.RetryAfter)
	}
}

// A client obeying Retry-After while the owner is stuck asks a handful of
// times over the whole lease, not every 100 ms: at the default TTL, the
// first answer and then one per lease end.
func TestInProgressRetryAfterNeverInvitesPolling(t *testing.T) {
	clk := newClock()
	l := newLedger(t, d1test.Local(t).NewClientSchema(t), idem.Config{Clock: clk.Now, Heartbeat: -1})
	begin(t, l, "p", "k", "fp") // an owner that never finishes
	asks := 0
	for {
		asks++
		d := begin(t, l, "p", "k", "fp")
		if d.Outcome == idem.Execute {
			break
		}
		if d.Outcome != idem.InProgress || d.RetryAfter <= 0 {
			t.Fatalf("ask %d: %v %v", asks, d.Outcome, d.RetryAfter)
		}
		clk.Advance(d.RetryAfter)
		if asks > 10 {
			t.Fatalf("still in progress after %d asks", asks)
		}
	}
	if asks > 3 {
		t.Errorf("%d asks before the takeover, want at most 3 over a %v lease", asks, idem.DefaultTTL)
	}
}

// A response stored as the sentinel instead of as given is never silent: the
// completion logs it at ERROR with the key's digest (never the principal)
// and the reason, for each reason.
func TestUnstoredResponseLogged(t *testing.T) {
	var logs bytes.Buffer
	db := d1test.Local(t).NewClientSchema(t)
	l := newLedger(t, db, idem.Config{MaxStoredBody: 10, Heartbeat: -1, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	for _, tc := range []struct {
		key, reason string
		resp        idem.Response
	}{
		{"big-key-0123456789abcdef", `reason="the body of 11 bytes is over Config.MaxStoredBody (10)"`, idem.Response{Status: 201, Body: []byte("01234567890")}},
		{"binary", `reason="the body is not valid UTF-8 (the stored body is text)"`, idem.Response{Status: 200, Body: []byte{0xff}}},
		{"status", `reason="the status 999 cannot be replayed (200-599)"`, idem.Response{Status: 999}},
	} {
		logs.Reset()
		r := begin(t, l, "secret-principal", tc.key, "fp").Reservation
		if c, err := l.Complete(bg, r, tc.resp); err != nil || !c.Sentinel {
			t.Fatalf("%s: %+v %v", tc.key, c, err)
		}
		out := logs.String()
		if !strings.Contains(out, "level=ERROR") || !strings.Contains(out, "response not stored as given") || !strings.Contains(out, tc.reason) ||
			!strings.Contains(out, "key_sha256=") || strings.Contains(out, "secret-principal") {
			t.Errorf("%s: logged\n%s", tc.key, out)
		}
	}
	logs.Reset()
	complete(t, l, begin(t, l, "p", "small", "fp").Reservation, 201, "ok")
	if logs.Len() != 0 {
		t.Errorf("a response stored as given logged:\n%s", logs.String())
	}
}
