package idemhttp_test

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1client/budget"
	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/idem/idemhttp"
	"github.com/d1idem/d1idem/internal/d1test"
)

// loadSpec is an open-loop load through the middleware, in fake time:
// requests of fresh keys at Rate per second for Duration, each handler
// taking Handler (or HandlerOf(i) for the i-th request), on Ledgers ledgers
// (a D1 client each) sharing one budget.Account of Budget, every D1 call
// taking Latency. With Account, d1local plays the account's API limit too,
// the same number of calls per window, with its Ratelimit headers and 971
// blocks.
type loadSpec struct {
	Rate      float64
	Duration  time.Duration
	TTL       time.Duration
	LedgerTTL time.Duration // if set, the ledger's Config.TTL, and TTL the route's (Options.TTL)
	Handler   time.Duration
	HandlerOf func(i int) time.Duration
	Budget    budget.Budget
	Account   bool
	Ledgers   int
	Latency   time.Duration
	Coalesce  d1client.CoalesceConfig // the ledgers' clients' group commit
}

func (s loadSpec) String() string {
	return fmt.Sprintf("rate=%g/s duration=%v ttl=%v ledger_ttl=%v handler=%v budget=%q burst=%d account=%v ledgers=%d latency=%v",
		s.Rate, s.Duration, s.TTL, s.LedgerTTL, s.Handler, s.Budget.String(), s.Budget.Burst(), s.Account, s.Ledgers, s.Latency)
}

// loadResult is what an open-loop load came to.
type loadResult struct {
	Requests, Answered, Shed, Other int
	Executed                        int             // keys whose handler ran
	Lost                            int             // executed keys whose row is not completed once every answer came
	Second                          int             // keys whose handler ran more than once
	NoRetryAfter                    int             // budget refusals without a Retry-After
	Errors                          []string        // the first line logged of each message
	Busy                            int             // 503 idempotency_ledger_busy
	Latencies, Refusals             []time.Duration // of the 201 and 503 answers, from their start
}

