package d1client

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/jarcoal/httpmock"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/d1idem/d1idem/d1client/budget"
	"github.com/d1idem/d1idem/internal/oteltest"
)

// secretParam is a parameter value no metric or span may show.
const secretParam = "secret-param-value-8c1f"

// withTelemetry gives a client's Config the recorder's providers.
func withTelemetry(rec *oteltest.Recorder) func(*Config) {
	return func(c *Config) { c.MeterProvider, c.TracerProvider = rec.MeterProvider, rec.TracerProvider }
}

// Each kind of failure, from recorded responses (and, for those no response
// carries, from what the client refuses or cannot send), is counted once
// under its class in the call and operation metrics, and ends its attempt's
// span with that class as the error; nothing shows the token or a
// parameter value.
func TestTelemetryRecordsEachFailureKind(t *testing.T) {
	stmts := []Statement{
		{SQL: "INSERT INTO t(k, v) VALUES (?, ?)", Params: []any{secretParam, 7}},
		{SQL: "SELECT v FROM t WHERE k = ?", Params: []any{secretParam}},
	}
	tests := []struct {
		name      string
		responder httpmock.Responder
		stmts     []Statement
		class     string
		status    int
		sent      bool // an HTTP call was made
	}{
		{"sql_error_syntax", replay(t, "sql_error_syntax"), stmts, "sql", 400, true},
		{"auth_10000", replay(t, "auth_10000"), stmts, "auth", 403, true},
		{"database_7404", replay(t, "database_7404"), stmts, "no_database", 404, true},
		{"rate_limit_971", replay(t, "rate_limit_971"), stmts, "rate_limited", 429, true},
		{"overloaded_429", replay(t, "overloaded_429"), stmts, "overloaded", 429, true},
		{"internal_500", replay(t, "internal_500"), stmts, "transient", 500, true},
		{"html_502", replay(t, "html_502"), stmts, "non_json", 502, true},
		{"success_false_200", replay(t, "success_false_200"), stmts, "envelope", 200, true},
		{"result_count_mismatch", replay(t, "result_count_mismatch"), stmts, "result_count", 200, true},
		// Any other 4xx, in the API's error envelope.
		{"other_4xx", httpmock.NewStringResponder(http.StatusRequestEntityTooLarge,
			`{"result":null,"success":false,"errors":[{"code":7009,"message":"request too large"}],"messages":[]}`), stmts, "rejected", 413, true},
		{"connection refused", dialRefused, stmts, "transport", 0, true},
		{"too many parameters", ok1(t), []Statement{{SQL: "SELECT " + strings.Repeat("?,", MaxParams) + "?", Params: make([]any, MaxParams+1)}}, "invalid", 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rec := oteltest.New()
			c, _ := mockClient(t, tc.responder, withTelemetry(rec), func(c *Config) { c.Retry = NoRetry() })
			_, err := c.Exec(context.Background(), tc.stmts, Operation("test"))
			var e *Error
			if !errors.As(err, &e) || e.kind.class() != tc.class {
				t.Fatalf("err = %v, want class %s", err, tc.class)
			}
			m := rec.Collect(t)
			checkAttempt(t, rec, m, tc.class, tc.status, tc.sent)
			rec.NoSecrets(t, m, testToken, secretParam)
		})
	}
}

