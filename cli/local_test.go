package cli

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/d1idem/d1idem/internal/d1test"
)

// syncBuffer is a bytes.Buffer safe to read while a command writes to it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

var servingLine = regexp.MustCompile(`d1local serving http://(\S+) `)

// serve starts `d1idem local serve args...` and returns its address once it
// listens; the server stops when the test ends. It listens on a free port
// of 127.0.0.1 unless args give another --addr (the last one counts): never
// on the default port, which a developer's own local serve may hold.
func serve(t *testing.T, args ...string) string {
	t.Helper()
	addr, _ := serveOutput(t, args...)
	return addr
}

// serveOutput is serve, which also returns what the server printed once
// it listened.
func serveOutput(t *testing.T, args ...string) (addr, printed string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var out, errb syncBuffer
	done := make(chan int, 1)
	argv := append([]string{"d1idem", "local", "serve", "--addr", "127.0.0.1:0"}, args...)
	go func() {
		done <- run(ctx, newApp(&out, &errb, &options{}), argv, &errb)
	}()
	t.Cleanup(func() {
		cancel()
		if code := <-done; code != 0 {
			t.Errorf("local serve exited %d: %s", code, errb.String())
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		// The serving line, and the block it begins, whose last line is the
		// keys list to paste.
		if o := out.String(); strings.Contains(o, "  d1idem keys list ") {
			if m := servingLine.FindStringSubmatch(o); m != nil {
				return m[1], o
			}
		}
		select {
		case code := <-done:
			done <- code
			t.Fatalf("local serve exited %d before listening: %s%s", code, out.String(), errb.String())
		case <-time.After(10 * time.Millisecond):
		}
	}
	t.Fatalf("local serve did not start: %s%s", out.String(), errb.String())
	return "", ""
}

func TestLocalServeNeedsATokenOffLoopback(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:0", ":0"} {
		r := runCLI(t, nil, "local", "serve", "--addr", addr)
		if r.code != exitUsage || !strings.Contains(r.stderr, "is not a loopback address") || !strings.Contains(r.stderr, "--token") {
			t.Errorf("--addr %s without a token: %s", addr, r)
		}
	}
	// With a token it serves, and requires it.
	addr := serve(t, "--addr", "0.0.0.0:0", "--token", "s3cret")
	port := addr[strings.LastIndexByte(addr, ':'):]
	req, _ := http.NewRequest("GET", "http://127.0.0.1"+port+"/client/v4/user/tokens/verify", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("verify without the token: %d, want 401", resp.StatusCode)
	}
	req.Header.Set("Authorization", "Bearer s3cret")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("verify with the token: %d, want 200", resp.StatusCode)
	}
}

func TestLocalServeRateLimit(t *testing.T) {
	addr := serve(t, "--rate-limit", "10/60s")
	resp, err := http.Get("http://" + addr + "/client/v4/memberships")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := resp.Header.Get("Ratelimit-Policy"); got != `"burst";q=10;w=60` {
		t.Errorf("Ratelimit-Policy = %q", got)
	}
	if got := resp.Header.Get("Ratelimit"); !strings.HasPrefix(got, `"default";r=9;t=`) {
		t.Errorf("Ratelimit = %q", got)
	}
	for _, bad := range []string{"10", "x/60s", "10/0s"} {
		for _, flag := range []string{"--rate-limit", "--budget"} { // its former name still works
			if r := runCLI(t, nil, "local", "serve", flag, bad); r.code != exitUsage || !strings.Contains(r.stderr, flag) {
				t.Errorf("%s %s: %s", flag, bad, r)
			}
		}
	}
	addr = serve(t, "--budget", "5/60s")
	resp, err = http.Get("http://" + addr + "/client/v4/memberships")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := resp.Header.Get("Ratelimit-Policy"); got != `"burst";q=5;w=60` {
		t.Errorf("--budget: Ratelimit-Policy = %q", got)
	}
}

func TestLocalServeNoAutoCreateCreatesNoDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "missing")
	r := runCLI(t, nil, "local", "serve", "--no-auto-create", "--dir", dir, "--addr", "127.0.0.1:0")
	if r.code == 0 || !strings.Contains(r.stderr, "missing") {
		t.Errorf("--no-auto-create with a missing --dir: %s", r)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the directory was created: %v", err)
	}
}

