// Command benchtable reads `go test -bench` output and prints one table of
// every benchmark, with the machine noted, followed by the project's figures,
// each beside its target. `make bench` pipes the benchmarks through it.
//
// Usage:
//
//	go test -bench . ./... | benchtable
//	benchtable [-doc docs/benchmarks.md] [-bridge docs/bridge.md] [file ...]
//
// It reads the files named (standard input when none). With -doc it also
// rewrites the figures table of that Markdown file, between the lines
// <!-- bench:begin --> and <!-- bench:end -->, so that the published
// figures are never typed by hand (make bench-figures); with -bridge, the
// table of the bridge's figures of that file (docs/bridge.md), between
// <!-- bridge-figures:begin --> and <!-- bridge-figures:end -->.
package main

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/d1idem/d1idem/internal/human"
)

// result is one benchmark line.
type result struct {
	pkg, name string
	iters     string
	metrics   []metric // in the order printed, ns/op first
}

type metric struct {
	value float64
	unit  string
}

func (r result) get(unit string) (float64, bool) {
	for _, m := range r.metrics {
		if m.unit == unit {
			return m.value, true
		}
	}
	return 0, false
}

// value is get without the ok.
func (r result) value(unit string) float64 {
	v, _ := r.get(unit)
	return v
}

var benchLine = regexp.MustCompile(`^(Benchmark\S+?)(?:-\d+)?\s+(\d+)\s+(.*)$`)

func parse(in io.Reader, echo io.Writer) (results []result, machine map[string]string, failed bool, err error) {
	machine = map[string]string{}
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	pkg := ""
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "pkg: "):
			pkg = strings.TrimPrefix(line, "pkg: github.com/d1idem/d1idem/")
		case strings.HasPrefix(line, "cpu: "), strings.HasPrefix(line, "goos: "), strings.HasPrefix(line, "goarch: "):
			k, v, _ := strings.Cut(line, ": ")
			machine[k] = strings.TrimSpace(v) // go test pads the cpu name
		case strings.HasPrefix(line, "FAIL"), strings.HasPrefix(line, "--- FAIL"), strings.HasPrefix(line, "panic:"):
			failed = true
			fmt.Fprintln(echo, line)
		}
		m := benchLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		r := result{pkg: pkg, name: strings.TrimPrefix(m[1], "Benchmark"), iters: m[2]}
		f := strings.Fields(m[3])
		for i := 0; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				continue
			}
			r.metrics = append(r.metrics, metric{v, f[i+1]})
		}
		results = append(results, r)
	}
	return results, machine, failed, sc.Err()
}

func format(v float64) string {
	switch {
	case v == 0:
		return "0"
	case v >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case v >= 10:
		return strings.TrimSuffix(strconv.FormatFloat(v, 'f', 1, 64), ".0")
	default:
		return strconv.FormatFloat(v, 'g', 3, 64)
	}
}

// ratioFormat formats a ratio to three decimals: near 1, as the ratios
// beside the spec's sequence are, three significant digits would round
// 1.004 to 1.
func ratioFormat(v float64) string { return strconv.FormatFloat(v, 'f', 3, 64) }

// count formats a whole number with thousands separators.
func count(v float64) string { return human.Count(int64(math.Round(v))) }

// join formats values separated by " / ".
func join(vs []float64, f func(float64) string) string {
	var s []string
	for _, v := range vs {
		s = append(s, f(v))
	}
	return strings.Join(s, " / ")
}

func memTotal() string {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return "?"
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return fmt.Sprintf("%.0f GiB", kb/1024/1024)
		}
	}
	return "?"
}

// row is one figure of the summary: what was measured, the measurement, and
// the target with whether it was met (ok nil: no target).
type row struct {
	what, measured, target string
	ok                     *bool
}

func (r row) mark() string {
	switch {
	case r.ok == nil:
		return ""
	case *r.ok:
		return "met"
	default:
		return "MISSED"
	}
}

func ptr(v bool) *bool { return &v }

// callsForRatio is a side-by-side cell's D1 calls per request and the p50
// ratio it bought, with the ratio's interval.
func callsForRatio(r result) string {
	s := fmt.Sprintf("%s → %s", format(r.value("d1-calls/req")), ratioFormat(r.value("p50-ratio")))
	if in, ok := r.interval("p50"); ok {
		s += " (" + in + ")"
	}
	return s
}

// interval is the 95 % interval of a side-by-side cell's ratio at
// percentile p ("p50", "p99"), as "lo–hi", if the cell reported one.
func (r result) interval(p string) (string, bool) {
	lo, okLo := r.get(p + "-ratio-lo")
	hi, okHi := r.get(p + "-ratio-hi")
	if !okLo || !okHi {
		return "", false
	}
	return ratioFormat(lo) + "–" + ratioFormat(hi), true
}

