package idemclient_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/idem/idemhttp"
	"github.com/d1idem/d1idem/idemclient"
	"github.com/d1idem/d1idem/internal/d1test"
)

// The end-to-end test: idemclient.Transport against the real middleware on
// a real ledger (d1local in process, SQLite), all in one synctest bubble,
// with faults at each layer:
//
//   - D1: responses lost after commit, 500s before and after commit, and
//     latency, on a fixed share of the ledger's calls;
//   - HTTP: the server's answer lost after the handler ran and the ledger
//     stored it, or replaced by a gateway's 502;
//   - the server: the first owner of a key dies in its handler before its
//     mutation, leaving the key pending until the TTL (heartbeats off).
//
// Each logical request is one goroutine's http.Client.Do. Per logical
// request: the mutation ran once, every attempt carried one key, and the
// client got the first answer, status and body, as the handler wrote it.

// e2eApp is the protected handler: it performs its mutation (a counter)
// and answers; the logical request n is in the X-Logical header.
type e2eApp struct {
	orders  atomic.Int64
	release chan struct{} // ends the handlers of the owners that died
	kills   sync.Map      // attempt token -> chan struct{}, closed when its owner dies
	ran     sync.Map      // attempt token -> true: the attempt ran the mutation

	mu          sync.Mutex
	invocations map[int]int
	mutations   map[int]int
	first       map[int]string // the first answer: "status body"
	keys        map[int]map[string]bool
}

// dies reports whether the first owner of logical request n dies.
func dies(n int) bool { return n%4 == 3 }

func (a *e2eApp) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n, _ := strconv.Atoi(r.Header.Get("X-Logical"))
	token := r.Header.Get("X-Attempt")
	a.mu.Lock()
	a.invocations[n]++
	inv := a.invocations[n]
	a.mu.Unlock()
	if dies(n) && inv == 1 {
		// The process dies here: its client loses the connection, and the
		// key stays pending, its lease unrenewed, until the TTL.
		if ch, ok := a.kills.Load(token); ok {
			close(ch.(chan struct{}))
		}
		<-a.release
		return
	}
	order := a.orders.Add(1)
	status, body := http.StatusCreated, fmt.Sprintf(`{"order":%d,"n":%d}`, order, n)
	switch n % 10 {
	case 5:
		status, body = http.StatusInternalServerError, fmt.Sprintf(`{"error":"payment_failed","n":%d}`, n)
	case 7:
		status, body = http.StatusUnprocessableEntity, fmt.Sprintf(`{"error":"invalid_sku","n":%d}`, n)
	}
	a.mu.Lock()
	a.mutations[n]++
	if _, ok := a.first[n]; !ok {
		a.first[n] = fmt.Sprint(status, " ", body)
	}
	a.mu.Unlock()
	a.ran.Store(token, true)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	io.WriteString(w, body)
}

// seenKeys records, outside the middleware, the key of every request.
func (a *e2eApp) seenKeys(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.Header.Get("X-Logical"))
		a.mu.Lock()
		if a.keys[n] == nil {
			a.keys[n] = map[string]bool{}
		}
		for _, k := range r.Header.Values(idemclient.HeaderKey) {
			a.keys[n][k] = true
		}
		a.mu.Unlock()
		next.ServeHTTP(w, r)
	})
}

// faultyNet is the network between the client and the server: it marks
// each attempt with a token, loses the answer when the owner dies, and
// loses or replaces the answer of the attempt that ran the mutation.
type faultyNet struct {
	base http.RoundTripper
	app  *e2eApp

	mu       sync.Mutex
	attempts map[int]int
	lost     atomic.Int64 // answers lost after the handler ran
	replaced atomic.Int64 // answers replaced by a 502
	killed   atomic.Int64 // attempts whose owner died
}

// cancelBody cancels its request's context once the body is closed.
type cancelBody struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b cancelBody) Close() error { err := b.ReadCloser.Close(); b.cancel(); return err }

