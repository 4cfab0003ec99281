package idemhttp_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/idem/idemhttp"
	"github.com/d1idem/d1idem/idemclient"
	"github.com/d1idem/d1idem/internal/d1test"
)

// Options.Key takes the key from elsewhere than the Idempotency-Key header:
// another header, or the body (which the handler still reads whole). ""
// is a missing key, an error an invalid one, and the key must pass
// idem.ValidKey.
func TestOptionKey(t *testing.T) {
	fromBody := func(r *http.Request) (string, error) {
		var v struct {
			Key string `json:"request_id"`
		}
		b, _ := io.ReadAll(r.Body)
		if len(b) == 0 {
			return "", nil
		}
		if err := json.Unmarshal(b, &v); err != nil {
			return "", err
		}
		return v.Key, nil
	}
	s := newStack(t, stackOpts{opts: idemhttp.Options{Key: fromBody}})
	first := s.do("POST", "/x", "", "tok", `{"request_id":"r-1","n":1}`)
	if first.status != 201 || !strings.Contains(first.body, `request_id`) {
		t.Fatalf("first: %+v (the handler must read the whole body)", first)
	}
	// The Idempotency-Key header plays no part.
	if again := s.do("POST", "/x", "ignored", "tok", `{"request_id":"r-1","n":1}`); again.status != 201 || again.header.Get(idemhttp.HeaderReplayed) != "true" || again.body != first.body {
		t.Fatalf("replay: %+v", again)
	}
	if s.runs.Load() != 1 {
		t.Fatalf("runs = %d", s.runs.Load())
	}
	for _, tc := range []struct{ body, code string }{
		{``, idemhttp.CodeKeyRequired},
		{`{"n":1}`, idemhttp.CodeKeyRequired},
		{`not json`, idemhttp.CodeKeyInvalid},
		{`{"request_id":"bad\u0001key"}`, idemhttp.CodeKeyInvalid},
	} {
		if r := s.do("POST", "/x", "k", "tok", tc.body); r.status != 400 || r.errorCode(t) != tc.code {
			t.Errorf("body %q: %+v, want 400 %s", tc.body, r, tc.code)
		}
	}
	// Another header, and the body cap still holds before Key runs.
	h := newStack(t, stackOpts{opts: idemhttp.Options{MaxBodyBytes: 8, Key: func(r *http.Request) (string, error) { return r.Header.Get("X-Request-Id"), nil }}})
	if r := h.do("POST", "/x", "", "tok", "{}", "X-Request-Id", "req-7"); r.status != 201 {
		t.Fatalf("X-Request-Id: %+v", r)
	}
	if r := h.do("POST", "/x", "", "tok", "{}", "X-Request-Id", "req-7"); r.header.Get(idemhttp.HeaderReplayed) != "true" {
		t.Fatalf("X-Request-Id replay: %+v", r)
	}
	if r := h.do("POST", "/x", "", "tok", "0123456789", "X-Request-Id", "req-8"); r.status != 413 {
		t.Fatalf("oversize: %+v", r)
	}
}

