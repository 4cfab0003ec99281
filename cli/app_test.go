package cli

import (
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/jarcoal/httpmock"
	"github.com/urfave/cli/v2"

	"github.com/d1idem/d1idem"
	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/internal/d1test"
)

// oneUsageLine fails t unless r is a usage error: exit 2, one line on
// stderr containing want, nothing on stdout.
func oneUsageLine(t *testing.T, r result, want string) {
	t.Helper()
	if r.code != exitUsage || strings.Count(r.stderr, "\n") != 1 || r.stdout != "" || !strings.Contains(r.stderr, want) {
		t.Errorf("want exit 2 and one line with %q; %s", want, r)
	}
}

func TestSuggestions(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"kyes"}, `unknown command "kyes"; did you mean 'd1idem keys'? see 'd1idem --help'`},
		{[]string{"stat"}, `did you mean 'd1idem stats'?`},
		{[]string{"schema", "aply"}, `unknown command "aply"; did you mean 'd1idem schema apply'? see 'd1idem schema --help'`},
		{[]string{"keys", "lsit"}, `did you mean 'd1idem keys list'?`},
		{[]string{"keys", "relase", "--principal", "p"}, `did you mean 'd1idem keys release'?`},
		{[]string{"local", "sreve"}, `did you mean 'd1idem local serve'?`},
		{[]string{"help", "kyes"}, `did you mean 'd1idem keys'?`},
		{[]string{"--local", "x", "stat"}, `did you mean 'd1idem stats'?`},
		{[]string{"bogus"}, `unknown command "bogus"; see 'd1idem --help'`},
		{[]string{"keys", "bogus"}, `unknown command "bogus"; see 'd1idem keys --help'`},
	} {
		oneUsageLine(t, runCLI(t, nil, tc.args...), tc.want)
	}
	if s := suggest("zzzzzz", commands(&options{})); s != "" {
		t.Errorf("suggest(zzzzzz) = %q", s)
	}
}

// TestFlagsBeforeOrAfterTheCommand: connection flags, --json included,
// work on either side of the command.
func TestFlagsBeforeOrAfterTheCommand(t *testing.T) {
	dir := t.TempDir()
	mustRun(t, nil, "--local", dir, "schema", "apply")
	after := mustRun(t, fixedClock(), "stats", "--local", dir, "--json")
	for _, args := range [][]string{
		{"--local", dir, "stats", "--json"},
		{"--json", "--local=" + dir, "stats"},
		{"--local", dir, "--json", "stats"},
	} {
		if r := mustRun(t, fixedClock(), args...); r.stdout != after.stdout {
			t.Errorf("%v:\n%s\nwant\n%s", args, r.stdout, after.stdout)
		}
	}
	r := mustRun(t, fixedClock(), "--local", dir, "keys", "stuck")
	if !strings.HasPrefix(r.stdout, "No stuck keys") {
		t.Errorf("--local before keys stuck: %s", r)
	}
	// A value that looks like a command stays the flag's value.
	if r := runCLI(t, nil, "--local", "keys", "stats"); r.code != exitError || !strings.HasPrefix(r.stderr, "d1idem: no directory keys:") {
		t.Errorf("--local keys stats: %s", r)
	}
}

func TestRewriteArgs(t *testing.T) {
	app := newApp(nil, nil, &options{})
	for _, tc := range []struct{ in, want string }{
		{"--local D stats", "stats --local D"},
		{"--local D keys stuck --json", "keys stuck --local D --json"},
		{"help keys get", "keys get --help"},
		{"keys help get", "keys get --help"},
		{"help", "--help"},
		{"help kyes", "kyes --help"},
		{"--json kyes", "kyes --json"},
		{"--version", "--version"},
		{"stats -- --local D", "stats -- --local D"},
		{"bridge init DIR --database a --database=b --force", "bridge init --database a --database=b --force DIR"},
		{"--json bridge init DIR --database a -- --x", "bridge init --json --database a DIR -- --x"},
		{"stats extra --json", "stats --json extra"},
	} {
		got := strings.Join(rewriteArgs(app, append([]string{"d1idem"}, strings.Fields(tc.in)...))[1:], " ")
		if got != tc.want {
			t.Errorf("rewriteArgs(%s) = %s, want %s", tc.in, got, tc.want)
		}
	}
}