// The baselines two targets are set against: D1 calls per first execution
// no more than the baseline's, and client allocations at most half the
// baseline's. They are fixed figures of make bench, kept as constants so
// that a target does not move with the code it judges.
var (
	// D1 calls per first execution in BenchmarkVsSpec at concurrency 1, 8,
	// 64 and 256, by D1 latency. Group commit's counts vary from run to run
	// by a few per cent, so the target allows 10 % over them.
	baselineCallsPerReq = map[string][]float64{
		"20ms": {2, 0.52, 0.063, 0.035},
		"50ms": {2, 0.52, 0.063, 0.04},
	}
	// Client allocations per D1 call in BenchmarkClientExec/client_only:
	// one statement, batch of 2.
	baselineAllocs = []float64{178, 218}
)

var concurrencies = []string{"1", "8", "64", "256"}

// benches are the results of a run.
type benches []result

// find returns the result of the benchmark named name.
func (b benches) find(name string) (result, bool) {
	for _, r := range b {
		if r.name == name {
			return r, true
		}
	}
	return result{}, false
}

// series returns unit of each benchmark named, or false if one is missing.
func (b benches) series(unit string, names ...string) ([]float64, bool) {
	var out []float64
	for _, n := range names {
		r, ok := b.find(n)
		if !ok {
			return nil, false
		}
		out = append(out, r.value(unit))
	}
	return out, true
}

// figures derives the summary rows from the results, group by group, in
// the order of the table.
func figures(results []result) []row {
	var rows []row
	for _, group := range []func(benches) []row{
		callsPerRequestRows, openLoopRows, overloadRows, vsSpecRows, callsVsLatencyRows,
		throughputRows, addedLatencyRows, clientAllocRows, middlewareCPURows,
		telemetryRows, fingerprintRows, sweepRows, claimLookupRows,
		shardScalingRows, shardTransitionRows, bridgeOverheadRows, bridgeRows,
		replicaRows, consoleRows,
	} {
		rows = append(rows, group(results)...)
	}
	return rows
}

// callsPerRequestRows are the ledger's D1 calls per request by path
// (BenchmarkLedgerCalls), and per first execution and replay by
// concurrency (BenchmarkCallsPerRequest).
func callsPerRequestRows(b benches) []row {
	var rows []row
	paths := []string{"first_execution", "replay", "in_progress", "takeover"}
	want := []float64{2, 1, 1, 2}
	var names []string
	for _, p := range paths {
		names = append(names, "LedgerCalls/"+p)
	}
	if v, ok := b.series("d1-calls/req", names...); ok {
		met := true
		for i := range v {
			met = met && v[i] == want[i]
		}
		rows = append(rows, row{"D1 calls per request: first execution / replay / in progress / takeover",
			join(v, format), "= " + join(want, format), &met})
	}
	for _, path := range []string{"first_execution", "replay"} {
		names = names[:0]
		for _, c := range concurrencies {
			names = append(names, "CallsPerRequest/"+path+"/c"+c)
		}
		if v, ok := b.series("d1-calls/req", names...); ok {
			rows = append(rows, row{fmt.Sprintf("D1 calls per %s at concurrency 1 / 8 / 64 / 256 (20 ms per call)", strings.ReplaceAll(path, "_", " ")),
				join(v, format), "≤ 0.1 at 64", ptr(v[2] <= 0.1)})
		}
	}
	return rows
}

// openLoopRows are two rows per open-loop run (BenchmarkOpenLoop), in the
// order they ran: what was answered and lost, and the latency.
func openLoopRows(b benches) []row {
	var rows []row
	for _, r := range b {
		rate, ok := strings.CutPrefix(r.name, "OpenLoop/default_budget/rate=")
		if !ok {
			continue
		}
		what := fmt.Sprintf("open loop, %s first executions/s for %s s, default budget (1200 calls / 300 s, not scaled), 20 ms per call", rate, count(r.value("run-s")))
		refused, label := count(r.value("budget-503"))+" budget 503s", "budget 503s"
		if busy := r.value("busy-503"); busy > 0 {
			refused, label = refused+" / "+count(busy)+" busy 503s", "budget 503s / busy 503s"
		}
		measured := fmt.Sprintf("%s answered / %s / %s other errors; completions lost: %s",
			count(r.value("answered")), refused, count(r.value("other-errors")), count(r.value("lost-completions")))
		if t, ok := r.get("first-budget-503-s"); ok {
			measured += fmt.Sprintf(" (first budget 503 after %s s)", format(t))
		}
		rows = append(rows, row{what + ": answered / " + label + " / other errors; completions lost", measured,
			"0 budget 503s, 0 lost", ptr(r.value("budget-503") == 0 && r.value("busy-503") == 0 && r.value("lost-completions") == 0)})
		p99, ok := r.get("p99-ms")
		rows = append(rows, row{what + ": latency of the answered p50 / p99; D1 calls/s",
			fmt.Sprintf("%s / %s ms; %s calls/s (peak %s calls in 300 s)", format(r.value("p50-ms")), format(p99),
				format(r.value("d1-calls/s")), count(r.value("peak-calls/300s"))),
			"p99 < 1500 ms", ptr(ok && p99 < 1500)})
	}
	return rows
}