func (f *faultyNet) RoundTrip(req *http.Request) (*http.Response, error) {
	n, _ := strconv.Atoi(req.Header.Get("X-Logical"))
	f.mu.Lock()
	f.attempts[n]++
	token := fmt.Sprintf("%d.%d", n, f.attempts[n])
	f.mu.Unlock()
	died := make(chan struct{})
	f.app.kills.Store(token, died)

	ctx, cancel := context.WithCancel(req.Context())
	req = req.Clone(ctx)
	req.Header.Set("X-Attempt", token)
	type result struct {
		res *http.Response
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := f.base.RoundTrip(req)
		done <- result{res, err}
	}()
	var r result
	select {
	case r = <-done:
	case <-died:
		f.killed.Add(1)
		cancel()
		if r = <-done; r.res != nil {
			r.res.Body.Close()
		}
		return nil, errors.New("faultyNet: connection reset: the server died")
	}
	if r.err != nil {
		cancel()
		return nil, r.err
	}
	if _, ran := f.app.ran.Load(token); ran && (n%4 == 1 || n%4 == 2) {
		io.Copy(io.Discard, r.res.Body)
		r.res.Body.Close()
		cancel()
		if n%4 == 1 {
			f.lost.Add(1)
			return nil, errors.New("faultyNet: connection reset after the server answered")
		}
		f.replaced.Add(1)
		const page = "<html><body>502 Bad Gateway</body></html>"
		return &http.Response{Status: "502 Bad Gateway", StatusCode: http.StatusBadGateway, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
			Header: http.Header{"Content-Type": {"text/html"}}, Body: io.NopCloser(strings.NewReader(page)), ContentLength: int64(len(page)), Request: req}, nil
	}
	r.res.Body = cancelBody{r.res.Body, cancel}
	return r.res, nil
}

// d1Faults are the D1 faults: on a fixed share of the ledger's calls once
// armed, each counted by kind.
type d1Faults struct {
	armed  atomic.Bool
	counts [4]atomic.Int64 // lost after commit, 500 after commit, 500, latency
}

func (d *d1Faults) fault(req d1local.Request) d1local.Fault {
	if !d.armed.Load() {
		return d1local.Fault{}
	}
	switch req.Seq % 9 {
	case 1:
		d.counts[0].Add(1)
		return d1local.Fault{LoseResponse: true}
	case 4:
		d.counts[1].Add(1)
		return d1local.Fault{Internal: true, AfterCommit: true}
	case 6:
		d.counts[2].Add(1)
		return d1local.Fault{Internal: true}
	case 2, 7:
		d.counts[3].Add(1)
		return d1local.Fault{Latency: 300 * time.Millisecond}
	}
	return d1local.Fault{}
}

// e2e is a protected orders API, on a ledger on an in-process d1local with
// faults, behind a faultyNet; for use inside a bubble.
type e2e struct {
	app     *e2eApp
	network *faultyNet
	ts      *httptest.Server
}

