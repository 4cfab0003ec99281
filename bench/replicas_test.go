package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// Environment of a replica process (the test binary re-executed).
const (
	envReplica   = "BENCH_REPLICA"    // set: run as a replica
	envReplicaDB = "BENCH_REPLICA_DB" // the database ID
	envReplicaD1 = "BENCH_REPLICA_D1" // d1local's base URL
)

// TestReplicaProcess is not a test: it is one replica of the service, run as
// a real subprocess by the replica benchmark and its smoke test. It serves
// the app (the full middleware, its ledger on a d1client with the default
// budget) against the parent's d1local, prints "ADDR <url>" once it listens,
// and exits when its standard input closes.
func TestReplicaProcess(t *testing.T) {
	if os.Getenv(envReplica) == "" {
		t.Skip("a replica process for BenchmarkReplicas and TestReplicasSmoke")
	}
	fail := func(err error) {
		fmt.Fprintf(os.Stderr, "replica: %v\n", err)
		os.Exit(3)
	}
	_, h, err := newApp(os.Getenv(envReplicaD1), os.Getenv(envReplicaDB))
	if err != nil {
		fail(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fail(err)
	}
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}()
	fmt.Printf("ADDR http://%s\n", ln.Addr())
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	fail(srv.Serve(ln))
}

// replica is a running replica process.
type replica struct {
	cmd    *exec.Cmd
	stdin  io.Closer
	stderr *bytes.Buffer
	url    string
}

// startReplicas starts n replica processes against d1's database id; they
// are stopped when tb ends.
func startReplicas(tb testing.TB, n int, d1 *d1Server, id string) []*replica {
	tb.Helper()
	var out []*replica
	for range n {
		cmd := exec.Command(os.Args[0], "-test.run=^TestReplicaProcess$", "-test.count=1")
		cmd.Env = append(os.Environ(), envReplica+"=1", envReplicaD1+"="+d1.URL, envReplicaDB+"="+id)
		stdin, err := cmd.StdinPipe()
		if err != nil {
			tb.Fatal(err)
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			tb.Fatal(err)
		}
		r := &replica{cmd: cmd, stdin: stdin, stderr: &bytes.Buffer{}}
		cmd.Stderr = r.stderr
		if err := cmd.Start(); err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() {
			// Closing stdin ends the replica; then, only our own child,
			// by its handle: a no-op once it has exited.
			_ = r.stdin.Close()
			done := make(chan struct{})
			go func() { _ = cmd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				_ = cmd.Process.Kill()
				<-done
			}
		})
		addr := make(chan string, 1)
		go func() {
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				if u, ok := strings.CutPrefix(sc.Text(), "ADDR "); ok {
					addr <- u
				}
			}
			close(addr)
		}()
		select {
		case u, ok := <-addr:
			if !ok {
				tb.Fatalf("a replica exited before listening; stderr:\n%s", r.stderr)
			}
			r.url = u
		case <-time.After(60 * time.Second):
			tb.Fatalf("a replica did not listen within 60 s; stderr:\n%s", r.stderr)
		}
		out = append(out, r)
	}
	return out
}

// stats asks a replica for its counters.
func (r *replica) stats(hc *http.Client) (appStats, error) {
	var s appStats
	res, err := hc.Get(r.url + "/stats")
	if err != nil {
		return s, err
	}
	defer res.Body.Close()
	return s, json.NewDecoder(res.Body).Decode(&s)
}

// replicaRun is the outcome of one run against several replicas.
type replicaRun struct {
	*load
	stats     []appStats // per replica
	completed int64      // completions stored in the ledger
	rateLimit int        // D1 answers 429 with code 971
	peak      int        // most D1 calls in any 300 s window

	accountBudget bool // d1local played the account's budget (Ratelimit headers)
}

func (r replicaRun) executed() (n int64) {
	for _, s := range r.stats {
		n += s.Executed
	}
	return n
}