// overloadRows is the row of the open loop at twice the ceiling
// (BenchmarkOpenLoop/overload): the goodput, the answered latency, and how
// soon the excess is refused.
func overloadRows(b benches) []row {
	var rows []row
	for _, r := range b {
		rate, ok := strings.CutPrefix(r.name, "OpenLoop/overload/rate=")
		if !ok {
			continue
		}
		ceiling, goodput := r.value("ceiling-req/s"), r.value("goodput-req/s")
		answered := r.value("answered")
		p99, okP99 := r.get("p99-ms")
		refusal, okRefusal := r.get("refusal-p99-ms")
		rows = append(rows, row{
			fmt.Sprintf("overload: open loop at twice the ceiling (%s first executions/s; the ceiling %s) for %s s, default budget, 20 ms per call: goodput; answered p50 / p99; time to a refusal p50 / p99",
				rate, count(ceiling), count(r.value("run-s"))),
			fmt.Sprintf("%s req/s (%s answered, %s refused busy / %s budget / %s other; completions lost: %s); %s / %s ms; %s / %s ms",
				format(goodput), count(answered), count(r.value("busy-503")), count(r.value("budget-503")),
				count(r.value("other-errors")), count(r.value("lost-completions")), format(r.value("p50-ms")), format(p99),
				format(r.value("refusal-p50-ms")), format(refusal)),
			"goodput ≥ 90 % of the ceiling; p99 < 1500 ms; refusal p99 < 50 ms; 0 lost",
			ptr(goodput >= 0.9*ceiling && okP99 && p99 < 1500 && (!okRefusal || refusal < 50) && r.value("lost-completions") == 0),
		})
	}
	return rows
}

// vsSpecRows are the side-by-side with the spec's sequence
// (internal/specseq, BenchmarkVsSpec), by D1 latency: p50, p99, and D1
// calls per first execution.
func vsSpecRows(b benches) []row {
	var rows []row
	for _, rtt := range []string{"20ms", "50ms"} {
		var names []string
		for _, c := range concurrencies {
			names = append(names, "VsSpec/rtt="+rtt+"/c="+c)
		}
		if _, ok := b.series("p50-ms", names...); !ok {
			continue
		}
		for _, p := range []string{"p50", "p99"} {
			rows = append(rows, vsSpecLatencyRow(b, rtt, p, names))
		}
		rows = append(rows, vsSpecCallsRow(b, rtt, names))
	}
	return rows
}

// vsSpecLatencyRow is the row of percentile p ("p50", "p99") of the
// side-by-side cells names at D1 latency rtt.
func vsSpecLatencyRow(b benches, rtt, p string, names []string) row {
	ours, _ := b.series(p+"-ms", names...)
	naive, _ := b.series("naive-"+p+"-ms", names...)
	ratio, _ := b.series(p+"-ratio", names...)
	var parts []string
	met := true
	for i := range ours {
		r := ratioFormat(ratio[i])
		res, _ := b.find(names[i])
		if in, ok := res.interval(p); ok {
			r += ", " + in
		}
		parts = append(parts, fmt.Sprintf("%s / %s (%s)", format(ours[i]), format(naive[i]), r))
		met = met && ratio[i] <= 1
	}
	return row{fmt.Sprintf("first execution vs the spec's sequence, %s per call, concurrency 1; 8; 64; 256: %s d1idem / naive ms (ratio, its 95 %% interval)", strings.TrimSuffix(rtt, "ms")+" ms", p),
		strings.Join(parts, "; "), "ratio ≤ 1", &met}
}

// vsSpecCallsRow is the row of D1 calls per first execution of the
// side-by-side cells names at D1 latency rtt, against the baseline's.
func vsSpecCallsRow(b benches, rtt string, names []string) row {
	ours, _ := b.series("d1-calls/req", names...)
	naive, _ := b.series("naive-d1-calls/req", names...)
	baseline := baselineCallsPerReq[rtt]
	met := true
	for i := range ours {
		met = met && ours[i] <= 1.1*baseline[i]
	}
	return row{fmt.Sprintf("D1 calls per first execution vs the spec's sequence, %s per call, concurrency 1 / 8 / 64 / 256", strings.TrimSuffix(rtt, "ms")+" ms"),
		fmt.Sprintf("%s (naive %s)", join(ours, format), join(naive, format)), "≤ the baseline's " + join(baseline, format) + ", within 10 %", &met}
}

