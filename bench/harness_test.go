package bench

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1client/budget"
	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/idem/idemhttp"
	"github.com/d1idem/d1idem/internal/d1test"
)

// Flags of the long forms (make bench-budget).
var (
	longForm = flag.Bool("bench.long", false,
		"run the long forms: open-loop load at 20, 150 and 400 req/s and four replica processes, each for -bench.duration (default 600 s)")
	loadDuration = flag.Duration("bench.duration", 0,
		"length of each open-loop run; 0 means 60 s, or 600 s with -bench.long")
	loadRates = flag.String("bench.rates", "",
		"BenchmarkOpenLoop: comma-separated rates (first executions per second) to run instead of its own")
	vsSpecInFlight = flag.Int("bench.vsspec-inflight", 0,
		"BenchmarkVsSpec: with N > 0, d1idem's group commit never waits (Coalesce.Window -1) and keeps up to N calls in flight, spending calls for latency")
)

// accountWindow is the window of Cloudflare's API budget (1200 calls per
// 300 s per account): the peak D1 calls in any such window is what the
// account's budget judges.
const accountWindow = 300 * time.Second

// runLength is the length of one open-loop run.
func runLength() time.Duration {
	switch {
	case *loadDuration > 0:
		return *loadDuration
	case *longForm:
		return 600 * time.Second
	default:
		return 60 * time.Second
	}
}

// newClient is the one place this package's budget, replica and
// side-by-side benchmarks build a d1client: with Cloudflare's default budget
// (1200 calls per 300 s, not shrunk) or with none. The other benchmarks
// (bench_test.go) get theirs from d1test.
func newClient(baseURL, databaseID string, hc *http.Client, defaultBudget bool) (*d1client.Client, error) {
	return d1client.New(clientConfig(baseURL, databaseID, hc, defaultBudget))
}

// clientConfig is newClient's configuration.
func clientConfig(baseURL, databaseID string, hc *http.Client, defaultBudget bool) d1client.Config {
	cfg := d1client.Config{BaseURL: baseURL, AccountID: d1test.AccountID, DatabaseID: databaseID, HTTPClient: hc}
	cfg.Budget = budget.Unlimited()
	if defaultBudget {
		cfg.Budget = budget.Budget{} // the zero Budget is Cloudflare's default
	}
	return cfg
}

// poolClient returns an HTTP client that keeps up to n idle connections per
// host, so that n concurrent callers reuse their connections.
func poolClient(n int) *http.Client {
	return &http.Client{Transport: &http.Transport{
		Proxy:               nil,
		MaxIdleConns:        n,
		MaxIdleConnsPerHost: n,
		IdleConnTimeout:     90 * time.Second,
	}}
}

// d1Server is d1local in process, served over loopback HTTP, with a latency
// injected in every D1 call and every call's arrival and answer observed.
type d1Server struct {
	*d1local.Server
	URL     string
	latency atomic.Int64 // ns slept before each call

	mu       sync.Mutex
	arrivals []time.Time    // every D1 call's arrival since the last reset, in order
	statuses map[string]int // "200", "429/971", ... -> answers
	policies int            // answers carrying a Ratelimit-Policy header
}

// localConfig is the d1local configuration of the benchmarks' D1. account
// asks for d1local to play the Cloudflare account's API budget (1200 calls
// per 300 s across every client, Ratelimit headers, 429/971 blocks); the
// replica runs ask for it (the replica row of the figures is judged on its
// own: see d1Server.accountBudget).
func localConfig(faults d1local.FaultFunc, account bool) d1local.Config {
	cfg := d1local.Config{Faults: faults}
	if account {
		cfg.RateLimit = d1local.CloudflareRateLimit()
	}
	return cfg
}

// startD1 starts a d1Server with latency per call, playing the account's
// budget if account is set (see localConfig); it is closed when tb ends.
func startD1(tb testing.TB, latency time.Duration, account bool) *d1Server {
	tb.Helper()
	s := &d1Server{statuses: map[string]int{}}
	s.latency.Store(int64(latency))
	local, err := d1local.New(localConfig(func(d1local.Request) d1local.Fault {
		return d1local.Fault{Latency: time.Duration(s.latency.Load())}
	}, account))
	if err != nil {
		tb.Fatal(err)
	}
	s.Server = local
	ts := httptest.NewServer(http.HandlerFunc(s.serve))
	s.URL = ts.URL
	tb.Cleanup(func() {
		ts.Close()
		if err := local.Close(); err != nil {
			tb.Errorf("closing d1local: %v", err)
		}
	})
	return s
}

