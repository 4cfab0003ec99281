package cli

import (
	"regexp"
	"strings"
	"testing"

	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/internal/d1test"
)

// commandPaths are every command path of the CLI.
var commandPaths = [][]string{
	{"schema"}, {"schema", "apply"}, {"schema", "verify"}, {"schema", "print"},
	{"keys"}, {"keys", "get"}, {"keys", "list"}, {"keys", "stuck"}, {"keys", "release"},
	{"sweep"}, {"stats"}, {"console"}, {"ring"}, {"ring", "status"}, {"ring", "init"}, {"ring", "grow"}, {"ring", "advance"},
	{"local"}, {"local", "serve"}, {"bridge"}, {"bridge", "init"}, {"bridge", "deploy"}, {"demo"},
}

// TestHelpText: help.txt has a section for each command, each used, and
// each command's description is its section, non-empty.
func TestHelpText(t *testing.T) {
	sections := regexp.MustCompile(`(?m)^== (.+) ==$`).FindAllStringSubmatch(helpText, -1)
	if len(sections) != len(commandPaths)+1 {
		t.Errorf("help.txt has %d sections; want one for d1idem and each of the %d commands", len(sections), len(commandPaths))
	}
	app := newApp(nil, nil, &options{})
	if app.Description != help("d1idem") || !strings.HasPrefix(app.Description, "d1idem keeps") {
		t.Errorf("the app's description is not its section: %q", app.Description)
	}
	for _, path := range commandPaths {
		cmd := findCommand(app.Commands, path[0])
		for _, name := range path[1:] {
			cmd = findCommand(cmd.Subcommands, name)
		}
		if d := help(strings.Join(path, " ")); d == "" || cmd.Description != d || strings.Contains(d, "{{") || strings.Contains(d, "\n== ") {
			t.Errorf("%s: description %q, section %q", strings.Join(path, " "), cmd.Description, d)
		}
	}
}

func TestHelp(t *testing.T) {
	r := mustRun(t, nil, "--help")
	golden(t, "help", r.stdout)
	for _, want := range []string{
		"schema   apply, verify and print the ledger schema",
		"keys     inspect and release idempotency keys",
		"sweep    delete rows past the retention window",
		"stats    counts by status, keys awaiting retry",
		"--version, -v  print the version",
		"--account-id, --api-token and\n   --database-id (or CLOUDFLARE_ACCOUNT_ID, CLOUDFLARE_API_TOKEN, D1_DATABASE_ID)",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("d1idem --help lacks %q", want)
		}
	}
	if bare := mustRun(t, nil); bare.stdout != r.stdout {
		t.Errorf("d1idem without arguments should print the same help")
	}

	for _, args := range [][]string{{"bogus"}, {"keys", "bogus"}, {"help", "bogus"}, {"keys", "help", "bogus"}, {"--bogus"}} {
		r := runCLI(t, nil, args...)
		if r.code != exitUsage || strings.Count(r.stderr, "\n") != 1 || r.stdout != "" {
			t.Errorf("d1idem %v: want exit 2 and one line; %s", args, r)
		}
	}

	r = mustRun(t, nil, "keys", "release", "--help")
	golden(t, "help_keys_release", r.stdout)

	// Every command has a usage line, a description with an example, and
	// every flag a usage text.
	for _, path := range commandPaths {
		checkCommandHelp(t, path)
	}

	for _, tc := range []struct {
		path []string
		want []string
	}{
		{[]string{"keys", "get"}, []string{"--principal PRINCIPAL", "--key KEY", "--ttl TTL", "(default: 30s)", "--json", "Exits 1 if there is no such key"}},
		{[]string{"keys", "list"}, []string{"--status STATUS", "pending or completed", "--older-than DURATION", "--limit N", "(default: 50)", "--cursor TOKEN", "next cursor: TOKEN"}},
		{[]string{"keys", "stuck"}, []string{"owner quiet", "awaiting retry", "--ttl TTL"}},
		{[]string{"keys", "release"}, []string{"--generation GENERATION", "--force", "its\n   completion is fenced out and not stored", "the next retry executes the request again"}},
		{[]string{"schema", "apply"}, []string{"--dry-run", "d1_migrations", "wrangler d1 migrations apply", "idempotent", "--migrations-dir DIR"}},
		{[]string{"schema", "verify"}, []string{"table_info and index_list", "exit 1 with a diff"}},
		{[]string{"sweep"}, []string{"--retention DURATION", "(default: 24h0m0s)", "--batch N", "(default: 20)", "--all", "--dry-run", "--max-calls N", "(default: 200, unlimited with --local or a bridge)", "1200 API calls per 5 minutes"}},
		{[]string{"stats"}, []string{"--ttl TTL", "--retention DURATION", "database size"}},
	} {
		checkHelpMentions(t, tc.path, tc.want)
	}
}