// callsVsLatencyRows is what a lower p50 costs in calls
// (BenchmarkCallsVsLatency): the concurrency-256, 50 ms cell with group
// commit's calls bounded smaller, beside the default's.
func callsVsLatencyRows(b benches) []row {
	def, ok := b.find("VsSpec/rtt=50ms/c=256")
	if !ok {
		return nil
	}
	parts := []string{"default (1024 × 4): " + callsForRatio(def)}
	for _, r := range b {
		if cfg, ok := strings.CutPrefix(r.name, "CallsVsLatency/cap="); ok {
			parts = append(parts, strings.Replace(cfg, "x", " × ", 1)+": "+callsForRatio(r))
		}
	}
	if len(parts) == 1 {
		return nil
	}
	return []row{{"first execution vs the spec's sequence, 50 ms per call, concurrency 256, group commit's calls bounded to MaxStatements × MaxInFlight: D1 calls per request → p50 ratio (its 95 % interval)",
		strings.Join(parts, "; "), "", nil}}
}

// throughputRows is the sustained rate of idempotent requests at the
// default budget's rate (BenchmarkSustainedThroughput).
func throughputRows(b benches) []row {
	r, ok := b.find("SustainedThroughput")
	if !ok {
		return nil
	}
	v := r.value("req/s")
	return []row{{"idempotent requests per second at the default budget's rate, its window scaled 60× (20 calls per 5 s), 512 closed-loop clients",
		fmt.Sprintf("%s (%s D1 calls/s)", format(v), format(r.value("d1-calls/s"))), "≥ 100", ptr(v >= 100)}}
}

// addedLatencyRows are the round trips and own time the ledger adds to a
// first execution and a replay (BenchmarkAddedLatency).
func addedLatencyRows(b benches) []row {
	var rows []row
	for _, path := range []string{"first_execution", "replay"} {
		r, ok := b.find("AddedLatency/ours/" + path)
		if !ok {
			continue
		}
		trips, own := r.value("round-trips"), r.value("own-p99-ms")
		want := 2.0
		if path == "replay" {
			want = 1
		}
		rows = append(rows, row{
			what: fmt.Sprintf("added latency, %s: round trips + own time p50 / p99 (RTT %s ms)", strings.ReplaceAll(path, "_", " "), format(r.value("rtt-ms"))),
			measured: fmt.Sprintf("%s + %s / %s ms (total p50 %s, p99 %s ms)", format(trips), format(r.value("own-p50-ms")), format(own),
				format(r.value("p50-ms")), format(r.value("p99-ms"))),
			target: fmt.Sprintf("≤ %g RTT + 3 ms", want),
			ok:     ptr(trips <= want && own <= 3),
		})
	}
	if r, ok := b.find("AddedLatency/ours/replay_cached"); ok {
		trips := r.value("round-trips")
		measured := fmt.Sprintf("%s D1 calls, p50 %s ms, p99 %s ms", format(trips), format(r.value("p50-ms")), format(r.value("p99-ms")))
		if u, ok := b.find("AddedLatency/ours/replay"); ok {
			measured += fmt.Sprintf(" (without the cache: %s calls, p50 %s ms)", format(u.value("round-trips")), format(u.value("p50-ms")))
		}
		rows = append(rows, row{
			what:     "replay answered from the replay cache (idem.Config.ReplayCache): D1 calls and latency per replay",
			measured: measured,
			target:   "0 calls, p50 ≤ 3 ms",
			ok:       ptr(trips == 0 && r.value("p50-ms") <= 3),
		})
	}
	return rows
}

// clientAllocRows are d1client's allocations per D1 call
// (BenchmarkClientExec), against half of the baseline's.
func clientAllocRows(b benches) []row {
	v, ok := b.series("allocs/op", "ClientExec/client_only/one_statement", "ClientExec/client_only/batch_of_2")
	if !ok {
		return nil
	}
	met := true
	half := make([]float64, len(v))
	for i := range v {
		half[i] = baselineAllocs[i] / 2
		met = met && v[i] <= half[i]
	}
	measured := join(v, count)
	if r, ok := b.find("ClientExec/d1local_in_process/one_statement"); ok {
		measured += fmt.Sprintf(" (%s with d1local's own work, in process)", count(r.value("allocs/op")))
	}
	return []row{{"client allocations per D1 call, d1local's answer replayed: one statement / batch of 2",
		measured, fmt.Sprintf("≤ %s (half of the baseline's %s)", join(half, count), join(baselineAllocs, count)), &met}}
}

// middlewareCPURows is the middleware's CPU time and allocations per
// request beside a bare handler's (BenchmarkMiddlewareOverhead).
func middlewareCPURows(b benches) []row {
	names := []string{"MiddlewareOverhead/bare", "MiddlewareOverhead/middleware/first_execution", "MiddlewareOverhead/middleware/replay"}
	v, ok := b.series("ns/op", names...)
	if !ok {
		return nil
	}
	a, _ := b.series("allocs/op", names...)
	var parts []string
	for i := range v {
		parts = append(parts, fmt.Sprintf("%s µs, %s allocs", format(v[i]/1000), count(a[i])))
	}
	return []row{{"middleware CPU, 1 KB body, d1local in process: bare / first execution / replay", strings.Join(parts, " / "), "", nil}}
}