// checkAttempt checks the metrics and the one span of an Exec of operation
// "test" that failed once with class (or succeeded, for "ok").
func checkAttempt(t *testing.T, rec *oteltest.Recorder, m oteltest.Metrics, class string, status int, sent bool) {
	t.Helper()
	result := attribute.String("d1idem.d1.result", class)
	db := attribute.String("db.namespace", testDatabase)
	wantCalls := uint64(0)
	if sent {
		wantCalls = 1
	}
	if n := m.Count("d1idem.d1.call.duration", result, db); n != wantCalls {
		t.Errorf("d1idem.d1.call.duration{result=%s} counts %d, want %d:\n%s", class, n, wantCalls, m)
	}
	if n := m.Count("d1idem.d1.call.duration"); n != wantCalls {
		t.Errorf("%d calls in all, want %d", n, wantCalls)
	}
	if n := m.Count("d1idem.d1.operation.duration", result, attribute.String("d1idem.d1.operation", "test")); n != 1 {
		t.Errorf("d1idem.d1.operation.duration{operation=test, result=%s} counts %d, want 1:\n%s", class, n, m)
	}
	spans := rec.Ended("d1idem.d1.test")
	if class == "invalid" && len(spans) == 0 {
		return // refused before any attempt
	}
	if len(spans) != 1 {
		t.Fatalf("%d spans d1idem.d1.test, want 1", len(spans))
	}
	s := spans[0]
	if v, _ := oteltest.Attr(s, "d1idem.d1.result"); v.AsString() != class {
		t.Errorf("span result = %q, want %q", v.AsString(), class)
	}
	if v, _ := oteltest.Attr(s, "d1idem.d1.attempt"); v.AsInt64() != 1 {
		t.Errorf("span attempt = %v", v)
	}
	if _, ok := oteltest.Attr(s, "d1idem.d1.statements"); !ok {
		t.Error("the span has no statement count")
	}
	wantCode := codes.Error
	if class == "ok" {
		wantCode = codes.Unset
	}
	if s.Status().Code != wantCode || (class != "ok" && s.Status().Description != class) {
		t.Errorf("span status = %+v, want %v %q", s.Status(), wantCode, class)
	}
	if v, ok := oteltest.Attr(s, "http.response.status_code"); (status != 0) != ok || ok && v.AsInt64() != int64(status) {
		t.Errorf("span status code = %v (%v), want %d", v.AsInt64(), ok, status)
	}
}

// A success is counted under "ok", with its statements; a retry is
// counted by the failure's class, and each attempt has its span.
func TestTelemetrySuccessAndRetry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) { // the backoff waits fake time
		rec := oteltest.New()
		c, _ := mockClient(t, sequence(replay(t, "overloaded_429"), replay(t, "raw_batch_two_results")), withTelemetry(rec))
		stmts := []Statement{{SQL: "SELECT 1"}, {SQL: "SELECT ?", Params: []any{secretParam}}}
		if _, err := c.Exec(context.Background(), stmts, Operation("read")); err != nil {
			t.Fatal(err)
		}
		m := rec.Collect(t)
		op := attribute.String("d1idem.d1.operation", "read")
		for _, tc := range []struct {
			metric string
			attrs  []attribute.KeyValue
			want   float64
		}{
			{"d1idem.d1.call.duration", []attribute.KeyValue{attribute.String("d1idem.d1.result", "overloaded"), attribute.String("d1idem.d1.call.kind", "batch")}, 1},
			{"d1idem.d1.call.duration", []attribute.KeyValue{attribute.String("d1idem.d1.result", "ok"), attribute.String("d1idem.d1.call.kind", "batch")}, 1},
			{"d1idem.d1.call.statements", []attribute.KeyValue{attribute.String("d1idem.d1.call.kind", "batch")}, 2},
			{"d1idem.d1.operation.duration", []attribute.KeyValue{op, attribute.String("d1idem.d1.result", "ok")}, 1},
		} {
			if n := m.Count(tc.metric, tc.attrs...); float64(n) != tc.want {
				t.Errorf("%s%v counts %d, want %g:\n%s", tc.metric, tc.attrs, n, tc.want, m)
			}
		}
		if sum := m.Match("d1idem.d1.call.statements")[0].Sum; sum != 4 {
			t.Errorf("statements in all = %g, want 4", sum)
		}
		if n := m.Value("d1idem.d1.retries", op, attribute.String("d1idem.d1.result", "overloaded")); n != 1 {
			t.Errorf("retries = %g, want 1:\n%s", n, m)
		}
		spans := rec.Ended("d1idem.d1.read")
		if len(spans) != 2 {
			t.Fatalf("%d spans, want one per attempt", len(spans))
		}
		for i, s := range spans {
			if v, _ := oteltest.Attr(s, "d1idem.d1.attempt"); v.AsInt64() != int64(i+1) {
				t.Errorf("span %d: attempt %d", i, v.AsInt64())
			}
		}
		rec.NoSecrets(t, m, testToken, secretParam)
	})
}