// runLoad runs spec inside the calling synctest bubble and waits for every
// answer; then the keys answered 201 whose row is not completed, and a
// sample of the others, are sent again after their TTL, on a replica
// outside the load's budget, until answered: each must be replayed (a
// completion lost to the budget shows as a second execution there).
func runLoad(t *testing.T, spec loadSpec) loadResult {
	t.Helper()
	lc := d1local.Config{Faults: func(d1local.Request) d1local.Fault { return d1local.Fault{Latency: spec.Latency} }}
	if spec.Account {
		lc.RateLimit = d1local.RateLimit{Limit: spec.Budget.Calls(), Window: spec.Budget.Per()}
	}
	b := d1test.InProcess(t, lc)
	admin := b.NewClientSchema(t)
	if spec.Account {
		// The load starts in a window of its own: the schema's call, in the
		// first, would look like another process spending.
		time.Sleep(spec.Budget.Per() + time.Second)
	}
	acct, err := budget.NewAccount(spec.Budget)
	if err != nil {
		t.Fatal(err)
	}
	var logMu sync.Mutex
	var logs bytes.Buffer
	cfg := idem.Config{TTL: cmp.Or(spec.LedgerTTL, spec.TTL), Clock: time.Now,
		Logger: slog.New(slog.NewTextHandler(lockedWriter{&logMu, &logs}, &slog.HandlerOptions{Level: slog.LevelError}))}
	var mu sync.Mutex
	execs := map[string]int{}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get(idemhttp.HeaderKey)
		mu.Lock()
		execs[key]++
		mu.Unlock()
		d := spec.Handler
		if spec.HandlerOf != nil {
			var i int
			fmt.Sscanf(key, "k%d", &i)
			d = spec.HandlerOf(i)
		}
		time.Sleep(d)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"created":true}`))
	})
	opts := idemhttp.Options{Principal: func(*http.Request) (string, error) { return "acct_1", nil }}
	if spec.LedgerTTL != 0 {
		opts.TTL = spec.TTL
	}
	var servers []http.Handler
	for range max(spec.Ledgers, 1) {
		db := b.Database(admin.DatabaseID()).Client(t, func(c *d1client.Config) {
			c.Budget, c.Account, c.Coalesce = budget.Budget{}, acct, spec.Coalesce
		})
		servers = append(servers, idemhttp.Must(newLedger(t, db, cfg), opts)(handler))
	}
	type answer struct {
		code              int
		error, retryAfter string
		took              time.Duration
	}
	serve := func(h http.Handler, key string) answer {
		start := time.Now()
		req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{"sku":"a"}`))
		req.Header.Set(idemhttp.HeaderKey, key)
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		var body struct{ Error string }
		_ = json.Unmarshal(rec.Body.Bytes(), &body)
		return answer{rec.Code, body.Error, rec.Header().Get("Retry-After"), time.Since(start)}
	}

	n := int(spec.Rate * spec.Duration.Seconds())
	answers := make([]answer, n)
	start := time.Now()
	var wg sync.WaitGroup
	for i := range n {
		time.Sleep(time.Until(start.Add(time.Duration(float64(i) / spec.Rate * float64(time.Second)))))
		wg.Go(func() { answers[i] = serve(servers[i%len(servers)], fmt.Sprintf("k%d", i)) })
	}
	wg.Wait()
	res := loadResult{Requests: n}
	for _, a := range answers {
		switch a.code {
		case http.StatusCreated:
			res.Answered++
			res.Latencies = append(res.Latencies, a.took)
		case http.StatusServiceUnavailable:
			res.Shed++
			res.Refusals = append(res.Refusals, a.took)
			if a.error == idemhttp.CodeLedgerBusy {
				res.Busy++
			}
			if a.retryAfter == "" {
				res.NoRetryAfter++
			}
		default:
			res.Other++
		}
	}
	// What follows is outside the load's budget; where d1local plays the
	// account, it waits for a window of its own and paces itself.
	after := admin
	if spec.Account {
		time.Sleep(spec.Budget.Per() + time.Second)
		after = b.Database(admin.DatabaseID()).Client(t, func(c *d1client.Config) { c.Budget = spec.Budget })
	}
	rows, err := after.Query(context.Background(), "SELECT key FROM idempotency_keys WHERE status = 'completed'")
	if err != nil {
		t.Fatal(err)
	}
	completed := map[string]bool{}
	for _, r := range rows.Rows {
		completed[r[0].String()] = true
	}
	mu.Lock()
	for k := range execs {
		res.Executed++
		if !completed[k] {
			res.Lost++
		}
	}
	mu.Unlock()

	time.Sleep(spec.TTL + time.Second)
	replica := idemhttp.Must(newLedger(t, after, cfg), opts)(handler)
	for i, a := range answers {
		// Only a key whose row is not completed can run again: those, and
		// a sample of the others.
		if a.code == http.StatusCreated && (!completed[fmt.Sprintf("k%d", i)] || i%16 == 0) {
			wg.Go(func() {
				// Until the replica's budget lets the replay through.
				for range 100 {
					if serve(replica, fmt.Sprintf("k%d", i)).code != http.StatusServiceUnavailable {
						return
					}
					time.Sleep(time.Second)
				}
				t.Errorf("k%d: the replay was refused 100 times", i)
			})
		}
	}
	wg.Wait()
	mu.Lock()
	for _, e := range execs {
		if e > 1 {
			res.Second++
		}
	}
	mu.Unlock()
	time.Sleep(time.Minute) // the batchers' runners go idle
	logMu.Lock()
	seen := map[string]bool{} // the first line of each message
	for line := range strings.Lines(logs.String()) {
		_, msg, _ := strings.Cut(line, " msg=")
		msg, _, _ = strings.Cut(msg, " principal_sha256=")
		if !seen[msg] {
			seen[msg] = true
			res.Errors = append(res.Errors, line)
		}
	}
	logMu.Unlock()
	return res
}

// checkOwed fails t unless no completion was lost, no key ran twice, and
// every budget refusal said when to retry.
func checkOwed(t *testing.T, spec loadSpec, r loadResult) {
	t.Helper()
	t.Logf("%v: %d requests: %d answered 201, %d refused 503, %d other; %d executed, %d completions lost, %d executed twice",
		spec, r.Requests, r.Answered, r.Shed, r.Other, r.Executed, r.Lost, r.Second)
	if r.Lost > 0 || r.Second > 0 || r.NoRetryAfter > 0 || r.Other > 0 {
		t.Errorf("%v:\n%d requests: %d answered 201, %d refused 503 (%d without Retry-After), %d other; %d executed, %d completions lost, %d executed twice\n%s",
			spec, r.Requests, r.Answered, r.Shed, r.NoRetryAfter, r.Other, r.Executed, r.Lost, r.Second, strings.Join(r.Errors, ""))
	}
}

var (
	budgetSeed = flag.Uint64("budget.seed", 0, "seed of TestBudgetOwesWhatItAdmits (0: a random one, logged)")
	budgetRun  = flag.Int("budget.run", -1, "with -budget.seed, replay only this run of TestBudgetOwesWhatItAdmits")
	budgetLong = flag.Bool("budget.long", false, "TestBudgetOwesWhatItAdmits: 200 runs of up to 3000 requests instead of 12 of up to 150")
)

