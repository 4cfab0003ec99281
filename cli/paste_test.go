package cli

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// pasted is a command line the CLI printed for the user to paste, read as
// sh reads it in an environment of env alone (the values a placeholder
// such as "$CLOUDFLARE_API_TOKEN" stands for): its arguments after
// "d1idem".
func pasted(t *testing.T, line string, env ...string) []string {
	t.Helper()
	return pastedIn(t, "sh", line, env...)
}

// pastedIn is pasted with another shell: bash, for the $'...' quotes.
func pastedIn(t *testing.T, shell, line string, env ...string) []string {
	t.Helper()
	cmd := exec.Command(shell, "-c", `printf '%s\0' `+line)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, env...)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s cannot read %q: %v", shell, line, err)
	}
	args := strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00")
	if args[0] != "d1idem" {
		t.Fatalf("not a d1idem command: %q", line)
	}
	return args[1:]
}

// printedCommand finds the command the pattern's group matches in text.
func printedCommand(t *testing.T, text, pattern string) string {
	t.Helper()
	m := regexp.MustCompile(pattern).FindStringSubmatch(text)
	if m == nil {
		t.Fatalf("no command matching %s in:\n%s", pattern, text)
	}
	return m[1]
}

// TestPrintedCommandsRunWhenPasted: each command the CLI prints for the
// operator to run next (in a table, a hint or an error) runs when pasted
// into a shell, with the connection flags the first command was given.
// The API token was given on the command line, not in the environment,
// so a suggested command holds "$CLOUDFLARE_API_TOKEN", never the token,
// and runs once the shell fills it in.
func TestPrintedCommandsRunWhenPasted(t *testing.T) {
	t.Setenv("CLOUDFLARE_API_TOKEN", "")
	t.Setenv("CLOUDFLARE_ACCOUNT_ID", "")
	t.Setenv("D1_DATABASE_ID", "")
	shellEnv := "CLOUDFLARE_API_TOKEN=tok_test"
	o := fixedClock()
	l := newSchemaDB(t, "ops")
	l.insert(t, testNow, scenario...)
	run := func(t *testing.T, from, line string) result {
		t.Helper()
		if strings.Contains(line, "tok_test") {
			t.Fatalf("%s printed the token: %s", from, line)
		}
		r := runCLI(t, o, pasted(t, line, shellEnv)...)
		if r.code != 0 {
			t.Errorf("%s printed %q, which fails when pasted: %s", from, line, r)
		}
		return r
	}

	lease := []string{"--ttl", "1h", "--heartbeat", "1m"}
	r := mustRun(t, o, l.args(append([]string{"keys", "stuck"}, lease...)...)...)
	release := printedCommand(t, r.stdout, `\n  (d1idem keys release --principal acct_42 --key order-7 [^\n]*)\n`)
	r = run(t, "keys stuck", release)
	run(t, "keys release", printedCommand(t, r.stdout, `See the row: (d1idem keys get [^\n]*)\n`))

	r = runCLI(t, o, l.args("keys", "release", "--principal", "acct_42", "--key", "order-8", "--generation", "1")...)
	run(t, "keys release of a moved generation", printedCommand(t, r.stderr, `look again with '([^']*)'`))

	r = mustRun(t, o, l.args("stats", "--ttl", "1h", "--retention", "72h")...)
	run(t, "stats' awaiting retry", printedCommand(t, r.stdout, `see '(d1idem keys stuck[^']*)'`))
	run(t, "stats' sweep backlog", printedCommand(t, r.stdout, `'(d1idem sweep --all[^']*)' deletes`))

	r = mustRun(t, o, l.args("schema", "apply")...)
	run(t, "schema apply", printedCommand(t, r.stdout, `Check the live shape with '([^']*)'`))

	bare := newLedgerDB(t, "bare")
	r = runCLI(t, o, bare.args("keys", "list")...)
	run(t, "keys list without the ledger table", printedCommand(t, r.stderr, `run '(d1idem schema apply[^']*)'`))
	mustRun(t, o, bare.args("keys", "list")...)

	dir := filepath.Join(t.TempDir(), "nothing-yet")
	r = runCLI(t, o, "keys", "list", "--local", dir, "--database-id", "orders")
	run(t, "keys list --local on a missing directory", printedCommand(t, r.stderr, `or '(d1idem schema apply[^']*)' do`))
	mustRun(t, o, "keys", "list", "--local", dir, "--database-id", "orders")
}

// TestLocalServePrintsWhatToPaste: the lines local serve prints, pasted
// into a shell, point d1idem at it, and its schema apply and keys list
// then run.
func TestLocalServePrintsWhatToPaste(t *testing.T) {
	_, out := serveOutput(t)
	var exports []string
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "  export ") {
			exports = append(exports, strings.TrimSpace(line))
		}
	}
	names := []string{"CLOUDFLARE_BASE_URL", "CLOUDFLARE_API_BASE_URL", "CLOUDFLARE_API_TOKEN", "CLOUDFLARE_ACCOUNT_ID"}
	script := strings.Join(exports, "\n") + "\nprintf '%s\\0'"
	for _, name := range names {
		script += ` "$` + name + `"`
	}
	values, err := exec.Command("sh", "-c", script).Output()
	if err != nil {
		t.Fatalf("sh: %v\n%s", err, script)
	}
	for i, v := range strings.Split(strings.TrimSuffix(string(values), "\x00"), "\x00") {
		if v == "" {
			t.Fatalf("local serve's exports leave %s empty:\n%s", names[i], out)
		}
		t.Setenv(names[i], v)
	}
	t.Setenv("D1_DATABASE_ID", "")
	for _, line := range strings.Split(out, "\n") {
		if line = strings.TrimSpace(line); strings.HasPrefix(line, "d1idem ") {
			if r := runCLI(t, nil, pasted(t, line)...); r.code != 0 {
				t.Errorf("local serve printed %q, which fails when pasted: %s", line, r)
			}
		}
	}
	if !strings.Contains(out, "d1idem schema apply") || !strings.Contains(out, "d1idem keys list") {
		t.Errorf("local serve does not say how to make and see a ledger:\n%s", out)
	}
}
