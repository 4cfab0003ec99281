// Package d1test gives tests D1 backends to run against: d1local in process,
// and Cloudflare's real local D1 (workerd through Miniflare, see
// conformance/server.mjs) behind the bridge (bridge/worker.js), in a Node
// process shared by the whole test binary. Both speak the D1 REST API, so the
// same test, through d1client or raw HTTP, runs against both:
//
//	func TestClaim(t *testing.T) {
//		d1test.ForEach(t, func(t *testing.T, b *d1test.Backend) {
//			c := b.NewClientSchema(t) // a fresh database with the ledger schema
//			...
//		})
//	}
//
// The workerd backend is the product's bridge with a secret: its clients send
// the secret as their API token, and the bridge checks it. Bridge starts a
// bridge of a test's own with another configuration (ledger-only mode, no
// secret, ...).
//
// The workerd leg needs Node (>= 20) and the npm packages pinned in
// conformance/package.json (`make test` installs them). Without them it is
// skipped, unless the CI environment variable is set, in which case it fails.
//
// Import it from _test.go files only.
package d1test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/d1idem/d1idem"
	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1client/budget"
	"github.com/d1idem/d1idem/d1local"
)

// AccountID is the account ID every backend's clients use. Neither backend
// checks it.
const AccountID = "0123456789abcdef0123456789abcdef"

// Backend names.
const (
	NameLocal   = "d1local"
	NameWorkerd = "workerd"
)

// Backend is one D1 implementation reachable over HTTP.
type Backend struct {
	// Name is NameLocal ("d1local") or NameWorkerd ("workerd").
	Name string
	// BaseURL is the API base, "http://127.0.0.1:<port>" without a trailing
	// slash; database endpoints are BaseURL + "/accounts/<acc>/d1/database/
	// <id>/{query,raw}", the paths of api.cloudflare.com/client/v4. On
	// workerd it is the bridge's own socket.
	BaseURL string
	// HarnessURL, on workerd, is the base URL of the test harness Worker
	// (conformance/harness.js, serving conformance/spec.mjs, the spec's Worker
	// code verbatim, on the same
	// databases) under /__spec/; "" on d1local.
	HarnessURL string
	// AccountID is the account ID used in URLs (see the constant AccountID).
	AccountID string
	// Token is the bearer token the clients made here and Database.Post
	// send: the bridge's secret on workerd, "" (none) on d1local.
	Token string
	// HTTPClient is a keep-alive client for this backend, used by the
	// d1client clients this package makes and by Database.Post.
	HTTPClient *http.Client
	// Local is the in-process d1local server (for fault injection and call
	// counts); nil for workerd.
	Local *d1local.Server
	// Admin, for a bridge started by Bridge, is a full-mode bridge with the
	// same secret on the same databases: the operator's way in (schema,
	// inspection) past a ledger-only bridge. nil otherwise.
	Admin *Backend

	// newID allocates a fresh, empty database and returns its ID; it
	// arranges for the database's release when t ends.
	newID func(t testing.TB) string
	// proc is the server.mjs behind a workerd backend.
	proc *workerdProc
}

// Local starts an in-process d1local server with the default configuration
// (in memory, no token, databases created on first use) on 127.0.0.1. The
// server is closed when t ends.
func Local(t testing.TB) *Backend {
	t.Helper()
	return LocalConfig(t, d1local.Config{})
}

// LocalConfig is Local with a given d1local configuration.
func LocalConfig(t testing.TB, cfg d1local.Config) *Backend {
	t.Helper()
	srv, err := d1local.New(cfg)
	if err != nil {
		t.Fatalf("d1test: d1local.New: %v", err)
	}
	ts := httptest.NewServer(srv)
	hc := newHTTPClient()
	t.Cleanup(func() {
		hc.CloseIdleConnections()
		ts.Close()
		if err := srv.Close(); err != nil {
			t.Errorf("d1test: closing d1local: %v", err)
		}
	})
	return &Backend{
		Name:       NameLocal,
		BaseURL:    ts.URL,
		AccountID:  AccountID,
		HTTPClient: hc,
		Local:      srv,
		newID:      func(testing.TB) string { return randomID() },
	}
}

