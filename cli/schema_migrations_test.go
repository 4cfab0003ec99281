package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/d1idem/d1idem"
	"github.com/d1idem/d1idem/schema"
)

// writeFiles writes files (path relative to dir: contents) under dir.
func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, body := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// recorded returns the names in a migrations table, in order.
func (l *ledgerDB) recorded(t *testing.T, table string) []string {
	t.Helper()
	var names []string
	for _, r := range l.exec(t, "SELECT name FROM "+table+" ORDER BY id").Rows {
		names = append(names, r[0].String())
	}
	return names
}

// TestSchemaEnv: --env (or CLOUDFLARE_ENV) takes --database from a wrangler
// environment, in TOML and in JSONC; d1_databases is not inherited and
// account_id is.
func TestSchemaEnv(t *testing.T) {
	staging := newLedgerDB(t, "6b4c8e3e-2222-4000-8000-00000000beef")
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"wrangler.toml": `account_id = "0123456789abcdef0123456789abcdef"

[[d1_databases]]
binding = "DB"
database_name = "orders-db"
database_id = "6b4c8e3e-1111-4000-8000-000000000000"

[env.staging]
[[env.staging.d1_databases]]
binding = "DB"
database_name = "orders-staging"
database_id = "` + staging.id + `"
preview_database_id = "preview-staging"
migrations_table = "staging_migrations"

[env.bare]
name = "no databases here"
`,
		"wrangler.jsonc": `{
  "account_id": "0123456789abcdef0123456789abcdef",
  "d1_databases": [{"binding": "DB", "database_name": "orders-db", "database_id": "6b4c8e3e-1111-4000-8000-000000000000"}],
  "env": {
    "staging": {
      // the same database as in wrangler.toml
      "d1_databases": [{"binding": "DB", "database_name": "orders-staging", "database_id": "` + staging.id + `", "migrations_table": "staging_migrations"}],
    },
  },
}`,
	})
	conn := func(config string, extra ...string) []string {
		return append([]string{"--database", "DB", "--config", filepath.Join(dir, config), "--base-url", staging.b.BaseURL, "--api-token", "tok"}, extra...)
	}
	r := mustRun(t, nil, append([]string{"schema", "apply"}, conn("wrangler.toml", "--env", "staging")...)...)
	want := "Created idempotency_keys and idx_idempotency_keys_updated_at, and recorded " + schema.MigrationName + " in staging_migrations, on orders-staging (" +
		staging.id + ", env staging, from " + filepath.Join(dir, "wrangler.toml") + ").\n"
	if firstLine(r.stdout) != want {
		t.Errorf("apply --env staging:\n%s\nwant %q", r, want)
	}
	t.Setenv("CLOUDFLARE_ENV", "staging")
	r = mustRun(t, nil, append([]string{"schema", "verify"}, conn("wrangler.jsonc")...)...)
	if !strings.Contains(r.stdout, "on orders-staging ("+staging.id+", env staging, from ") {
		t.Errorf("verify with CLOUDFLARE_ENV: %s", r)
	}
	// CLOUDFLARE_ENV alone does not disturb a connection without --database.
	mustRun(t, nil, staging.args("schema", "verify")...)
	t.Setenv("CLOUDFLARE_ENV", "")
	if got := staging.recorded(t, "staging_migrations"); !reflect.DeepEqual(got, []string{schema.MigrationName}) {
		t.Errorf("staging_migrations: %q", got)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{conn("wrangler.toml", "--env", "prod"), `d1idem: no environment "prod" in ` + filepath.Join(dir, "wrangler.toml") + " (it has: bare, staging)\n"},
		{conn("wrangler.toml", "--env", "bare"), `d1idem: no database named "DB" in the d1_databases of env.bare of ` + filepath.Join(dir, "wrangler.toml") +
			" (it has none; d1_databases is not inherited from the top level, as in wrangler)\n"},
		{conn("wrangler.jsonc", "--env", "staging", "--preview"), `d1idem: database "orders-staging" has no preview_database_id in ` + filepath.Join(dir, "wrangler.jsonc") + "\n"},
		{staging.args("--env", "staging"), "d1idem: --env selects a wrangler environment for --database; pass --database NAME too\n"},
		{staging.args("--preview"), "d1idem: --preview takes the preview_database_id of --database; pass --database NAME too\n"},
		{[]string{"--local", t.TempDir(), "--env", "staging"}, "d1idem: --env selects a wrangler environment for --database; pass --database NAME too\n"},
	} {
		r := runCLI(t, nil, append([]string{"schema", "verify"}, tc.args...)...)
		if r.code != exitUsage || r.stderr != tc.want {
			t.Errorf("%v:\n%s\nwant %q", tc.args, r, tc.want)
		}
	}

	// --preview takes preview_database_id.
	preview := newSchemaDB(t, "preview-staging")
	r = mustRun(t, nil, "schema", "verify", "--database", "DB", "--env", "staging", "--preview", "--config", filepath.Join(dir, "wrangler.toml"),
		"--base-url", preview.b.BaseURL, "--api-token", "tok")
	if !strings.Contains(r.stdout, "on orders-staging (preview-staging, env staging, preview, from ") {
		t.Errorf("--preview: %s", r)
	}
}