// runReplicas starts n replica processes sharing one d1local (d1Latency per
// call, its configuration from localConfig) and one ledger, offers rate
// first executions per second for d round robin over them, and collects
// what each served, the 971 answers and the completions stored.
func runReplicas(tb testing.TB, n int, rate float64, d time.Duration) replicaRun {
	tb.Helper()
	d1 := startD1(tb, d1Latency, true)
	id := newDatabase(tb, d1)
	reps := startReplicas(tb, n, d1, id)
	var targets []string
	for _, r := range reps {
		targets = append(targets, r.url)
	}
	hc := poolClient(2048)
	defer hc.CloseIdleConnections()
	d1.reset()
	l := openLoop(hc, targets, rate, d, fmt.Sprintf("rep%g", rate))
	out := replicaRun{load: l, rateLimit: d1.answers("429/971"), peak: d1.peakWindow(accountWindow),
		accountBudget: d1.accountBudget()}
	for _, r := range reps {
		s, err := r.stats(hc)
		if err != nil {
			tb.Fatalf("replica stats: %v; stderr:\n%s", err, r.stderr)
		}
		out.stats = append(out.stats, s)
	}
	rows, err := ledgerRows(context.Background(), d1.URL, id)
	if err != nil {
		tb.Fatal(err)
	}
	out.completed = rows["completed"]
	return out
}

// BenchmarkReplicas (long form only, -bench.long): four replica processes
// of the service, each with the default d1client budget, against one
// d1local, at 150 first executions per second in total (round robin) for
// -bench.duration (600 s by default), 20 ms per D1 call. Reports the D1
// answers with code 971, what each replica answered, the budget 503s, the
// completions lost, and the most D1 calls d1local saw in any 300 s window
// (the figure Cloudflare's account budget, 1200 per 300 s, judges). Target:
// 0 answers 971 and every replica served.
//
// The 971 count means something only once d1local plays the account's
// budget: switch it on in localConfig. Until then the row reports
// account-budget 0 and is not judged.
func BenchmarkReplicas(b *testing.B) {
	if !*longForm {
		b.Skip("long form: run with -bench.long (make bench-budget)")
	}
	const replicas, rate = 4, 150
	d := runLength()
	b.Run(fmt.Sprintf("n=%d/rate=%d", replicas, rate), func(b *testing.B) {
		r := runReplicas(b, replicas, rate, d)
		if len(r.others) > 0 {
			b.Logf("other outcomes: %s", r.summary())
		}
		var calls int64
		served := 0
		for i, s := range r.stats {
			b.Logf("replica %d: %d answered, %d executed, %d D1 calls", i, r.perTarget[i], s.Executed, s.Calls)
			calls += s.Calls
			if r.perTarget[i] > 0 {
				served++
			}
		}
		if !r.accountBudget {
			b.Log("d1local's answers carried no Ratelimit-Policy header: it did not play the account's budget, so no call could be answered 971; peak-calls/300s is what the account's budget (1200 per 300 s) would have judged")
		}
		b.ReportMetric(d.Seconds(), "run-s")
		b.ReportMetric(b2f(r.accountBudget), "account-budget")
		b.ReportMetric(float64(r.rateLimit), "971-answers")
		b.ReportMetric(float64(served), "replicas-served")
		b.ReportMetric(float64(r.answered), "answered")
		b.ReportMetric(float64(r.budget), "budget-503")
		b.ReportMetric(float64(r.other), "other-errors")
		b.ReportMetric(float64(r.executed()-r.completed), "lost-completions")
		b.ReportMetric(float64(calls)/r.elapsed.Seconds(), "d1-calls/s")
		b.ReportMetric(float64(r.peak), "peak-calls/300s")
	})
}

// The replica harness, briefly, so that it cannot rot: four real processes
// share one d1local and one ledger; each serves its share, no D1 call is
// answered 971, and every executed handler's completion is stored.
func TestReplicasSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts four processes")
	}
	t.Parallel()
	r := runReplicas(t, 4, 20, 2*time.Second)
	if r.answered != r.sent {
		t.Fatalf("%d of %d answered; other outcomes: %s", r.answered, r.sent, r.summary())
	}
	for i, n := range r.perTarget {
		if n != r.sent/4 || r.stats[i].Executed != n {
			t.Errorf("replica %d answered %d and executed %d of %d", i, n, r.stats[i].Executed, r.sent/4)
		}
	}
	if r.rateLimit != 0 {
		t.Errorf("%d D1 answers 971", r.rateLimit)
	}
	if lost := r.executed() - r.completed; lost != 0 {
		t.Errorf("%d executed, %d completions stored", r.executed(), r.completed)
	}
}
