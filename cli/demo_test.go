package cli

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/examples/orders/ordersdemo"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/idem/idemhttp"
)

// demoTTL is the demo's TTL in tests: short, so the story takes seconds,
// and long enough for a loaded machine.
const demoTTL = "1s"

// TestDemo plays the whole story: every promise holds, the first exchange
// is shown as it travels, the metrics the story produced are summed up
// (--metrics), and the last screen gives the next steps.
func TestDemo(t *testing.T) {
	r := mustRun(t, nil, "demo", "--ttl", demoTTL, "--metrics")
	for _, want := range []string{
		"> POST /v1/orders HTTP/1.1\n", "> Idempotency-Key: order-1.", "> {\"sku\":\"tea\",\"qty\":2}\n",
		"< HTTP/1.1 201 Created\n", "< Location: /v1/orders/ord_",
		"answer: 201 Created, a replay (each time)", "answer: 409 Conflict (idempotency_key_reused)",
		"1 created, ", "the retry takes the key over (generation 2): one order",
		"in memory (--dir DIR keeps it)", "Every promise held.",
		"go run ./examples/orders --local .d1idem", "curl -i -X POST localhost:8080/v1/orders", "go run ./cmd/d1idem keys list --local .d1idem",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("the demo's output lacks %q", want)
		}
	}
	if n := strings.Count(r.stdout, "\n      ok: "); n != 11 || strings.Contains(r.stdout, "BROKEN") {
		t.Errorf("%d promises held, want 11:\n%s", n, r.stdout)
	}
	checkDemoMetrics(t, r.stdout)
	for _, internal := range []string{"stored=", "instance B", "{\"content-type\""} {
		if strings.Contains(r.stdout, internal) {
			t.Errorf("the demo's output uses internal words: %q", internal)
		}
	}
}

// TestDemoKeepsItsDatabase: with --dir the database is kept where the CLI
// looks, the demo says so, and a second run in the same place holds too.
func TestDemoKeepsItsDatabase(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "kept")
	for range 2 {
		r := mustRun(t, nil, "demo", "--ttl", demoTTL, "--dir", dir)
		if strings.Contains(r.stdout, "OpenTelemetry metrics") {
			t.Error("the demo sums up its metrics without --metrics")
		}
		if !strings.Contains(r.stdout, `database "d1idem" kept under `+dir) ||
			!strings.Contains(r.stdout, "The demo's database is kept under "+dir+". Look at its rows:\n  go run ./cmd/d1idem keys list --local "+dir) {
			t.Errorf("the demo does not say where it kept its database:\n%s", r.stdout)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, d1local.LocalDatabaseID+".sqlite")); err != nil {
		t.Fatal(err)
	}
	r := mustRun(t, nil, "keys", "list", "--local", dir, "--status", "completed", "--json")
	if n := strings.Count(r.stdout, `"principal": "tok_demo_alice"`); n != 8 {
		t.Errorf("keys list after two demos shows %d of their 8 keys:\n%s", n, r.stdout)
	}
}

// TestDemoFailsLoudly: against an API that does not protect its requests,
// the promises break and the demo says which, and exits 1.
func TestDemoFailsLoudly(t *testing.T) {
	// The orders API's handler without the middleware: every request
	// creates an order, a slow one after its stall.
	unprotected := func(_ *idem.Ledger, db *d1client.Client) (http.Handler, error) {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if d, err := time.ParseDuration(r.Header.Get(ordersdemo.StallHeader)); err == nil {
				time.Sleep(d)
			}
			if _, err := db.Query(r.Context(), "INSERT INTO orders (id, principal, sku, qty, idempotency_key, created_at) VALUES (?, 'p', 'tea', 1, ?, 0)",
				fmt.Sprint(time.Now().UnixNano()), r.Header.Get(idemhttp.HeaderKey)); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			w.WriteHeader(http.StatusCreated)
		}), nil
	}
	var out bytes.Buffer
	err := runDemo(context.Background(), &out, demoOptions{ttl: time.Second}, unprotected)
	if err == nil || !regexp.MustCompile(`^\d+ promises broken: `).MatchString(err.Error()) || !strings.Contains(out.String(), "BROKEN: ") ||
		strings.Contains(out.String(), "Every promise held") {
		t.Errorf("err = %v\n%s", err, out.String())
	}
}