// checkCommandHelp checks the help of the command at path: a name line,
// a description with an example, every flag with a usage text and a named
// value, no default for a required flag; and "help CMD" says it too.
func checkCommandHelp(t *testing.T, path []string) {
	t.Helper()
	r := mustRun(t, nil, append(path, "--help")...)
	name := "d1idem " + strings.Join(path, " ")
	if !strings.Contains(r.stdout, "NAME:\n   "+name+" - ") {
		t.Errorf("%s --help: no name line:\n%s", name, r.stdout)
	}
	// "local" (cli/local.go) is owned elsewhere and has no description yet.
	if !strings.Contains(r.stdout, "DESCRIPTION:") && name != "d1idem local" {
		t.Errorf("%s --help: no description", name)
	}
	if len(path) > 1 || path[0] == "sweep" || path[0] == "stats" {
		if !strings.Contains(r.stdout, "\n      "+name) && !strings.Contains(r.stdout, "\n      d1idem "+path[0]) {
			t.Errorf("%s --help: no example", name)
		}
	}
	for _, line := range strings.Split(r.stdout, "\n") {
		checkFlagLine(t, name, line)
	}
	// "help CMD" says the same.
	if h := mustRun(t, nil, append([]string{"help"}, path...)...); len(path) == 1 && h.stdout == "" {
		t.Errorf("d1idem help %s printed nothing", strings.Join(path, " "))
	}
}

// checkFlagLine checks one line of command name's help: a flag has a
// usage text and a named value (urfave/cli says "value" for a flag whose
// usage has no `PLACEHOLDER`), and a required flag has no default.
func checkFlagLine(t *testing.T, name, line string) {
	t.Helper()
	if f := strings.Fields(line); len(f) == 2 && strings.HasPrefix(f[0], "--") {
		t.Errorf("%s --help: flag without usage: %q", name, line)
	}
	if f := strings.Fields(line); len(f) > 1 && strings.HasPrefix(f[0], "--") && (f[1] == "value" || f[1] == "value,") {
		t.Errorf("%s --help: a flag's value is not named: %q", name, line)
	}
	if strings.Contains(line, "(required) (default") || strings.Contains(line, "(default: none)") {
		t.Errorf("%s --help: a required flag shows a default: %q", name, line)
	}
}

// checkHelpMentions checks that the help of the command at path says
// each of wants, and lists every connection flag.
func checkHelpMentions(t *testing.T, path, wants []string) {
	t.Helper()
	r := mustRun(t, nil, append(path, "--help")...)
	for _, want := range wants {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("%v --help lacks %q:\n%s", path, want, r.stdout)
		}
	}
	for _, conn := range []string{"--account-id ID", "--api-token TOKEN", "--database-id ID", "--database NAME", "--config FILE", "--env NAME", "--preview", "--base-url URL", "--local DIR", "[$CLOUDFLARE_API_TOKEN]"} {
		if !strings.Contains(r.stdout, conn) {
			t.Errorf("%v --help lacks the connection flag %q", path, conn)
		}
	}
}

const (
	leakToken   = "tok_LEAKCHECK_7c1f9e2a5b"
	leakAccount = "acct0LEAKCHECK0000000000000000ff"
)

