package idemgin_test

import (
	"bytes"
	"context"
	"encoding/json"
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

	"github.com/gin-gonic/gin"

	idemgin "github.com/d1idem/d1idem/contrib/gin"
	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1local/d1localtest"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/idem/idemhttp"
)

var bg = context.Background()

func init() { gin.SetMode(gin.TestMode) }

// stack is an httptest server running a gin engine with the middleware on a
// d1localtest ledger.
type stack struct {
	t      *testing.T
	srv    *httptest.Server
	db     *d1client.Client
	ledger *idem.Ledger
	runs   atomic.Int64 // handler executions
	logs   *syncBuffer
}

type config struct {
	cfg      idem.Config
	opts     idemhttp.Options
	before   []gin.HandlerFunc // before the middleware
	after    []gin.HandlerFunc // between the middleware and the handler
	fallback bool              // engine.ContextWithFallback
	handler  gin.HandlerFunc
}

func principal(r *http.Request) (string, error) {
	if a := r.Header.Get("X-Account"); a != "" {
		return a, nil
	}
	return "", fmt.Errorf("no account")
}

func newStack(t *testing.T, c config) *stack {
	t.Helper()
	d1 := d1localtest.New(t, d1localtest.WithSchema())
	s := &stack{t: t, db: d1.Client, logs: &syncBuffer{}}
	if c.cfg.Logger == nil {
		c.cfg.Logger = slog.New(slog.NewTextHandler(s.logs, nil))
	}
	l, err := idem.New(d1.Client, c.cfg)
	if err != nil {
		t.Fatal(err)
	}
	s.ledger = l
	if c.opts.Principal == nil {
		c.opts.Principal = principal
	}
	if c.handler == nil {
		c.handler = func(c *gin.Context) {
			c.Header("Location", "/orders/1")
			c.Header("Set-Cookie", "session=abc")
			c.JSON(http.StatusCreated, gin.H{"order": 1})
		}
	}
	e := gin.New()
	e.ContextWithFallback = c.fallback
	e.Use(c.before...)
	e.Use(idemgin.Must(l, c.opts))
	e.Use(c.after...)
	h := c.handler
	e.Any("/*path", func(c *gin.Context) { s.runs.Add(1); h(c) })
	s.srv = httptest.NewServer(e)
	t.Cleanup(s.srv.Close)
	return s
}

