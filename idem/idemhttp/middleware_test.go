package idemhttp_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/gorilla/mux"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1client/budget"
	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/idem/idemhttp"
	"github.com/d1idem/d1idem/internal/d1test"
)

// stack is an httptest server running handler behind the middleware, on a
// d1local ledger.
type stack struct {
	t      *testing.T
	srv    *httptest.Server
	ledger *idem.Ledger
	db     *d1client.Client
	local  *d1local.Server
	runs   atomic.Int64 // handler executions
}

type stackOpts struct {
	cfg     idem.Config
	opts    idemhttp.Options
	handler http.HandlerFunc
	dbMod   func(*d1client.Config)
	router  func(mw func(http.Handler) http.Handler, h http.Handler) http.Handler
}

func bearer(r *http.Request) (string, error) {
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || tok == "" {
		return "", errors.New("no token")
	}
	return tok, nil
}

func newStack(t *testing.T, so stackOpts) *stack {
	t.Helper()
	b := d1test.Local(t)
	var mods []func(*d1client.Config)
	if so.dbMod != nil {
		mods = append(mods, so.dbMod)
	}
	db := b.NewClientSchema(t, mods...)
	if so.cfg.Heartbeat == 0 {
		so.cfg.Heartbeat = -1
	}
	s := &stack{t: t, db: db, local: b.Local, ledger: newLedger(t, db, so.cfg)}
	if so.opts.Principal == nil {
		so.opts.Principal = bearer
	}
	if so.handler == nil {
		so.handler = func(w http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Location", "/v1/things/1")
			w.Header().Set("Set-Cookie", "session=abc")
			w.Header().Set("X-Request-Id", "first")
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, `{"created":true,"echo":%q}`, body)
		}
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.runs.Add(1)
		so.handler(w, r)
	})
	mw := idemhttp.Must(s.ledger, so.opts)
	var root http.Handler
	if so.router != nil {
		root = so.router(mw, h)
	} else {
		m := http.NewServeMux()
		m.Handle("/", mw(h))
		root = m
	}
	s.srv = httptest.NewUnstartedServer(root)
	s.srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the panic test's stack traces
	s.srv.Start()
	t.Cleanup(s.srv.Close)
	return s
}

type reply struct {
	status int
	header http.Header
	body   string
	err    error
}

func (s *stack) do(method, path, key, token, body string, hdr ...string) reply {
	req, _ := http.NewRequest(method, s.srv.URL+path, strings.NewReader(body))
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := s.srv.Client().Do(req)
	if err != nil {
		return reply{err: err}
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return reply{status: res.StatusCode, header: res.Header, body: string(b), err: err}
}

func (r reply) errorCode(t *testing.T) string {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(r.body), &m); err != nil {
		t.Fatalf("body %q is not JSON: %v", r.body, err)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("error Content-Type = %q", ct)
	}
	code, _ := m["error"].(string)
	// Every error body says what happened in words, too.
	if msg, _ := m["message"].(string); msg == "" {
		t.Errorf("error body %s has no message", r.body)
	}
	return code
}

func TestMiddlewareFirstRequestAndReplay(t *testing.T) {
	s := newStack(t, stackOpts{})
	first := s.do("POST", "/v1/things?x=1", "k-1", "tok_a", `{"n":1}`)
	if first.status != 201 || first.header.Get("Set-Cookie") != "session=abc" || first.header.Get("X-Request-Id") != "first" ||
		first.header.Get(idemhttp.HeaderReplayed) != "" || !strings.Contains(first.body, `"created":true`) {
		t.Fatalf("first: %+v", first)
	}
	for i := 0; i < 3; i++ {
		again := s.do("POST", "/v1/things?x=1", "k-1", "tok_a", `{"n":1}`)
		if again.status != 201 || again.body != first.body {
			t.Fatalf("replay %d: %+v", i, again)
		}
		if again.header.Get(idemhttp.HeaderReplayed) != "true" || again.header.Get("Location") != "/v1/things/1" ||
			again.header.Get("Content-Type") != "application/json" {
			t.Errorf("replay headers: %v", again.header)
		}
		if again.header.Get("Set-Cookie") != "" || again.header.Get("X-Request-Id") != "" {
			t.Errorf("replayed a header off the allowlist: %v", again.header)
		}
	}
	if n := s.runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times", n)
	}
	// The same key under another principal is a separate execution.
	if other := s.do("POST", "/v1/things?x=1", "k-1", "tok_b", `{"n":1}`); other.status != 201 || other.header.Get(idemhttp.HeaderReplayed) != "" {
		t.Fatalf("other principal: %+v", other)
	}
	// Unsafe methods only: GET passes straight through, unguarded.
	if g := s.do("GET", "/v1/things", "", "", ""); g.status != 201 || s.runs.Load() != 3 {
		t.Fatalf("GET: %+v runs=%d", g, s.runs.Load())
	}
}

