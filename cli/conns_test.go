package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/d1idem/d1idem/internal/d1test"
)

// statsIDs runs stats --json and returns the IDs of the databases it read.
func statsIDs(t *testing.T, args ...string) []string {
	t.Helper()
	r := mustRun(t, nil, append(args, "stats", "--json")...)
	var s statsManyJSON
	if err := json.Unmarshal([]byte(r.stdout), &s); err != nil {
		t.Fatalf("stats --json: %v: %s", err, r)
	}
	var ids []string
	for _, d := range s.Databases {
		ids = append(ids, d.ID)
	}
	return ids
}

// refused checks that a command line is refused as a usage error, in one
// line, with this message.
func refused(t *testing.T, want string, args ...string) {
	t.Helper()
	r := runCLI(t, nil, args...)
	if r.code != exitUsage || r.stdout != "" || r.stderr != "d1idem: "+want+"\n" {
		t.Errorf("d1idem %s: want exit %d and %q; %s", strings.Join(args, " "), exitUsage, want, r)
	}
}

// TestSeveralDatabasesLocal: --database-id (repeated) and
// --databases-prefix with --local name the databases under DIR; a prefix
// that matches none, a database named twice, stats --watch over several and
// D1_DATABASE_ID beside a set are refused in one line.
func TestSeveralDatabasesLocal(t *testing.T) {
	t.Setenv("D1_DATABASE_ID", "")
	dir := t.TempDir()
	local := func(args ...string) []string { return append([]string{"--local", dir}, args...) }
	r := mustRun(t, nil, local("schema", "apply", "--database-id", "ledger-a", "--database-id", "ledger-b", "--database-id", "other")...)
	if strings.Count(r.stdout, "Created idempotency_keys") != 3 {
		t.Errorf("schema apply on 3 local databases: %s", r)
	}
	if ids := statsIDs(t, local("--databases-prefix", "ledger-")...); !slices.Equal(ids, []string{"ledger-a", "ledger-b"}) {
		t.Errorf("--databases-prefix ledger- read %v", ids)
	}
	if ids := statsIDs(t, local("--database-id", "other", "--databases-prefix", "ledger-")...); !slices.Equal(ids, []string{"other", "ledger-a", "ledger-b"}) {
		t.Errorf("--database-id other --databases-prefix ledger- read %v", ids)
	}
	refused(t, "--databases-prefix nope- names no database under "+dir+" (have: ledger-a, ledger-b, other)", local("stats", "--databases-prefix", "nope-")...)
	refused(t, "database ledger-a is named twice (--database-id ledger-a twice): name each database of the ledger once",
		local("stats", "--database-id", "ledger-a", "--database-id", "ledger-a")...)
	refused(t, "database ledger-b is named twice (--database-id ledger-b and --databases-prefix ledger-): name each database of the ledger once",
		local("keys", "list", "--database-id", "ledger-b", "--databases-prefix", "ledger-")...)
	refused(t, "--watch watches one database; name one, or leave --watch out to see all 2",
		local("stats", "--watch", "--databases-prefix", "ledger-")...)
	t.Setenv("D1_DATABASE_ID", "other")
	refused(t, "D1_DATABASE_ID is set (other) while the command line names several databases: unset it, or pass it as --database-id too",
		local("stats", "--databases-prefix", "ledger-")...)
}

