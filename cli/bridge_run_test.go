package cli

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/internal/d1test"
)

// fakeWrangler is a recorded stand-in for wrangler (and for npx running
// it): a shell script that appends each call's arguments, working
// directory, CLOUDFLARE_ENV (and whether D1IDEM_BRIDGE_URL is set) and, for
// `secret put`, its standard input to a log, and prints what wrangler
// 4.86.0 prints on a deploy. FAKE_FAIL=deploy or FAKE_FAIL=secret makes
// that step fail.
const fakeWrangler = `#!/bin/sh
PATH=/usr/bin:/bin
log="$FAKE_LOG"
{ printf 'argv:'; for a in "$@"; do printf ' %s' "$a"; done; printf '\n'; printf 'cwd: %s\nenv: %s%s\n' "$PWD" "${CLOUDFLARE_ENV-unset}" "${D1IDEM_BRIDGE_URL+ and D1IDEM_BRIDGE_URL}"; } >> "$log"
case "$*" in
*"secret put "*)
	printf 'stdin: ' >> "$log"; cat >> "$log"; printf '\n' >> "$log"
	echo "🔐 Creating secret... (Name: $#, Value: REDACTED)"
	[ "$FAKE_FAIL" = secret ] && exit 1
	echo "✨ Success! Uploaded secret";;
*deploy)
	[ "$FAKE_FAIL" = deploy ] && { echo "✘ [ERROR] Authentication error [code: 10000]" >&2; exit 1; }
	echo "Total Upload: 27.13 KiB / gzip: 6.02 KiB"
	echo "Uploaded d1idem-bridge (1.42 sec)"
	echo "Deployed d1idem-bridge triggers (0.31 sec)"
	echo "  https://d1idem-bridge.example.workers.dev"
	echo "Current Version ID: 0f1e2d3c-0000-4000-8000-000000000000";;
*) exit 3;;
esac
`