// The first response carries its replayable headers exactly as they are
// stored and replayed: a Location holding a byte that is not UTF-8 is
// stored as U+FFFD (as workerd decodes it), so the first response sends
// U+FFFD too, and the client sees the same bytes every time. Headers off
// the allowlist go out as the handler wrote them.
func TestMiddlewareFirstResponseHeadersAsReplayed(t *testing.T) {
	s := newStack(t, stackOpts{handler: func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; name=caf\xe9")
		w.Header().Set("Location", "/caf\xe9")
		w.Header().Set("X-Raw", "caf\xe9")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, "made")
	}})
	first := s.do("POST", "/v1/things", "k-bytes", "tok_a", "{}")
	again := s.do("POST", "/v1/things", "k-bytes", "tok_a", "{}")
	if first.status != 201 || again.status != 201 || again.header.Get(idemhttp.HeaderReplayed) != "true" {
		t.Fatalf("first %+v, replay %+v", first, again)
	}
	for name, want := range map[string]string{"Location": "/caf\uFFFD", "Content-Type": "text/plain; name=caf\uFFFD"} {
		if got := first.header.Values(name); len(got) != 1 || got[0] != want {
			t.Errorf("first response %s = %q, want %q (as replayed)", name, got, want)
		}
		if got, f := again.header.Values(name), first.header.Values(name); len(got) != 1 || len(f) != 1 || got[0] != f[0] {
			t.Errorf("%s: first response %q, replay %q: not byte-identical", name, f, got)
		}
	}
	if got := first.header.Get("X-Raw"); got != "caf\xe9" {
		t.Errorf("a header off the allowlist was rewritten: %q", got)
	}
}

func TestMiddlewareRejections(t *testing.T) {
	s := newStack(t, stackOpts{opts: idemhttp.Options{MaxBodyBytes: 16}})
	tests := []struct {
		name   string
		r      reply
		status int
		code   string
	}{
		{"missing key", s.do("POST", "/x", "", "tok", "{}"), 400, idemhttp.CodeKeyRequired},
		{"key too long", s.do("POST", "/x", strings.Repeat("k", 256), "tok", "{}"), 400, idemhttp.CodeKeyInvalid},
		{"key not ASCII", s.do("POST", "/x", "clé", "tok", "{}"), 400, idemhttp.CodeKeyInvalid},
		{"no principal", s.do("POST", "/x", "k", "", "{}"), 401, idemhttp.CodeUnauthenticated},
		{"body over the cap", s.do("POST", "/x", "k", "tok", strings.Repeat("x", 17)), 413, idemhttp.CodeBodyTooLarge},
	}
	for _, tc := range tests {
		if tc.r.status != tc.status || tc.r.errorCode(t) != tc.code {
			t.Errorf("%s: %d %s, want %d %s", tc.name, tc.r.status, tc.r.body, tc.status, tc.code)
		}
	}
	if n := s.runs.Load(); n != 0 {
		t.Fatalf("handler ran %d times on rejected requests", n)
	}
	// Reuse: 409 by default.
	s.do("POST", "/x", "reused", "tok", "{}")
	if r := s.do("POST", "/x", "reused", "tok", `{"other":1}`); r.status != 409 || r.errorCode(t) != idemhttp.CodeKeyReused {
		t.Fatalf("reuse: %+v", r)
	}
	if r := s.do("PUT", "/x", "reused", "tok", "{}"); r.status != 409 || r.errorCode(t) != idemhttp.CodeKeyReused {
		t.Fatalf("reuse with another method: %+v", r)
	}
	// 422 with the IETF draft's status.
	s422 := newStack(t, stackOpts{opts: idemhttp.Options{ReuseStatus: 422}})
	s422.do("POST", "/x", "reused", "tok", "{}")
	if r := s422.do("POST", "/x", "reused", "tok", `{"other":1}`); r.status != 422 || r.errorCode(t) != idemhttp.CodeKeyReused {
		t.Fatalf("reuse 422: %+v", r)
	}
	if _, err := idemhttp.New(s.ledger, idemhttp.Options{}); err == nil {
		t.Error("nil Principal accepted")
	}
	if _, err := idemhttp.New(s.ledger, idemhttp.Options{Principal: bearer, ReuseStatus: 418}); err == nil {
		t.Error("ReuseStatus 418 accepted")
	}
}