// telemetryRows is the CPU the instrumentation adds to the middleware
// (BenchmarkMiddlewareTelemetry).
func telemetryRows(b benches) []row {
	names := []string{"MiddlewareTelemetry/first_execution", "MiddlewareTelemetry/replay"}
	pct, ok := b.series("overhead-%", names...)
	if !ok {
		return nil
	}
	off, _ := b.series("off-cpu-µs/req", names...)
	on, _ := b.series("on-cpu-µs/req", names...)
	var parts []string
	met := true
	for i := range pct {
		parts = append(parts, fmt.Sprintf("%s %% (%s vs %s µs)", format(pct[i]), format(on[i]), format(off[i])))
		met = met && pct[i] < 10
	}
	return []row{{"middleware CPU per request, instrumentation on (OpenTelemetry SDK, in-memory reader, every span recorded) vs off, d1local in process: first execution / replay: overhead (on vs off)",
		strings.Join(parts, " / "), "< 10 %", &met}}
}

// fingerprintRows is the fingerprint's throughput against crypto/sha256's
// (BenchmarkFingerprint).
func fingerprintRows(b benches) []row {
	v, ok := b.series("MB/s", "Fingerprint/idem.Fingerprint", "Fingerprint/crypto/sha256")
	if !ok {
		return nil
	}
	x, y := v[0], v[1]
	return []row{{"fingerprint throughput vs raw crypto/sha256, 1 MiB",
		fmt.Sprintf("%s %% (%s vs %s MB/s)", format(100*x/y), format(x), format(y)), "≥ 90 %", ptr(x >= 0.9*y)}}
}

// sweepRows is a sweep batch's time on a large ledger against a small one
// (BenchmarkSweepBatch).
func sweepRows(b benches) []row {
	v, ok := b.series("ns/op", "SweepBatch/rows=10000", "SweepBatch/rows=1000000")
	if !ok {
		return nil
	}
	x, y := v[0], v[1]
	return []row{{"sweep batch (20 rows), 1M rows vs 10k rows",
		fmt.Sprintf("%s x (%s vs %s µs)", format(y/x), format(y/1000), format(x/1000)), "≤ 1.5 x", ptr(y <= 1.5*x)}}
}

// claimLookupRows is the rate of the claim and lookup batch on d1local and
// workerd (BenchmarkClaimLookup).
func claimLookupRows(b benches) []row {
	v, ok := b.series("stmts/s", "ClaimLookup/d1local/seq", "ClaimLookup/workerd/seq", "ClaimLookup/d1local/c16", "ClaimLookup/workerd/c16")
	if !ok {
		return nil
	}
	return []row{{"claim+lookup batch, d1local / workerd: sequential; 16-way",
		fmt.Sprintf("%s / %s stmts/s; %s / %s stmts/s", count(v[0]), count(v[1]), count(v[2]), count(v[3])), "", nil}}
}

// consoleRows are the D1 calls of the console's pages at 10 and at a
// million rows (console's BenchmarkPageCalls): a page of keys, at the start
// and half the ledger in, costs the same, and its time barely moves, where
// the naive LIMIT ... OFFSET read of the same deep page grows with the
// depth.
func consoleRows(b benches) []row {
	var rows []row
	pages := []string{"overview", "keys", "keys_deep", "lookup"}
	var names []string
	for _, n := range []string{"10", "1000000"} {
		for _, p := range pages {
			names = append(names, "PageCalls/rows="+n+"/"+p)
		}
	}
	if v, ok := b.series("d1-calls/view", names...); ok {
		met := slices.Equal(v[:4], v[4:])
		rows = append(rows, row{"console: D1 calls per page view, overview / keys / keys half the ledger in / lookup, at 10 rows; at 1,000,000 rows",
			join(v[:4], format) + "; " + join(v[4:], format), "the same at 1,000,000 rows as at 10", &met})
	}
	if v, ok := b.series("ns/op", "PageCalls/rows=1000000/keys_deep", "PageCalls/rows=1000000/keys_deep_offset_naive"); ok {
		rows = append(rows, row{"console: a page of keys half a million rows in, by cursor / by LIMIT ... OFFSET (naive)",
			fmt.Sprintf("%s / %s ms", format(v[0]/1e6), format(v[1]/1e6)), "", nil})
	}
	return rows
}

// shardScalingRows are the first executions per second of a sharded
// ledger with 1 to 8 databases, one writer each (BenchmarkShardScaling),
// by backend.
func shardScalingRows(b benches) []row {
	var rows []row
	for _, be := range []struct{ name, what string }{
		{"d1local", "d1local, 1 ms per statement per database"},
		{"workerd_busy", "workerd, 1 ms per statement per database held by a proxy"},
		{"workerd", "workerd as it is (microseconds per statement: the cores are the limit)"},
	} {
		var names []string
		for _, n := range []string{"1", "2", "4", "8"} {
			names = append(names, "ShardScaling/"+be.name+"/dbs="+n)
		}
		if v, ok := b.series("first-exec/s", names...); ok && v[0] > 0 {
			x := v[2] / v[0]
			r := row{"idempotent first executions/s with 1 / 2 / 4 / 8 databases, " + be.what + ": rate (1 → 4 databases)",
				fmt.Sprintf("%s (%s×)", join(v, count), format(x)), "", nil}
			if be.name != "workerd" {
				r.target, r.ok = "≥ 3× from 1 to 4", ptr(x >= 3)
			}
			rows = append(rows, r)
		}
	}
	return rows
}