// randomLoad draws run i of seed's loads: 1 to 1,000 requests per second
// (log-uniform), a TTL from 10 ms to 30 s, handlers of up to the TTL, a
// budget from the smallest allowed (2 calls) to the default, paced from
// 100 calls a second to one every 10 s, which d1local plays as the
// account's limit too in a third of the runs (in windows of 30 s or more),
// and 1 to 3 ledgers sharing its account; at most maxRequests requests.
func randomLoad(seed uint64, i, maxRequests int) loadSpec {
	rng := rand.New(rand.NewPCG(seed, uint64(i)))
	logUniform := func(lo, hi float64) float64 { return lo * math.Pow(hi/lo, rng.Float64()) }
	s := loadSpec{
		Rate:    math.Round(logUniform(1, 1000)),
		TTL:     time.Duration(logUniform(float64(10*time.Millisecond), float64(30*time.Second))).Round(time.Millisecond),
		Ledgers: 1 + rng.IntN(3),
		Latency: time.Duration(5+rng.IntN(46)) * time.Millisecond,
	}
	// Each handler takes up to share of the TTL, drawn per request.
	share, hs := rng.Float64(), rng.Uint64()
	s.HandlerOf = func(k int) time.Duration {
		r := rand.New(rand.NewPCG(hs, uint64(k)))
		return time.Duration(r.Float64() * share * float64(s.TTL)).Round(time.Millisecond)
	}
	s.Handler = time.Duration(share * float64(s.TTL)).Round(time.Millisecond) // the longest, for the record
	s.Duration = time.Duration(float64(maxRequests) / s.Rate * float64(time.Second))
	s.Duration = min(s.Duration, 10*time.Minute)
	if rng.IntN(4) == 0 {
		s.Budget = budget.Budget{} // Cloudflare's default
	} else {
		calls := int(math.Round(logUniform(2, 1200)))
		per := time.Duration(float64(calls) * logUniform(float64(10*time.Millisecond), float64(10*time.Second)))
		s.Budget = budget.New(calls, min(max(per, time.Millisecond), 24*time.Hour))
		if s.Account = rng.IntN(3) == 0; s.Account {
			// Cloudflare's window is 300 s; its headers say whole seconds.
			s.Budget = budget.New(calls, min(max(per, 30*time.Second), 24*time.Hour).Round(time.Second))
		}
		if rng.IntN(3) == 0 {
			s.Budget = s.Budget.WithBurst(1 + rng.IntN(min(calls, 20)))
		}
	}
	if rng.IntN(3) == 0 {
		s.LedgerTTL = 30 * time.Second // the TTL is the route's (Options.TTL)
	}
	return s
}

// The budget owes what it admits: whatever the load, the TTL, the handlers'
// times, the budget and the ledgers sharing it, no completion of a handler
// that ran is lost to the budget, and no key answered 201 runs twice (each
// is sent again after its TTL, and must be replayed); claims the budget
// cannot keep calls for are turned away with 503 and a Retry-After. Each
// run is in fake time; a failing one prints its seed, its number and its
// parameters. -budget.long runs more and longer loads.
func TestBudgetOwesWhatItAdmits(t *testing.T) {
	t.Parallel()
	seed := *budgetSeed
	if seed == 0 {
		seed = rand.Uint64() >> 1
	}
	runs, maxRequests := 12, 150
	if *budgetLong {
		runs, maxRequests = 200, 3000
	}
	t.Logf("seed %d (rerun with -budget.seed=%d)", seed, seed)
	var total loadResult
	for i := range runs {
		if *budgetRun >= 0 && i != *budgetRun {
			continue
		}
		spec := randomLoad(seed, i, maxRequests)
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := runLoad(t, spec)
				if r.Lost > 0 || r.Second > 0 || r.NoRetryAfter > 0 || r.Other > 0 {
					t.Errorf("replay with: go test ./idem/idemhttp -run 'TestBudgetOwesWhatItAdmits' -budget.seed=%d -budget.run=%d -budget.long=%v", seed, i, *budgetLong)
				}
				checkOwed(t, spec, r)
				total.Requests += r.Requests
				total.Answered += r.Answered
				total.Shed += r.Shed
				total.Executed += r.Executed
				total.Lost += r.Lost
				total.Second += r.Second
			})
		})
	}
	t.Logf("BUDGET SUMMARY seed=%d runs=%d requests=%d answered=%d refused=%d executed=%d completions_lost=%d second_executions=%d",
		seed, runs, total.Requests, total.Answered, total.Shed, total.Executed, total.Lost, total.Second)
}