func TestMiddlewareHandlerReadsBodyAndKeyOptional(t *testing.T) {
	s := newStack(t, stackOpts{opts: idemhttp.Options{KeyOptional: true}})
	r := s.do("POST", "/x", "", "tok", `{"a":"b"}`)
	if r.status != 201 || !strings.Contains(r.body, `{\"a\":\"b\"}`) {
		t.Fatalf("unprotected request: %+v", r)
	}
	r = s.do("POST", "/x", "k", "tok", `{"a":"c"}`)
	if r.status != 201 || !strings.Contains(r.body, `{\"a\":\"c\"}`) {
		t.Fatalf("the handler did not see the body: %+v", r)
	}
}

func TestMiddlewareInProgress(t *testing.T) {
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	s := newStack(t, stackOpts{cfg: idem.Config{TTL: 20 * time.Second}, handler: func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		<-release
		w.WriteHeader(200)
	}})
	done := make(chan reply)
	go func() { done <- s.do("POST", "/slow", "k", "tok", "{}") }()
	<-entered
	r := s.do("POST", "/slow", "k", "tok", "{}")
	close(release)
	if r.status != 409 || r.errorCode(t) != idemhttp.CodeKeyInProgress || r.header.Get("Retry-After") != "1" || !strings.Contains(r.body, `"retry_after_ms":`) {
		t.Fatalf("in progress: %+v", r)
	}
	if first := <-done; first.status != 200 {
		t.Fatalf("first: %+v", first)
	}
}

// When the ledger cannot be reached the handler never runs: 503 with
// Retry-After.
func TestMiddlewareFailsClosed(t *testing.T) {
	s := newStack(t, stackOpts{})
	s.local.Inject(d1local.Fault{Internal: true})
	r := s.do("POST", "/x", "k", "tok", "{}")
	if r.status != 503 || r.errorCode(t) != idemhttp.CodeLedgerUnavailable || r.header.Get("Retry-After") == "" {
		t.Fatalf("%+v", r)
	}
	s.local.Inject(d1local.Fault{BadGateway: true})
	if r = s.do("POST", "/x", "k", "tok", "{}"); r.status != 503 {
		t.Fatalf("%+v", r)
	}
	s.local.Inject(d1local.Fault{RateLimit: true, RetryAfter: 42 * time.Second})
	if r = s.do("POST", "/x", "k", "tok", "{}"); r.status != 503 || r.errorCode(t) != idemhttp.CodeBudgetExhausted || r.header.Get("Retry-After") != "42" {
		t.Fatalf("971: %+v", r)
	}
	if n := s.runs.Load(); n != 0 {
		t.Fatalf("handler ran %d times without protection", n)
	}
}