// shardTransitionRows is the cost in D1 calls of a change of the ring
// (BenchmarkShardTransitionCalls).
func shardTransitionRows(b benches) []row {
	r, ok := b.find("ShardTransitionCalls")
	if !ok {
		return nil
	}
	units := []string{"unmoved-first-exec", "unmoved-replay", "moved-first-exec", "moved-replay", "moved-replay-old-home", "after-first-exec"}
	var v []float64
	for _, u := range units {
		v = append(v, r.value("extra-calls/"+u))
	}
	met := v[0] == 0 && v[1] == 0 && v[2] <= 1 && v[3] <= 1 && v[4] == 0 && v[5] == 0
	return []row{{"extra D1 calls per request while the ring grows (2 → 3 databases, two retention windows): unmoved first execution / replay; moved first execution / replay / replay from the old home; after the change",
		fmt.Sprintf("%s / %s; %s / %s / %s; %s", format(v[0]), format(v[1]), format(v[2]), format(v[3]), format(v[4]), format(v[5])),
		"unmoved 0; moved ≤ 1; after 0", &met}}
}

// bridgeOverheadRows are the bridge's statements per second against raw
// binding calls from a Worker (BenchmarkBridgeOverhead).
func bridgeOverheadRows(b benches) []row {
	var rows []row
	for _, v := range []string{"write/single", "write/batch16", "read/single", "read/batch16"} {
		r, ok := b.find("BridgeOverhead/" + v)
		if !ok {
			continue
		}
		pct := r.value("bridge-%-of-raw")
		rows = append(rows, row{"D1 statements/s through the bridge vs raw binding calls from a Worker, " + v,
			fmt.Sprintf("%s %% (%s vs %s stmts/s)", format(pct), count(r.value("bridge-stmts/s")), count(r.value("raw-stmts/s"))),
			"≥ 70 %", ptr(pct >= 70)})
	}
	return rows
}

// replicaRows are the runs of replica processes sharing one account
// (BenchmarkReplicas): whether D1 answered 971 and every replica served.
// The 971 row is judged only when d1local played the account's budget.
func replicaRows(b benches) []row {
	var rows []row
	for _, r := range b {
		name, ok := strings.CutPrefix(r.name, "Replicas/")
		if !ok {
			continue
		}
		n, rate, _ := strings.Cut(name, "/")
		n, rate = strings.TrimPrefix(n, "n="), strings.TrimPrefix(rate, "rate=")
		what := fmt.Sprintf("%s replica processes, one d1local, default budget each, %s req/s in all for %s s: D1 answers 971; replicas served", n, rate, count(r.value("run-s")))
		served, want := r.value("replicas-served"), n
		measured := fmt.Sprintf("%s; %s of %s (%s answered / %s budget 503s / %s other; completions lost: %s; peak %s calls in 300 s)",
			count(r.value("971-answers")), format(served), want, count(r.value("answered")), count(r.value("budget-503")),
			count(r.value("other-errors")), count(r.value("lost-completions")), count(r.value("peak-calls/300s")))
		var met *bool
		if r.value("account-budget") == 1 {
			met = ptr(r.value("971-answers") == 0 && format(served) == want)
		} else {
			measured += "; d1local without the account budget, so no 971 was possible"
		}
		rows = append(rows, row{what, measured, "0; all", met})
	}
	return rows
}

// bridgeConcurrencies are those of BenchmarkBridgeVsREST.
var bridgeConcurrencies = []string{"1", "64", "256"}

