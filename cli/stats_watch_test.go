package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/internal/d1test"
)

// watchWriter is the output of a stats --watch run by watchRun: after each
// refresh written, it ticks the watch's injected ticker, and after the
// last one it cancels the command's context. The watch writes each
// refresh as one last Write ending in a newline that starts no other
// refresh, so counting ends of refreshes by the marker is exact.
type watchWriter struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	marker  string // the text that ends one refresh
	seen    int
	want    int
	tick    chan time.Time
	cancel  context.CancelFunc
	stopped bool
	// written, if set, is called after each refresh, with the number of
	// refreshes written, before the next tick.
	written func(n int)
}

func (w *watchWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	n := strings.Count(w.buf.String(), w.marker)
	for ; w.seen < n; w.seen++ {
		if w.written != nil {
			w.written(w.seen + 1)
		}
		if w.seen+1 >= w.want {
			w.cancel()
			continue
		}
		go func() { w.tick <- testNow }()
	}
	return len(p), nil
}

func (w *watchWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// watchRun runs `d1idem stats --watch` with args until it has written
// refreshes refreshes (each ending in marker), on an injected ticker, and
// returns its output and exit code.
func watchRun(t *testing.T, o *options, refreshes int, marker string, args ...string) (string, string, int) {
	t.Helper()
	return watchRunWith(t, o, &watchWriter{marker: marker, want: refreshes}, args...)
}

// watchRunWith is watchRun with a given writer.
func watchRunWith(t *testing.T, o *options, w *watchWriter, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w.tick, w.cancel = make(chan time.Time), cancel
	var intervals []time.Duration
	o.ticker = func(d time.Duration) (<-chan time.Time, func()) {
		intervals = append(intervals, d)
		return w.tick, func() { w.mu.Lock(); w.stopped = true; w.mu.Unlock() }
	}
	var errb bytes.Buffer
	code := run(ctx, newApp(w, &errb, o), append([]string{"d1idem", "stats", "--watch"}, args...), &errb)
	w.mu.Lock()
	stopped := w.stopped
	w.mu.Unlock()
	if len(intervals) != 1 || !stopped {
		t.Errorf("tickers made %v, stopped %v; want one, stopped", intervals, stopped)
	}
	return w.String(), errb.String(), code
}

// newBudgetDB is newSchemaDB on a d1local that plays an API budget, so that
// its answers carry Ratelimit headers.
func newBudgetDB(t *testing.T, id string) *ledgerDB {
	t.Helper()
	b := d1test.LocalConfig(t, d1local.Config{RateLimit: d1local.RateLimit{Limit: 1000, Window: 5 * time.Minute}})
	l := &ledgerDB{b: b, id: id, client: b.Database(id).Client(t)}
	d1test.ApplySchema(t, l.client)
	return l
}

// stats --watch --json writes one JSON object per refresh, each with the
// stats and the budget the last response's headers gave, until the
// context ends, which is a clean exit.
func TestStatsWatchJSON(t *testing.T) {
	l := newBudgetDB(t, "ops")
	l.insert(t, testNow, scenario...)
	out, stderr, code := watchRun(t, fixedClock(), 3, "\n", l.args("--json", "--interval", "2s")...)
	if code != 0 || stderr != "" {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != 3 {
		t.Fatalf("%d lines, want one per refresh (3):\n%s", len(lines), out)
	}
	last := 1 << 30
	for i, line := range lines {
		var v struct { // watchJSON, its stats embedded by value for decoding
			At string `json:"at"`
			statsJSON
			Budget *budgetJSON `json:"budget"`
			Error  string      `json:"error"`
		}
		if err := json.Unmarshal([]byte(line), &v); err != nil {
			t.Fatalf("line %d: %v: %s", i, err, line)
		}
		if v.Keys != 6 || v.Stuck != 3 || v.Database != "database ops" || v.At != "2026-03-01T03:00:00.000Z" || v.Error != "" {
			t.Errorf("line %d: %s", i, line)
		}
		if v.Budget == nil || v.Budget.Policy == nil || v.Budget.Policy.Quota != 1000 || v.Budget.Policy.WindowMS != 300000 {
			t.Fatalf("line %d: budget %+v", i, v.Budget)
		}
		if v.Budget.Remaining >= last || v.Budget.Remaining >= 1000 {
			t.Errorf("line %d: %d calls remaining after %d: each refresh is a call", i, v.Budget.Remaining, last)
		}
		last = v.Budget.Remaining
	}
	for _, field := range []string{`"at":`, `"keys":`, `"budget":{"seen":`, `"remaining":`, `"reset_in_ms":`, `"policy":{"quota":1000,"window_ms":300000}`} {
		if !strings.Contains(lines[0], field) {
			t.Errorf("no %s in %s", field, lines[0])
		}
	}
}

// On a terminal each refresh redraws the view in place; elsewhere the
// refreshes follow one another. Without Ratelimit headers the budget says
// it was not reported.
func TestStatsWatchTerminal(t *testing.T) {
	l := newBudgetDB(t, "ops")
	l.insert(t, testNow, scenario...)
	o := fixedClock()
	o.isTerminal = func(io.Writer) bool { return true }
	out, stderr, code := watchRun(t, o, 2, "(as the response of", l.args("--interval", "3s")...)
	if code != 0 || stderr != "" {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if n := strings.Count(out, clearScreen); n != 2 || !strings.HasPrefix(out, clearScreen) {
		t.Errorf("%d redraws, want 2:\n%q", n, out)
	}
	for _, want := range []string{"2026-03-01T03:00:00.000Z, every 3s; Ctrl-C stops\n", "keys            6\n"} {
		if strings.Count(out, want) != 2 {
			t.Errorf("%q not in each refresh:\n%s", want, out)
		}
	}

	// The budget's times are the client's, on the local clock: not the
	// command's injected one.
	budget := regexp.MustCompile(`\nAPI budget      99\d calls left of 1000 per 5m, resets in (5m|4m\d+s) \(as the response of \d+m?s ago said\)\n`)
	if n := len(budget.FindAllString(out, -1)); n != 2 {
		t.Errorf("%d budget lines matching %s, want 2:\n%s", n, budget, out)
	}

	plain := newSchemaDB(t, "ops")
	out, _, code = watchRun(t, fixedClock(), 2, "(d1local sends none unless it plays a budget)\n", plain.args()...)
	if code != 0 || strings.Contains(out, clearScreen) || strings.Contains(out, "Ctrl-C") ||
		!strings.Contains(out, "budget)\n\n2026-03-01T03:00:00.000Z, every 5s\n") {
		t.Errorf("stats --watch off a terminal:\n%s", out)
	}
}

// A refresh that fails after the first is shown, and the watch goes on.
func TestStatsWatchLaterFailure(t *testing.T) {
	var failing atomic.Bool
	b := d1test.LocalConfig(t, d1local.Config{Faults: func(d1local.Request) d1local.Fault {
		return d1local.Fault{Internal: failing.Load()}
	}})
	l := &ledgerDB{b: b, id: "ops", client: b.Database("ops").Client(t)}
	d1test.ApplySchema(t, l.client)
	o := fixedClock()
	o.clientMods = append(o.clientMods, func(c *d1client.Config) { c.Retry = d1client.NoRetry() })
	w := &watchWriter{marker: "\n", want: 3, written: func(n int) { failing.Store(n == 1) }}
	out, stderr, code := watchRunWith(t, o, w, l.args("--json")...)
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if code != 0 || stderr != "" || len(lines) != 3 {
		t.Fatalf("exit %d, stderr %q, %d lines:\n%s", code, stderr, len(lines), out)
	}
	for i, line := range lines {
		failed := strings.Contains(line, `"error":"stats: D1 transient server error (HTTP 500`) && !strings.Contains(line, `"keys":`)
		if failed != (i == 1) || (i != 1 && !strings.Contains(line, `"keys":0`)) {
			t.Errorf("line %d: %s", i, line)
		}
	}
}

// A first refresh that fails is the command's error; --interval needs
// --watch and is at least a second.
func TestStatsWatchErrors(t *testing.T) {
	l := newLedgerDB(t, "ops") // no table
	out, stderr, code := watchRun(t, fixedClock(), 1, "\n", l.args()...)
	if code != exitError || out != "" || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, "no such table: idempotency_keys") {
		t.Errorf("exit %d, stdout %q, stderr %q", code, out, stderr)
	}
	s := newSchemaDB(t, "ops")
	for _, tc := range []struct{ args, want []string }{
		{[]string{"stats", "--interval", "2s"}, []string{"--interval needs --watch"}},
		{[]string{"stats", "--watch", "--interval", "500ms"}, []string{"--interval 500ms is too short", "at least 1s"}},
	} {
		r := runCLI(t, fixedClock(), s.args(tc.args...)...)
		if r.code != exitUsage {
			t.Errorf("%v: %s", tc.args, r)
		}
		for _, w := range tc.want {
			if !strings.Contains(r.stderr, w) {
				t.Errorf("%v: no %q in %s", tc.args, w, r.stderr)
			}
		}
	}
}