// Options.Fingerprint with CanonicalJSON: a retry whose JSON differs only in
// white space, member order or an ignored field replays; a different
// content is a reuse. Its fingerprints are never the spec's: the same key
// on a route with the spec's fingerprint (as a Worker computes it) is
// reused, even for the same bytes.
func TestOptionFingerprintCanonicalJSON(t *testing.T) {
	b := d1test.Local(t)
	l := newLedger(t, b.NewClientSchema(t), idem.Config{Heartbeat: -1})
	var runs sync.Map
	handler := func(name string) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n, _ := runs.LoadOrStore(name, new(int))
			*n.(*int)++
			w.WriteHeader(201)
			fmt.Fprintf(w, "%s %d", name, *n.(*int))
		})
	}
	canon := idemhttp.Must(l, idemhttp.Options{Principal: bearer, Fingerprint: idemhttp.CanonicalJSON("timestamp", "/auth/token")})
	spec := idemhttp.Must(l, idemhttp.Options{Principal: bearer})
	mux := http.NewServeMux()
	mux.Handle("/canon", canon(handler("canon")))
	mux.Handle("/spec", spec(handler("spec")))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	s := &stack{t: t, srv: srv}

	first := s.do("POST", "/canon", "k1", "tok", `{"sku":"tea","qty":2,"timestamp":1,"auth":{"token":"a","user":"u"}}`)
	if first.status != 201 {
		t.Fatalf("first: %+v", first)
	}
	retry := s.do("POST", "/canon", "k1", "tok", "{ \"auth\": {\"user\":\"u\", \"token\":\"rotated\"},\n \"timestamp\": 2, \"qty\": 2, \"sku\": \"tea\" }")
	if retry.header.Get(idemhttp.HeaderReplayed) != "true" || retry.body != first.body {
		t.Fatalf("retry with an ignored field changed: %+v", retry)
	}
	for _, other := range []string{
		`{"sku":"tea","qty":2.0,"timestamp":1,"auth":{"token":"a","user":"u"}}`, // numbers as written
		`{"sku":"tea","qty":2,"timestamp":1,"auth":{"token":"a","user":"v"}}`,
		`{"sku":"tea","qty":2}`,
	} {
		if r := s.do("POST", "/canon", "k1", "tok", other); r.status != 409 || r.errorCode(t) != idemhttp.CodeKeyReused {
			t.Errorf("%s: %+v, want reused", other, r)
		}
	}
	// Invalid JSON is fingerprinted raw: the same bytes replay, others differ.
	if r := s.do("POST", "/canon", "k2", "tok", `{"sku":`); r.status != 201 {
		t.Fatalf("invalid JSON: %+v", r)
	}
	if r := s.do("POST", "/canon", "k2", "tok", `{"sku":`); r.header.Get(idemhttp.HeaderReplayed) != "true" {
		t.Fatalf("invalid JSON retried: %+v", r)
	}
	// A custom fingerprint never equals the spec's, even for the same bytes
	// of the same path: the key cannot be shared with a spec route.
	canonical := `{"a":1}`
	mux2 := http.NewServeMux()
	mux2.Handle("/same", canon(handler("canon-same")))
	srv2 := httptest.NewServer(mux2)
	t.Cleanup(srv2.Close)
	if r := (&stack{t: t, srv: srv2}).do("POST", "/same", "k3", "tok", canonical); r.status != 201 {
		t.Fatalf("canonical: %+v", r)
	}
	mux3 := http.NewServeMux()
	mux3.Handle("/same", spec(handler("spec-same")))
	srv3 := httptest.NewServer(mux3)
	t.Cleanup(srv3.Close)
	if r := (&stack{t: t, srv: srv3}).do("POST", "/same", "k3", "tok", canonical); r.status != 409 || r.errorCode(t) != idemhttp.CodeKeyReused {
		t.Fatalf("a spec fingerprint matched a custom one: %+v", r)
	}
}

func TestCanonicalJSON(t *testing.T) {
	fp := idemhttp.CanonicalJSON("ts", "/a/0/x", "/we~1ird~0")
	for _, tc := range []struct{ in, want string }{
		{`{"b":1,"a":[{"x":1,"y":2},{"x":3}],"ts":9}`, `{"a":[{"y":2},{"x":3}],"b":1}`},
		{` {"z" : "<&>\u00e9", "y": [true, false, null, -1.50e+3]} `, `{"y":[true,false,null,-1.50e+3],"z":"<&>é"}`},
		{`{"we/ird~":1,"k":{"ts":1}}`, `{"k":{"ts":1}}`},
		{`"text"`, `"text"`},
		{`12345678901234567890123`, `12345678901234567890123`},
		// Not one JSON value: the raw bytes.
		{`{"a":1}{}`, `{"a":1}{}`},
		{`{"a":1,"a":2}`, `{"a":1,"a":2}`},
		{`{"ts":1,"ts":2}`, `{"ts":1,"ts":2}`},
		{`{"a":`, `{"a":`},
		{``, ``},
		{strings.Repeat("[", 300) + strings.Repeat("]", 300), strings.Repeat("[", 300) + strings.Repeat("]", 300)},
	} {
		if got := string(fp(nil, []byte(tc.in))); got != tc.want {
			t.Errorf("CanonicalJSON(%s) = %s, want %s", tc.in, got, tc.want)
		}
	}
}