// bridgeRows are the figures of BenchmarkBridgeVsREST: the bridge's
// sustained throughput against the REST shape's under the budget, their
// latencies, and the latency the middleware adds through the bridge.
func bridgeRows(b benches) []row {
	var names []string
	for _, c := range bridgeConcurrencies {
		names = append(names, "BridgeVsREST/c="+c)
	}
	bridge, ok := b.series("bridge-req/s", names...)
	if !ok {
		return nil
	}
	rest, _ := b.series("rest-req/s", names...)
	ratio, _ := b.series("bridge/rest", names...)
	ceiling, _ := b.series("rest-ceiling-req/s", names...)
	memory, _ := b.series("bridge-d1-in-memory", names...)
	where := "local workerd, its D1 in memory"
	if memory[0] != 1 {
		where = "local workerd, its D1 on disk"
	}
	var parts []string
	met := true
	for i := range bridge {
		parts = append(parts, fmt.Sprintf("%s / %s (%s×)", count(bridge[i]), format(rest[i]), format(ratio[i])))
		met = met && ratio[i] >= 10
	}
	rows := []row{{
		what: "idempotent requests/s (first executions, 1 KB bodies, closed loop), concurrency 1; 64; 256: through the bridge (" + where +
			") / through the REST shape (d1local, 20 ms per call) at the default budget's rate (1200 calls / 300 s, its window scaled 60× to measure the sustained rate, not the burst)",
		measured: strings.Join(parts, "; ") + "; REST's ceiling at the budget's 4 calls/s with the batching it reached: " + join(ceiling, format),
		target:   "bridge ≥ 10× REST at each", ok: &met,
	}}
	var lat []string
	for _, n := range names {
		r, _ := b.find(n)
		lat = append(lat, fmt.Sprintf("%s / %s vs %s / %s", format(r.value("bridge-p50-ms")), format(r.value("bridge-p99-ms")),
			format(r.value("rest-p50-ms")), count(r.value("rest-p99-ms"))))
	}
	rows = append(rows, row{what: "latency p50 / p99 of those requests, concurrency 1; 64; 256: bridge vs REST (its budget waits are those of the scaled window), ms",
		measured: strings.Join(lat, "; ")})
	if r, ok := b.find("BridgeVsREST/c=1/added_latency"); ok {
		added, target := r.value("added-p50-ms"), r.value("target-ms")
		rows = append(rows, row{
			what:     fmt.Sprintf("latency the middleware adds through the bridge, concurrency 1, first execution: p50 (p99); round trip = a bare bridge call, %s ms", format(r.value("rtt-ms"))),
			measured: fmt.Sprintf("%s ms (%s ms)", format(added), format(r.value("added-p99-ms"))),
			target:   fmt.Sprintf("≤ 2 round trips + 3 ms = %s ms", format(target)), ok: ptr(added <= target),
		})
	}
	return rows
}

// latest keeps the last result of each benchmark (make bench-budget's run
// of OpenLoop at 150 req/s over make bench's, when both files are read).
func latest(results []result) []result {
	last := map[string]int{}
	for i, r := range results {
		last[r.pkg+" "+r.name] = i
	}
	var out []result
	for i, r := range results {
		if last[r.pkg+" "+r.name] == i {
			out = append(out, r)
		}
	}
	return out
}

// header is the machine line.
func header(machine map[string]string) string {
	return fmt.Sprintf("%s, %d cores, %s RAM, %s/%s, %s", machine["cpu"], runtime.NumCPU(), memTotal(), machine["goos"], machine["goarch"], runtime.Version())
}

// The marker lines that enclose the generated table in docs/benchmarks.md.
const (
	beginMarker = "<!-- bench:begin -->"
	endMarker   = "<!-- bench:end -->"
)

// markdown renders rows as a Markdown figures table.
func markdown(machine string, rows []row) string {
	var b strings.Builder
	fmt.Fprintf(&b, "<!-- generated by tools/benchtable from the benchmarks' output (make bench-figures); do not edit by hand -->\n")
	fmt.Fprintf(&b, "Machine: %s.\n\n", machine)
	b.WriteString("| Figure | Measured | Target | |\n|---|---|---|---|\n")
	cell := func(s string) string { return strings.ReplaceAll(s, "|", `\|`) }
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", cell(r.what), cell(r.measured), cell(r.target), r.mark())
	}
	return b.String()
}

// rewrite replaces what lies between the markers in doc with table.
func rewrite(doc []byte, table string) ([]byte, error) {
	return rewriteBetween(doc, beginMarker, endMarker, table)
}

// The marker lines of docs/bridge.md's figures, which -bridge rewrites with
// the bridge's rows alone.
const (
	bridgeBeginMarker = "<!-- bridge-figures:begin -->"
	bridgeEndMarker   = "<!-- bridge-figures:end -->"
)

// between returns where the lines between the line beginLine of doc and
// the next line endLine start and end. The markers are whole lines, so that
// a page may name them in its prose.
func between(doc []byte, beginLine, endLine string) (begin, end int, ok bool) {
	at, begin := 0, -1
	for line := range bytes.Lines(doc) {
		text := string(bytes.TrimSuffix(line, []byte("\n")))
		switch {
		case begin < 0 && text == beginLine && len(text) < len(line):
			begin = at + len(line)
		case begin >= 0 && text == endLine:
			return begin, at, true
		}
		at += len(line)
	}
	return 0, 0, false
}

// rewriteBetween replaces what lies between the lines begin and end of doc
// with table.
func rewriteBetween(doc []byte, beginLine, endLine, table string) ([]byte, error) {
	begin, end, ok := between(doc, beginLine, endLine)
	if !ok {
		return nil, errors.New("no " + beginLine + " ... " + endLine + " lines")
	}
	out := append([]byte{}, doc[:begin]...)
	out = append(out, table...)
	return append(out, doc[end:]...), nil
}

// isBridgeRow reports whether r is one of the bridge's figures, which
// -bridge writes to docs/bridge.md.
func isBridgeRow(r row) bool {
	return strings.Contains(r.what, "through the bridge") || strings.Contains(r.what, "bridge vs REST")
}