// InProcess returns a d1local reached without a network: its clients'
// transport calls the server's handler directly. Made inside a
// testing/synctest bubble, the whole request path runs in fake time (a
// Fault's latency included); D1's own clock, SQLite's, is the machine's,
// so such tests inject the ledger's Clock. A dropped connection (a
// LoseResponse fault) is a transport error, as it is over a network.
func InProcess(t testing.TB, cfg d1local.Config) *Backend {
	t.Helper()
	srv, err := d1local.New(cfg)
	if err != nil {
		t.Fatalf("d1test: d1local.New: %v", err)
	}
	t.Cleanup(func() {
		if err := srv.Close(); err != nil {
			t.Errorf("d1test: closing d1local: %v", err)
		}
	})
	return &Backend{
		Name:       NameLocal,
		BaseURL:    "http://127.0.0.1", // never dialled
		AccountID:  AccountID,
		HTTPClient: &http.Client{Transport: handlerTransport{srv}},
		Local:      srv,
		newID:      func(testing.TB) string { return randomID() },
	}
}

// handlerTransport is an http.RoundTripper that serves each request with a
// handler, in the caller's goroutine.
type handlerTransport struct{ h http.Handler }

func (t handlerTransport) RoundTrip(req *http.Request) (res *http.Response, err error) {
	rec := httptest.NewRecorder()
	defer func() {
		if v := recover(); v != nil {
			if v != http.ErrAbortHandler {
				panic(v)
			}
			res, err = nil, errors.New("d1test: the server dropped the connection")
		}
	}()
	t.h.ServeHTTP(rec, req)
	res = rec.Result()
	res.Request = req
	return res, nil
}

// All returns the backends available to this test binary: d1local, and
// workerd when it can run. It never skips t; where workerd cannot run it is
// left out with a log line (and t fails in CI). Prefer ForEach, which reports
// the workerd leg as a skipped subtest instead.
func All(t testing.TB) []*Backend {
	t.Helper()
	out := []*Backend{Local(t)}
	if b, reason := workerdBackend(t); b != nil {
		out = append(out, b)
	} else {
		t.Logf("d1test: %s", reason)
	}
	return out
}

// ForEach runs fn as two subtests, "d1local" and "workerd", each with its
// backend. The workerd subtest skips (or fails in CI) when Node or the
// conformance npm packages are missing.
func ForEach(t *testing.T, fn func(t *testing.T, b *Backend)) {
	t.Helper()
	t.Run(NameLocal, func(t *testing.T) { fn(t, Local(t)) })
	t.Run(NameWorkerd, func(t *testing.T) { fn(t, Workerd(t)) })
}

// NewClient returns a d1client.Client on a fresh, empty database of the
// backend (d1local: a random database ID; workerd: the next unused database
// of its pool), with an unlimited budget and the backend's HTTP client. mod
// functions may adjust the configuration before the client is made.
func (b *Backend) NewClient(t testing.TB, mod ...func(*d1client.Config)) *d1client.Client {
	t.Helper()
	return b.NewDatabase(t).Client(t, mod...)
}

// NewClientSchema is NewClient with d1idem.SchemaStatements() applied (as
// one batch).
func (b *Backend) NewClientSchema(t testing.TB, mod ...func(*d1client.Config)) *d1client.Client {
	t.Helper()
	c := b.NewClient(t, mod...)
	ApplySchema(t, c)
	return c
}

