package idemecho_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"

	idemecho "github.com/d1idem/d1idem/contrib/echo"
	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1local/d1localtest"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/idem/idemhttp"
)

var bg = context.Background()

// stack is an httptest server running echo with the middleware on a
// d1localtest ledger.
type stack struct {
	t    *testing.T
	srv  *httptest.Server
	db   *d1client.Client
	runs atomic.Int64 // handler executions
}

type config struct {
	cfg     idem.Config
	opts    idemhttp.Options
	before  []echo.MiddlewareFunc // before the middleware
	after   []echo.MiddlewareFunc // between the middleware and the handler
	handler echo.HandlerFunc
}

func principal(r *http.Request) (string, error) {
	if a := r.Header.Get("X-Account"); a != "" {
		return a, nil
	}
	return "", errors.New("no account")
}

func newEcho() *echo.Echo {
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.Logger.SetOutput(io.Discard)
	return e
}

func newStack(t *testing.T, c config) *stack {
	t.Helper()
	d1 := d1localtest.New(t, d1localtest.WithSchema())
	s := &stack{t: t, db: d1.Client}
	if c.cfg.Logger == nil {
		c.cfg.Logger = slog.New(slog.DiscardHandler)
	}
	l, err := idem.New(d1.Client, c.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if c.opts.Principal == nil {
		c.opts.Principal = principal
	}
	if c.handler == nil {
		c.handler = func(c echo.Context) error {
			c.Response().Header().Set("Location", "/orders/1")
			c.Response().Header().Set("Set-Cookie", "session=abc")
			return c.JSON(http.StatusCreated, map[string]int{"order": 1})
		}
	}
	e := newEcho()
	e.Use(c.before...)
	e.Use(idemecho.Must(l, c.opts))
	e.Use(c.after...)
	h := c.handler
	e.Any("/*", func(c echo.Context) error { s.runs.Add(1); return h(c) })
	s.srv = httptest.NewServer(e)
	t.Cleanup(s.srv.Close)
	return s
}

type reply struct {
	status int
	header http.Header
	body   string
}

var noRedirects = &http.Client{
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	Transport:     &http.Transport{MaxIdleConnsPerHost: 64},
}

func (s *stack) do(method, key, body string, hdr ...string) reply {
	s.t.Helper()
	req, _ := http.NewRequest(method, s.srv.URL+"/x", strings.NewReader(body))
	req.Header.Set("X-Account", "acct_1")
	if key != "" {
		req.Header.Set(idemhttp.HeaderKey, key)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := noRedirects.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return reply{res.StatusCode, res.Header, string(b)}
}

func (r reply) code(t *testing.T) string {
	t.Helper()
	var m struct{ Error string }
	if err := json.Unmarshal([]byte(r.body), &m); err != nil || r.header.Get("Content-Type") != "application/json" {
		t.Fatalf("not a JSON error body: %+v", r)
	}
	return m.Error
}

// replayed checks that again is the replay of first.
func replayed(t *testing.T, first, again reply) {
	t.Helper()
	if again.status != first.status || again.body != first.body || again.header.Get(idemhttp.HeaderReplayed) != "true" ||
		again.header.Get("Content-Type") != first.header.Get("Content-Type") || again.header.Get("Location") != first.header.Get("Location") {
		t.Fatalf("replay differs:\nfirst  %+v\nreplay %+v", first, again)
	}
	if first.header.Get(idemhttp.HeaderReplayed) != "" {
		t.Fatalf("first answer marked replayed: %+v", first)
	}
}

// The first execution answers as the handler wrote; a retry replays it
// without running the handler, nor the middleware after this one;
// Set-Cookie is not replayed.
func TestFirstExecutionAndReplay(t *testing.T) {
	var after atomic.Int64
	s := newStack(t, config{after: []echo.MiddlewareFunc{func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error { after.Add(1); return next(c) }
	}}})
	first := s.do("POST", "k1", `{"sku":"tea"}`)
	if first.status != 201 || first.body != "{\"order\":1}\n" || first.header.Get("Location") != "/orders/1" || first.header.Get("Set-Cookie") != "session=abc" {
		t.Fatalf("first: %+v", first)
	}
	for range 3 {
		again := s.do("POST", "k1", `{"sku":"tea"}`)
		replayed(t, first, again)
		if again.header.Get("Set-Cookie") != "" {
			t.Fatalf("Set-Cookie replayed: %v", again.header)
		}
	}
	if s.runs.Load() != 1 || after.Load() != 1 {
		t.Fatalf("handler ran %d times, the next middleware %d", s.runs.Load(), after.Load())
	}
	if r := s.do("GET", "", ""); r.status != 201 || s.runs.Load() != 2 {
		t.Fatalf("GET: %+v", r)
	}
}

// Every way an echo handler answers is captured as the client would have
// seen it, stored and replayed the same, errors returned to echo's
// HTTPErrorHandler included.
func TestWritePaths(t *testing.T) {
	for name, h := range map[string]echo.HandlerFunc{
		"JSON":          func(c echo.Context) error { return c.JSON(202, map[string]any{"a": []int{1, 2}}) },
		"String":        func(c echo.Context) error { return c.String(201, "made") },
		"NoContent":     func(c echo.Context) error { return c.NoContent(204) },
		"HTTPError":     func(c echo.Context) error { return echo.NewHTTPError(402, "pay first") },
		"wrapped error": func(c echo.Context) error { return fmt.Errorf("charge: %w", echo.ErrConflict) },
		"plain error":   func(c echo.Context) error { return errors.New("boom") },
		"Blob":          func(c echo.Context) error { return c.Blob(200, "text/csv", []byte("a,b\n")) },
		"Redirect":      func(c echo.Context) error { return c.Redirect(303, "/orders/9") },
		"Response.Write": func(c echo.Context) error {
			c.Response().WriteHeader(201)
			_, err := c.Response().Write([]byte("raw"))
			return err
		},
		"io.WriteString":  func(c echo.Context) error { _, err := io.WriteString(c.Response(), "written"); return err },
		"nothing":         func(c echo.Context) error { return nil },
		"write then fail": func(c echo.Context) error { c.String(201, "made"); return errors.New("late") },
	} {
		t.Run(name, func(t *testing.T) {
			// What echo answers without the middleware.
			e := newEcho()
			e.POST("/x", h)
			alone := httptest.NewServer(e)
			defer alone.Close()
			want := (&stack{t: t, srv: alone}).do("POST", "", "{}")

			s := newStack(t, config{handler: h})
			first := s.do("POST", "k", "{}")
			if first.status != want.status || first.body != want.body || first.header.Get("Content-Type") != want.header.Get("Content-Type") ||
				first.header.Get("Location") != want.header.Get("Location") {
				t.Fatalf("behind the middleware %+v; echo alone %+v", first, want)
			}
			replayed(t, first, s.do("POST", "k", "{}"))
			if s.runs.Load() != 1 {
				t.Fatalf("handler ran %d times", s.runs.Load())
			}
		})
	}
}

// The net/http suite's refusals through echo: missing key, oversize body,
// in progress (with Retry-After), reuse; an oversize response is the
// spec's sentinel, first and on replay.
func TestRefusalsAndSentinel(t *testing.T) {
	block := make(chan struct{})
	s := newStack(t, config{opts: idemhttp.Options{MaxBodyBytes: 64}, handler: func(c echo.Context) error {
		switch c.Request().Header.Get("X-Mode") {
		case "block":
			<-block
		case "big":
			return c.String(200, strings.Repeat("x", idem.DefaultMaxStoredBody+1))
		}
		return c.String(201, "ok")
	}})
	if r := s.do("POST", "", "{}"); r.status != 400 || r.code(t) != idemhttp.CodeKeyRequired {
		t.Fatalf("missing key: %+v", r)
	}
	if r := s.do("POST", "big-body", strings.Repeat("y", 65)); r.status != 413 || r.code(t) != idemhttp.CodeBodyTooLarge {
		t.Fatalf("oversize body: %+v", r)
	}
	done := make(chan reply)
	go func() { done <- s.do("POST", "slow", "{}", "X-Mode", "block") }()
	waitPending(t, s.db, 1)
	if r := s.do("POST", "slow", "{}"); r.status != 409 || r.code(t) != idemhttp.CodeKeyInProgress || r.header.Get("Retry-After") == "" {
		t.Fatalf("in progress: %+v", r)
	}
	close(block)
	if r := <-done; r.status != 201 {
		t.Fatalf("slow: %+v", r)
	}
	if r := s.do("POST", "slow", `{"other":true}`); r.status != 409 || r.code(t) != idemhttp.CodeKeyReused {
		t.Fatalf("reuse: %+v", r)
	}
	big := s.do("POST", "big", "{}", "X-Mode", "big")
	if big.status != 500 || big.body != "" {
		t.Fatalf("oversize response: %d, %d bytes", big.status, len(big.body))
	}
	replayed(t, big, s.do("POST", "big", "{}", "X-Mode", "big"))
	if s.runs.Load() != 2 {
		t.Fatalf("runs = %d", s.runs.Load())
	}
}

func waitPending(t *testing.T, db *d1client.Client, n int64) {
	t.Helper()
	for {
		res, err := db.Query(bg, "SELECT count(*) FROM idempotency_keys")
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := res.Rows[0][0].Int64(); got >= n {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func ordersTable(t *testing.T, db *d1client.Client) {
	t.Helper()
	if _, err := db.Query(bg, "CREATE TABLE orders (id TEXT PRIMARY KEY, owner TEXT NOT NULL)"); err != nil {
		t.Fatal(err)
	}
}

func orders(t *testing.T, db *d1client.Client) []string {
	t.Helper()
	res, err := db.Query(bg, "SELECT id || ':' || owner FROM orders ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range res.Rows {
		v, _ := r[0].Text()
		out = append(out, v)
	}
	return out
}

// An echo handler's business write commits with the stored response, once;
// a failing statement commits nothing (500, released, the retry commits
// once); a takeover fences the first owner out and its write is rolled back.
func TestTransactionalCompletion(t *testing.T) {
	var attempt atomic.Int64
	s := newStack(t, config{handler: func(c echo.Context) error {
		sql := "INSERT INTO orders (id, owner) VALUES ('ord', 'retry')"
		if attempt.Add(1) == 1 {
			sql = "INSERT INTO no_such_table VALUES (1)"
		}
		if err := idemecho.MustTx(c).Add(d1client.Statement{SQL: sql}); err != nil {
			return err
		}
		return c.String(201, "made")
	}})
	ordersTable(t, s.db)
	if r := s.do("POST", "k", "{}"); r.status != 500 || r.code(t) != idemhttp.CodeMutationAbandoned {
		t.Fatalf("failed statement: %+v", r)
	}
	first := s.do("POST", "k", "{}")
	if first.status != 201 || first.header.Get(idemhttp.HeaderReplayed) != "" {
		t.Fatalf("retry: %+v", first)
	}
	replayed(t, first, s.do("POST", "k", "{}"))
	if got := orders(t, s.db); strings.Join(got, ",") != "ord:retry" {
		t.Fatalf("orders = %v", got)
	}

	clk := &clock{t: time.UnixMilli(1_767_225_600_000)}
	release := make(chan struct{})
	f := newStack(t, config{cfg: idem.Config{Clock: clk.Now, Heartbeat: -1}, handler: func(c echo.Context) error {
		owner := c.Request().Header.Get("X-Owner")
		if owner == "first" {
			<-release
		}
		tx, ok := idemecho.TxFromContext(c)
		if !ok {
			return errors.New("no Tx")
		}
		tx.Add(d1client.Statement{SQL: "INSERT INTO orders (id, owner) VALUES (?, ?) ON CONFLICT DO NOTHING", Params: []any{"ord-" + owner, owner}})
		return c.String(201, "by "+owner)
	}})
	ordersTable(t, f.db)
	done := make(chan reply)
	go func() { done <- f.do("POST", "k", "{}", "X-Owner", "first") }()
	waitPending(t, f.db, 1)
	clk.Advance(idem.DefaultTTL + time.Second)
	second := f.do("POST", "k", "{}", "X-Owner", "second")
	if second.status != 201 || second.body != "by second" {
		t.Fatalf("takeover: %+v", second)
	}
	close(release)
	replayed(t, second, <-done) // the ledger's answer, never the fenced handler's
	if got := orders(t, f.db); strings.Join(got, ",") != "ord-second:second" {
		t.Fatalf("orders = %v: the fenced owner's write landed", got)
	}
}

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// Many concurrent requests with one key: one execution.
func TestConcurrentOneKey(t *testing.T) {
	s := newStack(t, config{})
	var wg sync.WaitGroup
	replies := make([]reply, 30)
	for i := range replies {
		wg.Go(func() { replies[i] = s.do("POST", "same", `{"n":1}`) })
	}
	wg.Wait()
	if s.runs.Load() != 1 {
		t.Fatalf("handler ran %d times", s.runs.Load())
	}
	for _, r := range replies {
		if r.status != 201 && !(r.status == 409 && r.code(t) == idemhttp.CodeKeyInProgress) {
			t.Fatalf("%+v", r)
		}
	}
}

// With Recover before the middleware (the documented order), a panic
// releases the key and Recover answers 500: the retry executes. With
// Recover after it, the 500 is an ordinary response, stored and replayed,
// unless Options.Store refuses 5xx.
func TestRecoverOrder(t *testing.T) {
	var attempt atomic.Int64
	panicky := func(c echo.Context) error {
		if attempt.Add(1)%2 == 1 {
			panic("boom")
		}
		return c.String(201, "made")
	}
	recoverMW := middleware.RecoverWithConfig(middleware.RecoverConfig{DisablePrintStack: true})
	attempt.Store(0)
	good := newStack(t, config{before: []echo.MiddlewareFunc{recoverMW}, handler: panicky})
	if r := good.do("POST", "k", "{}"); r.status != 500 {
		t.Fatalf("panic: %+v", r)
	}
	if r := good.do("POST", "k", "{}"); r.status != 201 || r.header.Get(idemhttp.HeaderReplayed) != "" {
		t.Fatalf("retry after a panic: %+v", r)
	}

	attempt.Store(0)
	bad := newStack(t, config{after: []echo.MiddlewareFunc{recoverMW}, handler: panicky})
	if r := bad.do("POST", "k", "{}"); r.status != 500 {
		t.Fatalf("panic: %+v", r)
	}
	if r := bad.do("POST", "k", "{}"); r.status != 500 || r.header.Get(idemhttp.HeaderReplayed) != "true" {
		t.Fatalf("Recover after the middleware: %+v, want the 500 stored and replayed", r)
	}

	attempt.Store(0)
	refused := newStack(t, config{after: []echo.MiddlewareFunc{recoverMW}, handler: panicky,
		opts: idemhttp.Options{Store: func(status int) bool { return status < 500 }}})
	refused.do("POST", "k", "{}")
	if r := refused.do("POST", "k", "{}"); r.status != 201 || r.header.Get(idemhttp.HeaderReplayed) != "" {
		t.Fatalf("Store refusing 5xx: %+v", r)
	}
}

// Middleware outside the adapter sees the response the client got (its
// status), and an error returned by an unguarded request goes up as echo
// passes it.
func TestOuterMiddlewareSeesTheResponse(t *testing.T) {
	var mu sync.Mutex
	var statuses []int
	var errs []error
	outer := func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			err := next(c)
			mu.Lock()
			defer mu.Unlock()
			statuses, errs = append(statuses, c.Response().Status), append(errs, err)
			return err
		}
	}
	s := newStack(t, config{before: []echo.MiddlewareFunc{outer}, handler: func(c echo.Context) error {
		if c.Request().Method == "GET" {
			return echo.ErrNotFound
		}
		return c.String(201, "made")
	}})
	s.do("POST", "k", "{}")
	s.do("POST", "k", "{}")
	s.do("POST", "", "{}")
	if r := s.do("GET", "", ""); r.status != 404 {
		t.Fatalf("GET: %+v", r)
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(statuses) != "[201 201 400 200]" || errs[0] != nil || !errors.Is(errs[3], echo.ErrNotFound) {
		t.Fatalf("outer middleware saw statuses %v, errors %v", statuses, errs)
	}
}

// The options of idemhttp work through the adapter, one middleware per
// group on one ledger.
func TestOptionsPerRoute(t *testing.T) {
	d1 := d1localtest.New(t, d1localtest.WithSchema())
	l, err := idem.New(d1.Client, idem.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := idemecho.New(l, idemhttp.Options{}); err == nil {
		t.Fatal("no Principal accepted")
	}
	e := newEcho()
	e.Group("/strict", idemecho.Must(l, idemhttp.Options{Principal: principal, ReuseStatus: 422, ProblemDetails: true})).
		POST("/x", func(c echo.Context) error { return c.String(201, "strict") })
	e.Group("/lax", idemecho.Must(l, idemhttp.Options{Principal: principal, KeyOptional: true})).
		POST("/x", func(c echo.Context) error { return c.String(201, "lax") })
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	post := func(path, key, body string) *http.Response {
		req, _ := http.NewRequest("POST", srv.URL+path, bytes.NewReader([]byte(body)))
		req.Header.Set("X-Account", "a")
		if key != "" {
			req.Header.Set(idemhttp.HeaderKey, key)
		}
		res, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res
	}
	post("/strict/x", "k", "1")
	if r := post("/strict/x", "k", "2"); r.StatusCode != 422 || r.Header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("strict reuse: %d %v", r.StatusCode, r.Header)
	}
	if r := post("/lax/x", "", "1"); r.StatusCode != 201 {
		t.Fatalf("lax without a key: %d", r.StatusCode)
	}
	if r := post("/strict/x", "", "1"); r.StatusCode != 400 {
		t.Fatalf("strict without a key: %d", r.StatusCode)
	}
}

// A handler that flushes streams its response: the client gets it whole,
// nothing is stored, and the retry executes again.
func TestStreamedNotStored(t *testing.T) {
	s := newStack(t, config{handler: func(c echo.Context) error {
		c.Response().WriteHeader(202)
		io.WriteString(c.Response(), "part 1;")
		c.Response().Flush()
		_, err := io.WriteString(c.Response(), "part 2")
		return err
	}})
	for i := range 2 {
		if r := s.do("POST", "k", "{}"); r.status != 202 || r.body != "part 1;part 2" || r.header.Get(idemhttp.HeaderReplayed) != "" {
			t.Fatalf("try %d: %+v", i, r)
		}
	}
	if s.runs.Load() != 2 {
		t.Fatalf("runs = %d", s.runs.Load())
	}
}
