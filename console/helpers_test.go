package console

import (
	"context"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/internal/d1test"
)

// t0 is the fake clock's start: the ledger's timestamps are the clock's
// (idem.Config.Clock), so ages and states do not depend on the machine.
var t0 = time.Date(2026, 3, 1, 3, 0, 0, 0, time.UTC)

// clock is the fake clock of a fixture's ledger.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// At runs fn with the clock at t, then puts it back.
func (c *clock) At(t time.Time, fn func()) {
	c.mu.Lock()
	was := c.now
	c.now = t
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.now = was
		c.mu.Unlock()
	}()
	fn()
}

// fixture is a console on a fresh d1local database with the ledger's
// schema, served on 127.0.0.1 for the test.
type fixture struct {
	db     *d1client.Client
	ledger *idem.Ledger // the application's and the console's, on the fake clock
	clock  *clock
	url    string // the console's base URL
}

// setup adjusts a fixture's console.
type setup struct {
	cfg    Config // Ledger and Databases are filled in
	client []func(*d1client.Config)
}

// newFixture starts a console on a fresh database.
func newFixture(t testing.TB, st setup) *fixture {
	t.Helper()
	b := d1test.Local(t)
	db := b.NewClientSchema(t, st.client...)
	return newFixtureOn(t, db, st)
}

// newFixtureOn starts a console on db, which has the ledger's schema.
func newFixtureOn(t testing.TB, db *d1client.Client, st setup) *fixture {
	t.Helper()
	c := &clock{now: t0}
	l, err := idem.New(db, idem.Config{Clock: c.Now})
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.cfg
	cfg.Ledger = l
	cfg.Databases = []Database{{Name: "orders", Client: db}}
	h, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{db: db, ledger: l, clock: c, url: newServer(t, h)}
}

// newServer serves h on 127.0.0.1 for the test, and returns its URL.
func newServer(t testing.TB, h http.Handler) string {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

// claim claims a key as a request would, and never completes it: the
// request was killed.
func (f *fixture) claim(t testing.TB, principal, key string) {
	t.Helper()
	dec, err := f.ledger.Begin(context.Background(), principal, key, strings.Repeat("f", 64))
	if err != nil || dec.Outcome != idem.Execute {
		t.Fatalf("Begin(%q, %q) = %v, %v", principal, key, dec.Outcome, err)
	}
}

// complete claims a key and stores its response.
func (f *fixture) complete(t testing.TB, principal, key string, resp idem.Response) {
	t.Helper()
	ctx := context.Background()
	dec, err := f.ledger.Begin(ctx, principal, key, strings.Repeat("c", 64))
	if err != nil || dec.Outcome != idem.Execute {
		t.Fatalf("Begin(%q, %q) = %v, %v", principal, key, dec.Outcome, err)
	}
	if _, err := f.ledger.Complete(ctx, dec.Reservation, resp); err != nil {
		t.Fatalf("Complete(%q, %q): %v", principal, key, err)
	}
}

// row reads a key's generation and status from the database itself.
func (f *fixture) row(t testing.TB, principal, key string) (generation int64, status string, updated int64) {
	t.Helper()
	res, err := f.db.Query(context.Background(), "SELECT generation, status, updated_at FROM idempotency_keys WHERE principal = ? AND key = ?", principal, key)
	if err != nil || len(res.Rows) != 1 {
		t.Fatalf("reading %q/%q: %v, %d rows", principal, key, err, len(res.Rows))
	}
	if err := res.Rows[0].Scan(&generation, &status, &updated); err != nil {
		t.Fatal(err)
	}
	return generation, status, updated
}

// answer is an answer of the console.
type answer struct {
	status int
	header http.Header
	body   string
}

// client is a browser-like HTTP client: it keeps cookies, and follows no
// redirect.
func client(t testing.TB) *http.Client {
	t.Helper()
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	return &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// do sends a request and reads the answer.
func do(t testing.TB, c *http.Client, req *http.Request) answer {
	t.Helper()
	res, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return answer{status: res.StatusCode, header: res.Header, body: string(b)}
}

func get(t testing.TB, c *http.Client, u string) answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	return do(t, c, req)
}

func post(t testing.TB, c *http.Client, u string, form url.Values) answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, u, strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	return do(t, c, req)
}

// csrfField finds the CSRF token of a page's form.
var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

func csrfOf(t testing.TB, body string) string {
	t.Helper()
	m := csrfField.FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no CSRF field in the page:\n%s", body)
	}
	return m[1]
}

// footer is the D1 calls a page says it cost.
var footer = regexp.MustCompile(`This page cost (no|[0-9,]+) D1 calls?`)

func callsOf(t testing.TB, body string) string {
	t.Helper()
	m := footer.FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("the page says nothing of its D1 calls:\n%s", body)
	}
	return m[1]
}
