package cli

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jarcoal/httpmock"

	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/internal/d1test"
)

// rawControl describes the first character of s that would reach a
// terminal raw and drive it: a C0 control but the newline, DEL, a C1
// control (U+0080 to U+009F), or a byte 0x80 to 0x9F of invalid UTF-8
// (which a terminal reading bytes takes for C1); "" when there is none.
func rawControl(s string) string {
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1 && s[i] >= 0x80 && s[i] <= 0x9f:
			return fmt.Sprintf("byte %#x at %d", s[i], i)
		case r < 0x20 && r != '\n', r >= 0x7f && r <= 0x9f:
			return fmt.Sprintf("%U at %d: %q", r, i, s[max(0, i-20):min(len(s), i+20)])
		}
		i += n
	}
	return ""
}

// TestPrincipalArgNUL: a principal with a NUL byte, which no argument can
// hold, is printed as --principal-hex, and --principal-hex reads it back.
func TestPrincipalArgNUL(t *testing.T) {
	if got := principalArg("a\x00b"); got != "--principal-hex 610062" {
		t.Errorf("principalArg = %s", got)
	}
	if got := principalArg("a\x1bb"); got != `--principal $'a\033b'` {
		t.Errorf("principalArg = %s", got)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"keys", "get", "--principal", "a", "--principal-hex", "61", "--key", "k"}, "d1idem: --principal and --principal-hex both name the principal; pass one\n"},
		{[]string{"keys", "release", "--principal-hex", "6x", "--key", "k", "--generation", "1"}, `d1idem: --principal-hex "6x" is not the hex of the principal's bytes (two hex digits a byte, such as 61637431 for acct1)` + "\n"},
		{[]string{"keys", "list", "--principal-hex", "c3"}, `d1idem: --principal "\xc3" (1 byte) is not one the ledger holds: principals are 1 to 1024 bytes of UTF-8` + "\n"},
	} {
		if r := runCLI(t, nil, tc.args...); r.code != exitUsage || r.stderr != tc.want {
			t.Errorf("%v: %s\nwant exit 2 and %q", tc.args, r, tc.want)
		}
	}
}

// The hostile ledger: rows whose values would drive a terminal. Any UTF-8
// is a principal (idem.ValidPrincipal), a NUL byte included; stored
// headers and bodies, fingerprints and statuses are whatever the table
// holds.
const (
	// hostilePrincipal retitles the window (OSC 0 ... BEL), clears the
	// screen (ESC [ 2 J) and starts a C1 CSI (U+009B) that paints red.
	hostilePrincipal = "\x1b]0;pwned\a\x1b[2J\u009b31m"
	hostileLetters   = "é日本\u009b\x7f\ttab"
	hostileNUL       = "nul\x00\x1b[2J"
)

var hostileRows = []row{
	{principal: hostilePrincipal, key: "order-1", status: "pending", generation: 1, created: 25 * time.Second, updated: 25 * time.Second},
	{principal: hostileLetters, key: "order-2", status: "completed", generation: 1, created: time.Hour, updated: time.Hour, respStatus: 201,
		headers: `{"x-evil\u001b[2J":"v\u009b\u001b]0;t\u0007"}`, body: "ok\x1b[2J\u009b\x7f", fingerprint: "\x1b[2Jfp\u0085"},
	{principal: hostileNUL, key: "order-3", status: "pending", generation: 1, created: 24 * time.Second, updated: 24 * time.Second},
	{principal: hostilePrincipal, key: "order-0", status: "pending", generation: 3, created: 2 * time.Hour, updated: 2 * time.Hour},
	{principal: "acct_1", key: "odd-status", status: "\x1b[2Jdone", generation: 1, created: time.Minute, updated: time.Minute},
}

// safeOutput fails t if the run's output has a character that would reach
// a terminal raw.
func safeOutput(t *testing.T, what string, r result) result {
	t.Helper()
	if c := rawControl(r.stdout + r.stderr); c != "" {
		t.Errorf("%s: %s reaches the terminal raw:\n%s", what, c, r)
	}
	return r
}