// TestSchemaApplyUnderFileName: the schema saved under any name in the
// wrangler migrations directory is recorded under that name (found by
// content), from --database, from the database ID, or from --migrations-dir.
func TestSchemaApplyUnderFileName(t *testing.T) {
	project := t.TempDir()
	l := newLedgerDB(t, "6b4c8e3e-3333-4000-8000-000000000000")
	writeFiles(t, project, map[string]string{
		"wrangler.toml": `account_id = "0123456789abcdef0123456789abcdef"
[[d1_databases]]
binding = "DB"
database_name = "orders-db"
database_id = "` + l.id + `"
migrations_dir = "db/migrations"
`,
		"db/migrations/0001_init.sql":          "CREATE TABLE orders (id TEXT PRIMARY KEY);\n",
		"db/migrations/0002_idempotency.sql":   "-- the ledger\n" + d1idem.Schema(),
		"elsewhere/0007_ledger_by_another.sql": strings.ToLower(d1idem.Schema()),
	})
	t.Chdir(project)

	// By --database: the config's migrations_dir, relative to the config.
	r := mustRun(t, nil, "schema", "apply", "--dry-run", "--json", "--database", "orders-db", "--base-url", l.b.BaseURL, "--api-token", "tok")
	var aj applyJSON
	if err := json.Unmarshal([]byte(r.stdout), &aj); err != nil || aj.Action != "create" || aj.Migration != "0002_idempotency.sql" ||
		!reflect.DeepEqual(aj.Migrations, []string{"0002_idempotency.sql"}) || aj.MigrationsDir != filepath.Join("db", "migrations") ||
		!strings.Contains(aj.SQL, "INSERT INTO d1_migrations (name) VALUES ('0002_idempotency.sql');") {
		t.Errorf("dry run --json: %v %s", err, r.stdout)
	}
	// By database ID: the same entry of the config wrangler would find.
	r = mustRun(t, nil, l.args("schema", "apply")...)
	if firstLine(r.stdout) != "Created idempotency_keys and idx_idempotency_keys_updated_at, and recorded 0002_idempotency.sql in d1_migrations, on database "+l.id+".\n" {
		t.Errorf("apply by ID: %s", r)
	}
	r = mustRun(t, nil, "schema", "apply", "--database", "orders-db", "--base-url", l.b.BaseURL, "--api-token", "tok")
	if !strings.HasPrefix(r.stdout, "Nothing to do on orders-db ("+l.id+", from wrangler.toml): 0002_idempotency.sql is already recorded in d1_migrations.") {
		t.Errorf("second apply: %s", r)
	}
	// --migrations-dir names another directory.
	r = mustRun(t, nil, l.args("schema", "apply", "--migrations-dir", "elsewhere")...)
	if firstLine(r.stdout) != "idempotency_keys already had the expected shape; recorded 0007_ledger_by_another.sql in d1_migrations, on database "+l.id+".\n" {
		t.Errorf("apply --migrations-dir: %s", r)
	}
	if got := l.recorded(t, "d1_migrations"); !reflect.DeepEqual(got, []string{"0002_idempotency.sql", "0007_ledger_by_another.sql"}) {
		t.Errorf("d1_migrations: %q", got)
	}
	// Another database ID: the config does not apply.
	other := newLedgerDB(t, "another")
	r = mustRun(t, nil, other.args("schema", "apply")...)
	if !strings.Contains(r.stdout, "recorded "+schema.MigrationName+" in d1_migrations") {
		t.Errorf("apply on a database the config lacks: %s", r)
	}
	// A broken config named explicitly is an error.
	writeFiles(t, project, map[string]string{"broken.toml": "d1_databases = 3"})
	r = runCLI(t, nil, other.args("schema", "apply", "--config", "broken.toml")...)
	if r.code != exitError || !strings.Contains(r.stderr, "parsing broken.toml") {
		t.Errorf("broken --config: %s", r)
	}
}

