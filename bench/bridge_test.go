package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1client/budget"
	"github.com/d1idem/d1idem/internal/d1test"
)

// restBudget is the API budget of the REST side of BenchmarkBridgeVsREST:
// the default budget's rate, 1200 calls per 300 s (4 calls/s), with its
// window scaled down 60 times (20 calls per 5 s) so that a run of seconds
// measures the sustained regime rather than the default's 1200-call burst.
var restBudget = budget.New(20, 5*time.Second)

// bridgeVsREST is one side of BenchmarkBridgeVsREST: the full middleware
// over loopback HTTP, its ledger on one of the two backends.
type bridgeVsREST struct {
	name     string
	app      *app
	url      string // the service's base URL
	hc       *http.Client
	warmup   time.Duration
	window   time.Duration
	shutdown func()
}

// closedRun is the outcome of a closed-loop run.
type closedRun struct {
	reqs      int64           // requests answered 2xx within the window
	errors    int64           // other outcomes, warm-up included
	latencies []time.Duration // of the requests that started within the window
	calls     int64           // D1 calls within the window
	window    time.Duration
}

func (r closedRun) rate() float64 { return float64(r.reqs) / r.window.Seconds() }

// closedLoop runs c clients, each sending first executions (1 KB bodies)
// to path one after another, for warmup plus window, and measures the
// window.
func (s *bridgeVsREST) closedLoop(c int, prefix string) closedRun {
	var (
		seq, done, errs atomic.Int64
		measuring       atomic.Bool
		mu              sync.Mutex
		lat             []time.Duration
		wg              sync.WaitGroup
	)
	stop := make(chan struct{})
	for range c {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				in := measuring.Load()
				t0 := time.Now()
				ok := s.post("/v1/orders", fmt.Sprintf("%s-%d", prefix, seq.Add(1)))
				took := time.Since(t0)
				switch {
				case !ok:
					errs.Add(1)
				case in && measuring.Load():
					done.Add(1)
					mu.Lock()
					lat = append(lat, took)
					mu.Unlock()
				}
			}
		})
	}
	time.Sleep(s.warmup)
	calls := s.app.db.Stats().Calls
	measuring.Store(true)
	time.Sleep(s.window)
	measuring.Store(false)
	r := closedRun{reqs: done.Load(), calls: s.app.db.Stats().Calls - calls, window: s.window}
	close(stop)
	wg.Wait()
	mu.Lock()
	r.latencies, r.errors = lat, errs.Load()
	mu.Unlock()
	return r
}

// post sends one request with a 1 KB body and says whether it was answered
// 2xx.
func (s *bridgeVsREST) post(path, key string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.url+path, bytes.NewReader(body1KB))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("X-Principal", "acct_1")
	res, err := s.hc.Do(req)
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return res.StatusCode/100 == 2
}

// serveApp serves the middleware on db over loopback HTTP.
func serveApp(tb testing.TB, name string, db *d1client.Client, warmup, window time.Duration) *bridgeVsREST {
	tb.Helper()
	a, h, err := newAppOn(db)
	if err != nil {
		tb.Fatal(err)
	}
	srv := httptest.NewServer(h)
	hc := poolClient(512)
	return &bridgeVsREST{name: name, app: a, url: srv.URL, hc: hc, warmup: warmup, window: window,
		shutdown: func() { hc.CloseIdleConnections(); srv.Close() }}
}

// bridgeSide is the middleware's ledger through the bridge on local workerd
// (conformance/server.mjs), its client configured by the bridge URL alone:
// no API budget. workerd keeps its local D1 under TMPDIR, which is put on
// tmpfs (/dev/shm) when there is one, so that its SQLite, like d1local's on
// the REST side, runs in memory: the figure is the bridge's, not the
// machine's disk's. It reports whether it could.
func bridgeSide(tb testing.TB) (*bridgeVsREST, bool) {
	tb.Helper()
	var env []string
	mem, err := os.MkdirTemp("/dev/shm", "d1idem-bench-")
	if err == nil {
		tb.Cleanup(func() { _ = os.RemoveAll(mem) })
		env = append(env, "TMPDIR="+mem)
	}
	be := d1test.Bridge(tb, d1test.BridgeConfig{Pool: 2, Env: env})
	db := be.NewDatabase(tb)
	d1test.ApplySchema(tb, db.Client(tb))
	c, err := d1client.New(d1client.Config{
		BridgeURL: be.BridgeURL(), AccountID: d1test.AccountID, DatabaseID: db.ID, HTTPClient: poolClient(512),
	})
	if err != nil {
		tb.Fatal(err)
	}
	if !c.Bridge() || c.BudgetWait() != 0 {
		tb.Fatal("the client does not know it talks to a bridge")
	}
	return serveApp(tb, "bridge", c, time.Second, 5*time.Second), mem != ""
}

// restSide is the middleware's ledger through the REST shape (d1local over
// loopback HTTP, 20 ms per call) under restBudget.
func restSide(tb testing.TB) *bridgeVsREST {
	tb.Helper()
	d1 := startD1(tb, d1Latency, false)
	id := newDatabase(tb, d1)
	c, err := d1client.New(d1client.Config{BaseURL: d1.URL, AccountID: d1test.AccountID, DatabaseID: id,
		HTTPClient: poolClient(512), Budget: restBudget})
	if err != nil {
		tb.Fatal(err)
	}
	return serveApp(tb, "rest", c, 6*time.Second, 12*time.Second)
}