// TestHostileValuesShownEscaped: keys stuck, get and list show the hostile
// rows escaped (the golden file shows how), in text and in JSON, which
// still carries their exact values.
func TestHostileValuesShownEscaped(t *testing.T) {
	l := newSchemaDB(t, "ops")
	l.insert(t, testNow, hostileRows...)
	o := fixedClock()
	stuck := safeOutput(t, "keys stuck", mustRun(t, o, l.args("keys", "stuck")...))
	get := safeOutput(t, "keys get", mustRun(t, o, l.args("keys", "get", "--principal", hostilePrincipal, "--key", "order-1")...))
	completed := safeOutput(t, "keys get of a completed row", mustRun(t, o, l.args("keys", "get", "--principal", hostileLetters, "--key", "order-2")...))
	nul := safeOutput(t, "keys get --principal-hex", mustRun(t, o, l.args("keys", "get", "--principal-hex", hex.EncodeToString([]byte(hostileNUL)), "--key", "order-3")...))
	list := safeOutput(t, "keys list", mustRun(t, o, l.args("keys", "list")...))
	golden(t, "keys_hostile", "$ d1idem keys stuck\n"+stuck.stdout+
		"\n$ d1idem keys get --principal $'\\033]0;pwned\\a\\033[2J\\302\\23331m' --key order-1\n"+get.stdout+
		"\n$ d1idem keys get --principal $'é日本\\302\\233\\177\\ttab' --key order-2\n"+completed.stdout+
		"\n$ d1idem keys get --principal-hex "+hex.EncodeToString([]byte(hostileNUL))+" --key order-3\n"+nul.stdout+
		"\n$ d1idem keys list\n"+list.stdout)

	for _, args := range [][]string{{"keys", "list", "--json"}, {"keys", "stuck", "--json"}} {
		r := safeOutput(t, strings.Join(args, " "), mustRun(t, o, l.args(args...)...))
		var page struct{ Keys []keySummaryJSON }
		if err := json.Unmarshal([]byte(r.stdout), &page); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, r.stdout)
		}
		got := map[string]bool{}
		for _, k := range page.Keys {
			got[k.Principal] = true
		}
		if !got[hostilePrincipal] || !got[hostileNUL] {
			t.Errorf("%v: the JSON does not carry the exact principals: %v", args, got)
		}
	}
	r := safeOutput(t, "keys get --json", mustRun(t, o, l.args("keys", "get", "--principal", hostileLetters, "--key", "order-2", "--json")...))
	var d keyDetailJSON
	if err := json.Unmarshal([]byte(r.stdout), &d); err != nil || d.Principal != hostileLetters || d.Fingerprint != hostileRows[1].fingerprint ||
		d.ResponseHeaders["x-evil\x1b[2J"] != "v\u009b\x1b]0;t\a" || d.ResponseBody == nil || *d.ResponseBody != hostileRows[1].body {
		t.Errorf("keys get --json (%v): %+v\n%s", err, d, r.stdout)
	}
}