// checkDemoMetrics checks the --metrics summary against what the story
// does: four executions (one a takeover), one reuse, one request without a
// key, one late completion fenced out, and as many D1 calls as the client
// counted.
func checkDemoMetrics(t *testing.T, out string) {
	t.Helper()
	_, summary, ok := strings.Cut(out, "What the story's OpenTelemetry metrics say")
	if !ok {
		t.Fatalf("no metrics summary:\n%s", out)
	}
	for _, want := range []*regexp.Regexp{
		// Largest first: how many polls the story's waits take varies.
		regexp.MustCompile(`requests, by outcome +[^\n]*\bexecute 4\b`),
		regexp.MustCompile(`requests, by outcome +[^\n]*\breplay [1-9]\d*\b`),
		regexp.MustCompile(`requests, by outcome +[^\n]*\bkey_missing 1\b`),
		regexp.MustCompile(`requests, by outcome +[^\n]*\breused 1\b`),
		regexp.MustCompile(`completions +stored 4, fenced_out 1\n`),
		regexp.MustCompile(`takeovers +1\n`),
		regexp.MustCompile(`lease renewals +renewed \d+\n`),
		regexp.MustCompile(`leases lost +none\n`),
		regexp.MustCompile(`D1 calls, by result +ok \d+\n`),
	} {
		if !want.MatchString(summary) {
			t.Errorf("the metrics summary does not match %s:\n%s", want, summary)
		}
	}
	calls := regexp.MustCompile(`, (\d+) D1 calls\.\n`).FindStringSubmatch(out)
	if calls == nil || !regexp.MustCompile(`D1 calls +`+calls[1]+`, `).MatchString(summary) {
		t.Errorf("the summary's D1 calls differ from the client's count (%v):\n%s", calls, summary)
	}
}

// TestDemoTTLBounds: a --ttl the story cannot tell well is refused at once.
func TestDemoTTLBounds(t *testing.T) {
	for _, tc := range []struct{ ttl, want string }{
		{"100ms", "d1idem: --ttl 100ms is too short for the story; use at least 500ms\n"},
		{"100h", "d1idem: --ttl 100h0m0s is too long for the story, which waits it out three times; use at most 5m0s\n"},
	} {
		if r := runCLI(t, nil, "demo", "--ttl", tc.ttl); r.code != exitUsage || r.stderr != tc.want || r.stdout != "" {
			t.Errorf("demo --ttl %s: %s\nwant %q", tc.ttl, r, tc.want)
		}
	}
}

// TestDemoShowsEachStepAsItHappens: the demo's first line, written before
// anything starts, says what it is doing, and each step is shown when it
// happens: by the story's last request, every step before it is on the
// screen.
func TestDemoShowsEachStepAsItHappens(t *testing.T) {
	var out syncBuffer
	var mu sync.Mutex // the handlers write beforeLast
	var atStart, beforeLast string
	api := func(l *idem.Ledger, db *d1client.Client) (http.Handler, error) {
		atStart = out.String()
		h, err := ordersdemo.API(l, db)
		if err != nil {
			return nil, err
		}
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get(idemhttp.HeaderKey) == "" { // the last scene
				mu.Lock()
				beforeLast = out.String()
				mu.Unlock()
			}
			h.ServeHTTP(w, r)
		}), nil
	}
	if err := runDemo(context.Background(), &out, demoOptions{ttl: time.Second}, api); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	mu.Lock()
	defer mu.Unlock()
	if !strings.HasPrefix(atStart, "d1idem demo: what Idempotency-Key protection does. Starting a local D1") {
		t.Errorf("before the demo starts its API, it shows:\n%q", atStart)
	}
	for _, step := range []string{" 1. The client sends an order", " 9. After the 1s TTL, the client retries", "10. The crashed server comes back"} {
		if !strings.Contains(beforeLast, step) {
			t.Errorf("step %q is not on the screen before the last request:\n%s", step, beforeLast)
		}
	}
	if strings.Count(out.String(), "      answer: ") != 11 {
		t.Errorf("the demo shows each step once:\n%s", out.String())
	}
}