func (s *d1Server) serve(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.arrivals = append(s.arrivals, time.Now())
	s.mu.Unlock()
	rec := &statusRecorder{ResponseWriter: w}
	s.Server.ServeHTTP(rec, r)
	key := strconv.Itoa(rec.status)
	if rec.status == http.StatusTooManyRequests {
		var env struct {
			Errors []struct{ Code int } `json:"errors"`
		}
		if json.Unmarshal(rec.head.Bytes(), &env) == nil && len(env.Errors) > 0 {
			key += "/" + strconv.Itoa(env.Errors[0].Code)
		}
	}
	s.mu.Lock()
	s.statuses[key]++
	if rec.Header().Get("Ratelimit-Policy") != "" {
		s.policies++
	}
	s.mu.Unlock()
}

// reset forgets the calls seen so far, so that peakWindow and the answer
// counts cover what follows (the load, not the setup).
func (s *d1Server) reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.arrivals = nil
	s.statuses = map[string]int{}
	s.policies = 0
}

// accountBudget reports whether d1local plays the account's API budget: its
// answers carry Cloudflare's Ratelimit-Policy header.
func (s *d1Server) accountBudget() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.policies > 0
}

// answers returns how many calls were answered with key ("200", "429/971").
func (s *d1Server) answers(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.statuses[key]
}

// peakWindow returns the most D1 calls that arrived within any window of
// length per: what Cloudflare's account budget would judge.
func (s *d1Server) peakWindow(per time.Duration) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	peak, lo := 0, 0
	for hi, t := range s.arrivals {
		for t.Sub(s.arrivals[lo]) >= per {
			lo++
		}
		peak = max(peak, hi-lo+1)
	}
	return peak
}

// statusRecorder keeps the status and the first bytes of a response.
type statusRecorder struct {
	http.ResponseWriter
	status int
	head   bytes.Buffer
}

