package main

import (
	"flag"
	"io"
	"os"
	"strings"
	"testing"
)

const sample = `goos: linux
goarch: amd64
pkg: github.com/d1idem/d1idem/idem
BenchmarkShardTransitionCalls-2 	200	6661092 ns/op	0 extra-calls/after-first-exec	1.000 extra-calls/moved-first-exec	1.000 extra-calls/moved-replay	0 extra-calls/moved-replay-old-home	0 extra-calls/unmoved-first-exec	0 extra-calls/unmoved-replay
pkg: github.com/d1idem/d1idem/bench
cpu: AMD EPYC
BenchmarkOpenLoop/default_budget/rate=150-2 	       1	60043998043 ns/op	      4108 answered	      4892 budget-503	        20.00 d1-calls/s	        27.39 first-budget-503-s	         6.000 lost-completions	       150.0 offered-req/s	         0 other-errors	        81.53 p50-ms	       110.3 p99-ms	      1200 peak-calls/300s	        60.00 run-s
BenchmarkOpenLoop/default_budget/rate=20-2 	       1	60043998043 ns/op	      1200 answered	      0 budget-503	        8.00 d1-calls/s	         0 lost-completions	       20.0 offered-req/s	         0 other-errors	        41.53 p50-ms	       50.3 p99-ms	      480 peak-calls/300s	        60.00 run-s
BenchmarkOpenLoop/overload/rate=1360-2 	       1	62043998043 ns/op	       680.0 ceiling-req/s	      1360 offered-req/s	        60.00 run-s	       671.2 goodput-req/s	     40272 answered	     41069 busy-503	         0 budget-503	         0 other-errors	       812.4 p50-ms	      1204 p99-ms	         3.1 refusal-p50-ms	        21.7 refusal-p99-ms	         0 lost-completions	       512.0 stmts/call
BenchmarkVsSpec/rtt=20ms/c=1-2 	1	1 ns/op	2.000 d1-calls/req	2.000 naive-d1-calls/req	42.00 naive-p50-ms	46.04 naive-p99-ms	42.43 p50-ms	1.010 p50-ratio	1.021 p50-ratio-hi	0.9981 p50-ratio-lo	45.17 p99-ms	0.9810 p99-ratio
BenchmarkVsSpec/rtt=20ms/c=8-2 	1	1 ns/op	0.5100 d1-calls/req	2.000 naive-d1-calls/req	44.30 naive-p50-ms	47.26 naive-p99-ms	87.33 p50-ms	1.971 p50-ratio	92.53 p99-ms	1.958 p99-ratio
BenchmarkVsSpec/rtt=20ms/c=64-2 	2	1 ns/op	0.06250 d1-calls/req	2.000 naive-d1-calls/req	49.59 naive-p50-ms	76.26 naive-p99-ms	101.6 p50-ms	2.049 p50-ratio	104.0 p99-ms	1.364 p99-ratio
BenchmarkVsSpec/rtt=20ms/c=256-2 	2	1 ns/op	0.03174 d1-calls/req	2.000 naive-d1-calls/req	106.9 naive-p50-ms	200.1 naive-p99-ms	88.97 p50-ms	0.8325 p50-ratio	124.1 p99-ms	0.6204 p99-ratio
BenchmarkMiddlewareTelemetry/first_execution-2         	    2596	    398535 ns/op	       384.4 off-cpu-µs/req	       397.3 on-cpu-µs/req	         3.373 overhead-%	         3.000 spans/req	   50862 B/op	     642 allocs/op
BenchmarkMiddlewareTelemetry/replay-2                  	    6592	    192983 ns/op	       181.9 off-cpu-µs/req	       199.8 on-cpu-µs/req	         10.2 overhead-%	         2.000 spans/req	   36339 B/op	     412 allocs/op
BenchmarkClientExec/client_only/one_statement-2         	   21354	     73336 ns/op	   13840 B/op	     80 allocs/op
BenchmarkClientExec/client_only/batch_of_2-2            	   13370	     95006 ns/op	   20612 B/op	     100 allocs/op
BenchmarkShardScaling/d1local/dbs=1-2 	1	4386315417 ns/op	0.03965 d1-calls/req	227.0 first-exec/s
BenchmarkShardScaling/d1local/dbs=2-2 	1	4466240942 ns/op	0.06285 d1-calls/req	477.3 first-exec/s	2.103 x-vs-1-db
BenchmarkShardScaling/d1local/dbs=4-2 	1	4226910500 ns/op	0.07563 d1-calls/req	912.3 first-exec/s	4.019 x-vs-1-db
BenchmarkShardScaling/d1local/dbs=8-2 	1	4203383518 ns/op	0.1758 d1-calls/req	1659 first-exec/s	7.308 x-vs-1-db
BenchmarkShardScaling/workerd/dbs=1-2 	1	5444393999 ns/op	0.03509 d1-calls/req	3344 first-exec/s
BenchmarkShardScaling/workerd/dbs=2-2 	1	4133673207 ns/op	0.05516 d1-calls/req	2357 first-exec/s	0.7047 x-vs-1-db
BenchmarkShardScaling/workerd/dbs=4-2 	1	4129376143 ns/op	0.05989 d1-calls/req	2271 first-exec/s	0.6790 x-vs-1-db
BenchmarkShardScaling/workerd/dbs=8-2 	1	4193679489 ns/op	0.1168 d1-calls/req	1823 first-exec/s	0.5453 x-vs-1-db
BenchmarkBridgeVsREST/c=1-2 	1	26092883164 ns/op	2.001 bridge-d1-calls/req	1.000 bridge-d1-in-memory	0 bridge-errors	2.024 bridge-p50-ms	12.04 bridge-p99-ms	356.0 bridge-req/s	224.8 bridge/rest	1.900 rest-ceiling-req/s	2.105 rest-d1-calls/req	0 rest-errors	46.59 rest-p50-ms	4591 rest-p99-ms	1.583 rest-req/s
BenchmarkBridgeVsREST/c=64-2 	1	26110409014 ns/op	0.06287 bridge-d1-calls/req	1.000 bridge-d1-in-memory	0 bridge-errors	37.25 bridge-p50-ms	172.1 bridge-p99-ms	1419 bridge-req/s	26.60 bridge/rest	64.00 rest-ceiling-req/s	0.06250 rest-d1-calls/req	0 rest-errors	149.3 rest-p50-ms	4407 rest-p99-ms	53.33 rest-req/s
BenchmarkBridgeVsREST/c=256-2 	1	26374783371 ns/op	0.03781 bridge-d1-calls/req	1.000 bridge-d1-in-memory	0 bridge-errors	208.9 bridge-p50-ms	426.9 bridge-p99-ms	758 bridge-req/s	9.17 bridge/rest	141.7 rest-ceiling-req/s	0.02823 rest-d1-calls/req	0 rest-errors	211.8 rest-p50-ms	4732 rest-p99-ms	82.67 rest-req/s
BenchmarkBridgeVsREST/c=1/added_latency-2 	1	1692141504 ns/op	2.622 added-p50-ms	22.00 added-p99-ms	0.1208 bare-p50-ms	2.743 p50-ms	1.099 rtt-ms	5.198 target-ms
BenchmarkReplicas/n=4/rate=150-2 	1	1 ns/op	0 account-budget	0 971-answers	4 replicas-served	9000 answered	0 budget-503	0 other-errors	0 lost-completions	4800 peak-calls/300s	600 run-s
PASS
`

