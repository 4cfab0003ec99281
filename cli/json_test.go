package cli

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/d1idem/d1idem/internal/d1test"
)

// jsonVolatile are the JSON values that differ from run to run: the wall
// clock's durations, and what depends on SQLite's page layout.
var jsonVolatile = regexp.MustCompile(`"(elapsed_ms|size_bytes|bytes_per_row|level_bytes)": [0-9.e+]+`)

// TestJSONGolden keeps every command's --json output, field names and
// values, as a golden file: on one database and on several, successes and
// errors.
func TestJSONGolden(t *testing.T) {
	var b strings.Builder
	show := func(r result, args ...string) {
		fmt.Fprintf(&b, "$ d1idem %s  # exit %d\n%s%s\n", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	}
	l := newSchemaDB(t, "ops")
	l.insert(t, testNow, scenario...)
	one := func(args ...string) {
		t.Helper()
		show(runCLI(t, fixedClock(), l.args(append(args, "--json")...)...), args...)
	}
	one("stats")
	one("keys", "get", "--principal", "acct_42", "--key", "order-1")
	one("keys", "get", "--principal", "acct_42", "--key", "order-7")
	one("keys", "get", "--principal", "acct_42", "--key", "nope")
	one("keys", "list", "--limit", "3")
	one("keys", "stuck")
	one("keys", "release", "--principal", "acct_42", "--key", "order-7", "--generation", "1")
	one("keys", "release", "--principal", "acct_42", "--key", "order-1", "--generation", "1", "--forget")
	one("sweep", "--dry-run")
	one("sweep", "--all")
	one("schema", "apply")
	one("schema", "verify")
	l.exec(t, "DROP INDEX idx_idempotency_keys_updated_at")
	one("schema", "verify")
	show(runCLI(t, nil, "schema", "print", "--json"), "schema", "print")
	show(runCLI(t, nil, "stats", "--json", "--local", "no-such-dir"), "stats", "--local", "no-such-dir")

	e := newShardEnv(t, d1test.Local(t), 2)
	many := func(args ...string) {
		t.Helper()
		show(e.run(t, 2, append(args, "--json")...), append(args, " # on 2 databases")...)
	}
	many("schema", "apply")
	many("schema", "verify")
	many("ring", "init")
	app := e.ledger(t)
	e.serve(t, app, "order-1", time.Minute, principals(4)...)
	many("stats")
	many("keys", "get", "--principal", "acct_1", "--key", "order-1")
	many("keys", "list")
	many("ring", "status")
	many("sweep", "--dry-run")
	many("sweep", "--all")
	golden(t, "json", jsonVolatile.ReplaceAllString(b.String(), `"$1": <N>`))
}