// A spent request budget answers 503 with Retry-After instead of waiting
// past the middleware's timeout, and the reserve keeps a call for the
// completion of the request that executed: its response is stored.
func TestMiddlewareBudgetExhausted(t *testing.T) {
	// 4 calls: the schema, the first claim, its completion (on the
	// reserve, which new claims never take); the second claim is refused.
	s := newStack(t, stackOpts{
		opts:  idemhttp.Options{Timeout: 200 * time.Millisecond},
		dbMod: func(c *d1client.Config) { c.Budget = budget.New(4, time.Hour) },
	})
	if r := s.do("POST", "/x", "k1", "tok", "{}"); r.status != 201 {
		t.Fatalf("first: %+v", r)
	}
	if st := s.db.Stats(); st.Calls != 3 || st.Failures != 0 {
		t.Fatalf("the first request's completion was not stored: %+v", st)
	}
	r := s.do("POST", "/x", "k2", "tok", "{}")
	if r.status != 503 || r.errorCode(t) != idemhttp.CodeBudgetExhausted {
		t.Fatalf("%+v", r)
	}
	if ra := r.header.Get("Retry-After"); ra == "" || ra == "0" {
		t.Fatalf("Retry-After = %q", ra)
	}
}

func TestMiddlewareResponseRules(t *testing.T) {
	var status atomic.Int64
	s := newStack(t, stackOpts{cfg: idem.Config{MaxStoredBody: 32}, handler: func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/nocontent":
			w.WriteHeader(http.StatusNoContent)
		case "/big":
			w.Header().Set("Content-Type", "text/plain")
			w.Write(bytes.Repeat([]byte("x"), 33))
		case "/implicit":
			w.Write([]byte("implicit 200"))
		case "/big500":
			// The handler's own 500, its body unstorable: the caller gets
			// the sentinel's stored headers, as a replay does.
			w.Header().Set("Content-Type", "text/plain")
			w.Header().Set("Content-Encoding", "gzip")
			w.Header().Set("Set-Cookie", "s=1")
			w.WriteHeader(http.StatusInternalServerError)
			w.Write([]byte{0x1f, 0x8b, 0xff})
		default:
			w.WriteHeader(int(status.Load()))
		}
	}})
	r := s.do("POST", "/nocontent", "k204", "tok", "")
	if r.status != 204 || r.body != "" {
		t.Fatalf("204: %+v", r)
	}
	if r = s.do("POST", "/nocontent", "k204", "tok", ""); r.status != 204 || r.body != "" || r.header.Get(idemhttp.HeaderReplayed) != "true" {
		t.Fatalf("204 replay: %+v", r)
	}
	// Over the stored-body cap: the spec's 500 with no body, now and on replay.
	for i := 0; i < 2; i++ {
		if r = s.do("POST", "/big", "kbig", "tok", ""); r.status != 500 || r.body != "" || r.header.Get("Content-Type") != "text/plain" {
			t.Fatalf("oversized %d: %+v", i, r)
		}
	}
	for i := 0; i < 2; i++ {
		r = s.do("POST", "/big500", "kbig500", "tok", "")
		if r.status != 500 || r.body != "" || r.header.Get("Content-Type") != "text/plain" || r.header.Get("Content-Encoding") != "" || r.header.Get("Set-Cookie") != "" {
			t.Fatalf("unstorable 500, %d: %+v", i, r)
		}
	}
	if r = s.do("POST", "/implicit", "kimp", "tok", ""); r.status != 200 || r.body != "implicit 200" {
		t.Fatalf("implicit: %+v", r)
	}
	// Errors are stored and replayed too (Stripe does the same).
	status.Store(503)
	s.do("POST", "/err", "kerr", "tok", "")
	status.Store(200)
	if r = s.do("POST", "/err", "kerr", "tok", ""); r.status != 503 || r.header.Get(idemhttp.HeaderReplayed) != "true" {
		t.Fatalf("stored error: %+v", r)
	}
}