// TestSchemaPrintMigration: --migration writes the schema as the next
// wrangler migration of the configured directory, once.
func TestSchemaPrintMigration(t *testing.T) {
	project := t.TempDir()
	writeFiles(t, project, map[string]string{
		"wrangler.jsonc": `{"d1_databases": [{"binding": "DB", "database_name": "orders-db", "database_id": "x", "migrations_dir": "sql"}],
		  "env": {"staging": {"d1_databases": [{"binding": "DB", "database_name": "orders-staging", "database_id": "y"}, {"binding": "AUDIT", "database_id": "z"}]}}}`,
		"sql/0001_init.sql":  "CREATE TABLE orders (id TEXT PRIMARY KEY);\n",
		"sql/0002_notes.sql": "CREATE TABLE notes (id TEXT PRIMARY KEY);\n",
	})
	t.Chdir(project)

	// The config's only database; the next number after 0002.
	r := mustRun(t, nil, "schema", "print", "--migration")
	want := filepath.Join("sql", "0003_d1idem_idempotency_keys.sql")
	if !strings.HasPrefix(r.stdout, "Wrote "+want+" (the ledger schema).\nApply it with 'wrangler d1 migrations apply orders-db --remote' or 'd1idem schema apply --database orders-db'.") {
		t.Errorf("print --migration: %s", r)
	}
	if b, err := os.ReadFile(want); err != nil || string(b) != d1idem.Schema() {
		t.Fatalf("%s: %v %q", want, err, b)
	}
	// Once: a file holding the schema, under any name, is enough.
	r = mustRun(t, nil, "schema", "print", "--migration", "--database", "orders-db", "--json")
	var pj struct {
		Migration, Path string
		Written         bool
	}
	if err := json.Unmarshal([]byte(r.stdout), &pj); err != nil || pj.Migration != "0003_d1idem_idempotency_keys.sql" || pj.Path != want || pj.Written {
		t.Errorf("second print --migration --json: %v %s", err, r.stdout)
	}
	if err := os.Rename(want, filepath.Join("sql", "0003_ledger.sql")); err != nil {
		t.Fatal(err)
	}
	r = mustRun(t, nil, "schema", "print", "--migration")
	if r.stdout != filepath.Join("sql", "0003_ledger.sql")+" already holds the ledger schema; nothing written.\n" {
		t.Errorf("renamed: %s", r)
	}

	// An environment's database: its default directory, migrations/,
	// created as needed.
	r = mustRun(t, nil, "schema", "print", "--migration", "--env", "staging", "--database", "orders-staging")
	if !strings.HasPrefix(r.stdout, "Wrote "+filepath.Join("migrations", "0001_d1idem_idempotency_keys.sql")+" (the ledger schema).\nApply it with 'wrangler d1 migrations apply orders-staging --env staging --remote' or 'd1idem schema apply --database orders-staging --env staging'.") {
		t.Errorf("print --migration --env staging: %s", r)
	}
	// Several databases and none named: a usage error, unless the
	// directory is given.
	r = runCLI(t, nil, "schema", "print", "--migration", "--env", "staging")
	if r.code != exitUsage || r.stderr != "d1idem: env.staging of wrangler.jsonc has several d1_databases (it has: orders-staging, AUDIT); name one; pass --database NAME or --migrations-dir DIR\n" {
		t.Errorf("several databases: %s", r)
	}
	r = mustRun(t, nil, "schema", "print", "--migration", "--env", "staging", "--migrations-dir", "audit")
	if !strings.HasPrefix(r.stdout, "Wrote "+filepath.Join("audit", "0001_d1idem_idempotency_keys.sql")) {
		t.Errorf("--migrations-dir: %s", r)
	}
	// A file where the directory should be.
	r = runCLI(t, nil, "schema", "print", "--migration", "--migrations-dir", "wrangler.jsonc")
	if r.code != exitUsage || r.stderr != "d1idem: the migrations directory wrangler.jsonc is a file, not a directory\n" {
		t.Errorf("--migrations-dir FILE: %s", r)
	}

	// No wrangler config at all: ./migrations.
	t.Chdir(t.TempDir())
	r = mustRun(t, nil, "schema", "print", "--migration")
	if !strings.HasPrefix(r.stdout, "Wrote "+filepath.Join("migrations", "0001_d1idem_idempotency_keys.sql")) {
		t.Errorf("without a config: %s", r)
	}
	r = runCLI(t, nil, "schema", "print", "--migration", "--database", "orders-db")
	if r.code != exitUsage || !strings.Contains(r.stderr, "--database needs a wrangler config") {
		t.Errorf("--database without a config: %s", r)
	}
}