// TestFlagKindsAgree: a flag name means the same kind of flag (boolean or
// taking a value) in every command, which rewriteArgs and wantsJSON rely
// on.
func TestFlagKindsAgree(t *testing.T) {
	seen := map[string]bool{}
	var walk func(path string, cmds []*cli.Command)
	walk = func(path string, cmds []*cli.Command) {
		for _, c := range cmds {
			for _, f := range c.Flags {
				_, isBool := f.(*cli.BoolFlag)
				for _, n := range f.Names() {
					if prev, ok := seen[n]; ok && prev != !isBool {
						t.Errorf("--%s takes a value in one command and not in %s %s", n, path, c.Name)
					}
					seen[n] = !isBool
				}
			}
			walk(path+" "+c.Name, c.Subcommands)
		}
	}
	walk("d1idem", commands(&options{}))
}

// TestVersion: --version prints d1idem.Version (tested there).
func TestVersion(t *testing.T) {
	if r := mustRun(t, nil, "--version"); r.stdout != "d1idem version "+d1idem.Version()+"\n" {
		t.Errorf("--version: %s", r)
	}
}

// TestErrorsAsJSON: under --json every error is one line of JSON on
// stderr, with the exit status it has without --json.
func TestErrorsAsJSON(t *testing.T) {
	dir := t.TempDir()
	mustRun(t, nil, "schema", "apply", "--local", dir)
	o, _ := mocked(t, "auth_10000")
	for _, tc := range []struct {
		o    *options
		args []string
		code int
		want string
	}{
		{nil, []string{"--json", "kyes"}, exitUsage, `did you mean 'd1idem keys'?`},
		{nil, []string{"keys", "get", "--json", "--key", "k"}, exitUsage, "--principal is required"},
		{nil, []string{"stats", "--json", "--bogus"}, exitUsage, "unknown flag --bogus"},
		{nil, []string{"stats", "--json", "--local", dir, "--database-id", "other"}, exitError, `no database \"other\" under `},
		{o, append([]string{"stats", "--json"}, mockFlags()...), exitError, "D1 refused the credentials (HTTP 403, code 10000)"},
	} {
		r := runCLI(t, tc.o, tc.args...)
		var got struct {
			Error errorJSON `json:"error"`
		}
		if err := json.Unmarshal([]byte(r.stderr), &got); err != nil || r.code != tc.code || strings.Count(r.stderr, "\n") != 1 ||
			got.Error.ExitCode != tc.code || got.Error.Usage != (tc.code == exitUsage) || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%v: %v; %s", tc.args, err, r)
		}
		// Without --json: the same status, as text.
		plain := runCLI(t, tc.o, slicesWithout(tc.args, "--json")...)
		if plain.code != tc.code || !strings.HasPrefix(plain.stderr, "d1idem: ") {
			t.Errorf("%v without --json: %s", tc.args, plain)
		}
	}
	r := runCLI(t, o, append([]string{"stats", "--json"}, mockFlags()...)...)
	var d1err struct {
		Error errorJSON `json:"error"`
	}
	_ = json.Unmarshal([]byte(r.stderr), &d1err)
	if d := d1err.Error.D1; d == nil || d.HTTPStatus != 403 || len(d.Codes) != 1 || d.Codes[0] != 10000 {
		t.Errorf("the D1 failure's details: %s", r.stderr)
	}
	// --json=false is no JSON; a --json that is another flag's value is
	// not either.
	if r := runCLI(t, nil, "kyes", "--json=false"); strings.HasPrefix(r.stderr, "{") {
		t.Errorf("--json=false: %s", r)
	}
	if r := runCLI(t, nil, "keys", "get", "--principal", "--json", "--key", "k"); strings.HasPrefix(r.stderr, "{") {
		t.Errorf("--principal --json: %s", r)
	}
}