// Streamed and hijacked responses are not stored: the reservation is
// released so a retry executes again. A panic releases it too and is
// re-raised.
func TestMiddlewareStreamHijackPanic(t *testing.T) {
	s := newStack(t, stackOpts{handler: func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/stream":
			w.Write([]byte("part 1;"))
			http.NewResponseController(w).Flush()
			w.Write([]byte("part 2"))
		case "/hijack":
			conn, buf, err := http.NewResponseController(w).Hijack()
			if err != nil {
				panic(err)
			}
			buf.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi")
			buf.Flush()
			conn.Close()
		case "/panic":
			panic("boom")
		}
	}})
	// The streamed or hijacked response reaches the client before the
	// handler returns and the reservation is released: wait for the
	// release (the row's generation moves on) before retrying.
	generation := func(key string) int64 {
		t.Helper()
		res, err := s.db.Query(bg, "SELECT generation FROM idempotency_keys WHERE key = ? AND status = 'pending'", key)
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Rows) == 0 {
			return 0
		}
		g, _ := res.Rows[0][0].Int64()
		return g
	}
	released := func(key string, want int64) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			if generation(key) == want {
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
		t.Fatalf("reservation %s never released (generation %d, want %d)", key, generation(key), want)
	}
	for _, path := range []string{"/stream", "/hijack"} {
		for i := 0; i < 2; i++ {
			r := s.do("POST", path, "k"+path, "tok", "")
			if r.err != nil || r.status != 200 || r.header.Get(idemhttp.HeaderReplayed) != "" {
				t.Fatalf("%s attempt %d: %+v", path, i, r)
			}
			// Claimed at 1, released to 2; taken over at 3, released to 4.
			released("k"+path, int64(2*i+2))
		}
	}
	if r := s.do("POST", "/stream", "k/stream2", "tok", ""); r.body != "part 1;part 2" {
		t.Fatalf("streamed body: %q", r.body)
	}
	for i := 0; i < 2; i++ {
		if r := s.do("POST", "/panic", "kpanic", "tok", ""); r.err == nil {
			t.Fatalf("panic attempt %d answered: %+v", i, r)
		}
	}
	// 7 at least: Go's transport itself retries a request that carries an
	// Idempotency-Key when the connection dies before the response (the
	// panics), and each retry executes because the reservation was released.
	if n := s.runs.Load(); n < 7 {
		t.Fatalf("handler ran %d times, want at least 7: released reservations must let retries execute", n)
	}
	res, err := s.db.Query(bg, "SELECT count(*) FROM idempotency_keys WHERE status <> 'pending' OR generation % 2 = 1")
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := res.Rows[0][0].Int64(); n != 0 {
		t.Errorf("%d ledger rows are held; every reservation must have been released", n)
	}
}

// 50 concurrent duplicates: the handler runs once.
func TestMiddlewareConcurrentDuplicates(t *testing.T) {
	s := newStack(t, stackOpts{})
	var wg sync.WaitGroup
	replies := make([]reply, 50)
	for i := range replies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			replies[i] = s.do("POST", "/dup", "same", "tok", `{"n":1}`)
		}()
	}
	wg.Wait()
	if n := s.runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times", n)
	}
	var body string
	for _, r := range replies {
		switch r.status {
		case 201:
			if body != "" && r.body != body {
				t.Fatalf("two different bodies: %q %q", body, r.body)
			}
			body = r.body
		case 409:
			if r.errorCode(t) != idemhttp.CodeKeyInProgress {
				t.Fatalf("%+v", r)
			}
		default:
			t.Fatalf("%+v", r)
		}
	}
}

func TestMiddlewareUnreadableRecord(t *testing.T) {
	s := newStack(t, stackOpts{})
	s.do("POST", "/x", "k", "tok", "{}")
	if _, err := s.db.Query(bg, "UPDATE idempotency_keys SET response_headers = 'garbage'"); err != nil {
		t.Fatal(err)
	}
	if r := s.do("POST", "/x", "k", "tok", "{}"); r.status != 500 || r.errorCode(t) != idemhttp.CodeRecordUnreadable {
		t.Fatalf("%+v", r)
	}
	if s.runs.Load() != 1 {
		t.Fatal("a corrupt record re-executed the handler")
	}
}

