package bench

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/internal/specseq"
)

// sideBySide is one implementation of a first execution (round trips 1 and
// 2) on its own database of a shared d1local.
type sideBySide struct {
	db      *d1client.Client
	request func(key string) error
}

// newSideBySide returns d1idem's ledger, its group commit configured by co,
// and the spec's literal sequence, each on a fresh database of d1, with
// clients without a budget.
func newSideBySide(tb testing.TB, d1 *d1Server, conns int, co d1client.CoalesceConfig) (ours, naive sideBySide) {
	tb.Helper()
	mk := func(coalesce d1client.CoalesceConfig) *d1client.Client {
		cfg := clientConfig(d1.URL, newDatabase(tb, d1), poolClient(conns), false)
		cfg.Coalesce = coalesce
		c, err := d1client.New(cfg)
		if err != nil {
			tb.Fatal(err)
		}
		return c
	}
	ours.db = mk(co)
	l, err := idem.New(ours.db, idem.Config{Heartbeat: -1})
	if err != nil {
		tb.Fatal(err)
	}
	ours.request = func(key string) error {
		d, err := l.Begin(ctx, "p", key, "fp")
		if err != nil {
			return err
		}
		if d.Outcome != idem.Execute {
			return fmt.Errorf("%s: outcome %v, want execute", key, d.Outcome)
		}
		_, err = l.Complete(ctx, d.Reservation, okResponse)
		return err
	}
	naive.db = mk(d1client.CoalesceConfig{})
	naive.request = func(key string) error {
		o, err := specseq.Begin(ctx, naive.db, "p", key, "fp", time.Now(), idem.DefaultTTL)
		if err != nil {
			return err
		}
		if !strings.HasPrefix(o.Text, "execute") {
			return fmt.Errorf("%s: outcome %s, want execute", key, o.Text)
		}
		stored, err := specseq.CompleteRow(ctx, naive.db, "p", key, o.Generation, 201, `{"id":"ord_1"}`, `{"content-type":"application/json"}`, time.Now())
		if err == nil && !stored {
			err = fmt.Errorf("%s: completion not stored", key)
		}
		return err
	}
	return ours, naive
}

// closedLoop runs n first executions of impl with c concurrent callers, each
// starting its next request when its last one returns, and returns each
// request's latency.
func closedLoop(impl sideBySide, c, n int, prefix string) ([]time.Duration, error) {
	lat := make([]time.Duration, n)
	var next atomic.Int64
	var failed atomic.Value
	var wg sync.WaitGroup
	for range c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				t0 := time.Now()
				if err := impl.request(fmt.Sprintf("%s-%d", prefix, i)); err != nil {
					failed.Store(err)
					return
				}
				lat[i] = time.Since(t0)
			}
		}()
	}
	wg.Wait()
	if err, ok := failed.Load().(error); ok {
		return nil, err
	}
	return lat, nil
}

// BenchmarkVsSpec: d1idem's first execution (Begin and Complete through
// group commit) side by side with the spec's literal statement sequence
// (internal/specseq: claim, then completion, one D1 call each) at
// concurrency 1, 8, 64 and 256, with 20 ms and 50 ms injected per D1 call
// and no budget. Each cell is a vsSpecCell.
// Targets: both ratios at most 1; d1idem's calls per request no more than
// the baseline of tools/benchtable.
//
// With -bench.vsspec-inflight N, d1idem's group commit never waits and keeps
// up to N calls in flight: how much latency spending calls buys.
func BenchmarkVsSpec(b *testing.B) {
	var co d1client.CoalesceConfig
	if n := *vsSpecInFlight; n > 0 {
		co = d1client.CoalesceConfig{Window: -1, MaxInFlight: n}
	}
	for _, latency := range []time.Duration{20 * time.Millisecond, 50 * time.Millisecond} {
		for _, c := range []int{1, 8, 64, 256} {
			b.Run(fmt.Sprintf("rtt=%s/c=%d", latency, c), func(b *testing.B) {
				vsSpecCell(b, latency, c, co)
			})
		}
	}
}

// BenchmarkCallsVsLatency: the p50 of BenchmarkVsSpec's concurrency-256,
// 50 ms cell against the D1 calls group commit spends, with its calls
// bounded to fewer statements and more of them in flight than by default
// (MaxStatements x MaxInFlight; it waits for returning callers as by
// default). Each configuration is a vsSpecCell. The default configuration
// is BenchmarkVsSpec's own cell; these say what a lower p50 would cost in
// calls per request.
func BenchmarkCallsVsLatency(b *testing.B) {
	for _, co := range []d1client.CoalesceConfig{
		{MaxStatements: 128, MaxInFlight: 8},
		{MaxStatements: 64, MaxInFlight: 16},
		{MaxStatements: 32, MaxInFlight: 64},
	} {
		b.Run(fmt.Sprintf("cap=%dx%d", co.MaxStatements, co.MaxInFlight), func(b *testing.B) {
			vsSpecCell(b, 50*time.Millisecond, 256, co)
		})
	}
}

