package cli

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/d1idem/d1idem"
	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/internal/d1test"
	"github.com/d1idem/d1idem/schema"
)

func TestSchemaPrint(t *testing.T) {
	r := mustRun(t, nil, "schema", "print")
	if r.stdout != d1idem.Schema() {
		t.Errorf("schema print is not schema.sql:\n%s", r.stdout)
	}
	r = mustRun(t, nil, "schema", "print", "--json")
	var out struct {
		Migration  string   `json:"migration"`
		SQL        string   `json:"sql"`
		Statements []string `json:"statements"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || out.SQL != d1idem.Schema() || len(out.Statements) != 2 || out.Migration != schema.MigrationName {
		t.Errorf("schema print --json: %v %s", err, r.stdout)
	}
}

// TestSchemaApplyVerifyCI is the CI pipeline: apply (idempotent), then
// verify, on a fresh database.
func TestSchemaApplyVerifyCI(t *testing.T) {
	l := newLedgerDB(t, "ci")

	dry := mustRun(t, nil, l.args("schema", "apply", "--dry-run")...)
	if !strings.HasPrefix(dry.stdout, "-- schema apply on database ci would create the ledger table and index, and record the migration, in one transaction:\n") ||
		!strings.Contains(dry.stdout, "CREATE TABLE idempotency_keys (") || !strings.Contains(dry.stdout, "INSERT INTO d1_migrations (name) VALUES ('"+schema.MigrationName+"');") {
		t.Errorf("dry run:\n%s", dry.stdout)
	}
	res := l.exec(t, "SELECT count(*) FROM sqlite_master WHERE name IN ('idempotency_keys', 'd1_migrations')")
	if n, _ := res.Rows[0][0].Int64(); n != 0 {
		t.Fatal("--dry-run changed the database")
	}

	r := runCLI(t, nil, l.args("schema", "verify")...)
	if r.code != exitError || !strings.Contains(r.stdout, "- table idempotency_keys (missing)") ||
		r.stderr != "d1idem: schema drift: idempotency_keys does not exist on database ci; run 'd1idem schema apply"+l.hint()+"'\n" {
		t.Errorf("verify before apply: %s", r)
	}

	r = mustRun(t, nil, l.args("schema", "apply")...)
	if r.stdout != "Created idempotency_keys and idx_idempotency_keys_updated_at, and recorded "+schema.MigrationName+" in d1_migrations, on database ci.\n"+
		"Check the live shape with 'd1idem schema verify"+l.hint()+"'.\n" {
		t.Errorf("apply: %q", r.stdout)
	}
	r = mustRun(t, nil, l.args("schema", "apply")...)
	if !strings.HasPrefix(r.stdout, "Nothing to do on database ci: "+schema.MigrationName+" is already recorded in d1_migrations.") {
		t.Errorf("second apply: %q", r.stdout)
	}
	r = mustRun(t, nil, l.args("schema", "apply", "--dry-run")...)
	if r.stdout != "-- nothing to do on database ci: "+schema.MigrationName+" is already recorded in d1_migrations\n" {
		t.Errorf("dry run after apply: %q", r.stdout)
	}
	r = mustRun(t, nil, l.args("schema", "apply", "--json")...)
	var aj applyJSON
	if err := json.Unmarshal([]byte(r.stdout), &aj); err != nil || aj.Action != "nothing" || aj.MigrationsTable != "d1_migrations" || aj.DryRun {
		t.Errorf("apply --json: %v %s", err, r.stdout)
	}

	// wrangler's record: one row, under the migration's file name.
	res = l.exec(t, "SELECT name FROM d1_migrations")
	if len(res.Rows) != 1 || res.Rows[0][0].String() != schema.MigrationName {
		t.Errorf("d1_migrations: %v", res.Rows)
	}

	r = mustRun(t, nil, l.args("schema", "verify")...)
	if r.stdout != "idempotency_keys on database ci matches schema.sql: 10 columns, 2 indexes.\n" || r.stderr != "" {
		t.Errorf("verify: %s", r)
	}
	r = mustRun(t, nil, l.args("schema", "verify", "--json")...)
	if !strings.Contains(r.stdout, `"matches": true`) || !strings.Contains(r.stdout, `"diff": []`) {
		t.Errorf("verify --json: %s", r.stdout)
	}
}

// TestSchemaApplyRecordsExistingTable: a table a Worker made with the
// right shape is recorded, not recreated.
func TestSchemaApplyRecordsExistingTable(t *testing.T) {
	l := newSchemaDB(t, "ci")
	r := mustRun(t, nil, l.args("schema", "apply", "--dry-run")...)
	if !strings.HasPrefix(r.stdout, "-- schema apply on database ci would record the migration (the table already exists with the expected shape)") {
		t.Errorf("dry run: %s", r.stdout)
	}
	r = mustRun(t, nil, l.args("schema", "apply")...)
	if firstLine(r.stdout) != "idempotency_keys already had the expected shape; recorded "+schema.MigrationName+" in d1_migrations, on database ci.\n" {
		t.Errorf("apply: %q", r.stdout)
	}
}

// TestSchemaDrift: verify shows a readable diff and exits 1; apply refuses
// to record a table of another shape.
func TestSchemaDrift(t *testing.T) {
	l := newLedgerDB(t, "ci")
	l.exec(t, `CREATE TABLE idempotency_keys (
  principal TEXT NOT NULL, key TEXT NOT NULL, fingerprint TEXT NOT NULL,
  status TEXT NOT NULL DEFAULT 'pending', generation INTEGER NOT NULL DEFAULT 1,
  response_status INTEGER, response_body BLOB, response_headers TEXT,
  created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL, note TEXT,
  PRIMARY KEY (principal, key))`)

	r := runCLI(t, nil, l.args("schema", "verify")...)
	golden(t, "schema_verify_drift", r.stdout)
	if r.code != exitError || r.stderr != "d1idem: schema drift: idempotency_keys on database ci differs from schema.sql (4 differences, shown on stdout)\n" {
		t.Errorf("verify: %s", r)
	}
	r = runCLI(t, nil, l.args("schema", "verify", "--json")...)
	var vj verifyJSON
	if err := json.Unmarshal([]byte(r.stdout), &vj); err != nil || vj.Matches || len(vj.Diff) != 4 || r.code != exitError {
		t.Errorf("verify --json: %v %s", err, r)
	}

	r = runCLI(t, nil, l.args("schema", "apply")...)
	if r.code != exitError || !strings.Contains(r.stdout, "- index idx_idempotency_keys_updated_at") ||
		r.stderr != "d1idem: idempotency_keys differs from schema.sql (4 differences, shown on stdout): not recording the migration; fix the table by hand or restore it, then apply again\n" {
		t.Errorf("apply on drift: %s", r)
	}
	res := l.exec(t, "SELECT count(*) FROM sqlite_master WHERE name = 'd1_migrations'")
	if n, _ := res.Rows[0][0].Int64(); n != 0 {
		t.Error("apply recorded a drifted table")
	}
}

// TestSchemaApplyAfterDrift is the CI pipeline on a database whose
// migration is recorded but whose index was dropped: apply creates the
// index again, and verify passes after it; on a column that changed, apply
// fails as verify does, never "Nothing to do" with exit 0.
func TestSchemaApplyAfterDrift(t *testing.T) {
	dir := t.TempDir()
	mustRun(t, nil, "schema", "apply", "--local", dir)
	localExec(t, dir, "DROP INDEX idx_idempotency_keys_updated_at")
	if r := runCLI(t, nil, "schema", "verify", "--local", dir); r.code != exitError {
		t.Fatalf("verify after the drop: %s", r)
	}
	r := mustRun(t, nil, "schema", "apply", "--local", dir)
	want := "idempotency_keys had the expected columns but not its index idx_idempotency_keys_updated_at, which was created again; " +
		"0001_d1idem_idempotency_keys.sql is recorded in d1_migrations, on local database \"d1idem\" under " + dir + ".\n" +
		"Check the live shape with 'd1idem schema verify --local " + dir + "'.\n"
	if r.stdout != want {
		t.Errorf("apply after the drop:\n got %q\nwant %q", r.stdout, want)
	}
	mustRun(t, nil, "schema", "verify", "--local", dir)

	localExec(t, dir, "ALTER TABLE idempotency_keys ADD COLUMN note TEXT")
	r = runCLI(t, nil, "schema", "apply", "--local", dir)
	if r.code != exitError || !strings.Contains(r.stdout, "+ column note TEXT") ||
		r.stderr != "d1idem: idempotency_keys differs from schema.sql (1 difference, shown on stdout): the migration is recorded, but the table is not what it made; fix the table by hand or restore it, then apply again\n" {
		t.Errorf("apply on a changed column: %s", r)
	}
}

// localExec runs sql on the local database d1idem under dir, as an
// operator's own SQL would.
func localExec(t *testing.T, dir, sql string) {
	t.Helper()
	srv, err := d1local.Listen(d1local.Config{Dir: dir}, "")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	db, err := localClient(srv, d1local.LocalDatabaseID)
	if err == nil {
		_, err = db.Query(context.Background(), sql)
	}
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// TestSchemaApplyWranglerConfig: --database NAME takes the database ID,
// the account ID and migrations_table from the wrangler config, so that
// wrangler's own record agrees.
func TestSchemaApplyWranglerConfig(t *testing.T) {
	l := newLedgerDB(t, "6b4c8e3e-1111-4000-8000-000000000000")
	dir := t.TempDir()
	for name, body := range map[string]string{
		"wrangler.toml": `name = "orders"
account_id = "0123456789abcdef0123456789abcdef"

[[d1_databases]]
binding = "DB"
database_name = "orders-db"
database_id = "` + l.id + `"
migrations_table = "custom_migrations"
`,
		"wrangler.jsonc": `{
  // comments and trailing commas, as wrangler allows
  "account_id": "0123456789abcdef0123456789abcdef",
  "d1_databases": [
    {"binding": "DB", "database_name": "orders-db", "database_id": "` + l.id + `", "migrations_table": "custom_migrations",},
  ],
}`,
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for i, config := range []string{"wrangler.toml", "wrangler.jsonc"} {
		args := []string{"schema", "apply", "--database", "orders-db", "--config", filepath.Join(dir, config), "--base-url", l.b.BaseURL, "--api-token", "tok"}
		r := mustRun(t, nil, args...)
		want := "Created idempotency_keys"
		if i > 0 {
			want = "Nothing to do"
		}
		where := "orders-db (" + l.id + ", from " + filepath.Join(dir, config) + ")"
		if !strings.HasPrefix(r.stdout, want) || !strings.Contains(r.stdout, where) || !strings.Contains(r.stdout, "custom_migrations") {
			t.Errorf("%s: %s", config, r)
		}
	}
	res := l.exec(t, "SELECT name FROM custom_migrations")
	if len(res.Rows) != 1 || res.Rows[0][0].String() != schema.MigrationName {
		t.Errorf("custom_migrations: %v", res.Rows)
	}

	r := runCLI(t, nil, "schema", "verify", "--database", "nope", "--config", filepath.Join(dir, "wrangler.toml"), "--api-token", "tok")
	if r.code != exitUsage || !strings.Contains(r.stderr, `no database named "nope" in the d1_databases of`) || !strings.Contains(r.stderr, "(it has: orders-db)") {
		t.Errorf("unknown --database: %s", r)
	}
}

// TestSchemaLocal runs apply and verify on the embedded d1local.
func TestSchemaLocal(t *testing.T) {
	dir := t.TempDir()
	r := mustRun(t, nil, "schema", "apply", "--local", dir)
	created := `Created database "d1idem" under ` + dir + ": there was no database of that name.\nCreated idempotency_keys"
	if !strings.HasPrefix(r.stdout, created) || !strings.Contains(r.stdout, `, on local database "d1idem" under `+dir+".") {
		t.Errorf("apply --local: %s", r)
	}
	if r = mustRun(t, nil, "schema", "apply", "--local", dir); strings.Contains(r.stdout, "Created") {
		t.Errorf("apply --local again: %s", r)
	}
	r = mustRun(t, nil, "schema", "verify", "--local", dir)
	if !strings.HasPrefix(r.stdout, `idempotency_keys on local database "d1idem" under `+dir+" matches schema.sql") {
		t.Errorf("verify --local: %s", r)
	}
	// Another database under the same directory is another database, and
	// verify does not create it.
	r = runCLI(t, nil, "schema", "verify", "--local", dir, "--database-id", "other")
	if r.code != exitError || r.stderr != `d1idem: no database "other" under `+dir+" (have: d1idem)\n" {
		t.Errorf("verify --local other: %s", r)
	}
}

// TestHintRepeatsCommandLine: the command a hint suggests repeats the base
// URL and IDs given on the command line, so that it runs as it is, and
// leaves out what the environment gives it anyway and a URL's user
// information; a token or bridge URL given on the command line is a
// placeholder, never the secret.
func TestHintRepeatsCommandLine(t *testing.T) {
	l := newLedgerDB(t, "ci")
	hint := func(r result) string {
		t.Helper()
		_, h, ok := strings.Cut(r.stdout, "Check the live shape with 'd1idem schema verify")
		if !ok || r.code != 0 {
			t.Fatalf("schema apply: %s", r)
		}
		return strings.TrimSuffix(h, "'.\n")
	}
	t.Setenv("CLOUDFLARE_API_TOKEN", "tok_env")
	t.Setenv("CLOUDFLARE_ACCOUNT_ID", d1test.AccountID)
	t.Setenv("D1_DATABASE_ID", "")
	t.Setenv(d1client.BridgeURLEnv, "")
	if h := hint(runCLI(t, nil, "schema", "apply", "--base-url", l.b.BaseURL, "--database-id", "ci")); h != " --base-url "+l.b.BaseURL+" --database-id ci" {
		t.Errorf("account ID from the environment: hint %q", h)
	}
	// A base URL with user information is not repeated at all.
	withUser := strings.Replace(l.b.BaseURL, "http://", "http://u:pw-s3cr3t@", 1)
	if r := runCLI(t, nil, "schema", "apply", "--base-url", withUser, "--database-id", "ci"); hint(r) != " --database-id ci" || strings.Contains(r.stdout+r.stderr, "s3cr3t") {
		t.Errorf("base URL with a password: %s", r)
	}
	t.Setenv("D1_DATABASE_ID", "ci")
	if h := hint(runCLI(t, nil, "schema", "apply", "--base-url", l.b.BaseURL, "--account-id", d1test.AccountID)); h != " --base-url "+l.b.BaseURL {
		t.Errorf("IDs from the environment: hint %q", h)
	}
	// Through a bridge, the IDs on the command line (as docs/bridge.md
	// has it) and never the bridge's secret.
	t.Setenv("CLOUDFLARE_ACCOUNT_ID", "")
	t.Setenv("D1_DATABASE_ID", "")
	bridge := strings.Replace(l.b.BaseURL, "http://", "http://:s3cr3t-bridge-0123456789@", 1)
	r := runCLI(t, nil, "schema", "apply", "--bridge-url", bridge, "--account-id", d1test.AccountID, "--database-id", "ci")
	if h := hint(r); h != " --account-id "+d1test.AccountID+` --bridge-url "$D1IDEM_BRIDGE_URL" --database-id ci` || strings.Contains(r.stdout+r.stderr, "s3cr3t") {
		t.Errorf("through a bridge: hint %q; %s", h, r)
	}
}