// keepRows returns rows merged into the table already between beginLine
// and endLine of doc: each row there keeps its place, replaced by the row
// of the same figure when rows has one, and kept as it was otherwise (its
// benchmark was not in this run: make bench-budget's, after a make bench);
// rows new to the table follow.
func keepRows(doc []byte, beginLine, endLine string, rows []row) []row {
	begin, end, ok := between(doc, beginLine, endLine)
	if !ok {
		return rows
	}
	byWhat := map[string]row{}
	for _, r := range rows {
		byWhat[figureKey(r.what)] = r
	}
	var out []row
	used := map[string]bool{}
	for _, line := range strings.Split(string(doc[begin:end]), "\n") {
		if !strings.HasPrefix(line, "| ") || !strings.HasSuffix(line, " |") || strings.HasPrefix(line, "| Figure |") {
			continue
		}
		cells := strings.Split(strings.TrimSuffix(strings.TrimPrefix(line, "| "), " |"), " | ")
		if len(cells) != 4 {
			continue
		}
		unescape := func(s string) string { return strings.ReplaceAll(s, `\|`, "|") }
		what := unescape(cells[0])
		if r, ok := byWhat[figureKey(what)]; ok {
			if !used[r.what] { // a second old row of the same figure goes
				out = append(out, r)
				used[r.what] = true
			}
			continue
		}
		old := row{what: what, measured: unescape(cells[1]), target: unescape(cells[2])}
		switch cells[3] {
		case "met":
			old.ok = ptr(true)
		case "MISSED":
			old.ok = ptr(false)
		}
		out = append(out, old)
	}
	for _, r := range rows {
		if !used[r.what] {
			out = append(out, r)
		}
	}
	return out
}

// measuredInName matches what a figure's name holds of a measurement (a
// round trip of 0.91 ms, RTT 51 ms or RTT 50.9 ms), which differs from run
// to run.
var measuredInName = regexp.MustCompile(`RTT \d+(?:\.\d+)?|\d+\.\d+`)

// figureKey is a figure's name without the measurements in it.
func figureKey(what string) string { return measuredInName.ReplaceAllString(what, "#") }

// rewriteFile rewrites the part of the Markdown file at path between
// beginLine and endLine with rows, keeping the rows of figures this run did
// not measure (see keepRows).
func rewriteFile(path, beginLine, endLine, machine string, rows []row) error {
	doc, err := os.ReadFile(path)
	if err == nil {
		rows = keepRows(doc, beginLine, endLine, rows)
		doc, err = rewriteBetween(doc, beginLine, endLine, markdown(machine, rows))
	}
	if err == nil {
		err = os.WriteFile(path, doc, 0o644)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	fmt.Fprintf(os.Stderr, "%s: figures table rewritten (%d rows)\n", path, len(rows))
	return nil
}

func main() {
	doc := flag.String("doc", "", "rewrite this Markdown file's figures table, between "+beginMarker+" and "+endMarker)
	bridgeDoc := flag.String("bridge", "", "rewrite this Markdown file's table of the bridge's figures, between "+bridgeBeginMarker+" and "+bridgeEndMarker)
	flag.Parse()
	var in io.Reader = os.Stdin
	if flag.NArg() > 0 {
		var readers []io.Reader
		for _, name := range flag.Args() {
			f, err := os.Open(name)
			if err != nil {
				fmt.Fprintln(os.Stderr, "benchtable:", err)
				os.Exit(2)
			}
			defer f.Close()
			readers = append(readers, f)
		}
		in = io.MultiReader(readers...)
	}
	results, machine, failed, err := parse(in, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchtable:", err)
		os.Exit(2)
	}
	results = latest(results)
	out := os.Stdout
	fmt.Fprintf(out, "Machine: %s\n\n", header(machine))
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PACKAGE\tBENCHMARK\tITER\tFIGURES")
	for _, r := range results {
		var figs []string
		for _, m := range r.metrics {
			figs = append(figs, format(m.value)+" "+m.unit)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.pkg, r.name, r.iters, strings.Join(figs, "   "))
	}
	tw.Flush()

	rows := figures(results)
	if len(rows) > 0 {
		fmt.Fprintln(out, "\nFigures:")
		tw = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "FIGURE\tMEASURED\tTARGET\t")
		for _, r := range rows {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.what, r.measured, r.target, r.mark())
		}
		tw.Flush()
	}
	if failed {
		fmt.Fprintln(out, "\nA benchmark failed; see above.")
		os.Exit(1)
	}
	if *doc != "" {
		err = rewriteFile(*doc, beginMarker, endMarker, header(machine), rows)
	}
	if *bridgeDoc != "" && err == nil {
		var bridge []row
		for _, r := range rows {
			if isBridgeRow(r) {
				bridge = append(bridge, r)
			}
		}
		err = rewriteFile(*bridgeDoc, bridgeBeginMarker, bridgeEndMarker, header(machine), bridge)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchtable:", err)
		os.Exit(1)
	}
}