// fakeTools makes a directory holding the fake as each of names, sets PATH
// to it alone and the fake's log, and returns the log's path.
func fakeTools(t *testing.T, names ...string) string {
	t.Helper()
	if runtime.GOOS == "windows" {
		t.Skip("the stand-in for wrangler is a shell script")
	}
	bin := t.TempDir()
	for _, n := range names {
		if err := os.WriteFile(filepath.Join(bin, n), []byte(fakeWrangler), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	log := filepath.Join(t.TempDir(), "calls.log")
	t.Setenv("PATH", bin)
	t.Setenv("FAKE_LOG", log)
	t.Setenv("FAKE_FAIL", "")
	return log
}

// initBridgeDir writes a bridge into ./bridge of a new working directory.
func initBridgeDir(t *testing.T) {
	t.Helper()
	t.Chdir(t.TempDir())
	mustRun(t, nil, "bridge", "init", "bridge", "--database", "orders-db="+ordersID)
}

var hexSecret = regexp.MustCompile(`^[0-9a-f]{64}$`)

// secretOf reads bridge/.bridge-secret and checks that only its owner may
// read it.
func secretOf(t *testing.T) string {
	t.Helper()
	fi, err := os.Stat("bridge/.bridge-secret")
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("bridge/.bridge-secret has mode %04o, want 0600", fi.Mode().Perm())
	}
	s := readFile(t, "bridge/.bridge-secret")
	if !hexSecret.MatchString(s) {
		t.Fatalf("secret %q is not 32 random bytes in hex", s)
	}
	return s
}

// bridge deploy runs wrangler deploy, then wrangler secret put with the
// secret on its standard input, in the bridge's directory, without
// CLOUDFLARE_ENV or D1IDEM_BRIDGE_URL; the secret is never printed, and the instruction it ends
// with reads it from its file. A second deploy keeps the secret;
// --rotate-secret replaces it.
func TestBridgeDeploy(t *testing.T) {
	initBridgeDir(t)
	log := fakeTools(t, "wrangler", "npx")
	t.Setenv("CLOUDFLARE_ENV", "staging")
	t.Setenv("D1IDEM_BRIDGE_URL", "https://:old-secret-0123456789abcdef@bridge.example.com")
	r := mustRun(t, nil, "bridge", "deploy", "bridge")
	secret := secretOf(t)
	golden(t, "bridge_deploy", r.stdout)
	wd, _ := os.Getwd()
	bin := filepath.Dir(mustLookPath(t, "wrangler"))
	want := "argv: deploy\ncwd: " + filepath.Join(wd, "bridge") + "\nenv: unset\n" +
		"argv: secret put BRIDGE_SECRET\ncwd: " + filepath.Join(wd, "bridge") + "\nenv: unset\nstdin: " + secret + "\n"
	if got := readFile(t, log); got != want {
		t.Fatalf("wrangler (%s) was called so:\n%s\nwant:\n%s", bin, got, want)
	}
	if strings.Contains(r.stdout+r.stderr, secret) {
		t.Fatalf("the secret was printed: %s", r)
	}
	if !strings.Contains(r.stderr, "Deployed d1idem-bridge triggers") {
		t.Errorf("wrangler's output is not passed on stderr: %s", r)
	}

	r = mustRun(t, nil, "bridge", "deploy", "bridge")
	if s := secretOf(t); s != secret || !strings.Contains(r.stdout, "with its secret (BRIDGE_SECRET)") {
		t.Fatalf("a second deploy changed the secret, or says so: %s", r)
	}
	// Rotation keeps the old secret accepted, as BRIDGE_SECRET_PREVIOUS.
	if err := os.WriteFile(log, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	r = mustRun(t, nil, "bridge", "deploy", "bridge", "--rotate-secret", "--url", "https://d1.example.com/bridge")
	rotated := secretOf(t)
	dir := filepath.Join(wd, "bridge")
	want = "argv: deploy\ncwd: " + dir + "\nenv: unset\n" +
		"argv: secret put BRIDGE_SECRET_PREVIOUS\ncwd: " + dir + "\nenv: unset\nstdin: " + secret + "\n" +
		"argv: secret put BRIDGE_SECRET\ncwd: " + dir + "\nenv: unset\nstdin: " + rotated + "\n"
	if got := readFile(t, log); rotated == secret || got != want || strings.Contains(r.stdout+r.stderr, rotated) || strings.Contains(r.stdout+r.stderr, secret) {
		t.Fatalf("--rotate-secret: %s\nwrangler was called so:\n%s\nwant:\n%s", r, got, want)
	}
	golden(t, "bridge_deploy_rotate", r.stdout)
}

func mustLookPath(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Without wrangler on PATH, npx runs the tested wrangler.
func TestBridgeDeployThroughNpx(t *testing.T) {
	initBridgeDir(t)
	log := fakeTools(t, "npx")
	mustRun(t, nil, "bridge", "deploy", "bridge")
	got := readFile(t, log)
	if !strings.HasPrefix(got, "argv: --yes wrangler@"+wranglerVersion+" deploy\n") ||
		!strings.Contains(got, "argv: --yes wrangler@"+wranglerVersion+" secret put BRIDGE_SECRET\n") {
		t.Fatalf("npx was called so:\n%s", got)
	}
}

// With neither wrangler nor npx, nothing is deployed: it prints the
// commands to run, exits 1, and the secret they read is ready.
func TestBridgeDeployWithoutWrangler(t *testing.T) {
	initBridgeDir(t)
	fakeTools(t)
	r := runCLI(t, nil, "bridge", "deploy", "bridge")
	if r.code != exitError || r.stderr != "d1idem: bridge deploy: nothing was deployed: neither wrangler nor npx is on PATH; run the commands above\n" {
		t.Fatalf("%s", r)
	}
	golden(t, "bridge_deploy_commands", r.stdout)
	secret := secretOf(t)
	if strings.Contains(r.stdout, secret) {
		t.Fatal("the secret was printed")
	}
	// Again: the same secret; a rotation needs wrangler, and changes nothing.
	if r := runCLI(t, nil, "bridge", "deploy", "bridge"); r.code != exitError || secretOf(t) != secret {
		t.Fatalf("a second time: %s", r)
	}
	r = runCLI(t, nil, "bridge", "deploy", "bridge", "--rotate-secret")
	if r.code != exitError || r.stderr != "d1idem: bridge deploy: --rotate-secret runs wrangler, and neither wrangler nor npx is on PATH; nothing was changed\n" || secretOf(t) != secret {
		t.Fatalf("--rotate-secret without wrangler: %s", r)
	}
}

// A failed wrangler deploy stops there; a failed secret put says the Worker
// refuses everything until a deploy succeeds. A secret file others can
// read, or one the bridge would refuse, is not used. Outside a bridge's
// directory, deploy says how to make one.
func TestBridgeDeployFailures(t *testing.T) {
	initBridgeDir(t)
	log := fakeTools(t, "wrangler")
	t.Setenv("FAKE_FAIL", "deploy")
	r := runCLI(t, nil, "bridge", "deploy", "bridge")
	if r.code != exitError || !strings.Contains(r.stderr, "d1idem: bridge deploy: 'wrangler deploy' failed (exit status 1; its output is above); nothing else was done\n") ||
		strings.Contains(readFile(t, log), "secret put") {
		t.Fatalf("deploy failing: %s\n%s", r, readFile(t, log))
	}
	t.Setenv("FAKE_FAIL", "secret")
	r = runCLI(t, nil, "bridge", "deploy", "bridge")
	if r.code != exitError || !strings.Contains(r.stderr, "the Worker is deployed, but 'wrangler secret put BRIDGE_SECRET' failed") ||
		!strings.Contains(r.stderr, "run 'd1idem bridge deploy bridge' again") {
		t.Fatalf("secret put failing: %s", r)
	}
	before := secretOf(t)
	r = runCLI(t, nil, "bridge", "deploy", "bridge", "--rotate-secret")
	if r.code != exitError || !strings.Contains(r.stderr, "'wrangler secret put BRIDGE_SECRET_PREVIOUS' failed (exit status 1; its output is above); the secret was not rotated") ||
		secretOf(t) != before {
		t.Fatalf("rotation failing: %s", r)
	}
	t.Setenv("FAKE_FAIL", "")
	if err := os.Chmod("bridge/.bridge-secret", 0o644); err != nil {
		t.Fatal(err)
	}
	r = runCLI(t, nil, "bridge", "deploy", "bridge")
	if r.code != exitError || !strings.Contains(r.stderr, "bridge/.bridge-secret is readable by others (mode 0644)") {
		t.Fatalf("a secret others may read: %s", r)
	}
	if err := os.WriteFile("bridge/.bridge-secret", []byte("short"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod("bridge/.bridge-secret", 0o600); err != nil {
		t.Fatal(err)
	}
	if r = runCLI(t, nil, "bridge", "deploy", "bridge"); r.code != exitError || !strings.Contains(r.stderr, "does not hold a secret the bridge accepts") {
		t.Fatalf("a short secret: %s", r)
	}
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"elsewhere"}, exitError, "d1idem: elsewhere has no wrangler.toml: write the bridge there first with 'd1idem bridge init elsewhere --database NAME'\n"},
		{[]string{"a", "b"}, exitUsage, "d1idem: bridge deploy takes at most one argument, the bridge's directory (got 2)\n"},
		{[]string{"bridge", "--url", "http://x"}, exitUsage, `d1idem: --url "http://x": expected the Worker's https://HOST[/PATH], without a secret` + "\n"},
	} {
		if r := runCLI(t, nil, append([]string{"bridge", "deploy"}, tc.args...)...); r.code != tc.code || r.stderr != tc.want {
			t.Errorf("bridge deploy %v: %s\nwant exit %d with %q", tc.args, r, tc.code, tc.want)
		}
	}
	// A URL that may hold a secret is not repeated.
	for _, u := range []string{"https://:SECRETPWabcdefghijklmnop@my.workers.dev", "https://user:SECRETPW@my.workers.dev", "https://SECRETPW@my.workers.dev",
		"https://my.workers.dev/?k=SECRETPW", "https://my.workers.dev/#SECRETPW", "https://:SECRET PW@my.workers.dev"} {
		r := runCLI(t, nil, "bridge", "deploy", "bridge", "--url", u)
		if r.code != exitUsage || strings.Contains(r.stdout+r.stderr, "SECRET") || !strings.Contains(r.stderr, "the URL given is not shown") || strings.Count(r.stderr, "\n") != 1 {
			t.Errorf("--url %s: %s", u, r)
		}
	}
}

// wranglerBin returns the directory of the pinned wrangler
// (conformance/node_modules/.bin). It skips t when Node or the npm packages
// are missing, and fails it in CI.
func wranglerBin(t *testing.T) string {
	t.Helper()
	missing := func(why string) {
		t.Helper()
		if os.Getenv("CI") != "" {
			t.Fatalf("bridge serve cannot be tested in CI: %s; install Node >= 20 and run `npm ci` in conformance/", why)
		}
		t.Skipf("bridge serve not tested: %s; run `make test` with Node 20 and npm to include it", why)
	}
	if _, err := exec.LookPath("node"); err != nil {
		missing("node is not in PATH")
	}
	root, err := d1test.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(root, "conformance", "node_modules", ".bin")
	if _, err := os.Stat(filepath.Join(bin, "wrangler")); err != nil {
		missing(err.Error())
	}
	return bin
}

var bridgeURLLine = regexp.MustCompile(`export D1IDEM_BRIDGE_URL=(http://:[0-9a-f]{64}@127\.0\.0\.1:(\d+))\n`)

// bridge serve runs the bridge bridge init wrote, under the pinned
// wrangler's `wrangler dev --local` (real workerd D1), and prints the
// D1IDEM_BRIDGE_URL that reaches it: with that variable alone, the CLI
// applies the schema and the ledger serves a request and its replay. It
// stops when its context ends, workerd with it.
func TestBridgeServe(t *testing.T) {
	if testing.Short() {
		t.Skip("starts wrangler dev")
	}
	bin := wranglerBin(t)
	initBridgeDir(t)
	home := t.TempDir()
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	for k, v := range map[string]string{"HOME": home, "XDG_CONFIG_HOME": filepath.Join(home, ".config"), "WRANGLER_SEND_METRICS": "false",
		"BROWSER": "none", "NO_COLOR": "1", d1client.BridgeURLEnv: "", d1client.BaseURLEnv: "", d1client.APIBaseURLEnv: "", "CLOUDFLARE_API_TOKEN": ""} {
		t.Setenv(k, v)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errb syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, newApp(&out, &errb, &options{}), []string{"d1idem", "bridge", "serve", "bridge", "--port", "0"}, &errb)
	}()
	m := waitFor(t, &out, &errb, done, bridgeURLLine)
	if fi, err := os.Stat("bridge/.dev.vars"); err != nil || fi.Mode().Perm() != 0o600 || !strings.Contains(readFile(t, "bridge/.dev.vars"), "BRIDGE_SECRET="+m[1][8:72]) {
		t.Fatalf("bridge/.dev.vars: %v", err)
	}
	t.Setenv(d1client.BridgeURLEnv, m[1])
	r := mustRun(t, nil, "schema", "apply", "--account-id", "local", "--database-id", "orders-db")
	if !strings.Contains(r.stdout, "on database orders-db through the bridge at http://127.0.0.1:"+m[2]+".") {
		t.Errorf("schema apply: %s", r)
	}
	serveLedger(t)
	mustRun(t, nil, "keys", "get", "--account-id", "local", "--database-id", ordersID, "--principal", "acct_1", "--key", "order-1")

	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("bridge serve exited %d on its context's end: %s", code, errb.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("bridge serve did not stop within 30 s of its context's end")
	}
	if c, err := net.DialTimeout("tcp", "127.0.0.1:"+m[2], time.Second); err == nil {
		c.Close()
		t.Fatal("the bridge still answers after serve returned")
	}
}

// serveLedger runs one request and its replay through the ledger, on a
// client configured by D1IDEM_BRIDGE_URL alone.
func serveLedger(t *testing.T) {
	t.Helper()
	db, err := d1client.New(d1client.Config{AccountID: "local", DatabaseID: ordersID})
	if err != nil || !db.Bridge() {
		t.Fatalf("d1client from D1IDEM_BRIDGE_URL: %v (bridge %v)", err, db != nil && db.Bridge())
	}
	ledger, err := idem.New(db, idem.Config{Heartbeat: -1})
	if err != nil {
		t.Fatal(err)
	}
	d, err := ledger.Begin(t.Context(), "acct_1", "order-1", "fp")
	if err != nil || d.Outcome != idem.Execute {
		t.Fatalf("Begin: %v, %v", d.Outcome, err)
	}
	if _, err := ledger.Complete(t.Context(), d.Reservation, idem.Response{Status: 201, Body: []byte(`{"id":1}`)}); err != nil {
		t.Fatal(err)
	}
	d, err = ledger.Begin(t.Context(), "acct_1", "order-1", "fp")
	if err != nil || d.Outcome != idem.Replay || string(d.Response.Body) != `{"id":1}` {
		t.Fatalf("replay: %v, %v", d.Outcome, err)
	}
}

// waitFor waits up to 3 minutes for out to match re, failing t if the
// command exits first.
func waitFor(t *testing.T, out, errb *syncBuffer, done chan int, re *regexp.Regexp) []string {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for time.Now().Before(deadline) {
		if m := re.FindStringSubmatch(out.String()); m != nil {
			return m
		}
		select {
		case code := <-done:
			done <- code
			t.Fatalf("exited %d: %s%s", code, out.String(), errb.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
	t.Fatalf("no %s within 3 minutes: %s%s", re, out.String(), errb.String())
	return nil
}

// The wrangler that deploy and serve run through npx is the one the tests
// pin (conformance/package.json).
func TestWranglerVersionIsThePinnedOne(t *testing.T) {
	root, err := d1test.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	var pkg struct {
		Dependencies map[string]string `json:"dependencies"`
	}
	if err := json.Unmarshal([]byte(readFile(t, filepath.Join(root, "conformance", "package.json"))), &pkg); err != nil {
		t.Fatal(err)
	}
	if got := pkg.Dependencies["wrangler"]; got != wranglerVersion {
		t.Errorf("conformance/package.json pins wrangler %q; bridge deploy and serve run %q", got, wranglerVersion)
	}
}
