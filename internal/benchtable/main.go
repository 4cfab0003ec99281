// Command benchtable reads `go test -bench` output on stdin and prints one
// table of every benchmark, with the machine noted, followed by the figures
// the project's issues set targets for, each beside its target. `make bench`
// pipes the benchmarks through it.
package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"text/tabwriter"
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

var benchLine = regexp.MustCompile(`^(Benchmark\S+?)(?:-\d+)?\s+(\d+)\s+(.*)$`)

func parse(in io.Reader, echo io.Writer) (results []result, machine map[string]string, failed bool) {
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
			machine[k] = v
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
	return results, machine, failed
}

func format(v float64) string {
	switch {
	case v == 0:
		return "0"
	case v >= 1000:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case v >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	default:
		return strconv.FormatFloat(v, 'g', 4, 64)
	}
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

func main() {
	results, machine, failed := parse(os.Stdin, os.Stderr)
	out := os.Stdout
	fmt.Fprintf(out, "Machine: %s, %d cores, %s RAM, %s/%s, %s\n\n", machine["cpu"], runtime.NumCPU(), memTotal(), machine["goos"], machine["goarch"], runtime.Version())
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

	find := func(name string) (result, bool) {
		for _, r := range results {
			if r.name == name {
				return r, true
			}
		}
		return result{}, false
	}
	type check struct {
		what, measured, target string
		ok                     bool
	}
	var checks []check
	add := func(what string, measured float64, unit, target string, ok bool) {
		checks = append(checks, check{what, format(measured) + " " + unit, target, ok})
	}
	for _, p := range []struct {
		name string
		want float64
	}{{"first_execution", 2}, {"replay", 1}, {"in_progress", 1}, {"takeover", 2}} {
		if r, ok := find("LedgerCalls/" + p.name); ok {
			v, _ := r.get("d1-calls/req")
			add("D1 calls per request, "+p.name, v, "calls", fmt.Sprintf("= %g", p.want), v == p.want)
		}
	}
	if r, ok := find("CallsPerRequest/first_execution/c64"); ok {
		v, _ := r.get("d1-calls/req")
		add("D1 calls per first execution at concurrency 64", v, "calls", "<= 0.1", v <= 0.1)
	}
	if r, ok := find("CallsPerRequest/replay/c64"); ok {
		v, _ := r.get("d1-calls/req")
		add("D1 calls per replay at concurrency 64", v, "calls", "<= 0.1", v <= 0.1)
	}
	if r, ok := find("SustainedThroughput"); ok {
		v, _ := r.get("req/s")
		add("idempotent requests per second within the default budget", v, "req/s", ">= 100", v >= 100)
	}
	for _, path := range []string{"first_execution", "replay"} {
		if r, ok := find("AddedLatency/ours/" + path); ok {
			trips, _ := r.get("round-trips")
			own, _ := r.get("own-p99-ms")
			p50, _ := r.get("p50-ms")
			p99, _ := r.get("p99-ms")
			rtt, _ := r.get("rtt-ms")
			want := 2.0
			if path == "replay" {
				want = 1
			}
			checks = append(checks, check{
				what:     "added latency, " + path,
				measured: fmt.Sprintf("%s round trips + %s ms own (p99); total p50 %s / p99 %s ms, RTT %s ms", format(trips), format(own), format(p50), format(p99), format(rtt)),
				target:   fmt.Sprintf("<= %g RTT + 3 ms", want),
				ok:       trips <= want && own <= 3,
			})
		}
	}
	if a, ok := find("Fingerprint/idem.Fingerprint"); ok {
		if b, ok := find("Fingerprint/crypto/sha256"); ok {
			x, _ := a.get("MB/s")
			y, _ := b.get("MB/s")
			add("fingerprint throughput vs raw SHA-256 (1 MiB)", 100*x/y, "%", ">= 90 %", x >= 0.9*y)
		}
	}
	if a, ok := find("SweepBatch/rows=10000"); ok {
		if b, ok := find("SweepBatch/rows=1000000"); ok {
			x, _ := a.get("ns/op")
			y, _ := b.get("ns/op")
			add("sweep batch time, 1M rows vs 10k rows", y/x, "x", "<= 1.5 x", y <= 1.5*x)
		}
	}
	for _, v := range []string{"write/single", "write/batch16", "read/single", "read/batch16"} {
		if r, ok := find("BridgeOverhead/" + v); ok {
			pct, _ := r.get("bridge-%-of-raw")
			bridge, _ := r.get("bridge-stmts/s")
			raw, _ := r.get("raw-stmts/s")
			checks = append(checks, check{
				what:     "D1 statements/s through the bridge vs raw binding calls, " + v,
				measured: fmt.Sprintf("%s %% (%s vs %s stmts/s)", format(pct), format(bridge), format(raw)),
				target:   ">= 70 %",
				ok:       pct >= 70,
			})
		}
	}
	if len(checks) > 0 {
		fmt.Fprintln(out, "\nTargets:")
		tw = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "FIGURE\tMEASURED\tTARGET\t")
		for _, c := range checks {
			mark := "met"
			if !c.ok {
				mark = "MISSED"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", c.what, c.measured, c.target, mark)
		}
		tw.Flush()
	}
	if failed {
		fmt.Fprintln(out, "\nA benchmark failed; see above.")
		os.Exit(1)
	}
}