func slicesWithout(args []string, drop string) []string {
	var out []string
	for _, a := range args {
		if a != drop {
			out = append(out, a)
		}
	}
	return out
}

// TestHelpListsCommands: help of a command group lists its commands, and
// "help PATH" is "PATH --help".
func TestHelpListsCommands(t *testing.T) {
	want := mustRun(t, nil, "keys", "--help").stdout
	for _, cmd := range []string{"get ", "list ", "stuck ", "release "} {
		if !strings.Contains(want, "COMMANDS:") || !strings.Contains(want, "\n   "+cmd) {
			t.Errorf("keys --help does not list %q:\n%s", cmd, want)
		}
	}
	for _, args := range [][]string{{"help", "keys"}, {"keys"}} {
		if r := mustRun(t, nil, args...); r.stdout != want {
			t.Errorf("%v:\n%s\nwant\n%s", args, r.stdout, want)
		}
	}
	get := mustRun(t, nil, "keys", "get", "--help").stdout
	for _, args := range [][]string{{"help", "keys", "get"}, {"keys", "help", "get"}} {
		if r := mustRun(t, nil, args...); r.stdout != get {
			t.Errorf("%v:\n%s\nwant\n%s", args, r.stdout, get)
		}
	}
}

// TestRequiredFlags: the flags a command cannot do without say so in its
// help, and their absence is one usage line.
func TestRequiredFlags(t *testing.T) {
	for _, tc := range []struct {
		path     []string
		required []string
	}{
		{[]string{"keys", "get"}, []string{"--principal PRINCIPAL", "--key KEY"}},
		{[]string{"keys", "release"}, []string{"--principal PRINCIPAL", "--key KEY", "--generation GENERATION"}},
	} {
		help := mustRun(t, nil, append(tc.path, "--help")...).stdout
		marked := 0
		for _, line := range strings.Split(help, "\n") {
			if strings.HasSuffix(line, "(required)") || strings.Contains(line, "(required) (default") {
				marked++
			}
		}
		if marked != len(tc.required) {
			t.Errorf("%v --help marks %d flags required, want %d:\n%s", tc.path, marked, len(tc.required), help)
		}
		for _, f := range tc.required {
			if !strings.Contains(help, f) {
				t.Errorf("%v --help lacks %s", tc.path, f)
			}
			args := append([]string{}, tc.path...)
			for _, other := range tc.required {
				if other != f {
					args = append(args, strings.Fields(other)[0], "1")
				}
			}
			oneUsageLine(t, runCLI(t, nil, args...), strings.Fields(f)[0]+" is required")
		}
	}
}

// TestReadOnlyCreatesNothing: with --local, every command but schema apply
// needs the directory and the database to exist, and creates neither.
func TestReadOnlyCreatesNothing(t *testing.T) {
	readOnly := [][]string{
		{"stats"}, {"keys", "stuck"}, {"keys", "list"}, {"keys", "get", "--principal", "p", "--key", "k"},
		{"schema", "verify"}, {"sweep", "--dry-run"}, {"sweep"},
		{"keys", "release", "--principal", "p", "--key", "k", "--generation", "1"},
	}
	missingDir := filepath.Join(t.TempDir(), "typo")
	dir := t.TempDir()
	mustRun(t, nil, "schema", "apply", "--local", dir, "--database-id", "orders")
	mustRun(t, nil, "schema", "apply", "--local", dir, "--database-id", "audit")
	for _, args := range readOnly {
		r := runCLI(t, nil, append(args, "--local", missingDir)...)
		if r.code != exitError || !strings.Contains(r.stderr, "no directory "+missingDir+": nothing has kept a database there yet") {
			t.Errorf("%v --local %s: %s", args, missingDir, r)
		}
		r = runCLI(t, nil, append(args, "--local", dir, "--database-id", "ordres")...)
		if r.code != exitError || r.stderr != `d1idem: no database "ordres" under `+dir+" (have: audit, orders)\n" {
			t.Errorf("%v --database-id ordres: %s", args, r)
		}
	}
	if _, err := os.Stat(missingDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a read-only command created %s: %v", missingDir, err)
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "ordres") || strings.HasPrefix(e.Name(), d1local.LocalDatabaseID) {
			t.Errorf("a read-only command created %s", e.Name())
		}
	}
}

