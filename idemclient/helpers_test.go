package idemclient_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/d1idem/d1idem/idemclient"
)

// The tests run servers and clients in fake time, inside testing/synctest
// bubbles. A goroutine blocked on a socket is not durably blocked, so a
// bubble's clock would not move while a keep-alive connection waits: the
// servers here are real httptest servers (net/http on both sides) whose
// connections are in memory (net.Pipe), on which a blocked goroutine is.

// pipeListener is a net.Listener of in-memory connections.
type pipeListener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func newPipeListener() *pipeListener {
	return &pipeListener{conns: make(chan net.Conn), done: make(chan struct{})}
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *pipeListener) Addr() net.Addr { return pipeAddr{} }

// dial connects to the listener, whatever the address.
func (l *pipeListener) dial(ctx context.Context, _, _ string) (net.Conn, error) {
	client, server := net.Pipe()
	select {
	case l.conns <- server:
		return client, nil
	case <-l.done:
		err := net.ErrClosed
		client.Close()
		server.Close()
		return nil, err
	case <-ctx.Done():
		client.Close()
		server.Close()
		return nil, ctx.Err()
	}
}

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "pipe" }

// pipeServer starts an httptest.Server for h on in-memory connections, and
// returns it with a transport that reaches it (each request on a new
// connection unless keepAlive). Both are closed when t ends, once h's
// requests are done.
func pipeServer(t testing.TB, h http.Handler, keepAlive bool) (*httptest.Server, *http.Transport) {
	t.Helper()
	ts := httptest.NewUnstartedServer(h)
	ts.Listener.Close()
	l := newPipeListener()
	ts.Listener = l
	ts.Start()
	tr := &http.Transport{DialContext: l.dial, DisableKeepAlives: !keepAlive}
	t.Cleanup(func() {
		tr.CloseIdleConnections()
		ts.Close()
	})
	return ts, tr
}

// script is a server that answers the n-th request it gets with its n-th
// step (the last step answers all the later ones), and records what each
// request carried.
type script struct {
	steps []http.HandlerFunc
	mu    sync.Mutex
	seen  []seen
}

// seen is a request as a script got it.
type seen struct {
	method string
	keys   []string // the Idempotency-Key fields
	body   string
	at     time.Time
}

func (s *script) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	n := len(s.seen)
	s.seen = append(s.seen, seen{method: r.Method, keys: r.Header.Values(idemclient.HeaderKey), body: string(body), at: time.Now()})
	s.mu.Unlock()
	s.steps[min(n, len(s.steps)-1)](w, r)
}

// requests returns what the script saw.
func (s *script) requests() []seen {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]seen(nil), s.seen...)
}

// gaps returns the times between the requests the script saw.
func (s *script) gaps() []time.Duration {
	var out []time.Duration
	rs := s.requests()
	for i := 1; i < len(rs); i++ {
		out = append(out, rs[i].at.Sub(rs[i-1].at))
	}
	return out
}

// reply answers status with body and the header fields given as pairs.
func reply(status int, body string, header ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		for i := 0; i+1 < len(header); i += 2 {
			w.Header().Set(header[i], header[i+1])
		}
		w.WriteHeader(status)
		io.WriteString(w, body)
	}
}

// errorBody answers status with the JSON error body of code, the way
// idemhttp does, and retryAfter, if not "", as Retry-After.
func errorBody(status int, code, retryAfter string) http.HandlerFunc {
	b, _ := json.Marshal(map[string]string{"error": code, "message": "the message of " + code})
	h := []string{"Content-Type", "application/json"}
	if retryAfter != "" {
		h = append(h, idemclient.HeaderRetryAfter, retryAfter)
	}
	return reply(status, string(b), h...)
}

// inProgress answers 409 in progress with retry_after_ms ms (none if
// negative) and retryAfter, if not "", as Retry-After.
func inProgress(ms int64, retryAfter string) http.HandlerFunc {
	body := fmt.Sprintf(`{"error":%q,"message":"still running"`, idemclient.CodeKeyInProgress)
	if ms >= 0 {
		body += fmt.Sprintf(`,"retry_after_ms":%d`, ms)
	}
	h := []string{"Content-Type", "application/json"}
	if retryAfter != "" {
		h = append(h, idemclient.HeaderRetryAfter, retryAfter)
	}
	return reply(http.StatusConflict, body+"}", h...)
}

// hangUp drops the connection without an answer.
func hangUp(http.ResponseWriter, *http.Request) { panic(http.ErrAbortHandler) }

// created answers 201 with a body.
var created = reply(http.StatusCreated, `{"order":1}`, "Content-Type", "application/json")

// result is what a request came to.
type result struct {
	status int
	body   string
	header http.Header
	err    error
	report idemclient.Report
}

// send makes a request of method with body (replayable: a strings.Reader)
// through rt and reads its answer; header holds pairs of fields to set.
func send(t testing.TB, ctx context.Context, rt http.RoundTripper, method, body string, header ...string) result {
	t.Helper()
	var r result
	req, err := http.NewRequestWithContext(idemclient.WithReport(ctx, &r.report), method, "http://pipe/orders", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	return do(t, rt, req, &r)
}

// do sends req through rt with an http.Client and fills in r.
func do(t testing.TB, rt http.RoundTripper, req *http.Request, r *result) result {
	t.Helper()
	res, err := (&http.Client{Transport: rt}).Do(req)
	if err != nil {
		r.err = err
		return *r
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	r.status, r.body, r.header = res.StatusCode, string(b), res.Header
	return *r
}

func (r result) String() string {
	if r.err != nil {
		return fmt.Sprintf("error %v (report %+v)", r.err, r.report)
	}
	return fmt.Sprintf("%d %s (report %+v)", r.status, strings.TrimSpace(r.body), r.report)
}