// startE2E starts the API with the ledger's defaults but for its clock and
// heartbeats.
func startE2E(t *testing.T, faults d1local.FaultFunc) *e2e {
	db := d1test.InProcess(t, d1local.Config{Faults: faults}).NewClientSchema(t)
	ledger, err := idem.New(db, idem.Config{
		Clock:     time.Now,                      // the bubble's: D1's own clock is the machine's
		Heartbeat: -1,                            // so that an owner that dies leaves its lease to expire
		Logger:    slog.New(slog.DiscardHandler), // the faults make ERROR lines
	})
	if err != nil {
		t.Fatal(err)
	}
	protect, err := idemhttp.New(ledger, idemhttp.Options{
		Principal: func(r *http.Request) (string, error) { return r.Header.Get("X-Account"), nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	app := &e2eApp{release: make(chan struct{}), invocations: map[int]int{}, mutations: map[int]int{},
		first: map[int]string{}, keys: map[int]map[string]bool{}}
	ts, base := pipeServer(t, app.seenKeys(protect(app)), true)
	return &e2e{app: app, network: &faultyNet{base: base, app: app, attempts: map[int]int{}}, ts: ts}
}

// run sends the logical requests ns at once through tr, whose Base must be
// e.network, and returns what each came to, by n, once the server is
// stopped.
func (e *e2e) run(t *testing.T, tr *idemclient.Transport, ns []int) map[int]result {
	var mu sync.Mutex
	got := map[int]result{}
	var wg sync.WaitGroup
	for _, n := range ns {
		wg.Go(func() {
			var r result
			req, _ := http.NewRequestWithContext(idemclient.WithReport(t.Context(), &r.report), "POST", "http://pipe/orders",
				strings.NewReader(fmt.Sprintf(`{"sku":"tea","n":%d}`, n)))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("X-Account", "acct_1")
			req.Header.Set("X-Logical", strconv.Itoa(n))
			do(t, tr, req, &r)
			mu.Lock()
			got[n] = r
			mu.Unlock()
		})
	}
	wg.Wait()
	close(e.app.release) // the dead owners return, and are fenced out
	tr.CloseIdleConnections()
	e.ts.Close() // once every handler has returned
	// Group commit's runners wait for their callers to come back, for a
	// round trip: let them end before the bubble's time stops.
	time.Sleep(time.Minute)
	return got
}

// check asserts, for each logical request, that its mutation ran once,
// that the client got its first answer, and that every attempt carried one
// key, its own; it returns the number of replays.
func (e *e2e) check(t *testing.T, got map[int]result) (replays int) {
	t.Helper()
	a := e.app
	a.mu.Lock()
	defer a.mu.Unlock()
	allKeys := map[string]bool{}
	for n, r := range got {
		if r.err != nil {
			t.Errorf("request %d: %v", n, r)
			continue
		}
		if a.mutations[n] != 1 {
			t.Errorf("request %d: the mutation ran %d times", n, a.mutations[n])
		}
		if wantInv := 1 + b2i(dies(n)); a.invocations[n] != wantInv {
			t.Errorf("request %d: the handler was called %d times, want %d", n, a.invocations[n], wantInv)
		}
		if answer := fmt.Sprint(r.status, " ", r.body); answer != a.first[n] {
			t.Errorf("request %d: the client got %q, the handler answered %q", n, answer, a.first[n])
		}
		if len(a.keys[n]) != 1 || !a.keys[n][r.report.Key] {
			t.Errorf("request %d: the server saw keys %v, the client sent %q", n, a.keys[n], r.report.Key)
		}
		if r.report.Replayed != (r.header.Get(idemclient.HeaderReplayed) == "true") {
			t.Errorf("request %d: Report.Replayed %v, header %q", n, r.report.Replayed, r.header.Get(idemclient.HeaderReplayed))
		}
		allKeys[r.report.Key] = true
		replays += b2i(r.report.Replayed)
	}
	if len(allKeys) != len(got) {
		t.Errorf("%d keys for %d requests", len(allKeys), len(got))
	}
	return replays
}

func TestEndToEndWithFaults(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		faults := &d1Faults{}
		e := startE2E(t, faults.fault)
		tr := &idemclient.Transport{
			Base: e.network,
			// A dead owner's key is taken over after the TTL; a claim whose
			// answer D1 lost waits for the TTL too: two of those in a row
			// take over a minute.
			Policy: idemclient.Policy{RetryServerErrors: true, MaxElapsed: 5 * time.Minute},
		}
		const N = 40
		var ns []int
		for n := range N {
			ns = append(ns, n)
		}
		faults.armed.Store(true)
		got := e.run(t, tr, ns)
		faults.armed.Store(false)
		replays := e.check(t, got)
		for n, r := range got {
			// An answer lost, replaced or stored as a 500 comes back to the
			// client as a replay.
			if lostOrRetried := n%4 == 1 || n%4 == 2 || n%10 == 5; lostOrRetried && (!r.report.Replayed || r.report.Attempts < 2) {
				t.Errorf("request %d: %v, want a replay", n, r)
			}
		}
		// The faults happened.
		for i, name := range []string{"lost after commit", "500 after commit", "500", "latency"} {
			if faults.counts[i].Load() == 0 {
				t.Errorf("no D1 fault %q", name)
			}
		}
		if nw := e.network; nw.lost.Load() != N/4 || nw.replaced.Load() != N/4 || nw.killed.Load() != N/4 {
			t.Errorf("%d answers lost, %d replaced, %d owners died; want %d each", nw.lost.Load(), nw.replaced.Load(), nw.killed.Load(), N/4)
		}
		t.Logf("%d requests: %d replays; D1 faults: %d lost after commit, %d 500 after commit, %d 500, %d latency; %d attempts in all",
			N, replays, faults.counts[0].Load(), faults.counts[1].Load(), faults.counts[2].Load(), faults.counts[3].Load(), totalAttempts(got))
	})
}

// With the Transport's defaults, and the ledger's (a TTL of 30 s), a retry
// outlasts an owner that died and takes its key over, however short the
// server's in-progress hints: the request is answered once the TTL has
// passed, not given up on.
func TestEndToEndDeadOwnerWithDefaults(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := startE2E(t, nil)
		var ns []int
		for n := 3; n < 40; n += 4 { // each one's first owner dies
			ns = append(ns, n)
		}
		start := time.Now()
		got := e.run(t, &idemclient.Transport{Base: e.network}, ns)
		e.check(t, got)
		for n, r := range got {
			// 0.25 + 0.5 + ... + 8 s, less up to half, then 5 to 10 s: at
			// most 11 attempts to reach the TTL, 12 to get past it.
			if r.err == nil && (r.report.Attempts < 3 || r.report.Attempts > 12 || r.report.Waited < idem.DefaultTTL || r.report.Waited > idemclient.DefaultMaxElapsed) {
				t.Errorf("request %d: %v, want a takeover after the TTL, in 3 to 12 attempts", n, r)
			}
		}
		if k := e.network.killed.Load(); k != int64(len(ns)) {
			t.Errorf("%d owners died, want %d", k, len(ns))
		}
		t.Logf("%d requests answered in %v; %d attempts in all", len(ns), time.Since(start)-time.Minute, totalAttempts(got))
	})
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func totalAttempts(rs map[int]result) (n int) {
	for _, r := range rs {
		n += r.report.Attempts
	}
	return n
}