// TestHostileValuesPastedCommands: the commands keys stuck, keys get and
// a refused keys release print for hostile rows, pasted into bash, name
// exactly those rows: the release releases the row keys stuck showed.
func TestHostileValuesPastedCommands(t *testing.T) {
	l := newSchemaDB(t, "ops")
	l.insert(t, testNow, hostileRows...)
	o := fixedClock()
	env := []string{"CLOUDFLARE_API_TOKEN=tok_test", "LC_ALL=C"}
	released := func(principal, key string) int64 {
		return l.count(t, "principal = ? AND key = ? AND generation = 2 AND status = 'pending'", principal, key)
	}

	stuck := safeOutput(t, "keys stuck", mustRun(t, o, l.args("keys", "stuck")...))
	args := pastedIn(t, "bash", printedCommand(t, stuck.stdout, `\n  (d1idem keys release [^\n]*)\n`), env...)
	if args[2] != "--principal" || args[3] != hostilePrincipal || args[5] != "order-1" {
		t.Fatalf("keys stuck's release command, pasted, names %q", args[:6])
	}
	safeOutput(t, "the pasted release", mustRun(t, o, args...))
	if released(hostilePrincipal, "order-1") != 1 {
		t.Errorf("the pasted release did not release the row keys stuck showed")
	}

	hexNUL := hex.EncodeToString([]byte(hostileNUL))
	get := safeOutput(t, "keys get", mustRun(t, o, l.args("keys", "get", "--principal-hex", hexNUL, "--key", "order-3")...))
	args = pastedIn(t, "bash", printedCommand(t, get.stdout, `\n  (d1idem keys release [^\n]*)\n`), env...)
	if args[2] != "--principal-hex" || args[3] != hexNUL {
		t.Fatalf("keys get's release command, pasted, names %q", args[:6])
	}
	rel := safeOutput(t, "the pasted release", mustRun(t, o, args...))
	if released(hostileNUL, "order-3") != 1 {
		t.Errorf("the pasted release did not release the row with a NUL byte")
	}
	look := pastedIn(t, "bash", printedCommand(t, rel.stdout, `See the row: (d1idem keys get [^\n]*)\n`), env...)
	safeOutput(t, "the pasted keys get", mustRun(t, o, look...))

	r := safeOutput(t, "keys release at a moved generation", runCLI(t, o, l.args("keys", "release", "--principal", hostilePrincipal, "--key", "order-0", "--generation", "1")...))
	look = pastedIn(t, "bash", printedCommand(t, r.stderr, `look again with '(.*)'\n`), env...)
	if look[2] != "--principal" || look[3] != hostilePrincipal {
		t.Errorf("the refused release's keys get command, pasted, names %q", look[:6])
	}
	safeOutput(t, "the pasted keys get", mustRun(t, o, look...))
}

// TestHostileValuesStats: stats, its JSON and its watch show the hostile
// rows escaped.
func TestHostileValuesStats(t *testing.T) {
	l := newSchemaDB(t, "ops")
	l.insert(t, testNow, hostileRows...)
	o := fixedClock()
	r := safeOutput(t, "stats", mustRun(t, o, l.args("stats")...))
	for _, want := range []string{`"\x1b]0;pwned\a\x1b[2J\u009b31m" / order-0: pending, last updated 2h ago`, `  "\x1b[2Jdone"  1 (not a status the ledger writes)`} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("stats lacks %s:\n%s", want, r.stdout)
		}
	}
	safeOutput(t, "stats --json", mustRun(t, o, l.args("stats", "--json")...))
	out, stderr, _ := watchRun(t, fixedClock(), 1, "\n", l.args("--json")...)
	safeOutput(t, "stats --watch --json", result{stdout: out, stderr: stderr})
	out, stderr, _ = watchRun(t, fixedClock(), 1, "(d1local sends none unless it plays a budget)\n", l.args()...)
	safeOutput(t, "stats --watch", result{stdout: out, stderr: stderr})
	r = safeOutput(t, "keys release of an odd status", runCLI(t, o, l.args("keys", "release", "--principal", "acct_1", "--key", "odd-status", "--generation", "1", "--force")...))
	if !strings.Contains(r.stderr, `has status "\x1b[2Jdone", which the ledger does not release`) {
		t.Errorf("keys release of an odd status: %s", r)
	}
}