// TestLocalServeTypoCreatesNothing drives a newcomer's slip against a real
// local serve: once schema apply has made database "orders", every command
// given a misspelled --database-id answers that there is no such database,
// naming the one there is, and creates nothing; schema apply alone creates
// a database, and says so.
func TestLocalServeTypoCreatesNothing(t *testing.T) {
	dir := t.TempDir()
	base := "http://" + serve(t, "--dir", dir) + "/client/v4"
	flags := []string{"--base-url", base, "--account-id", "local", "--api-token", "local"}
	r := mustRun(t, nil, append([]string{"schema", "apply", "--database-id", "orders"}, flags...)...)
	if !strings.HasPrefix(r.stdout, `Created database "orders" on the d1local at `+base+"/: there was no database of that name.\n") {
		t.Errorf("schema apply does not say it created the database:\n%s", r.stdout)
	}
	for _, args := range [][]string{
		{"keys", "list"}, {"keys", "stuck"}, {"keys", "get", "--principal", "p", "--key", "k"},
		{"keys", "release", "--principal", "p", "--key", "k", "--generation", "1"},
		{"stats"}, {"sweep"}, {"sweep", "--dry-run"}, {"schema", "verify"}, {"schema", "apply", "--dry-run"},
	} {
		r := runCLI(t, nil, append(append(args, flags...), "--database-id", "ordres")...)
		if want := "no database \"ordres\" (have: orders)\n"; r.code != exitError || !strings.HasSuffix(r.stderr, want) || r.stdout != "" {
			t.Errorf("%v --database-id ordres: want exit 1 and %q; %s", args, want, r)
		}
	}
	// ring status shows each database of a ring, read or not.
	r = runCLI(t, nil, append([]string{"ring", "status", "--database-id", "ordres"}, flags...)...)
	if want := "ordres: no database \"ordres\" (have: orders)\n"; r.code != exitError || !strings.HasSuffix(r.stderr, want) || strings.Contains(r.stdout, "ring init") {
		t.Errorf("ring status --database-id ordres: want exit 1 and %q, and no ring init suggested; %s", want, r)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), "orders.sqlite") {
			t.Errorf("%s was created under --dir", e.Name())
		}
	}
	res, err := http.Get(base + "/accounts/local/d1/database")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	if !strings.Contains(string(body), `"result":[{"name":"orders",`) || strings.Count(string(body), `"name"`) != 1 {
		t.Errorf("the server's databases: %s", body)
	}
}

// TestLocalServeWrangler: with the pinned wrangler against a real local
// serve, which creates a database only when asked, 'wrangler d1 create'
// makes one, d1idem's schema apply finds it there (and creates nothing),
// and wrangler reads the ledger table it made.
func TestLocalServeWrangler(t *testing.T) {
	if testing.Short() {
		t.Skip("runs wrangler")
	}
	addr := serve(t)
	w := pinnedWrangler(t, &d1test.Backend{BaseURL: "http://" + addr})
	dir := t.TempDir()
	if out := w.runArgs(t, dir, "d1", "create", "orders"); !strings.Contains(out, "orders") {
		t.Fatalf("wrangler d1 create:\n%s", out)
	}
	r := mustRun(t, nil, "schema", "apply", "--database-id", "orders", "--base-url", "http://"+addr+"/client/v4", "--account-id", "local", "--api-token", "local")
	if !strings.HasPrefix(r.stdout, "Created idempotency_keys") {
		t.Errorf("schema apply on the database wrangler created: %s", r)
	}
	if out := w.run(t, dir, "d1", "execute", "orders", "--command", "SELECT count(*) AS n FROM idempotency_keys", "--json"); !strings.Contains(out, `"n": 0`) {
		t.Errorf("wrangler d1 execute on the ledger table:\n%s", out)
	}
}

// TestLocalServeAutoCreate: --auto-create brings back creation on first
// use, for clients that never create a database; beside --no-auto-create
// it is a usage error.
func TestLocalServeAutoCreate(t *testing.T) {
	base := "http://" + serve(t, "--auto-create") + "/client/v4"
	res, err := http.Post(base+"/accounts/local/d1/database/fresh/query", "application/json", strings.NewReader(`{"sql":"SELECT 1"}`))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Errorf("a first query with --auto-create: HTTP %d", res.StatusCode)
	}
	oneUsageLine(t, runCLI(t, nil, "local", "serve", "--auto-create", "--no-auto-create"), "--auto-create and --no-auto-create contradict each other")
}