// vsSpecCell runs one cell of the side-by-side (see sideBySideRounds) for
// vsSpecRounds(c) rounds per iteration of max(100, 4c) requests each, and
// reports p50/p99 of both sides over all rounds and their ratios (d1idem /
// naive), each with its 95 % bootstrap interval (p50-ratio-lo and -hi: see
// ratioIntervals), and D1 calls per request of both.
func vsSpecCell(b *testing.B, latency time.Duration, c int, co d1client.CoalesceConfig) {
	ours, naive := warmSideBySide(b, latency, c, co)
	n := max(100, 4*c)
	b.ResetTimer()
	r := sideBySideRounds(b, ours, naive, c, b.N*vsSpecRounds(c), n)
	b.StopTimer()
	total := float64(len(r.ours) * n)
	latOurs, latNaive := slices.Concat(r.ours...), slices.Concat(r.naive...)
	p50o, p99o := percentile(latOurs, 0.50), percentile(latOurs, 0.99)
	p50n, p99n := percentile(latNaive, 0.50), percentile(latNaive, 0.99)
	b.ReportMetric(ms(p50o), "p50-ms")
	b.ReportMetric(ms(p99o), "p99-ms")
	b.ReportMetric(ms(p50n), "naive-p50-ms")
	b.ReportMetric(ms(p99n), "naive-p99-ms")
	b.ReportMetric(float64(p50o)/float64(p50n), "p50-ratio")
	b.ReportMetric(float64(p99o)/float64(p99n), "p99-ratio")
	in50, in99 := ratioIntervals(r.ours, r.naive)
	b.ReportMetric(in50[0], "p50-ratio-lo")
	b.ReportMetric(in50[1], "p50-ratio-hi")
	b.ReportMetric(in99[0], "p99-ratio-lo")
	b.ReportMetric(in99[1], "p99-ratio-hi")
	b.ReportMetric(float64(r.callsOurs)/total, "d1-calls/req")
	b.ReportMetric(float64(r.callsNaive)/total, "naive-d1-calls/req")
}

// warmSideBySide returns d1idem (its group commit configured by co) and
// the spec's sequence on one d1local with latency per call, each warmed
// up by c requests from c concurrent callers at that latency:
// connections, statement caches, the first sweep, and group commit's
// estimate of a round trip, which a running service has.
func warmSideBySide(tb testing.TB, latency time.Duration, c int, co d1client.CoalesceConfig) (ours, naive sideBySide) {
	tb.Helper()
	d1 := startD1(tb, 0, false)
	ours, naive = newSideBySide(tb, d1, c, co)
	d1.latency.Store(int64(latency))
	for _, impl := range []sideBySide{ours, naive} {
		if _, err := closedLoop(impl, c, c, "warm"); err != nil {
			tb.Fatal(err)
		}
	}
	return ours, naive
}

// sideBySideResult is the latencies of each round of both sides, and the
// D1 calls each made in them.
type sideBySideResult struct {
	ours, naive           [][]time.Duration
	callsOurs, callsNaive int64
}

// sideBySideRounds runs rounds rounds of n first executions of each side
// with c concurrent callers, the sides taking turns, so that a drift of
// the machine weighs on both alike.
func sideBySideRounds(tb testing.TB, ours, naive sideBySide, c, rounds, n int) sideBySideResult {
	tb.Helper()
	var r sideBySideResult
	for i := range rounds {
		for _, impl := range []struct {
			sideBySide
			rounds *[][]time.Duration
			calls  *int64
		}{{ours, &r.ours, &r.callsOurs}, {naive, &r.naive, &r.callsNaive}} {
			before := impl.db.Stats().Calls
			lat, err := closedLoop(impl.sideBySide, c, n, fmt.Sprintf("run%d", i))
			if err != nil {
				tb.Fatal(err)
			}
			*impl.rounds = append(*impl.rounds, lat)
			*impl.calls += impl.db.Stats().Calls - before
		}
	}
	return r
}

// vsSpecRounds is how many turns each side of BenchmarkVsSpec takes per
// iteration at concurrency c. A round at concurrency 1 or 8 is long (100
// requests one after another, or 8 at a time) and its p50 steady: three do.
// At 64 and 256 a round is half a second, each client's four requests, and
// how a round's requests happen to share calls moves its p50 by several
// percent either way, on both sides: twelve rounds narrow the ratio's
// spread from run to run.
func vsSpecRounds(c int) int {
	if c <= 8 {
		return 3
	}
	return 12
}

// TestSideBySideSmoke runs the side-by-side of BenchmarkVsSpec and
// BenchmarkCallsVsLatency briefly: every request of both sides executes
// and completes in every round, the spec's sequence makes exactly two
// calls per first execution, and the bound given to group commit holds:
// with at most 8 statements a call, the 3 statements of a first execution
// (claim, lookup, completion) take at least 3/8 of a call.
func TestSideBySideSmoke(t *testing.T) {
	const c, rounds, n, maxStmts = 8, 2, 40, 8
	ours, naive := warmSideBySide(t, time.Millisecond, c, d1client.CoalesceConfig{MaxStatements: maxStmts, MaxInFlight: 16})
	r := sideBySideRounds(t, ours, naive, c, rounds, n)
	for side, lat := range map[string][][]time.Duration{"d1idem": r.ours, "naive": r.naive} {
		if len(lat) != rounds {
			t.Fatalf("%s: %d rounds, want %d", side, len(lat), rounds)
		}
		for i, round := range lat {
			if len(round) != n || slices.Contains(round, 0) {
				t.Errorf("%s, round %d: %d latencies, some missing: %v", side, i, len(round), round)
			}
		}
	}
	total := int64(rounds * n)
	if r.callsNaive != 2*total {
		t.Errorf("naive: %d calls for %d first executions, want 2 each", r.callsNaive, total)
	}
	if r.callsOurs*maxStmts < 3*total {
		t.Errorf("d1idem: %d calls for %d first executions of 3 statements, at most %d a call", r.callsOurs, total, maxStmts)
	}
}