// TestHostileRingHome: a ring may name a home whose ID holds C1 controls
// (idem refuses only C0 and DEL in a home ID); ring status, ring advance
// and keys get show it escaped, in text and in errors.
func TestHostileRingHome(t *testing.T) {
	const home = "\u009b2J\u009d0;pwned\u009c"
	e := newShardEnv(t, d1test.Local(t), 2)
	e.must(t, 2, "schema", "apply")
	l, err := idem.NewSharded([]idem.Home{{DB: e.client(t, e.ids[0])}, {ID: home, DB: e.client(t, e.ids[1])}},
		idem.Config{Clock: e.clk.Now, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Admin().InitRing(t.Context()); err != nil {
		t.Fatal(err)
	}
	r := safeOutput(t, "ring status", e.run(t, 1, "ring", "status"))
	shown := `"\u009b2J\u009d0;pwned\u009c"`
	if r.code != exitError || !strings.Contains(r.stdout, "over 2 databases (ledger-a, "+shown+")") || !strings.Contains(r.stdout, shown+"  not given here") ||
		!strings.Contains(r.stderr, "names a database not given here ("+shown+")") {
		t.Errorf("ring status: %s", r)
	}
	r = safeOutput(t, "ring status --json", e.run(t, 1, "ring", "status", "--json"))
	var st ringStatusJSON
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || st.Ring == nil || st.Ring.Homes[1] != home {
		t.Errorf("ring status --json (%v): %s", err, r)
	}
	safeOutput(t, "ring advance", e.run(t, 1, "ring", "advance"))
	for i := range 20 {
		p := fmt.Sprintf("acct_%d", i)
		if idem.Rendezvous(p, []string{e.ids[0], home}) == home {
			safeOutput(t, "keys get", e.run(t, 1, "keys", "get", "--principal", p, "--key", "k"))
			break
		}
	}
}

// TestHostileSchemaDrift: schema verify shows a live column's name, read
// from the database, escaped.
func TestHostileSchemaDrift(t *testing.T) {
	l := newSchemaDB(t, "ops")
	l.exec(t, "ALTER TABLE idempotency_keys ADD COLUMN \"\x1b]0;pwned\a\u009b2J\" TEXT")
	for _, args := range [][]string{{"schema", "verify"}, {"schema", "verify", "--json"}, {"schema", "apply"}} {
		r := safeOutput(t, strings.Join(args, " "), runCLI(t, fixedClock(), l.args(args...)...))
		if r.code != exitError {
			t.Errorf("%v: %s", args, r)
		}
	}
	r := runCLI(t, fixedClock(), l.args("schema", "verify")...)
	if !strings.Contains(r.stdout, `+ column \x1b]0;pwned\a\u009b2J TEXT`) {
		t.Errorf("schema verify does not show the column escaped:\n%s", r)
	}
}

// TestHostileD1Message: a D1 error's message (a proxy's page, say) is shown
// escaped, in the error line and in its JSON.
func TestHostileD1Message(t *testing.T) {
	o, tr := mocked(t, "auth_10000")
	body := `{"result":[],"success":false,"errors":[{"code":7500,"message":"no such table: \u001b]0;pwned\u0007\n\u009b2J\u007f"}],"messages":[]}`
	tr.RegisterResponder(http.MethodPost, mockRawURL, httpmock.NewStringResponder(http.StatusBadRequest, body))
	r := safeOutput(t, "keys list", runCLI(t, o, append([]string{"keys", "list"}, mockFlags()...)...))
	if !strings.HasSuffix(r.stderr, `no such table: \x1b]0;pwned\a \u009b2J\x7f`+"\n") || strings.Count(r.stderr, "\n") != 1 {
		t.Errorf("keys list: %s", r)
	}
	r = safeOutput(t, "keys list --json", runCLI(t, o, append([]string{"keys", "list", "--json"}, mockFlags()...)...))
	var e struct{ Error errorJSON }
	if err := json.Unmarshal([]byte(r.stderr), &e); err != nil || e.Error.D1 == nil || e.Error.D1.Message != "no such table: \x1b]0;pwned\a\n\u009b2J\x7f" {
		t.Errorf("keys list --json (%v): %s", err, r)
	}
}