// The middleware is plain func(http.Handler) http.Handler: it works with
// chi and gorilla/mux, and fingerprints the path as received.
func TestMiddlewareWithRouters(t *testing.T) {
	routers := map[string]func(mw func(http.Handler) http.Handler, h http.Handler) http.Handler{
		"chi": func(mw func(http.Handler) http.Handler, h http.Handler) http.Handler {
			r := chi.NewRouter()
			r.Use(mw)
			r.Post("/v1/orders/{id}", h.ServeHTTP)
			r.Get("/v1/orders/{id}", h.ServeHTTP)
			return r
		},
		"gorilla": func(mw func(http.Handler) http.Handler, h http.Handler) http.Handler {
			r := mux.NewRouter()
			r.Use(mux.MiddlewareFunc(mw))
			r.Handle("/v1/orders/{id}", h).Methods("POST", "GET")
			return r
		},
	}
	for name, router := range routers {
		t.Run(name, func(t *testing.T) {
			s := newStack(t, stackOpts{router: router})
			a := s.do("POST", "/v1/orders/7?x=1", "k", "tok", "{}")
			b := s.do("POST", "/v1/orders/7?x=1", "k", "tok", "{}")
			c := s.do("POST", "/v1/orders/8?x=1", "k", "tok", "{}")
			g := s.do("GET", "/v1/orders/7", "", "", "")
			if a.status != 201 || b.header.Get(idemhttp.HeaderReplayed) != "true" || c.status != 409 || g.status != 201 || s.runs.Load() != 2 {
				t.Fatalf("a=%+v b=%+v c=%+v g=%+v runs=%d", a, b, c, g, s.runs.Load())
			}
		})
	}
}