func (r *statusRecorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Write(p []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	if n := 4096 - r.head.Len(); n > 0 {
		r.head.Write(p[:min(n, len(p))])
	}
	return r.ResponseWriter.Write(p)
}

// newDatabase returns a fresh database ID on s with the ledger's schema,
// applied through a client without a budget.
func newDatabase(tb testing.TB, s *d1Server) string {
	tb.Helper()
	id := randomID()
	c, err := newClient(s.URL, id, nil, false)
	if err != nil {
		tb.Fatal(err)
	}
	d1test.ApplySchema(tb, c)
	return id
}

// randomID returns a random D1-style database UUID.
func randomID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// ledgerRows counts the ledger's rows by status, through a client without a
// budget (one D1 call).
func ledgerRows(ctx context.Context, baseURL, databaseID string) (map[string]int64, error) {
	c, err := newClient(baseURL, databaseID, nil, false)
	if err != nil {
		return nil, err
	}
	res, err := c.Query(ctx, `SELECT status, count(*) FROM idempotency_keys GROUP BY status`)
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for _, row := range res.Rows {
		st, _ := row[0].Text()
		n, _ := row[1].Int64()
		out[st] = n
	}
	return out, nil
}

// app is the service under load: a business handler behind the full
// middleware, its ledger on a d1client with the default budget.
type app struct {
	db       *d1client.Client
	executed atomic.Int64 // handler executions
}

// newApp builds the service's handler on the database databaseID at baseURL,
// its client's configuration adjusted by mods.
func newApp(baseURL, databaseID string, mods ...func(*d1client.Config)) (*app, http.Handler, error) {
	cfg := clientConfig(baseURL, databaseID, poolClient(64), true)
	for _, m := range mods {
		m(&cfg)
	}
	db, err := d1client.New(cfg)
	if err != nil {
		return nil, nil, err
	}
	return newAppOn(db)
}

// newAppOn builds the service's handler on the client db. Besides POST
// /v1/orders behind the middleware, it serves the same handler bare on
// POST /v1/bare, for the latency the middleware adds.
func newAppOn(db *d1client.Client) (*app, http.Handler, error) {
	l, err := idem.New(db, idem.Config{})
	if err != nil {
		return nil, nil, err
	}
	a := &app{db: db}
	orders := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		a.executed.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%q,"status":"created"}`, r.Header.Get(idemhttp.HeaderKey))
	})
	mw := idemhttp.Must(l, idemhttp.Options{Principal: func(r *http.Request) (string, error) {
		return r.Header.Get("X-Principal"), nil
	}})
	mux := http.NewServeMux()
	mux.Handle("POST /v1/orders", mw(orders))
	mux.Handle("POST /v1/bare", orders)
	mux.HandleFunc("GET /stats", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(appStats{Executed: a.executed.Load(), Calls: db.Stats().Calls})
	})
	return a, mux, nil
}

// appStats is what an app's GET /stats answers.
type appStats struct {
	Executed int64 `json:"executed"` // handler executions
	Calls    int64 `json:"calls"`    // D1 calls its client sent
}

// body1KB is the request body of every load request.
var body1KB = bytes.Repeat([]byte("x"), 1024)

// load is the outcome of an open-loop run.
type load struct {
	sent, answered, budget, other int64
	busy                          int64           // 503 idempotency_ledger_busy: shed by group commit's queue
	latencies                     []time.Duration // of answered requests, from their scheduled start
	refusals                      []time.Duration // of 503 answers (budget, busy, unavailable), from their scheduled start
	perTarget                     []int64         // answered per target
	others                        map[string]int  // other outcomes, by status and error code
	firstBudget                   time.Duration   // from the start to the first budget 503; -1 if none
	elapsed                       time.Duration   // from the start until the last answer
}

// openLoop offers rate first executions per second for d, round robin over
// targets (base URLs serving POST /v1/orders), on a fixed schedule: request i
// starts at start + i/rate whether or not earlier ones have been answered.
// Latency counts from the scheduled start. It returns once every request has
// been answered (or has failed).
func openLoop(hc *http.Client, targets []string, rate float64, d time.Duration, prefix string) *load {
	n := int(rate * d.Seconds())
	res := &load{perTarget: make([]int64, len(targets)), others: map[string]int{}, firstBudget: -1}
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	for i := 0; i < n; i++ {
		at := start.Add(time.Duration(float64(i) / rate * float64(time.Second)))
		if wait := time.Until(at); wait > 0 {
			time.Sleep(wait)
		}
		wg.Add(1)
		go func(i int, at time.Time) {
			defer wg.Done()
			target := i % len(targets)
			outcome, ok := post(hc, targets[target], fmt.Sprintf("%s-%d", prefix, i), fmt.Sprintf("principal-%d", i%8))
			took := time.Since(at)
			mu.Lock()
			defer mu.Unlock()
			if strings.HasPrefix(outcome, "503 ") {
				res.refusals = append(res.refusals, took)
			}
			switch {
			case ok:
				res.answered++
				res.perTarget[target]++
				res.latencies = append(res.latencies, took)
			case outcome == "503 "+idemhttp.CodeLedgerBusy:
				res.busy++
			case outcome == "503 "+idemhttp.CodeBudgetExhausted:
				res.budget++
				if since := at.Sub(start); res.firstBudget < 0 || since < res.firstBudget {
					res.firstBudget = since
				}
			default:
				res.other++
				res.others[outcome]++
			}
		}(i, at)
	}
	res.sent = int64(n)
	wg.Wait()
	res.elapsed = time.Since(start)
	return res
}

// post sends one first execution and says whether it was answered 2xx, and
// otherwise what came back ("503 idempotency_budget_exhausted", "transport").
func post(hc *http.Client, target, key, principal string) (string, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target+"/v1/orders", bytes.NewReader(body1KB))
	if err != nil {
		return "request: " + err.Error(), false
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(idemhttp.HeaderKey, key)
	req.Header.Set("X-Principal", principal)
	res, err := hc.Do(req)
	if err != nil {
		return "transport", false
	}
	defer res.Body.Close()
	data, _ := io.ReadAll(res.Body)
	if res.StatusCode/100 == 2 {
		return strconv.Itoa(res.StatusCode), true
	}
	var e struct{ Error string }
	_ = json.Unmarshal(data, &e)
	return strings.TrimSpace(strconv.Itoa(res.StatusCode) + " " + e.Error), false
}

// summary formats the other outcomes for a log line.
func (l *load) summary() string {
	var parts []string
	for k, v := range l.others {
		parts = append(parts, fmt.Sprintf("%s: %d", k, v))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

// ms is d in milliseconds.
func ms(d time.Duration) float64 { return float64(d) / 1e6 }

// b2f is 1 for true and 0 for false, for a metric.
func b2f(v bool) float64 {
	if v {
		return 1
	}
	return 0
}