// TestMissingDatabaseOnServer: against a d1local that creates no database
// on first use (as local serve and Cloudflare), a wrong database ID is
// named as missing, with the databases there are; schema apply alone
// creates it, through d1local's create endpoint.
func TestMissingDatabaseOnServer(t *testing.T) {
	b := d1test.LocalConfig(t, d1local.Config{NoAutoCreate: true})
	for _, id := range []string{"orders", "audit"} {
		if err := b.Local.CreateDatabase(id); err != nil {
			t.Fatal(err)
		}
	}
	flags := []string{"--base-url", b.BaseURL, "--account-id", d1test.AccountID, "--api-token", "tok"}
	for _, args := range [][]string{{"stats"}, {"keys", "stuck"}, {"schema", "verify"}, {"schema", "apply", "--dry-run"}} {
		r := runCLI(t, nil, append(append(args, flags...), "--database-id", "ordres")...)
		want := "no database \"ordres\" (have: audit, orders)\n"
		if r.code != exitError || !strings.HasSuffix(r.stderr, want) || strings.Count(r.stderr, "\n") != 1 {
			t.Errorf("%v: want %q; %s", args, want, r)
		}
	}
	r := mustRun(t, nil, append([]string{"schema", "apply", "--json", "--database-id", "ordres"}, flags...)...)
	if !strings.Contains(r.stdout, `"created_database": true`) || !strings.Contains(r.stdout, `"action": "create"`) {
		t.Errorf("schema apply of a missing database on d1local: %s", r)
	}
	if have, _ := b.Local.Databases(); !slices.Equal(have, []string{"audit", "orders", "ordres"}) {
		t.Errorf("databases after schema apply: %v", have)
	}
}

// TestSchemaApplyCreatesNothingOnD1: D1 answers a missing database 404/7404
// on the database's own endpoint too, as d1local does, but as Cloudflare:
// schema apply makes no create call there (it would give the database a
// UUID of D1's choosing).
func TestSchemaApplyCreatesNothingOnD1(t *testing.T) {
	o, tr := mocked(t, "database_7404")
	fromD1 := replay(t, "database_7404")
	tr.RegisterResponder(http.MethodGet, mockListURL+"/"+mockDatabase, func(req *http.Request) (*http.Response, error) {
		res, err := fromD1(req)
		if res != nil {
			res.Header.Set("Server", "cloudflare")
		}
		return res, err
	})
	created := 0
	tr.RegisterResponder(http.MethodPost, mockListURL, func(*http.Request) (*http.Response, error) {
		created++
		return httpmock.NewStringResponse(http.StatusOK, `{"result":{"uuid":"x","name":"x"},"success":true,"errors":[],"messages":[]}`), nil
	})
	r := runCLI(t, o, append([]string{"schema", "apply"}, mockFlags()...)...)
	if r.code != exitError || !strings.Contains(r.stderr, `no database "`+mockDatabase+`"`) || created != 0 {
		t.Errorf("schema apply on D1 of a missing database: %d create calls; %s", created, r)
	}
	if tr.GetCallCountInfo()["GET "+mockListURL+"/"+mockDatabase] != 1 {
		t.Errorf("schema apply did not look at the database's endpoint: %v", tr.GetCallCountInfo())
	}
}