// BenchmarkBridgeVsREST: the same middleware under the same closed-loop
// load (first executions, 1 KB bodies, 1, 64 and 256 clients), side by
// side in one run, its ledger
//
//   - through the bridge on local workerd (bridge/worker.js in
//     conformance/server.mjs, real workerd D1, no injected latency), the
//     client configured by its bridge URL alone, so with no API budget;
//   - through the REST shape (d1local, 20 ms per call) under the default
//     budget's rate, 1200 calls per 300 s, its window scaled 60× (20 calls
//     per 5 s) and a 6 s warm-up, so that the 12 s window measures the
//     sustained, budget-bound rate rather than the burst.
//
// Per concurrency: requests per second, p50/p99 latency (from the client,
// through the middleware and HTTP), D1 calls per request, errors, and the
// bridge's rate over REST's. Target: at least 10×.
//
// At concurrency 1, "c=1/added_latency" samples in turn a bare bridge call
// (SELECT 1 through the client: the round trip), the handler without the
// middleware, and with it; the added latency is the difference of the two
// requests' p50s. Target: at most 2 round trips + 3 ms.
func BenchmarkBridgeVsREST(b *testing.B) {
	bridge, inMemory := bridgeSide(b)
	rest := restSide(b)
	defer bridge.shutdown()
	defer rest.shutdown()
	for _, c := range []int{1, 64, 256} {
		b.Run(fmt.Sprintf("c=%d", c), func(b *testing.B) {
			b.ReportMetric(b2f(inMemory), "bridge-d1-in-memory")
			// One run, however large b.N: the run is the measurement.
			br := bridge.closedLoop(c, fmt.Sprintf("bridge-c%d", c))
			rr := rest.closedLoop(c, fmt.Sprintf("rest-c%d", c))
			for _, side := range []struct {
				name string
				r    closedRun
			}{{"bridge", br}, {"rest", rr}} {
				b.ReportMetric(side.r.rate(), side.name+"-req/s")
				if len(side.r.latencies) > 0 {
					b.ReportMetric(ms(percentile(side.r.latencies, 0.50)), side.name+"-p50-ms")
					b.ReportMetric(ms(percentile(side.r.latencies, 0.99)), side.name+"-p99-ms")
				}
				if side.r.reqs > 0 {
					b.ReportMetric(float64(side.r.calls)/float64(side.r.reqs), side.name+"-d1-calls/req")
				}
				b.ReportMetric(float64(side.r.errors), side.name+"-errors")
			}
			if rr.reqs > 0 {
				b.ReportMetric(br.rate()/rr.rate(), "bridge/rest")
				// REST's ceiling at the budget's steady rate, with the
				// batching this run achieved.
				per := restBudget.Per().Seconds() / float64(restBudget.Calls())
				b.ReportMetric(float64(rr.reqs)/float64(rr.calls)/per, "rest-ceiling-req/s")
			}
		})
	}
	b.Run("c=1/added_latency", func(b *testing.B) { addedLatency(b, bridge) })
}

// addedLatency measures, at concurrency 1 through the bridge, the round
// trip (a bare bridge call) and the latency the middleware adds to a
// request (first executions).
func addedLatency(b *testing.B, s *bridgeVsREST) {
	const samples = 300
	var rtt, bare, guarded []time.Duration
	for i := range samples {
		t0 := time.Now()
		if _, err := s.app.db.Query(context.Background(), "SELECT 1"); err != nil {
			b.Fatal(err)
		}
		rtt = append(rtt, time.Since(t0))
		t0 = time.Now()
		if !s.post("/v1/bare", "") {
			b.Fatal("the bare handler failed")
		}
		bare = append(bare, time.Since(t0))
		t0 = time.Now()
		if !s.post("/v1/orders", fmt.Sprintf("added-%d", i)) {
			b.Fatal("a request through the middleware failed")
		}
		guarded = append(guarded, time.Since(t0))
	}
	rt, p50 := percentile(rtt, 0.50), percentile(guarded, 0.50)-percentile(bare, 0.50)
	b.ReportMetric(ms(rt), "rtt-ms")
	b.ReportMetric(ms(p50), "added-p50-ms")
	b.ReportMetric(ms(percentile(guarded, 0.99)-percentile(bare, 0.99)), "added-p99-ms")
	b.ReportMetric(ms(percentile(guarded, 0.50)), "p50-ms")
	b.ReportMetric(ms(percentile(bare, 0.50)), "bare-p50-ms")
	b.ReportMetric(2*ms(rt)+3, "target-ms")
}

// The side-by-side harness end to end, briefly, so that it cannot rot: both
// sides answer every request (the REST side within its budget's burst),
// and only the bridge side's client knows it talks to a bridge.
func TestBridgeVsRESTSmoke(t *testing.T) {
	bridge, _ := bridgeSide(t)
	rest := restSide(t)
	defer bridge.shutdown()
	defer rest.shutdown()
	bridge.warmup, bridge.window = 100*time.Millisecond, 500*time.Millisecond
	rest.warmup, rest.window = 0, 300*time.Millisecond
	for _, tc := range []struct {
		s *bridgeVsREST
		c int
	}{{bridge, 4}, {rest, 1}} {
		r := tc.s.closedLoop(tc.c, "smoke-"+tc.s.name)
		if r.reqs == 0 || r.errors != 0 || len(r.latencies) != int(r.reqs) || r.calls == 0 {
			t.Errorf("%s: %d answered in the window, %d errors, %d latencies, %d calls", tc.s.name, r.reqs, r.errors, len(r.latencies), r.calls)
		}
	}
	if !bridge.app.db.Bridge() || rest.app.db.Bridge() {
		t.Error("the sides' clients are not what they should be")
	}
}