// A coalesced call's span says how many statements the shared call carried,
// and its parent is the caller's span.
func TestTelemetryCoalescedCall(t *testing.T) {
	rec := oteltest.New()
	answer := replay(t, "raw_batch_two_results")
	var sentIn trace.SpanContext // the span in the HTTP request's context
	c, _ := mockClient(t, func(req *http.Request) (*http.Response, error) {
		sentIn = trace.SpanContextFromContext(req.Context())
		return answer(req)
	}, withTelemetry(rec))
	ctx, parent := rec.TracerProvider.Tracer("test").Start(context.Background(), "request")
	if _, err := c.Exec(ctx, []Statement{{SQL: "SELECT 1"}, {SQL: "SELECT 2"}}, Coalesce(), Operation("claim")); err != nil {
		t.Fatal(err)
	}
	parent.End()
	spans := rec.Ended("d1idem.d1.claim")
	if len(spans) != 1 {
		t.Fatalf("%d spans", len(spans))
	}
	s := spans[0]
	if s.Parent().SpanID() != parent.SpanContext().SpanID() {
		t.Error("the D1 span is not a child of the caller's span")
	}
	// A call carrying one caller's statements is sent in its attempt's
	// context: an instrumented HTTP client's span would be the attempt
	// span's child.
	if sentIn.SpanID() != s.SpanContext().SpanID() {
		t.Error("the lone caller's call was not sent in its attempt's context")
	}
	kind, _ := oteltest.Attr(s, "d1idem.d1.call.kind")
	shared, _ := oteltest.Attr(s, "d1idem.d1.call.statements")
	if kind.AsString() != "coalesced" || shared.AsInt64() != 2 {
		t.Errorf("kind %q, call statements %d", kind.AsString(), shared.AsInt64())
	}
	m := rec.Collect(t)
	if n := m.Count("d1idem.d1.call.duration", attribute.String("d1idem.d1.call.kind", "coalesced")); n != 1 {
		t.Errorf("coalesced calls = %d:\n%s", n, m)
	}
}

// The budget gauges show what the last response's Ratelimit headers said,
// for the client's account.
func TestTelemetryBudgetGauges(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := oteltest.New()
		withHeaders := func(req *http.Request) (*http.Response, error) {
			res, err := ok1(t)(req)
			if err == nil {
				res.Header = rateHeaders(1100, 120, 1200, 300)
			}
			return res, err
		}
		c, _ := mockClient(t, withHeaders, withTelemetry(rec))
		acct := attribute.String("cloud.account.id", testAccount)
		m := rec.Collect(t)
		if len(m.Match("d1idem.d1.budget.remaining")) != 0 || len(m.Match("d1idem.d1.budget.limit")) != 0 {
			t.Errorf("budget gauges before any header (unlimited local budget):\n%s", m)
		}
		if _, err := c.Exec(context.Background(), readStmt); err != nil {
			t.Fatal(err)
		}
		m = rec.Collect(t)
		if v := m.Value("d1idem.d1.budget.remaining", acct); v != 1100 {
			t.Errorf("remaining = %g:\n%s", v, m)
		}
		if v := m.Value("d1idem.d1.budget.limit", acct); v != 1200 {
			t.Errorf("limit = %g", v)
		}
		if v := m.Value("d1idem.d1.budget.reset", acct); v != 120 {
			t.Errorf("reset = %g s, want 120", v)
		}
		time.Sleep(20 * time.Second)
		if v := rec.Collect(t).Value("d1idem.d1.budget.reset", acct); v != 100 {
			t.Errorf("20 s later, reset = %g s, want 100", v)
		}
		runtime.KeepAlive(c)
	})
}

