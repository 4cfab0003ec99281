package cli

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/d1idem/d1idem/bridge"
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
	if !strings.HasPrefix(got, "argv: --yes wrangler@"+bridge.WranglerVersion+" deploy\n") ||
		!strings.Contains(got, "argv: --yes wrangler@"+bridge.WranglerVersion+" secret put BRIDGE_SECRET\n") {
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