type reply struct {
	status int
	header http.Header
	body   string
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

var noRedirects = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

func init() {
	noRedirects.Transport = &http.Transport{MaxIdleConnsPerHost: 64}
}

func (r reply) code(t *testing.T) string {
	t.Helper()
	var m struct{ Error string }
	if err := json.Unmarshal([]byte(r.body), &m); err != nil || r.header.Get("Content-Type") != "application/json" {
		t.Fatalf("not a JSON error body: %+v", r)
	}
	return m.Error
}

// replayed checks that again is the replay of first: the same status and
// body, the replayable headers, the replay marker.
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

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// The first execution answers as the handler wrote; a retry replays it byte
// for byte without running the handler, nor any handler after the
// middleware; Set-Cookie is not replayed.
func TestFirstExecutionAndReplay(t *testing.T) {
	var after atomic.Int64
	s := newStack(t, config{after: []gin.HandlerFunc{func(c *gin.Context) { after.Add(1); c.Next() }}})
	first := s.do("POST", "k1", `{"sku":"tea"}`)
	if first.status != 201 || first.body != `{"order":1}` || first.header.Get("Location") != "/orders/1" || first.header.Get("Set-Cookie") != "session=abc" {
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
	// GET is not guarded: through, with no key.
	if r := s.do("GET", "", ""); r.status != 201 || s.runs.Load() != 2 {
		t.Fatalf("GET: %+v", r)
	}
}

// Every way a gin handler writes is captured as the client would have seen
// it, stored, and replayed the same: c.String, c.JSON, io.WriteString,
// c.AbortWithStatus, c.Status then c.Writer.Write, c.Status alone, c.Data,
// a status set twice before the body, 204.
func TestWritePaths(t *testing.T) {
	for name, h := range map[string]gin.HandlerFunc{
		"String":            func(c *gin.Context) { c.String(201, "made %d", 7) },
		"JSON":              func(c *gin.Context) { c.JSON(202, gin.H{"a": []int{1, 2}}) },
		"io.WriteString":    func(c *gin.Context) { c.Status(201); io.WriteString(c.Writer, "written") },
		"io.WriteString200": func(c *gin.Context) { io.WriteString(c.Writer, "written") },
		"AbortWithStatus":   func(c *gin.Context) { c.AbortWithStatus(402) },
		"Status+Write":      func(c *gin.Context) { c.Status(201); c.Writer.Write([]byte("raw")) },
		"Status alone":      func(c *gin.Context) { c.Status(201) },
		"nothing":           func(c *gin.Context) {},
		"Data":              func(c *gin.Context) { c.Data(200, "text/csv", []byte("a,b\n")) },
		"status twice":      func(c *gin.Context) { c.Status(500); c.Status(201); c.String(0, "last wins") },
		"NoContent":         func(c *gin.Context) { c.Status(204) },
		"AbortJSON":         func(c *gin.Context) { c.AbortWithStatusJSON(409, gin.H{"e": "conflict"}) },
		"Redirect":          func(c *gin.Context) { c.Redirect(303, "/orders/9") },
	} {
		t.Run(name, func(t *testing.T) {
			// What gin answers without the middleware.
			e := gin.New()
			e.POST("/x", h)
			alone := httptest.NewServer(e)
			defer alone.Close()
			want := (&stack{t: t, srv: alone}).do("POST", "", "{}")

			s := newStack(t, config{handler: h})
			first := s.do("POST", "k", "{}")
			if first.status != want.status || first.body != want.body || first.header.Get("Content-Type") != want.header.Get("Content-Type") ||
				first.header.Get("Location") != want.header.Get("Location") {
				t.Fatalf("behind the middleware %+v; gin alone %+v", first, want)
			}
			replayed(t, first, s.do("POST", "k", "{}"))
			if s.runs.Load() != 1 {
				t.Fatalf("handler ran %d times", s.runs.Load())
			}
		})
	}
}

// The net/http suite's refusals: reuse, in progress (with Retry-After),
// missing key, oversize body; and an oversize response, stored and
// answered as the spec's sentinel.
func TestRefusalsAndSentinel(t *testing.T) {
	block := make(chan struct{})
	s := newStack(t, config{opts: idemhttp.Options{MaxBodyBytes: 64}, handler: func(c *gin.Context) {
		switch c.GetHeader("X-Mode") {
		case "block":
			<-block
		case "big":
			c.String(200, strings.Repeat("x", idem.DefaultMaxStoredBody+1))
			return
		}
		c.String(201, "ok")
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

// waitPending waits until n rows are in the ledger (a request has claimed).
func waitPending(t *testing.T, db *d1client.Client, n int64) {
	t.Helper()
	for {
		res, err := db.Query(context.Background(), "SELECT count(*) FROM idempotency_keys")
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
	if _, err := db.Query(context.Background(), "CREATE TABLE orders (id TEXT PRIMARY KEY, owner TEXT NOT NULL)"); err != nil {
		t.Fatal(err)
	}
}

func orders(t *testing.T, db *d1client.Client) []string {
	t.Helper()
	res, err := db.Query(context.Background(), "SELECT id || ':' || owner FROM orders ORDER BY id")
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

// A gin handler's business write commits with the stored response, once,
// however it finds the Tx: idemgin.MustTx(c), or idemhttp.TxFromContext(c)
// with or without ContextWithFallback.
func TestTransactionalCompletion(t *testing.T) {
	for _, fallback := range []bool{false, true} {
		for name, tx := range map[string]func(c *gin.Context) *idemhttp.Tx{
			"MustTx":                 idemgin.MustTx,
			"idemhttp.TxFromContext": func(c *gin.Context) *idemhttp.Tx { tx, _ := idemhttp.TxFromContext(c); return tx },
			"TxFromContext":          func(c *gin.Context) *idemhttp.Tx { tx, _ := idemgin.TxFromContext(c); return tx },
		} {
			t.Run(fmt.Sprintf("%s/fallback=%v", name, fallback), func(t *testing.T) {
				s := newStack(t, config{fallback: fallback, handler: func(c *gin.Context) {
					if err := tx(c).Add(d1client.Statement{SQL: "INSERT INTO orders (id, owner) VALUES (?, ?)", Params: []any{"ord-1", "first"}}); err != nil {
						c.String(500, err.Error())
						return
					}
					c.String(201, "ord-1")
				}})
				ordersTable(t, s.db)
				first := s.do("POST", "k", "{}")
				if first.status != 201 {
					t.Fatalf("first: %+v", first)
				}
				replayed(t, first, s.do("POST", "k", "{}"))
				if got := orders(t, s.db); len(got) != 1 {
					t.Fatalf("orders = %v", got)
				}
			})
		}
	}
}

// A handler statement that fails commits nothing: 500
// idempotency_mutation_not_committed, the key released, and the retry
// commits once. A takeover fences the first owner out: its write is rolled
// back, and it is answered with what the ledger holds.
func TestTransactionalRollback(t *testing.T) {
	var attempt atomic.Int64
	s := newStack(t, config{handler: func(c *gin.Context) {
		sql := "INSERT INTO orders (id, owner) VALUES ('ord', 'retry')"
		if attempt.Add(1) == 1 {
			sql = "INSERT INTO no_such_table VALUES (1)"
		}
		idemgin.MustTx(c).Add(d1client.Statement{SQL: sql})
		c.String(201, "made")
	}})
	ordersTable(t, s.db)
	if r := s.do("POST", "k", "{}"); r.status != 500 || r.code(t) != idemhttp.CodeMutationAbandoned {
		t.Fatalf("failed statement: %+v", r)
	}
	if r := s.do("POST", "k", "{}"); r.status != 201 || r.header.Get(idemhttp.HeaderReplayed) != "" {
		t.Fatalf("retry: %+v", r)
	}
	if got := orders(t, s.db); strings.Join(got, ",") != "ord:retry" {
		t.Fatalf("orders = %v", got)
	}

	// Fenced out: a takeover while the first owner still runs.
	clk := &clock{t: time.UnixMilli(1_767_225_600_000)}
	release := make(chan struct{})
	f := newStack(t, config{cfg: idem.Config{Clock: clk.Now, Heartbeat: -1}, handler: func(c *gin.Context) {
		owner := c.GetHeader("X-Owner")
		if owner == "first" {
			<-release
		}
		idemgin.MustTx(c).Add(d1client.Statement{SQL: "INSERT INTO orders (id, owner) VALUES (?, ?) ON CONFLICT DO NOTHING", Params: []any{"ord-" + owner, owner}})
		c.String(201, "by "+owner)
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
	first := <-done
	replayed(t, second, first) // the ledger's answer, never the fenced handler's
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

// Many concurrent requests with one key: one execution; every other answer
// is the replay or in progress.
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

// With gin.Recovery before the middleware (the documented order), a panic
// releases the key and Recovery answers 500: the retry executes. With
// Recovery after it, the 500 Recovery writes is an ordinary response,
// stored and replayed, and the middleware warns; Options.Store refusing
// 5xx makes that order safe too.
func TestRecoveryOrder(t *testing.T) {
	var attempt atomic.Int64
	panicky := func(c *gin.Context) {
		if attempt.Add(1)%2 == 1 {
			panic("boom")
		}
		c.String(201, "made")
	}
	attempt.Store(0)
	good := newStack(t, config{before: []gin.HandlerFunc{gin.RecoveryWithWriter(io.Discard)}, handler: panicky})
	if r := good.do("POST", "k", "{}"); r.status != 500 {
		t.Fatalf("panic: %+v", r)
	}
	if r := good.do("POST", "k", "{}"); r.status != 201 || r.header.Get(idemhttp.HeaderReplayed) != "" {
		t.Fatalf("retry after a panic: %+v", r)
	}
	if strings.Contains(good.logs.String(), "gin.Recovery runs after") {
		t.Fatalf("warned about the documented order: %s", good.logs)
	}

	attempt.Store(0)
	bad := newStack(t, config{after: []gin.HandlerFunc{gin.RecoveryWithWriter(io.Discard)}, handler: panicky})
	first := bad.do("POST", "k", "{}")
	if first.status != 500 {
		t.Fatalf("panic: %+v", first)
	}
	if r := bad.do("POST", "k", "{}"); r.status != 500 || r.header.Get(idemhttp.HeaderReplayed) != "true" {
		t.Fatalf("recovery after the middleware: %+v, want the 500 stored and replayed", r)
	}
	if !strings.Contains(bad.logs.String(), "gin.Recovery runs after the idempotency middleware") {
		t.Fatalf("no warning: %s", bad.logs)
	}

	attempt.Store(0)
	refused := newStack(t, config{after: []gin.HandlerFunc{gin.RecoveryWithWriter(io.Discard)}, handler: panicky,
		opts: idemhttp.Options{Store: func(status int) bool { return status < 500 }}})
	refused.do("POST", "k", "{}")
	if r := refused.do("POST", "k", "{}"); r.status != 201 || r.header.Get(idemhttp.HeaderReplayed) != "" {
		t.Fatalf("Store refusing 5xx: %+v", r)
	}
}

// The options of idemhttp work through the adapter: one middleware per
// route group on one ledger, with its own options.
func TestOptionsPerRoute(t *testing.T) {
	d1 := d1localtest.New(t, d1localtest.WithSchema())
	l, err := idem.New(d1.Client, idem.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := idemgin.New(l, idemhttp.Options{}); err == nil {
		t.Fatal("no Principal accepted")
	}
	e := gin.New()
	strict := e.Group("/strict", idemgin.Must(l, idemhttp.Options{Principal: principal, ReuseStatus: 422, ProblemDetails: true}))
	strict.POST("/x", func(c *gin.Context) { c.String(201, "strict") })
	lax := e.Group("/lax", idemgin.Must(l, idemhttp.Options{Principal: principal, KeyOptional: true}))
	lax.POST("/x", func(c *gin.Context) { c.String(201, "lax") })
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	post := func(path, key, body string) *http.Response {
		req, _ := http.NewRequest("POST", srv.URL+path, strings.NewReader(body))
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
	s := newStack(t, config{handler: func(c *gin.Context) {
		c.Status(202)
		c.Writer.WriteString("part 1;")
		c.Writer.Flush()
		c.Writer.WriteString("part 2")
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