// A call that waits for the budget is counted with its wait, and one whose
// deadline comes first is shed.
func TestTelemetryBudgetWaitAndShed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := oteltest.New()
		acct := newTestAccount(t, budget.New(2, time.Second))
		c, _ := mockClient(t, ok1(t), withTelemetry(rec), func(c *Config) { c.Budget, c.Account = budget.Budget{}, acct })
		for range 2 { // the window's two calls
			if _, err := c.Exec(context.Background(), readStmt, Priority()); err != nil {
				t.Fatal(err)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		if _, err := c.Exec(ctx, readStmt); !errors.Is(err, ErrBudget) {
			t.Fatalf("err = %v", err)
		}
		start := time.Now()
		if _, err := c.Exec(context.Background(), readStmt, Priority()); err != nil {
			t.Fatal(err)
		}
		window := time.Second + time.Second/300 // the ring's window, with its margin of a 300th
		if waited := time.Since(start); waited != window {
			t.Fatalf("the call waited %v, want %v", waited, window)
		}
		m := rec.Collect(t)
		if n := m.Value("d1idem.d1.budget.sheds", attribute.Bool("d1idem.d1.priority", false)); n != 1 {
			t.Errorf("sheds = %g:\n%s", n, m)
		}
		waits := m.Match("d1idem.d1.budget.wait.duration", attribute.Bool("d1idem.d1.priority", true))
		if len(waits) != 1 || waits[0].Count != 1 || waits[0].Sum != window.Seconds() {
			t.Errorf("waits:\n%s", waits)
		}
		if n := m.Count("d1idem.d1.operation.duration", attribute.String("d1idem.d1.result", "budget")); n != 1 {
			t.Errorf("budget results = %d", n)
		}
	})
}

// The budget gauges' callback is unregistered once its client is gone, so
// that short-lived clients do not pile up in a provider.
func TestTelemetryUnregistersWithTheClient(t *testing.T) {
	rec := oteltest.New()
	mp := &unregistrations{MeterProvider: rec.MeterProvider, done: make(chan struct{}, 1)}
	func() {
		c, _ := mockClient(t, ok1(t), func(c *Config) {
			c.MeterProvider, c.TracerProvider = mp, rec.TracerProvider
			c.Budget = budget.New(10, time.Second)
		})
		if v := rec.Collect(t).Value("d1idem.d1.budget.limit"); v != 10 {
			t.Fatalf("limit = %g", v)
		}
		runtime.KeepAlive(c)
	}()
	runtime.GC() // finds the client unreachable and queues its cleanup
	select {
	case <-mp.done:
	case <-time.After(time.Minute):
		t.Fatal("the callback of a client that is gone was not unregistered")
	}
	if len(rec.Collect(t).Match("d1idem.d1.budget.limit")) != 0 {
		t.Fatal("the callback of a client that is gone still observes")
	}
}

// unregistrations is a MeterProvider that signals done when a callback
// registered with one of its meters is unregistered.
type unregistrations struct {
	metric.MeterProvider
	done chan struct{}
}

func (p *unregistrations) Meter(name string, opts ...metric.MeterOption) metric.Meter {
	return unregistrationsMeter{p.MeterProvider.Meter(name, opts...), p.done}
}

type unregistrationsMeter struct {
	metric.Meter
	done chan struct{}
}

func (m unregistrationsMeter) RegisterCallback(f metric.Callback, instruments ...metric.Observable) (metric.Registration, error) {
	r, err := m.Meter.RegisterCallback(f, instruments...)
	if err != nil {
		return r, err
	}
	return unregistration{r, m.done}, nil
}

type unregistration struct {
	metric.Registration
	done chan struct{}
}

func (r unregistration) Unregister() error {
	err := r.Registration.Unregister()
	select {
	case r.done <- struct{}{}:
	default:
	}
	return err
}

// okEach answers a call with one empty result per statement it carries.
func okEach(req *http.Request) (*http.Response, error) {
	var body struct {
		Batch []json.RawMessage `json:"batch"`
	}
	if err := json.NewDecoder(req.Body).Decode(&body); err != nil {
		return nil, err
	}
	return httpmock.NewStringResponse(200, okResults(max(1, len(body.Batch)))), nil
}

// Concurrent callers record into the same instruments without races.
func TestTelemetryConcurrentCallers(t *testing.T) {
	rec := oteltest.New()
	c, _ := mockClient(t, okEach, withTelemetry(rec))
	var wg sync.WaitGroup
	for i := range 32 {
		wg.Go(func() {
			op := []string{"claim", "complete", "renew"}[i%3]
			if _, err := c.Exec(context.Background(), readStmt, Operation(op), Coalesce()); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if n := rec.Collect(t).Count("d1idem.d1.operation.duration", attribute.String("d1idem.d1.result", "ok")); n != 32 {
		t.Errorf("%d operations recorded, want 32", n)
	}
}