// ApplySchema runs d1idem.SchemaStatements() on c as one batch.
func ApplySchema(t testing.TB, c *d1client.Client) {
	t.Helper()
	var stmts []d1client.Statement
	for _, s := range d1idem.SchemaStatements() {
		stmts = append(stmts, d1client.Statement{SQL: s})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := c.Exec(ctx, stmts); err != nil {
		t.Fatalf("d1test: applying the schema: %v", err)
	}
}

// Database is one database of a backend, addressed by ID.
type Database struct {
	Backend *Backend
	ID      string
}

// NewDatabase allocates a fresh, empty database.
func (b *Backend) NewDatabase(t testing.TB) *Database {
	t.Helper()
	return &Database{Backend: b, ID: b.newID(t)}
}

// Database addresses the database with the given ID without allocating it:
// on d1local (with auto-creation on) any ID works; on workerd an ID outside
// the pool answers 404 with code 7404.
func (b *Backend) Database(id string) *Database { return &Database{Backend: b, ID: id} }

// Client returns a d1client.Client for the database; see Backend.NewClient.
func (d *Database) Client(t testing.TB, mod ...func(*d1client.Config)) *d1client.Client {
	t.Helper()
	cfg := d1client.Config{
		BaseURL:    d.Backend.BaseURL,
		APIToken:   d.Backend.Token,
		AccountID:  d.Backend.AccountID,
		DatabaseID: d.ID,
		HTTPClient: d.Backend.HTTPClient,
		Budget:     budget.Unlimited(),
	}
	for _, m := range mod {
		m(&cfg)
	}
	c, err := d1client.New(cfg)
	if err != nil {
		t.Fatalf("d1test: d1client.New: %v", err)
	}
	return c
}

// URL returns the URL of one of the database's endpoints ("query" or "raw").
func (d *Database) URL(endpoint string) string {
	return d.Backend.BaseURL + "/accounts/" + d.Backend.AccountID + "/d1/database/" + d.ID + "/" + endpoint
}

// Response is a raw HTTP response.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
}

// Admin returns the same database on the backend's Admin bridge (see
// Backend.Admin); it fails t when the backend has none.
func (d *Database) Admin(t testing.TB) *Database {
	t.Helper()
	if d.Backend.Admin == nil {
		t.Fatalf("d1test: the %s backend at %s has no admin bridge", d.Backend.Name, d.Backend.BaseURL)
	}
	return &Database{Backend: d.Backend.Admin, ID: d.ID}
}

// Post sends body (a string or []byte as is, anything else as JSON) to the
// database's endpoint ("query" or "raw") with the backend's token and
// returns the response. Transport failures end the test.
func (d *Database) Post(t testing.TB, endpoint string, body any) *Response {
	t.Helper()
	return d.PostHeader(t, endpoint, authHeader(d.Backend.Token, nil), body)
}

// PostHeader is Post with the given request headers instead of the
// backend's token (Content-Type is application/json unless header sets it).
func (d *Database) PostHeader(t testing.TB, endpoint string, header http.Header, body any) *Response {
	t.Helper()
	var data []byte
	switch v := body.(type) {
	case string:
		data = []byte(v)
	case []byte:
		data = v
	default:
		var err error
		if data, err = json.Marshal(v); err != nil {
			t.Fatalf("d1test: encoding the body: %v", err)
		}
	}
	h := http.Header{"Content-Type": {"application/json"}}
	for k, v := range header {
		h[k] = v
	}
	res, err := do(d.Backend.HTTPClient, http.MethodPost, d.URL(endpoint), h, data)
	if err != nil {
		t.Fatalf("d1test: POST %s: %v", endpoint, err)
	}
	return res
}

// authHeader adds "Authorization: Bearer <token>" to h (a new header when h
// is nil), unless token is "".
func authHeader(token string, h http.Header) http.Header {
	if h == nil {
		h = http.Header{}
	}
	if token != "" {
		h.Set("Authorization", "Bearer "+token)
	}
	return h
}

func do(hc *http.Client, method, url string, header http.Header, body []byte) (*Response, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	for k, vs := range header {
		req.Header[k] = append([]string(nil), vs...)
	}
	res, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	data, err := io.ReadAll(res.Body)
	if err != nil {
		return nil, err
	}
	return &Response{Status: res.StatusCode, Header: res.Header, Body: data}, nil
}

// newHTTPClient returns a client that keeps enough idle connections for
// 16-way concurrent benchmarks and never follows proxies (loopback only).
func newHTTPClient() *http.Client {
	return &http.Client{Transport: &http.Transport{
		Proxy:               nil,
		MaxIdleConns:        64,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     30 * time.Second,
	}}
}

// randomID returns a random D1-style database UUID.
func randomID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return strings.Join([]string{h[:8], h[8:12], h[12:16], h[16:20], h[20:]}, "-")
}