// Options.Store decides which responses are stored. A refused one (here a
// 5xx) is sent as written, whole even past MaxStoredBody, and its key
// released: the retry executes again, and its stored answer replays.
func TestOptionStore(t *testing.T) {
	var attempt int
	big := strings.Repeat("x", 40_000)
	s := newStack(t, stackOpts{opts: idemhttp.Options{Store: func(status int) bool { return status < 500 }},
		handler: func(w http.ResponseWriter, r *http.Request) {
			attempt++
			if attempt == 1 {
				w.Header().Set("X-Why", "upstream down")
				w.WriteHeader(503)
				io.WriteString(w, big)
				return
			}
			w.WriteHeader(201)
			io.WriteString(w, "made")
		}})
	first := s.do("POST", "/x", "k", "tok", "{}")
	if first.status != 503 || first.body != big || first.header.Get("X-Why") != "upstream down" {
		t.Fatalf("first: %d, %d bytes, %v", first.status, len(first.body), first.header)
	}
	if r := s.do("POST", "/x", "k", "tok", "{}"); r.status != 201 || r.header.Get(idemhttp.HeaderReplayed) != "" {
		t.Fatalf("retry did not execute: %+v", r)
	}
	if r := s.do("POST", "/x", "k", "tok", "{}"); r.status != 201 || r.header.Get(idemhttp.HeaderReplayed) != "true" {
		t.Fatalf("replay: %+v", r)
	}
	if s.runs.Load() != 2 {
		t.Fatalf("runs = %d", s.runs.Load())
	}
	// A handler that writes nothing sends 200, which Store judges too.
	n := newStack(t, stackOpts{opts: idemhttp.Options{Store: func(status int) bool { return status != 200 }},
		handler: func(w http.ResponseWriter, r *http.Request) {}})
	for range 2 {
		if r := n.do("POST", "/x", "k", "tok", "{}"); r.status != 200 || r.header.Get(idemhttp.HeaderReplayed) != "" {
			t.Fatalf("empty 200: %+v", r)
		}
	}
	if n.runs.Load() != 2 {
		t.Fatalf("empty 200 stored: runs = %d", n.runs.Load())
	}
}

// With Tx statements queued, a response Store refuses commits none of them:
// a failure (5xx, 4xx) goes out as written, and a success, which would tell
// the client of writes that did not happen, is answered 500
// idempotency_mutation_not_committed. The key is released either way, and
// the retry commits once.
func TestOptionStoreTx(t *testing.T) {
	var attempt int
	status := []int{503, 200, 201}
	s := newStack(t, stackOpts{opts: idemhttp.Options{Store: func(s int) bool { return s == 201 }},
		handler: func(w http.ResponseWriter, r *http.Request) {
			tx := idemhttp.MustTx(r.Context())
			if err := tx.Add(insertOrder("k", fmt.Sprint(attempt))); err != nil {
				t.Error(err)
			}
			w.WriteHeader(status[attempt])
			fmt.Fprintf(w, "attempt %d", attempt)
			attempt++
			if attempt < 3 { // a status Store refused closes the Tx
				if err := tx.Add(insertOrder("k", "late")); !errors.Is(err, idemhttp.ErrTxClosed) {
					t.Errorf("Add after a refused status: %v", err)
				}
			}
		}})
	businessTable(t, s.db)
	if r := s.do("POST", "/x", "k", "tok", "{}"); r.status != 503 || r.body != "attempt 0" {
		t.Fatalf("503: %+v", r)
	}
	if r := s.do("POST", "/x", "k", "tok", "{}"); r.status != 500 || r.errorCode(t) != idemhttp.CodeMutationAbandoned {
		t.Fatalf("refused 200 with statements: %+v", r)
	}
	if got := orders(t, s.db, "k"); len(got) != 0 {
		t.Fatalf("refused responses committed %v", got)
	}
	if r := s.do("POST", "/x", "k", "tok", "{}"); r.status != 201 || r.body != "attempt 2" {
		t.Fatalf("stored: %+v", r)
	}
	if r := s.do("POST", "/x", "k", "tok", "{}"); r.header.Get(idemhttp.HeaderReplayed) != "true" || r.body != "attempt 2" {
		t.Fatalf("replay: %+v", r)
	}
	if got := orders(t, s.db, "k"); strings.Join(got, ",") != "2" {
		t.Fatalf("orders = %v, want the stored attempt's alone", got)
	}
}