func rowsOf(t *testing.T, in string) map[string]row {
	t.Helper()
	results, _, failed, err := parse(strings.NewReader(in), io.Discard)
	if err != nil || failed {
		t.Fatalf("parse: %v, failed %v", err, failed)
	}
	out := map[string]row{}
	for _, r := range figures(results) {
		out[r.what] = r
	}
	return out
}

func find(t *testing.T, rows map[string]row, prefix string) row {
	t.Helper()
	var found []row
	for what, r := range rows {
		if strings.HasPrefix(what, prefix) {
			found = append(found, r)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d rows start with %q: %v", len(found), prefix, rows)
	}
	return found[0]
}

func TestFigures(t *testing.T) {
	rows := rowsOf(t, sample)
	for _, tc := range []struct {
		prefix, measured, mark string
	}{
		{"open loop, 150 first executions/s for 60 s, default budget (1200 calls / 300 s, not scaled), 20 ms per call: answered",
			"4,108 answered / 4,892 budget 503s / 0 other errors; completions lost: 6 (first budget 503 after 27.4 s)", "MISSED"},
		{"open loop, 150 first executions/s for 60 s, default budget (1200 calls / 300 s, not scaled), 20 ms per call: latency",
			"81.5 / 110 ms; 20 calls/s (peak 1,200 calls in 300 s)", "met"},
		{"open loop, 20 first executions/s for 60 s, default budget (1200 calls / 300 s, not scaled), 20 ms per call: answered",
			"1,200 answered / 0 budget 503s / 0 other errors; completions lost: 0", "met"},
		{"overload: open loop at twice the ceiling (1360 first executions/s; the ceiling 680) for 60 s",
			"671 req/s (40,272 answered, 41,069 refused busy / 0 budget / 0 other; completions lost: 0); 812 / 1204 ms; 3.1 / 21.7 ms", "met"},
		{"first execution vs the spec's sequence, 20 ms per call, concurrency 1; 8; 64; 256: p50",
			"42.4 / 42 (1.010, 0.998–1.021); 87.3 / 44.3 (1.971); 102 / 49.6 (2.049); 89 / 107 (0.833)", "MISSED"},
		{"D1 calls per first execution vs the spec's sequence, 20 ms per call",
			"2 / 0.51 / 0.0625 / 0.0317 (naive 2 / 2 / 2 / 2)", "met"},
		{"client allocations per D1 call", "80 / 100", "met"},
		{"middleware CPU per request, instrumentation on", "3.37 % (397 vs 384 µs) / 10.2 % (200 vs 182 µs)", "MISSED"},
		{"idempotent first executions/s with 1 / 2 / 4 / 8 databases, d1local", "227 / 477 / 912 / 1,659 (4.02×)", "met"},
		{"idempotent first executions/s with 1 / 2 / 4 / 8 databases, workerd as", "3,344 / 2,357 / 2,271 / 1,823 (0.679×)", ""},
		{"extra D1 calls per request while the ring grows", "0 / 0; 1 / 1 / 0; 0", "met"},
		{"idempotent requests/s (first executions, 1 KB bodies, closed loop), concurrency 1; 64; 256: through the bridge (local workerd, its D1 in memory)",
			"356 / 1.58 (225×); 1,419 / 53.3 (26.6×); 758 / 82.7 (9.17×); REST's ceiling at the budget's 4 calls/s with the batching it reached: 1.9 / 64 / 142", "MISSED"},
		{"latency p50 / p99 of those requests", "2.02 / 12 vs 46.6 / 4,591; 37.2 / 172 vs 149 / 4,407; 209 / 427 vs 212 / 4,732", ""},
		{"latency the middleware adds through the bridge, concurrency 1, first execution: p50 (p99); round trip = a bare bridge call, 1.1 ms", "2.62 ms (22 ms)", "met"},
		{"4 replica processes", "0; 4 of 4 (9,000 answered / 0 budget 503s / 0 other; completions lost: 0; peak 4,800 calls in 300 s); d1local without the account budget, so no 971 was possible", ""},
	} {
		r := find(t, rows, tc.prefix)
		if r.measured != tc.measured || r.mark() != tc.mark {
			t.Errorf("%s:\n got %q %q\nwant %q %q", tc.prefix, r.measured, r.mark(), tc.measured, tc.mark)
		}
	}
	// With d1local playing the account's budget, the replica row is judged.
	rows = rowsOf(t, strings.Replace(sample, "0 account-budget\t0 971-answers", "1 account-budget\t3 971-answers", 1))
	if r := find(t, rows, "4 replica processes"); r.mark() != "MISSED" || !strings.HasPrefix(r.measured, "3; 4 of 4") {
		t.Errorf("replicas with the account budget: %q %q", r.measured, r.mark())
	}
}

func TestRewrite(t *testing.T) {
	doc := "# T\n\nbefore\n" + beginMarker + "\nold | table\n" + endMarker + "\nafter\n"
	got, err := rewrite([]byte(doc), "new\n")
	if err != nil {
		t.Fatal(err)
	}
	if want := "# T\n\nbefore\n" + beginMarker + "\nnew\n" + endMarker + "\nafter\n"; string(got) != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	// A page that names the markers in its prose, before the table, keeps
	// that prose: only whole lines are markers.
	doc = "run `make bench-figures` (" + beginMarker + " ... " + endMarker + ")\n" + doc
	got, err = rewrite([]byte(doc), "new\n")
	if err != nil {
		t.Fatal(err)
	}
	if want := strings.Replace(doc, "\nold | table\n", "\nnew\n", 1); string(got) != want {
		t.Errorf("markers named in the prose: got\n%s\nwant\n%s", got, want)
	}
	table := "see " + beginMarker + " and " + endMarker + "\n" + beginMarker + "\n| in | 1 |  |  |\n" + endMarker + "\n| out | 2 |  |  |\n"
	if rows := keepRows([]byte(table), beginMarker, endMarker, nil); len(rows) != 1 || rows[0].what != "in" {
		t.Errorf("keepRows = %+v, want the row between the marker lines alone", rows)
	}
	for _, bad := range []string{"no markers\n", endMarker + "\n" + beginMarker + "\n", beginMarker + "\nunterminated\n",
		beginMarker + "\nx " + endMarker + "\n"} {
		if _, err := rewrite([]byte(bad), "new\n"); err == nil {
			t.Errorf("rewrite(%q): no error", bad)
		}
	}
	md := markdown("AMD EPYC, 2 cores", []row{{"a | b", "1", "≤ 2", ptr(true)}, {"c", "3", "", nil}})
	if want := "| a \\| b | 1 | ≤ 2 | met |\n| c | 3 |  |  |\n"; !strings.HasSuffix(md, want) {
		t.Errorf("markdown:\n%s\nwant it to end with\n%s", md, want)
	}
}

// docs/benchmarks.md and docs/bridge.md keep their figures tables between
// the markers make bench-figures rewrites.
func TestDocsHaveMarkers(t *testing.T) {
	doc, err := os.ReadFile("../../docs/benchmarks.md")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rewrite(doc, ""); err != nil {
		t.Fatalf("docs/benchmarks.md: %v", err)
	}
	doc, err = os.ReadFile("../../docs/bridge.md")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rewriteBetween(doc, bridgeBeginMarker, bridgeEndMarker, ""); err != nil {
		t.Fatalf("docs/bridge.md: %v", err)
	}
}

// The bridge's rows, and only they, go to docs/bridge.md.
func TestBridgeRows(t *testing.T) {
	in := sample + "BenchmarkBridgeOverhead/write/single-2 	2000	1 ns/op	900 bridge-stmts/s	1000 raw-stmts/s	90 bridge-%-of-raw\n"
	var bridge []string
	for what, r := range rowsOf(t, in) {
		if isBridgeRow(r) {
			bridge = append(bridge, what)
		}
	}
	if len(bridge) != 4 {
		t.Errorf("bridge rows: %q", bridge)
	}
}

// A benchmark in both files (make bench's and make bench-budget's) is
// reported once, from the later file.
func TestLatest(t *testing.T) {
	in := sample + strings.Replace(sample, "4108 answered", "9000 answered", 1)
	results, _, _, err := parse(strings.NewReader(in), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	results = latest(results)
	n := 0
	for _, r := range results {
		if r.name == "OpenLoop/default_budget/rate=150" {
			n++
			if v := r.value("answered"); v != 9000 {
				t.Errorf("answered %v, want the later run's 9000", v)
			}
		}
	}
	if n != 1 || len(results) != strings.Count(sample, "\nBenchmark") {
		t.Errorf("%d OpenLoop results, %d in all", n, len(results))
	}
}

// Rows of figures a run did not measure (make bench-budget's, after a make
// bench) keep their place and their figures; measured ones are replaced,
// whatever measurement their names hold (RTT 51 ms, RTT 50.9 ms), once;
// new ones follow.
func TestKeepRows(t *testing.T) {
	doc := []byte("x\n" + beginMarker + "\nMachine: m.\n\n| Figure | Measured | Target | |\n|---|---|---|---|\n" +
		"| a | 1 | ≤ 2 | met |\n| long run | 5 \\| 6 | 0 | MISSED |\n| c, round trip 0.91 ms | 3 |  |  |\n" +
		"| e (RTT 50.9 ms) | 1 |  |  |\n| e (RTT 51 ms) | 2 |  |  |\n" + endMarker + "\n")
	got := keepRows(doc, beginMarker, endMarker, []row{{what: "a", measured: "9", target: "≤ 2", ok: ptr(false)}, {what: "c, round trip 0.893 ms", measured: "4"},
		{what: "e (RTT 51.1 ms)", measured: "3"}, {what: "d", measured: "7"}})
	var lines []string
	for _, r := range got {
		lines = append(lines, r.what+"="+r.measured+"/"+r.mark())
	}
	if want := "a=9/MISSED; long run=5 | 6/MISSED; c, round trip 0.893 ms=4/; e (RTT 51.1 ms)=3/; d=7/"; strings.Join(lines, "; ") != want {
		t.Fatalf("rows %q, want %q", strings.Join(lines, "; "), want)
	}
}

func TestCallsVsLatencyRow(t *testing.T) {
	in := `BenchmarkVsSpec/rtt=50ms/c=256-2 	1	1 ns/op	0.02900 d1-calls/req	2.000 naive-d1-calls/req	110.0 naive-p50-ms	150.0 naive-p99-ms	112.2 p50-ms	1.020 p50-ratio	1.030 p50-ratio-hi	1.001 p50-ratio-lo	125.0 p99-ms	0.8333 p99-ratio
BenchmarkCallsVsLatency/cap=128x8-2 	1	1 ns/op	0.04300 d1-calls/req	2.000 naive-d1-calls/req	110.0 naive-p50-ms	150.0 naive-p99-ms	110.6 p50-ms	1.005 p50-ratio	1.020 p50-ratio-hi	0.9900 p50-ratio-lo	125.0 p99-ms	0.8333 p99-ratio
BenchmarkCallsVsLatency/cap=32x64-2 	1	1 ns/op	0.2000 d1-calls/req	2.000 naive-d1-calls/req	110.0 naive-p50-ms	150.0 naive-p99-ms	108.9 p50-ms	0.9900 p50-ratio	125.0 p99-ms	0.8333 p99-ratio
`
	r := find(t, rowsOf(t, in), "first execution vs the spec's sequence, 50 ms per call, concurrency 256, group commit's calls bounded")
	want := "default (1024 × 4): 0.029 → 1.020 (1.001–1.030); 128 × 8: 0.043 → 1.005 (0.990–1.020); 32 × 64: 0.2 → 0.990"
	if r.measured != want || r.ok != nil {
		t.Errorf("row %q (ok %v), want %q with no target", r.measured, r.ok, want)
	}
	// Without the bounded runs there is no row.
	for what := range rowsOf(t, strings.SplitAfter(in, "\n")[0]) {
		if strings.Contains(what, "calls bounded") {
			t.Errorf("row %q without CallsVsLatency results", what)
		}
	}
}

var update = flag.Bool("update", false, "rewrite testdata/all.figures.md from testdata/all.bench")

// TestFiguresTable: the whole figures table, in order, of a run that has
// every benchmark the table reads (testdata/all.bench), is the one in
// testdata/all.figures.md (-update rewrites it).
func TestFiguresTable(t *testing.T) {
	in, err := os.ReadFile("testdata/all.bench")
	if err != nil {
		t.Fatal(err)
	}
	results, _, failed, err := parse(strings.NewReader(string(in)), io.Discard)
	if err != nil || failed {
		t.Fatalf("parse: %v, failed %v", err, failed)
	}
	got := markdown("AMD EPYC, 2 cores", figures(latest(results)))
	const golden = "testdata/all.figures.md"
	if *update {
		if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Errorf("figures table:\n%s\nwant (%s):\n%s", got, golden, want)
	}
}

// The machine line names the CPU as go test prints it, without the spaces
// it pads the name with.
func TestMachineCPUTrimmed(t *testing.T) {
	_, machine, _, err := parse(strings.NewReader("cpu: Oxide Virtual Turin-like Processor             \n"), io.Discard)
	if err != nil || machine["cpu"] != "Oxide Virtual Turin-like Processor" {
		t.Fatalf("cpu %q, %v", machine["cpu"], err)
	}
}