// A status net/http refuses (outside 100-999) is refused the same way, a
// panic, and nothing is stored: the reservation is released and a retry
// executes. An informational status is sent at once and never stored; 101
// streams, like a flush. A status a Worker cannot replay (600-999) is
// stored as the spec's sentinel.
func TestMiddlewareStatusCodes(t *testing.T) {
	var code atomic.Int64
	s := newStack(t, stackOpts{handler: func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/early-hints":
			w.Header().Set("Link", "</style.css>; rel=preload")
			w.WriteHeader(http.StatusEarlyHints)
			w.WriteHeader(http.StatusCreated)
			w.Write([]byte("final"))
		case "/switching":
			w.WriteHeader(http.StatusSwitchingProtocols)
		default:
			w.WriteHeader(int(code.Load()))
			w.Write([]byte("body"))
		}
	}})
	for _, bad := range []int{1000, 99, 0, -1} {
		code.Store(int64(bad))
		key := fmt.Sprint("bad-", bad)
		for i := 0; i < 2; i++ {
			if r := s.do("POST", "/bad", key, "tok", ""); r.err == nil {
				t.Fatalf("WriteHeader(%d) answered: %+v", bad, r)
			}
		}
		res, err := s.db.Query(bg, "SELECT count(*) FROM idempotency_keys WHERE key = ? AND status = 'completed'", key)
		if err != nil {
			t.Fatal(err)
		}
		if n, _ := res.Rows[0][0].Int64(); n != 0 {
			t.Errorf("WriteHeader(%d) was stored", bad)
		}
	}
	// 1xx: sent, not stored; the final status is.
	r := s.do("POST", "/early-hints", "hints", "tok", "")
	if r.status != 201 || r.body != "final" {
		t.Fatalf("early hints: %+v", r)
	}
	if r = s.do("POST", "/early-hints", "hints", "tok", ""); r.status != 201 || r.body != "final" || r.header.Get(idemhttp.HeaderReplayed) != "true" {
		t.Fatalf("early hints replay: %+v", r)
	}
	// 600-999: answered and stored as the spec's sentinel, 500 with no body.
	code.Store(799)
	for i := 0; i < 2; i++ {
		if r := s.do("POST", "/odd", "odd", "tok", ""); r.status != 500 || r.body != "" {
			t.Fatalf("status 799, attempt %d: %+v", i, r)
		}
	}
	// 101 streams: nothing stored, the reservation released.
	s.do("POST", "/switching", "switch", "tok", "")
	deadline := time.Now().Add(10 * time.Second)
	for {
		res, err := s.db.Query(bg, "SELECT status, generation FROM idempotency_keys WHERE key = 'switch'")
		if err != nil {
			t.Fatal(err)
		}
		var status string
		var gen int64
		_ = res.Rows[0].Scan(&status, &gen)
		if status == "pending" && gen == 2 {
			break
		}
		if status == "completed" || time.Now().After(deadline) {
			t.Fatalf("after 101: %s at generation %d", status, gen)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A principal the ledger cannot hold (not UTF-8, or over 1,024 bytes) is the
// server's bug: 500 idempotency_principal_invalid, without Retry-After, and
// a WARN log that does not carry the principal. It is never reported as the
// ledger being unavailable. Ledger.Begin returns ErrInvalidPrincipal.
func TestMiddlewareInvalidPrincipal(t *testing.T) {
	var logs bytes.Buffer
	var mu sync.Mutex
	s := newStack(t, stackOpts{cfg: idem.Config{Logger: slog.New(slog.NewJSONHandler(lockedWriter{&mu, &logs}, nil))},
		opts: idemhttp.Options{Principal: func(r *http.Request) (string, error) { return r.Header.Get("X-Principal"), nil }}})
	long := strings.Repeat("p", idem.MaxPrincipalLength)
	for _, p := range []string{"acct\xff", long + "q", "\xc3("} {
		r := s.do("POST", "/x", "k", "", "{}", "X-Principal", p)
		if r.status != 500 || r.errorCode(t) != idemhttp.CodePrincipalInvalid || r.header.Get("Retry-After") != "" {
			t.Errorf("principal %.20q: %+v", p, r)
		}
		if _, err := s.ledger.Begin(bg, p, "k", "fp"); !errors.Is(err, idem.ErrInvalidPrincipal) || strings.Contains(err.Error(), p) {
			t.Errorf("Begin with principal %.20q: %v", p, err)
		}
	}
	if r := s.do("POST", "/x", "k", "", "{}", "X-Principal", long); r.status != 201 {
		t.Errorf("a principal of exactly %d bytes: %+v", idem.MaxPrincipalLength, r)
	}
	if n := s.runs.Load(); n != 1 {
		t.Errorf("handler ran %d times", n)
	}
	mu.Lock()
	out := logs.String()
	mu.Unlock()
	if strings.Count(out, `"level":"WARN"`) != 3 || strings.Contains(out, "acct") || strings.Contains(out, long) ||
		strings.Contains(out, "ERROR") || !strings.Contains(out, `"principal_bytes":1025`) {
		t.Errorf("log:\n%s", out)
	}
}

// Two Idempotency-Key fields are two keys: refused, never merged into one
// "k1, k2" key. One field holding a comma is one key (the spec's pattern
// allows it, and a Worker keys it the same).
func TestMiddlewareDuplicateKeyHeaders(t *testing.T) {
	s := newStack(t, stackOpts{})
	req, _ := http.NewRequest("POST", s.srv.URL+"/x", strings.NewReader("{}"))
	req.Header.Set("Authorization", "Bearer tok")
	req.Header.Add("Idempotency-Key", "k1")
	req.Header.Add("Idempotency-Key", "k2")
	res, err := s.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	r := reply{status: res.StatusCode, header: res.Header, body: string(body)}
	if r.status != 400 || r.errorCode(t) != idemhttp.CodeKeyInvalid {
		t.Fatalf("two fields: %+v", r)
	}
	if n := s.runs.Load(); n != 0 {
		t.Fatalf("handler ran %d times", n)
	}
	// One field with a comma: the whole value is the key.
	if r := s.do("POST", "/x", "k1, k2", "tok", "{}"); r.status != 201 {
		t.Fatalf("one field with a comma: %+v", r)
	}
	res2, err := s.db.Query(bg, "SELECT key FROM idempotency_keys")
	if err != nil {
		t.Fatal(err)
	}
	if k, _ := res2.Rows[0][0].Text(); len(res2.Rows) != 1 || k != "k1, k2" {
		t.Fatalf("keys: %v", res2.Rows)
	}
}

// With no Logger, the middleware logs to slog.Default(). A refusal no
// retry can cure until an operator acts (no table, a refused token, an
// unknown database) answers 500 idempotency_ledger_misconfigured without
// Retry-After, so that clients stop, and its log line carries the fix; a
// transient failure stays a 503 with Retry-After.
func TestMiddlewarePermanentRefusals(t *testing.T) {
	local := d1test.LocalConfig(t, d1local.Config{Token: "right-token", Dir: t.TempDir(), NoAutoCreate: true})
	local.Token = "right-token"
	for _, tc := range []struct {
		name, logged, fix string
		db                func(t *testing.T) *d1client.Client
	}{
		{"no table", "no such table: idempotency_keys", "fix=\"the ledger table is missing: run `d1idem schema apply`", func(t *testing.T) *d1client.Client {
			return d1test.Local(t).NewClient(t)
		}},
		{"wrong token", "HTTP 403, code 10000", "fix=\"D1 refused the API token", func(t *testing.T) *d1client.Client {
			return local.NewClient(t, func(c *d1client.Config) { c.APIToken = "wrong-token" })
		}},
		{"unknown database", "HTTP 404, code 7404", "fix=\"the account has no D1 database with this ID", func(t *testing.T) *d1client.Client {
			return local.Database("no-such-database").Client(t)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs bytes.Buffer
			var mu sync.Mutex
			prev := slog.Default()
			slog.SetDefault(slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, nil)))
			t.Cleanup(func() { slog.SetDefault(prev) })

			l, err := idem.New(tc.db(t), idem.Config{})
			if err != nil {
				t.Fatal(err)
			}
			h := idemhttp.Must(l, idemhttp.Options{Principal: bearer})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				t.Error("the handler ran without a ledger")
			}))
			req := httptest.NewRequest("POST", "/x", strings.NewReader("{}"))
			req.Header.Set("Authorization", "Bearer tok")
			req.Header.Set("Idempotency-Key", "k")
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != 500 || !strings.Contains(rec.Body.String(), idemhttp.CodeLedgerMisconfigured) || rec.Header().Get("Retry-After") != "" {
				t.Fatalf("%d %s (Retry-After %q)", rec.Code, rec.Body, rec.Header().Get("Retry-After"))
			}
			mu.Lock()
			out := logs.String()
			mu.Unlock()
			if !strings.Contains(out, "level=ERROR") || !strings.Contains(out, "ledger misconfigured") ||
				!strings.Contains(out, tc.logged) || !strings.Contains(out, tc.fix) || strings.Contains(out, "wrong-token") {
				t.Errorf("default log:\n%s", out)
			}
		})
	}
}

// A request without a Body (a test calling ServeHTTP with one it built by
// hand; a server's request always has one) is a request with an empty body,
// not a panic: it fingerprints as one, so its retry with an empty body
// replays.
func TestMiddlewareNilBody(t *testing.T) {
	s := newStack(t, stackOpts{})
	mw := idemhttp.Must(s.ledger, idemhttp.Options{Principal: bearer})
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil || len(b) != 0 {
			t.Errorf("the handler read %q, %v", b, err)
		}
		w.WriteHeader(http.StatusCreated)
	}))
	for i, body := range []io.Reader{nil, http.NoBody} {
		req := httptest.NewRequest("POST", "/x", body)
		if body == nil {
			req.Body = nil
		}
		req.Header.Set("Authorization", "Bearer tok")
		req.Header.Set(idemhttp.HeaderKey, "nil-body")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusCreated || (i == 1) != (rec.Header().Get(idemhttp.HeaderReplayed) == "true") {
			t.Errorf("request %d: %d %v %s", i, rec.Code, rec.Header(), rec.Body)
		}
	}
}