// TestTokenNeverPrinted sets the token in the environment, as CI does, and
// runs every command: help, successes, usage errors and API failures. The
// token appears in no output.
func TestTokenNeverPrinted(t *testing.T) {
	l := newSchemaDB(t, "leak")
	l.insert(t, testNow, scenario...)
	t.Setenv("CLOUDFLARE_API_TOKEN", leakToken)
	t.Setenv("CLOUDFLARE_ACCOUNT_ID", leakAccount)
	t.Setenv("D1_DATABASE_ID", "leak")
	t.Setenv("CLOUDFLARE_BASE_URL", l.b.BaseURL)

	check := func(what string, r result) {
		t.Helper()
		for _, secret := range []string{leakToken, "LEAKCHECK_7c1f", "7c1f9e2a5b"} {
			if strings.Contains(r.stdout, secret) || strings.Contains(r.stderr, secret) {
				t.Errorf("%s printed the token:\n%s", what, r)
			}
		}
	}
	var runs [][]string
	runs = append(runs, []string{"--help"}, []string{"help"}, []string{})
	for _, path := range commandPaths {
		runs = append(runs, append(path, "--help"), append([]string{"help"}, path...))
	}
	runs = append(runs,
		[]string{"schema", "apply", "--dry-run"}, []string{"schema", "apply"}, []string{"schema", "apply", "--json"},
		[]string{"schema", "verify"}, []string{"schema", "verify", "--json"}, []string{"schema", "print"},
		[]string{"stats"}, []string{"stats", "--json"},
		[]string{"keys", "stuck"}, []string{"keys", "stuck", "--json"},
		[]string{"keys", "list"}, []string{"keys", "list", "--json", "--limit", "2"},
		[]string{"keys", "get", "--principal", "acct_42", "--key", "order-1"}, []string{"keys", "get", "--principal", "acct_42", "--key", "order-1", "--json"},
		[]string{"keys", "get", "--principal", "acct_42", "--key", "missing"},
		[]string{"keys", "release", "--principal", "acct_42", "--key", "order-8", "--generation", "1"},
		[]string{"keys", "release", "--principal", "acct_42", "--key", "order-7", "--generation", "1"},
		[]string{"keys", "release", "--principal", "acct_42", "--key", "order-8", "--generation", "2", "--json"},
		[]string{"sweep", "--dry-run"}, []string{"sweep", "--all"}, []string{"sweep", "--json"},
		// Usage errors.
		[]string{"keys", "list", "--status", "nope"}, []string{"keys", "list", "--cursor", "bogus"}, []string{"keys", "release", "--principal", "p", "--key", "k"},
		[]string{"sweep", "--batch", "0"}, []string{"keys", "get", "--bogus-flag"}, []string{"bogus"}, []string{"keys", "bogus"},
		[]string{"stats", "--database", "x", "--config", "/nonexistent/wrangler.toml"},
		// A wrong database (the token is right, the database is not there).
		[]string{"stats", "--database-id", "nonexistent", "--base-url", "http://127.0.0.1:1"},
	)
	for _, args := range runs {
		check("d1idem "+strings.Join(args, " "), runCLI(t, fixedClock(), args...))
	}

	// API failures, recorded, with the token from the environment.
	for _, fixture := range []string{"auth_10000", "rate_limit_971", "html_502", "sql_error_syntax", "internal_500"} {
		o, _ := mocked(t, fixture)
		for _, args := range [][]string{{"stats"}, {"keys", "release", "--principal", "p", "--key", "k", "--generation", "1"}, {"sweep", "--all"}} {
			args = append(args, "--base-url", mockBaseURL, "--account-id", mockAccount, "--database-id", mockDatabase)
			r := runCLI(t, o, args...)
			if r.code != exitError {
				t.Errorf("%s %v: %s", fixture, args, r)
			}
			check(fixture+": d1idem "+strings.Join(args, " "), r)
		}
	}

	// A d1local that wants another token answers 403 with code 10000.
	strict := d1test.LocalConfig(t, d1local.Config{Token: "tok_the_right_one"})
	r := runCLI(t, fixedClock(), "stats", "--base-url", strict.BaseURL)
	if r.code != exitError || !strings.Contains(r.stderr, "D1 refused the credentials (HTTP 403, code 10000)") {
		t.Errorf("wrong token: %s", r)
	}
	check("wrong token", r)
}
