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
// today's.
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

// vsSpecCell runs one cell of the side-by-side: d1idem (its group commit
// configured by co) and the spec's sequence, each on its own database of
// one d1local with latency per call, c concurrent callers. Each iteration
// runs vsSpecRounds(c) rounds of max(100, 4c) requests of each, taking
// turns, so that a drift of the machine weighs on both alike. It reports
// p50/p99 of both over all rounds and their ratios (d1idem / naive), each
// with its 95 % bootstrap interval (p50-ratio-lo and -hi: see
// ratioIntervals), and D1 calls per request of both.
func vsSpecCell(b *testing.B, latency time.Duration, c int, co d1client.CoalesceConfig) {
	d1 := startD1(b, 0, false)
	ours, naive := newSideBySide(b, d1, c, co)
	// Warm up at the latency measured: connections, statement
	// caches, the first sweep, and group commit's estimate of
	// a round trip, which a running service has.
	d1.latency.Store(int64(latency))
	for _, impl := range []sideBySide{ours, naive} {
		if _, err := closedLoop(impl, c, c, "warm"); err != nil {
			b.Fatal(err)
		}
	}
	n := max(100, 4*c)
	var roundsOurs, roundsNaive [][]time.Duration
	var callsOurs, callsNaive int64
	b.ResetTimer()
	rounds := vsSpecRounds(c)
	for i := 0; i < b.N*rounds; i++ {
		for _, impl := range []struct {
			sideBySide
			rounds *[][]time.Duration
			calls  *int64
		}{{ours, &roundsOurs, &callsOurs}, {naive, &roundsNaive, &callsNaive}} {
			before := impl.db.Stats().Calls
			lat, err := closedLoop(impl.sideBySide, c, n, fmt.Sprintf("run%d", i))
			if err != nil {
				b.Fatal(err)
			}
			*impl.rounds = append(*impl.rounds, lat)
			*impl.calls += impl.db.Stats().Calls - before
		}
	}
	b.StopTimer()
	total := float64(b.N * rounds * n)
	latOurs, latNaive := slices.Concat(roundsOurs...), slices.Concat(roundsNaive...)
	p50o, p99o := percentile(latOurs, 0.50), percentile(latOurs, 0.99)
	p50n, p99n := percentile(latNaive, 0.50), percentile(latNaive, 0.99)
	b.ReportMetric(ms(p50o), "p50-ms")
	b.ReportMetric(ms(p99o), "p99-ms")
	b.ReportMetric(ms(p50n), "naive-p50-ms")
	b.ReportMetric(ms(p99n), "naive-p99-ms")
	b.ReportMetric(float64(p50o)/float64(p50n), "p50-ratio")
	b.ReportMetric(float64(p99o)/float64(p99n), "p99-ratio")
	in50, in99 := ratioIntervals(roundsOurs, roundsNaive)
	b.ReportMetric(in50[0], "p50-ratio-lo")
	b.ReportMetric(in50[1], "p50-ratio-hi")
	b.ReportMetric(in99[0], "p99-ratio-lo")
	b.ReportMetric(in99[1], "p99-ratio-hi")
	b.ReportMetric(float64(callsOurs)/total, "d1-calls/req")
	b.ReportMetric(float64(callsNaive)/total, "naive-d1-calls/req")
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