// Options per route: two middlewares on one ledger, each with its own TTL,
// methods and reuse status.
func TestOptionsPerRoute(t *testing.T) {
	clk := &testClock{t: time.UnixMilli(1_767_225_600_000)}
	db := d1test.Local(t).NewClientSchema(t)
	l := newLedger(t, db, idem.Config{TTL: 30 * time.Second, Heartbeat: -1, Clock: clk.Now})
	if _, err := idemhttp.New(l, idemhttp.Options{Principal: bearer, TTL: time.Minute}); err == nil || !strings.Contains(err.Error(), "Options.TTL 1m0s is out of range: 10ms up to the ledger's Config.TTL (30s)") {
		t.Fatalf("TTL over the ledger's: %v", err)
	}
	block := make(chan struct{})
	slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Block") != "" {
			<-block
		}
		w.WriteHeader(201)
	})
	fast := idemhttp.Must(l, idemhttp.Options{Principal: bearer, TTL: 2 * time.Second, ReuseStatus: 422, Methods: []string{"POST"}})
	std := idemhttp.Must(l, idemhttp.Options{Principal: bearer})
	mux := http.NewServeMux()
	mux.Handle("/fast", fast(slow))
	mux.Handle("/std", std(slow))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	s := &stack{t: t, srv: srv}

	var wg sync.WaitGroup
	defer wg.Wait()
	defer close(block)
	for _, path := range []string{"/fast", "/std"} {
		wg.Go(func() { s.do("POST", path, "k"+path, "tok", "{}", "X-Block", "1") })
	}
	waitFor(t, func() bool {
		res, err := db.Query(bg, "SELECT count(*) FROM idempotency_keys")
		if err != nil {
			t.Fatal(err)
		}
		n, _ := res.Rows[0][0].Int64()
		return n == 2
	})
	// Both owners hang: past the route's TTL, not the ledger's.
	clk.Advance(3 * time.Second)
	if r := s.do("POST", "/fast", "k/fast", "tok", "{}"); r.status != 201 {
		t.Fatalf("fast route after its TTL: %+v, want a takeover", r)
	}
	if r := s.do("POST", "/std", "k/std", "tok", "{}"); r.status != 409 || r.errorCode(t) != idemhttp.CodeKeyInProgress {
		t.Fatalf("other route within the ledger's TTL: %+v, want in progress", r)
	}
	if r := s.do("POST", "/fast", "k/fast", "tok", `{"other":1}`); r.status != 422 || r.errorCode(t) != idemhttp.CodeKeyReused {
		t.Fatalf("fast route reuse: %+v", r)
	}
	if r := s.do("POST", "/std", "k/std", "tok", `{"other":1}`); r.status != 409 || r.errorCode(t) != idemhttp.CodeKeyReused {
		t.Fatalf("other route reuse: %+v", r)
	}
	if r := s.do("PUT", "/fast", "", "tok", "{}"); r.status != 201 {
		t.Fatalf("PUT is not guarded on the fast route: %+v", r)
	}
	if r := s.do("PUT", "/std", "", "tok", "{}"); r.status != 400 {
		t.Fatalf("PUT is guarded on the other: %+v", r)
	}
}