// TestBaseURLVariables: the CLI leaves CLOUDFLARE_API_BASE_URL and
// CLOUDFLARE_BASE_URL to d1client, which takes either and refuses both when
// they differ.
func TestBaseURLVariables(t *testing.T) {
	l := newSchemaDB(t, "env")
	args := []string{"stats", "--account-id", d1test.AccountID, "--api-token", "tok", "--database-id", "env"}
	for _, tc := range []struct{ wrangler, cf string }{{l.b.BaseURL, ""}, {"", l.b.BaseURL}, {l.b.BaseURL + "/", l.b.BaseURL}} {
		t.Setenv("CLOUDFLARE_API_BASE_URL", tc.wrangler)
		t.Setenv("CLOUDFLARE_BASE_URL", tc.cf)
		mustRun(t, nil, args...)
	}
	t.Setenv("CLOUDFLARE_API_BASE_URL", l.b.BaseURL)
	t.Setenv("CLOUDFLARE_BASE_URL", "http://127.0.0.1:1")
	oneUsageLine(t, runCLI(t, nil, args...), `cannot reach D1: CLOUDFLARE_API_BASE_URL ("`+l.b.BaseURL+`") and CLOUDFLARE_BASE_URL ("http://127.0.0.1:1") name different API base URLs: unset one of them, or set --base-url`)
	// --base-url settles it.
	mustRun(t, nil, append(args, "--base-url", l.b.BaseURL)...)
}

// TestFlagErrors: a flag value the command cannot parse, a flag without
// its value and an unknown flag are each one usage line naming the flag as
// it is typed, with two dashes, and a value it takes.
func TestFlagErrors(t *testing.T) {
	dir := t.TempDir()
	mustRun(t, nil, "schema", "apply", "--local", dir)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"keys", "list", "--older-than", "5"}, `keys list: --older-than "5" is not a duration (a number with its unit: ms, s, m or h); give it as --older-than 10m; see 'd1idem keys list --help'`},
		{[]string{"keys", "list", "--limit", "x"}, `keys list: --limit "x" is not a whole number; give it as --limit 50; see 'd1idem keys list --help'`},
		{[]string{"keys", "list", "--limit", "99999999999999999999"}, `keys list: --limit "99999999999999999999" is out of range; give it as --limit 50`},
		{[]string{"keys", "list", "--limit"}, `keys list: --limit needs a value, such as --limit 50; see 'd1idem keys list --help'`},
		{[]string{"keys", "list", "--limt", "5"}, `keys list: unknown flag --limt (did you mean --limit?); see 'd1idem keys list --help'`},
		{[]string{"keys", "release", "--principal", "p", "--key", "k", "--generation", "one"}, `keys release: --generation "one" is not a whole number; give it as --generation 1`},
		{[]string{"keys", "release", "--principal", "p", "--key", "k", "--generation", "1", "--force=maybe"}, `keys release: --force takes no value (got "maybe"): give --force alone, or leave it out`},
		{[]string{"keys", "get", "--key", "k", "--principal"}, `keys get: --principal needs a value, such as --principal PRINCIPAL`},
		{[]string{"stats", "--ttl", "30"}, `stats: --ttl "30" is not a duration (a number with its unit: ms, s, m or h); give it as --ttl 30s`},
		{[]string{"sweep", "--retention", "1d"}, `sweep: --retention "1d" is not a duration (a number with its unit: ms, s, m or h); give it as --retention 24h`},
	} {
		r := runCLI(t, nil, append([]string{"--local", dir}, tc.args...)...)
		oneUsageLine(t, r, tc.want)
		if strings.Contains(r.stderr, " -"+strings.TrimLeft(tc.args[len(tc.args)-1], "-")) {
			t.Errorf("%v: a flag with one dash: %s", tc.args, r.stderr)
		}
	}
	oneUsageLine(t, runCLI(t, nil, "--bogus"), `unknown flag --bogus; see 'd1idem --help'`)
}
