package idemhttp_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1client/budget"
	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/idem/idemhttp"
	"github.com/d1idem/d1idem/internal/d1test"
	"github.com/d1idem/d1idem/internal/oteltest"
)

// The secrets of the telemetry tests: no metric or span may show them.
const (
	telPrincipal = "acct_secret_principal_42"
	telToken     = "Bearer " + telPrincipal
)

// telEnv is a ledger and its D1 client, both reporting to one in-memory
// SDK, on d1local.
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
	b := d1test.LocalConfig(t, lc)
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

// handler is the middleware with opts around a handler that creates
// something.
func (e *telEnv) handler(t *testing.T, opts idemhttp.Options) http.Handler {
	t.Helper()
	if opts.Principal == nil {
		opts.Principal = bearer
	}
	mw, err := idemhttp.New(e.ledger, opts)
	if err != nil {
		t.Fatal(err)
	}
	return mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"id":"ord_1"}`)
	}))
}

// post sends a POST through h, with the key (none for "") and the body.
func post(h http.Handler, key, body string, mod ...func(*http.Request)) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, "/v1/orders", strings.NewReader(body))
	req.Header.Set("Authorization", telToken)
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set(idemhttp.HeaderKey, key)
	}
	for _, m := range mod {
		m(req)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func shortSHA256(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])[:12]
}

type erroringBody struct{}

func (erroringBody) Read([]byte) (int, error) { return 0, errors.New("connection reset") }

// Each answer of the middleware is counted under its outcome, in a span of
// its own whose attributes say the outcome, the generation of an executed
// request and the principal's short digest; the D1 calls it made are
// spans under it. No metric or span shows a principal, a key or a token.
func TestTelemetryMiddlewareOutcomes(t *testing.T) {
	e := newTelEnv(t, idem.Config{})
	h := e.handler(t, idemhttp.Options{MaxBodyBytes: 64})
	optional := e.handler(t, idemhttp.Options{KeyOptional: true})
	long := e.handler(t, idemhttp.Options{Principal: func(*http.Request) (string, error) {
		return strings.Repeat("p", idem.MaxPrincipalLength+1), nil
	}})
	fp, err := idem.Fingerprint(http.MethodPost, "/v1/orders", http.Header{"Content-Type": {"application/json"}},
		idem.DefaultFingerprintHeaders, strings.NewReader(`{"n":2}`))
	if err != nil {
		t.Fatal(err)
	}
	if d := begin(t, e.ledger, telPrincipal, "key-secret-pending", fp); d.Outcome != idem.Execute {
		t.Fatal(d.Outcome)
	}
	keys := []string{"key-secret-pending"}
	steps := []struct {
		outcome string
		status  int
		send    func() *httptest.ResponseRecorder
	}{
		{"execute", 201, func() *httptest.ResponseRecorder { return post(h, "key-secret-1", `{"n":1}`) }},
		{"replay", 201, func() *httptest.ResponseRecorder { return post(h, "key-secret-1", `{"n":1}`) }},
		{"reused", 409, func() *httptest.ResponseRecorder { return post(h, "key-secret-1", `{"n":9}`) }},
		{"in_progress", 409, func() *httptest.ResponseRecorder { return post(h, "key-secret-pending", `{"n":2}`) }},
		{"key_missing", 400, func() *httptest.ResponseRecorder { return post(h, "", `{}`) }},
		{"key_invalid", 400, func() *httptest.ResponseRecorder {
			return post(h, "key-secret-a", `{}`, func(r *http.Request) { r.Header.Add(idemhttp.HeaderKey, "key-secret-b") })
		}},
		{"unauthenticated", 401, func() *httptest.ResponseRecorder {
			return post(h, "key-secret-2", `{}`, func(r *http.Request) { r.Header.Del("Authorization") })
		}},
		{"principal_invalid", 500, func() *httptest.ResponseRecorder { return post(long, "key-secret-3", `{}`) }},
		{"too_large", 413, func() *httptest.ResponseRecorder { return post(h, "key-secret-4", strings.Repeat("x", 65)) }},
		{"body_unreadable", 400, func() *httptest.ResponseRecorder {
			return post(h, "key-secret-5", "", func(r *http.Request) { r.Body = io.NopCloser(erroringBody{}) })
		}},
		{"unprotected", 201, func() *httptest.ResponseRecorder { return post(optional, "", `{}`) }},
		{"ledger_unavailable", 503, func() *httptest.ResponseRecorder {
			e.b.Local.Inject(d1local.Fault{Internal: true})
			return post(h, "key-secret-6", `{}`)
		}},
		{"budget_shed", 503, func() *httptest.ResponseRecorder { // last: a 971 blocks the account
			e.b.Local.Inject(d1local.Fault{RateLimit: true})
			return post(h, "key-secret-7", `{}`)
		}},
	}
	for _, k := range []string{"1", "a", "b", "2", "3", "4", "5", "6", "7"} {
		keys = append(keys, "key-secret-"+k)
	}
	secrets := append(keys, telPrincipal, telToken, strings.Repeat("p", 64))
	for _, st := range steps {
		e.rec.Spans.Reset()
		if res := st.send(); res.Code != st.status {
			t.Fatalf("%s: status %d, want %d: %s", st.outcome, res.Code, st.status, res.Body)
		}
		checkRequestSpan(t, e.rec, st.outcome)
		e.rec.NoSecrets(t, nil, secrets...)
	}
	m := e.rec.Collect(t)
	for _, st := range steps {
		if n := m.Count("d1idem.request.duration", attribute.String("d1idem.outcome", st.outcome)); n != 1 {
			t.Errorf("d1idem.request.duration{outcome=%s} counts %d, want 1:\n%s", st.outcome, n, m)
		}
	}
	if n := m.Value("d1idem.completions", attribute.String("d1idem.completion.result", "stored")); n != 1 {
		t.Errorf("stored completions = %g", n)
	}
	if n := m.Count("d1idem.d1.call.duration", attribute.String("d1idem.d1.result", "transient")); n != 1 {
		t.Errorf("transient D1 calls = %d:\n%s", n, m)
	}
	if n := m.Count("d1idem.d1.call.duration", attribute.String("d1idem.d1.result", "rate_limited")); n != 1 {
		t.Errorf("rate-limited D1 calls = %d:\n%s", n, m)
	}
	e.rec.NoSecrets(t, m, secrets...)
}

// checkRequestSpan checks the one request span recorded since the last
// reset, and that the D1 calls made for it are its children.
func checkRequestSpan(t *testing.T, rec *oteltest.Recorder, outcome string) {
	t.Helper()
	spans := rec.Ended("d1idem.request")
	if len(spans) != 1 {
		t.Fatalf("%s: %d request spans, want 1", outcome, len(spans))
	}
	s := spans[0]
	if v, _ := oteltest.Attr(s, "d1idem.outcome"); v.AsString() != outcome {
		t.Errorf("span outcome %q, want %q", v.AsString(), outcome)
	}
	v, ok := oteltest.Attr(s, "d1idem.principal.sha256")
	if authenticated := outcome != "unauthenticated" && outcome != "principal_invalid"; ok != authenticated || ok && v.AsString() != shortSHA256(telPrincipal) {
		t.Errorf("%s: principal digest %q (%v)", outcome, v.AsString(), ok)
	}
	gen, ok := oteltest.Attr(s, "d1idem.generation")
	if (outcome == "execute") != ok || ok && gen.AsInt64() != 1 {
		t.Errorf("%s: generation %v (%v)", outcome, gen.AsInt64(), ok)
	}
	failed := outcome == "ledger_unavailable" || outcome == "budget_shed" || outcome == "principal_invalid" || outcome == "record_unreadable"
	if (s.Status().Code == codes.Error) != failed {
		t.Errorf("%s: span status %+v", outcome, s.Status())
	}
	for _, d := range rec.Ended("") {
		if strings.HasPrefix(d.Name(), "d1idem.d1.") && d.Parent().SpanID() != s.SpanContext().SpanID() {
			t.Errorf("%s: D1 span %s is not a child of the request span", outcome, d.Name())
		}
	}
	if outcome == "execute" {
		names := spanNames(rec.Ended(""))
		if !strings.Contains(names, "d1idem.d1.claim") || !strings.Contains(names, "d1idem.d1.complete") {
			t.Errorf("execute: spans %s, want a claim and a completion", names)
		}
		if v, _ := oteltest.Attr(s, "d1idem.completion.result"); v.AsString() != "stored" {
			t.Errorf("completion result %q", v.AsString())
		}
	}
}

func spanNames(spans []sdktrace.ReadOnlySpan) string {
	var names []string
	for _, s := range spans {
		names = append(names, s.Name())
	}
	return strings.Join(names, ",")
}

// The middleware continues the caller's span (the one the application's
// propagator put in the request's context); it reads no header itself.
func TestTelemetryContinuesTheCallersSpan(t *testing.T) {
	e := newTelEnv(t, idem.Config{})
	h := e.handler(t, idemhttp.Options{})
	ctx, parent := e.rec.TracerProvider.Tracer("app").Start(context.Background(), "POST /v1/orders")
	res := post(h, "key-secret-1", `{}`, func(r *http.Request) {
		*r = *r.WithContext(ctx)
		r.Header.Set("Traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	})
	parent.End()
	if res.Code != 201 {
		t.Fatal(res.Code)
	}
	s := e.rec.Ended("d1idem.request")[0]
	if s.Parent().SpanID() != parent.SpanContext().SpanID() || s.SpanContext().TraceID() != parent.SpanContext().TraceID() {
		t.Errorf("the request span's parent is %v, want the caller's span %v", s.Parent(), parent.SpanContext())
	}
}

// Each kind of D1 failure d1local can stage, met by round trip 1, is
// counted in the D1 call metrics under its class and answered as the
// middleware documents.
func TestTelemetryD1FaultsThroughTheMiddleware(t *testing.T) {
	for _, tc := range []struct {
		fault   d1local.Fault
		class   string
		outcome string
	}{
		{d1local.Fault{Overloaded: true}, "overloaded", "ledger_unavailable"},
		{d1local.Fault{Internal: true}, "transient", "ledger_unavailable"},
		{d1local.Fault{BadGateway: true}, "non_json", "ledger_unavailable"},
		{d1local.Fault{LoseResponse: true}, "transport", "ledger_unavailable"},
		{d1local.Fault{RateLimit: true}, "rate_limited", "budget_shed"},
	} {
		t.Run(tc.class, func(t *testing.T) {
			e := newTelEnv(t, idem.Config{})
			h := e.handler(t, idemhttp.Options{})
			e.b.Local.Inject(tc.fault)
			if res := post(h, "key-secret-1", `{}`); res.Code != http.StatusServiceUnavailable {
				t.Fatalf("status %d", res.Code)
			}
			m := e.rec.Collect(t)
			result := attribute.String("d1idem.d1.result", tc.class)
			if n := m.Count("d1idem.d1.call.duration", result); n != 1 {
				t.Errorf("calls{result=%s} = %d:\n%s", tc.class, n, m)
			}
			if n := m.Count("d1idem.d1.operation.duration", result, attribute.String("d1idem.d1.operation", "claim")); n != 1 {
				t.Errorf("claims{result=%s} = %d:\n%s", tc.class, n, m)
			}
			if n := m.Count("d1idem.request.duration", attribute.String("d1idem.outcome", tc.outcome)); n != 1 {
				t.Errorf("requests{outcome=%s} = %d", tc.outcome, n)
			}
			d1 := e.rec.Ended("d1idem.d1.claim")
			if len(d1) != 1 || d1[0].Status().Description != tc.class {
				t.Errorf("claim spans: %d, status %+v", len(d1), d1[0].Status())
			}
			e.rec.NoSecrets(t, m, telPrincipal, telToken, "key-secret-1")
		})
	}
}

// vanishingClaim is a transport that answers the next claim, when told to,
// as D1 would were the row gone between the claim and its lookup (the
// rare Retry outcome): every statement succeeds with no row. Every other
// call goes to the real d1local.
type vanishingClaim struct {
	base http.RoundTripper
	next atomic.Bool
}

func (v *vanishingClaim) RoundTrip(req *http.Request) (*http.Response, error) {
	if !v.next.Load() {
		return v.base.RoundTrip(req)
	}
	body, err := io.ReadAll(req.Body)
	if err != nil {
		return nil, err
	}
	var batch struct {
		Batch []json.RawMessage `json:"batch"`
	}
	if err := json.Unmarshal(body, &batch); err != nil || !strings.Contains(string(body), "INSERT INTO idempotency_keys") || !v.next.CompareAndSwap(true, false) {
		req.Body = io.NopCloser(bytes.NewReader(body))
		return v.base.RoundTrip(req)
	}
	results := strings.Repeat(`{"results":{"columns":[],"rows":[]},"success":true,"meta":{}},`, len(batch.Batch))
	return &http.Response{StatusCode: http.StatusOK, Header: http.Header{"Content-Type": {"application/json"}}, Request: req,
		Body: io.NopCloser(strings.NewReader(`{"result":[` + strings.TrimSuffix(results, ",") + `],"success":true,"errors":[],"messages":[]}`))}, nil
}

// The rarer outcomes: a claim whose row vanished (retry), a stored
// response that cannot be read (record_unreadable), and a claim the local
// API budget cannot carry before its deadline (budget_shed, with the
// client's shed counted).
func TestTelemetryRareOutcomes(t *testing.T) {
	t.Run("retry", func(t *testing.T) {
		vanish := &vanishingClaim{}
		e := newTelEnvWith(t, idem.Config{}, d1local.Config{}, func(c *d1client.Config) {
			vanish.base = c.HTTPClient.Transport
			if vanish.base == nil {
				vanish.base = http.DefaultTransport
			}
			c.HTTPClient = &http.Client{Transport: vanish}
		})
		vanish.next.Store(true)
		if res := post(e.handler(t, idemhttp.Options{}), "key-secret-1", `{}`); res.Code != http.StatusConflict || !strings.Contains(res.Body.String(), idemhttp.CodeKeyRetry) {
			t.Fatalf("status %d: %s", res.Code, res.Body)
		}
		checkRequestSpan(t, e.rec, "retry")
		m := e.rec.Collect(t)
		if n := m.Count("d1idem.request.duration", attribute.String("d1idem.outcome", "retry")); n != 1 {
			t.Errorf("retries = %d:\n%s", n, m)
		}
		e.rec.NoSecrets(t, m, telPrincipal, telToken, "key-secret-1")
	})
	t.Run("record_unreadable", func(t *testing.T) {
		e := newTelEnv(t, idem.Config{})
		h := e.handler(t, idemhttp.Options{})
		if res := post(h, "key-secret-1", `{}`); res.Code != http.StatusCreated {
			t.Fatal(res.Code)
		}
		if _, err := e.db.Exec(context.Background(), []d1client.Statement{{SQL: "UPDATE idempotency_keys SET response_headers = 'garbage'"}}); err != nil {
			t.Fatal(err)
		}
		e.rec.Spans.Reset()
		if res := post(h, "key-secret-1", `{}`); res.Code != http.StatusInternalServerError {
			t.Fatalf("status %d: %s", res.Code, res.Body)
		}
		checkRequestSpan(t, e.rec, "record_unreadable")
		m := e.rec.Collect(t)
		if n := m.Count("d1idem.request.duration", attribute.String("d1idem.outcome", "record_unreadable")); n != 1 {
			t.Errorf("unreadable = %d:\n%s", n, m)
		}
		e.rec.NoSecrets(t, m, telPrincipal, telToken, "key-secret-1")
	})
	t.Run("budget_shed", func(t *testing.T) {
		e := newTelEnvWith(t, idem.Config{}, d1local.Config{}, func(c *d1client.Config) {
			c.Budget = budget.New(2, time.Hour)
		})
		// The schema took the hour's one call for work without priority
		// (the other is kept for completions).
		if res := post(e.handler(t, idemhttp.Options{}), "key-secret-1", `{}`); res.Code != http.StatusServiceUnavailable ||
			!strings.Contains(res.Body.String(), "budget") {
			t.Fatalf("status %d: %s", res.Code, res.Body)
		}
		checkRequestSpan(t, e.rec, "budget_shed")
		m := e.rec.Collect(t)
		if n := m.Count("d1idem.request.duration", attribute.String("d1idem.outcome", "budget_shed")); n != 1 {
			t.Errorf("sheds = %d:\n%s", n, m)
		}
		if n := m.Value("d1idem.d1.budget.sheds", attribute.Bool("d1idem.d1.priority", false)); n != 1 {
			t.Errorf("client sheds = %g:\n%s", n, m)
		}
		if n := m.Count("d1idem.d1.operation.duration", attribute.String("d1idem.d1.operation", "claim"), attribute.String("d1idem.d1.result", "budget")); n != 1 {
			t.Errorf("claims shed = %d:\n%s", n, m)
		}
		if n := m.Count("d1idem.d1.call.duration", attribute.String("d1idem.d1.result", "budget")); n != 0 {
			t.Errorf("a shed claim was counted as a call: %d", n)
		}
		e.rec.NoSecrets(t, m, telPrincipal, telToken, "key-secret-1")
	})
}