// waitFor polls cond until it holds (what the test waits for is observable
// only by asking).
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for !cond() {
		time.Sleep(5 * time.Millisecond)
	}
}

type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *testClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *testClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// OnReplay changes a replay's headers; OnDecision sees each guarded request
// once, after its answer, with digests of the principal and key only.
func TestOptionHooks(t *testing.T) {
	var mu sync.Mutex
	var events []idemhttp.Event
	s := newStack(t, stackOpts{opts: idemhttp.Options{
		OnReplay: func(r *http.Request, h http.Header) { h.Set("Cache-Control", "no-store"); h.Set("X-Path", r.URL.Path) },
		OnDecision: func(ctx context.Context, e idemhttp.Event) {
			mu.Lock()
			defer mu.Unlock()
			events = append(events, e)
		},
	}})
	first := s.do("POST", "/x", "secret-key-1", "tok_secret", "{}")
	replay := s.do("POST", "/x", "secret-key-1", "tok_secret", "{}")
	s.do("POST", "/x", "secret-key-1", "tok_secret", `{"n":2}`)
	s.do("POST", "/x", "", "tok_secret", "{}")
	s.do("GET", "/x", "", "", "")
	if first.header.Get("Cache-Control") != "" || replay.header.Get("Cache-Control") != "no-store" || replay.header.Get("X-Path") != "/x" {
		t.Fatalf("OnReplay: first %v, replay %v", first.header, replay.header)
	}
	mu.Lock()
	defer mu.Unlock()
	want := []struct {
		outcome    string
		status     int
		completion string
		keyed      bool
	}{{"execute", 201, "stored", true}, {"replay", 201, "", true}, {"reused", 409, "", true}, {"key_missing", 400, "", false}}
	if len(events) != len(want) {
		t.Fatalf("events = %+v", events)
	}
	keyHash := events[0].KeySHA256
	for i, w := range want {
		e := events[i]
		if e.Outcome != w.outcome || e.Status != w.status || e.Completion != w.completion || (e.KeySHA256 != "") != w.keyed || e.PrincipalSHA256 == "" || e.Duration <= 0 {
			t.Errorf("event %d = %+v, want %+v", i, e, w)
		}
		if w.keyed && e.KeySHA256 != keyHash {
			t.Errorf("event %d: key digest %s, want %s", i, e.KeySHA256, keyHash)
		}
		if s := fmt.Sprintf("%+v", e); strings.Contains(s, "secret") {
			t.Errorf("event %d carries the key or principal: %s", i, s)
		}
	}
	if events[0].Generation != 1 || len(keyHash) != 12 {
		t.Errorf("execute event: %+v", events[0])
	}
}