// TestSeveralDatabasesWrangler: --database (repeated) and
// --databases-prefix take databases from the wrangler config's
// d1_databases, by name or binding, beside --database-id; the same
// refusals as with --local.
func TestSeveralDatabasesWrangler(t *testing.T) {
	t.Setenv("D1_DATABASE_ID", "")
	e := newShardEnv(t, d1test.Local(t), 3)
	e.must(t, 3, "schema", "apply")
	config := filepath.Join(t.TempDir(), "wrangler.toml")
	body := `name = "orders"
account_id = "` + d1test.AccountID + `"
`
	for i, name := range []string{"orders-1", "orders-2", "audit"} {
		body += "\n[[d1_databases]]\nbinding = \"" + strings.ToUpper(strings.ReplaceAll(name, "-", "_")) + "\"\ndatabase_name = \"" + name + "\"\ndatabase_id = \"" + e.ids[i] + "\"\n"
	}
	if err := os.WriteFile(config, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	conn := func(args ...string) []string {
		return append([]string{"--config", config, "--base-url", e.b.BaseURL, "--api-token", "tok_test"}, args...)
	}
	if ids := statsIDs(t, conn("--databases-prefix", "orders-")...); !slices.Equal(ids, e.ids[:2]) {
		t.Errorf("--databases-prefix orders- read %v", ids)
	}
	if ids := statsIDs(t, conn("--databases-prefix", "ORDERS_", "--database", "audit")...); !slices.Equal(ids, []string{e.ids[2], e.ids[0], e.ids[1]}) {
		t.Errorf("--databases-prefix ORDERS_ (bindings) --database audit read %v", ids)
	}
	if ids := statsIDs(t, conn("--database", "orders-2", "--database", "audit", "--database-id", e.ids[0])...); !slices.Equal(ids, []string{e.ids[1], e.ids[2], e.ids[0]}) {
		t.Errorf("--database orders-2 --database audit --database-id %s read %v", e.ids[0], ids)
	}
	refused(t, "--databases-prefix nope: no database of the d1_databases of "+config+` has a name or binding beginning with "nope" (it has: orders-1, orders-2, audit)`,
		conn("stats", "--databases-prefix", "nope")...)
	refused(t, "database "+e.ids[0]+" is named twice (--databases-prefix orders- and --database-id "+e.ids[0]+"): name each database of the ledger once",
		conn("ring", "status", "--databases-prefix", "orders-", "--database-id", e.ids[0])...)
	refused(t, "database "+e.ids[1]+" is named twice (--database orders-2 twice): name each database of the ledger once",
		conn("sweep", "--database", "orders-2", "--database", "orders-2")...)
}

// TestLocalRefusesCloudflareFlags: beside --local, a flag of the command
// line that would choose a Cloudflare database is refused, for one
// database and for several, without showing its value; the environment's
// are ignored.
func TestLocalRefusesCloudflareFlags(t *testing.T) {
	dir := t.TempDir()
	for _, env := range []string{"CLOUDFLARE_ACCOUNT_ID", "CLOUDFLARE_API_TOKEN", "D1IDEM_BRIDGE_URL", "D1_DATABASE_ID"} {
		t.Setenv(env, "")
	}
	mustRun(t, nil, "schema", "apply", "--local", dir)
	for _, tc := range [][]string{
		{"--account-id", "abc"},
		{"--api-token", "SECRETTOKEN123"},
		{"--bridge-url", "http://:SECRETBRIDGE0123456789@127.0.0.1:1"},
		{"--base-url", "http://127.0.0.1:1"},
		{"--config", "wrangler.toml"},
	} {
		for _, several := range [][]string{nil, {"--databases-prefix", "d1"}} {
			args := append(append([]string{"stats", "--local", dir}, several...), tc...)
			refused(t, tc[0]+" has no use with --local: d1local needs no Cloudflare account, API or wrangler config; leave one of them out", args...)
		}
	}
	// Their environment variables are ignored beside --local, a bridge URL
	// (and its secret) included.
	t.Setenv("CLOUDFLARE_ACCOUNT_ID", "abc")
	t.Setenv("CLOUDFLARE_API_TOKEN", "SECRETTOKEN123")
	t.Setenv("D1IDEM_BRIDGE_URL", "https://:SECRETBRIDGE0123456789@bridge.example")
	if r := mustRun(t, nil, "stats", "--local", dir); strings.Contains(r.stdout+r.stderr, "SECRET") {
		t.Errorf("stats: %s", r)
	}
}