// ProblemDetails answers with RFC 9457 bodies that keep the spec's "error"
// member (and retry_after_ms in progress); Retry-After is unchanged; the
// handler's own responses and replays are untouched; idemclient reads them.
func TestOptionProblemDetails(t *testing.T) {
	block := make(chan struct{})
	s := newStack(t, stackOpts{opts: idemhttp.Options{ProblemDetails: true, ReuseStatus: 422}, handler: func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Block") != "" {
			<-block
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(201)
		io.WriteString(w, `{"ok":true}`)
	}})
	problem := func(r reply) map[string]any {
		t.Helper()
		if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
			t.Errorf("Content-Type = %q", ct)
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(r.body), &m); err != nil {
			t.Fatalf("%q: %v", r.body, err)
		}
		if m["status"] != float64(r.status) || m["title"] == "" || m["detail"] == "" || m["type"] != idemhttp.ProblemTypeBase+m["error"].(string) {
			t.Errorf("problem body %s", r.body)
		}
		return m
	}
	if m := problem(s.do("POST", "/x", "", "tok", "{}")); m["error"] != idemhttp.CodeKeyRequired || m["title"] != "Idempotency-Key required" {
		t.Errorf("%v", m)
	}
	done := make(chan reply)
	go func() { done <- s.do("POST", "/x", "k", "tok", "{}", "X-Block", "1") }()
	waitFor(t, func() bool {
		res, err := s.db.Query(bg, "SELECT count(*) FROM idempotency_keys")
		if err != nil {
			t.Fatal(err)
		}
		n, _ := res.Rows[0][0].Int64()
		return n == 1
	})
	r := s.do("POST", "/x", "k", "tok", "{}")
	if m := problem(r); m["error"] != idemhttp.CodeKeyInProgress || m["retry_after_ms"] == nil || r.header.Get("Retry-After") == "" {
		t.Errorf("in progress: %v %v", m, r.header)
	}
	close(block)
	if first := <-done; first.status != 201 || first.body != `{"ok":true}` || first.header.Get("Content-Type") != "application/json" {
		t.Fatalf("the handler's response: %+v", first)
	}
	if r := s.do("POST", "/x", "k", "tok", `{"n":2}`); r.status != 422 || problem(r)["error"] != idemhttp.CodeKeyReused {
		t.Errorf("reused: %+v", r)
	}
	// The client half reads the problem's code and detail.
	c := &http.Client{Transport: &idemclient.Transport{}}
	req, _ := http.NewRequest("POST", s.srv.URL+"/x", strings.NewReader(`{"n":3}`))
	req.Header.Set("Authorization", "Bearer tok")
	req.Header.Set(idemhttp.HeaderKey, "k")
	_, err := c.Do(req)
	var reused *idemclient.KeyReusedError
	if !errors.As(err, &reused) || reused.Message != "This Idempotency-Key was already used for a different request." {
		t.Fatalf("idemclient: %v", err)
	}
}

// Guard.Serve reports whether it ran next: an adapter must stop its chain
// when it did not (the middleware answered itself).
func TestGuardServeReportsWhetherNextRan(t *testing.T) {
	b := d1test.Local(t)
	l := newLedger(t, b.NewClientSchema(t), idem.Config{Heartbeat: -1})
	g, err := idemhttp.NewGuard(l, idemhttp.Options{Principal: bearer, KeyOptional: true})
	if err != nil {
		t.Fatal(err)
	}
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(201) })
	serve := func(method, key, token string) (bool, int) {
		req := httptest.NewRequest(method, "/x", strings.NewReader("{}"))
		if key != "" {
			req.Header.Set(idemhttp.HeaderKey, key)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		w := httptest.NewRecorder()
		ran := g.Serve(w, req, next)
		return ran, w.Code
	}
	for _, tc := range []struct {
		method, key, token string
		ran                bool
		status             int
	}{
		{"POST", "k", "tok", true, 201},     // execute
		{"POST", "k", "tok", false, 201},    // replay
		{"POST", "k", "", false, 401},       // refused
		{"POST", "", "tok", true, 201},      // unprotected
		{"GET", "", "", true, 201},          // not guarded
		{"POST", "\x01", "tok", false, 400}, // invalid key
	} {
		if ran, status := serve(tc.method, tc.key, tc.token); ran != tc.ran || status != tc.status {
			t.Errorf("%+v: ran %v, status %d", tc, ran, status)
		}
	}
}

// MustTx finds the Tx behind the middleware, and under TxContextKey in a
// context that looks values up by string; without one it panics, so that a
// business write is never skipped silently.
func TestMustTx(t *testing.T) {
	tx := &idemhttp.Tx{}
	//lint:ignore SA1029 a framework's context keyed by string, as gin's is
	ctx := context.WithValue(bg, idemhttp.TxContextKey, tx)
	if got, ok := idemhttp.TxFromContext(ctx); !ok || got != tx {
		t.Fatal("TxContextKey not read")
	}
	if idemhttp.MustTx(ctx) != tx {
		t.Fatal("MustTx")
	}
	defer func() {
		if v := recover(); v == nil || !strings.Contains(fmt.Sprint(v), "no Tx in this context") {
			t.Fatalf("MustTx without a Tx: %v", v)
		}
	}()
	idemhttp.MustTx(bg)
}
