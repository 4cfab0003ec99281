package wrangler

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

const tomlConfig = `name = "orders"
main = "src/index.ts"
account_id = "top-account"

[[d1_databases]]
binding = "DB"
database_name = "orders-db"
database_id = "id-top"
preview_database_id = "id-top-preview"

[[d1_databases]]
binding = "AUDIT"
database_name = "audit-db"
database_id = "id-audit"
migrations_dir = "db/audit"
migrations_table = "audit_migrations"

[env.staging]
account_id = "staging-account"

[[env.staging.d1_databases]]
binding = "DB"
database_name = "orders-staging"
database_id = "id-staging"
migrations_dir = "/abs/migrations"

[env.empty]
vars = { A = "b" }
`

const jsoncConfig = `{
  // comments and trailing commas, as wrangler allows
  "name": "orders",
  "main": "src/index.ts",
  "account_id": "top-account",
  "d1_databases": [
    {"binding": "DB", "database_name": "orders-db", "database_id": "id-top", "preview_database_id": "id-top-preview"},
    {"binding": "AUDIT", "database_name": "audit-db", "database_id": "id-audit", "migrations_dir": "db/audit", "migrations_table": "audit_migrations",},
  ],
  "env": {
    "staging": {
      "account_id": "staging-account",
      "d1_databases": [
        {"binding": "DB", "database_name": "orders-staging", "database_id": "id-staging", "migrations_dir": "/abs/migrations"},
      ],
    },
    "empty": {"vars": {"A": "b"}},
  },
}`

// TestDatabases: the same configuration in each format resolves the same,
// with wrangler's defaults and inheritance.
func TestDatabases(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []struct{ name, body string }{
		{"wrangler.toml", tomlConfig},
		{"wrangler.jsonc", jsoncConfig},
		{"wrangler.json", jsoncConfig},
	} {
		path := filepath.Join(dir, f.name)
		if err := os.WriteFile(path, []byte(f.body), 0o644); err != nil {
			t.Fatal(err)
		}
		cfg, err := Load(path)
		if err != nil {
			t.Fatalf("%s: %v", f.name, err)
		}
		if cfg.Name != "orders" || cfg.Main != "src/index.ts" {
			t.Errorf("%s: name %q, main %q", f.name, cfg.Name, cfg.Main)
		}
		for _, tc := range []struct {
			env, name string
			want      Database
		}{
			{"", "orders-db", Database{
				D1Database: D1Database{Binding: "DB", DatabaseName: "orders-db", DatabaseID: "id-top", PreviewDatabaseID: "id-top-preview"},
				ConfigPath: path, AccountID: "top-account", MigrationsDir: filepath.Join(dir, "migrations"), MigrationsTable: "d1_migrations",
			}},
			{"", "AUDIT", Database{
				D1Database: D1Database{Binding: "AUDIT", DatabaseName: "audit-db", DatabaseID: "id-audit", MigrationsDir: "db/audit", MigrationsTable: "audit_migrations"},
				ConfigPath: path, AccountID: "top-account", MigrationsDir: filepath.Join(dir, "db/audit"), MigrationsTable: "audit_migrations",
			}},
			{"staging", "DB", Database{
				D1Database: D1Database{Binding: "DB", DatabaseName: "orders-staging", DatabaseID: "id-staging", MigrationsDir: "/abs/migrations"},
				ConfigPath: path, Env: "staging", AccountID: "staging-account", MigrationsDir: "/abs/migrations", MigrationsTable: "d1_migrations",
			}},
		} {
			got, err := cfg.Database(tc.env, tc.name)
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Errorf("%s: Database(%q, %q) = %+v, %v; want %+v", f.name, tc.env, tc.name, got, err, tc.want)
			}
		}
		if got := cfg.EnvNames(); !reflect.DeepEqual(got, []string{"empty", "staging"}) {
			t.Errorf("%s: EnvNames = %v", f.name, got)
		}
	}
}

// TestDatabaseErrors: what cannot be found is named with what exists.
func TestDatabaseErrors(t *testing.T) {
	cfg, err := Parse("conf/wrangler.toml", []byte(tomlConfig))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		env, name, want string
	}{
		{"", "nope", `no database named "nope" in the d1_databases of conf/wrangler.toml (it has: orders-db, audit-db)`},
		{"staging", "orders-db", `no database named "orders-db" in the d1_databases of env.staging of conf/wrangler.toml (it has: orders-staging)`},
		{"empty", "DB", `no database named "DB" in the d1_databases of env.empty of conf/wrangler.toml (it has none; d1_databases is not inherited from the top level, as in wrangler)`},
		{"prod", "DB", `no environment "prod" in conf/wrangler.toml (it has: empty, staging)`},
	} {
		_, err := cfg.Database(tc.env, tc.name)
		if err == nil || err.Error() != tc.want {
			t.Errorf("Database(%q, %q) = %v; want %s", tc.env, tc.name, err, tc.want)
		}
	}
	dup, err := Parse("w.toml", []byte("[[d1_databases]]\nbinding = \"DB\"\ndatabase_name = \"a\"\ndatabase_id = \"id-a\"\n"+
		"[[d1_databases]]\nbinding = \"DB\"\ndatabase_name = \"b\"\ndatabase_id = \"id-b\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dup.Database("", "DB"); err == nil || err.Error() != `"DB" names 2 entries of the d1_databases of w.toml (binding "DB", database_name "a", database_id "id-a"; binding "DB", database_name "b", database_id "id-b"): give each a binding and a database_name of its own` {
		t.Errorf("a binding used twice: %v", err)
	}
	if d, err := dup.Database("", "b"); err != nil || d.DatabaseID != "id-b" {
		t.Errorf("Database(b) = %+v, %v", d, err)
	}
	noEnvs, _ := Parse("w.toml", []byte(`account_id = "a"`))
	if _, err := noEnvs.Databases("staging"); err == nil || err.Error() != `no environment "staging" in w.toml (it has none)` {
		t.Errorf("no envs: %v", err)
	}

	if d, err := cfg.Only("staging"); err != nil || d.DatabaseID != "id-staging" {
		t.Errorf("Only(staging) = %+v, %v", d, err)
	}
	if _, err := cfg.Only(""); err == nil || err.Error() != "conf/wrangler.toml has several d1_databases (it has: orders-db, audit-db); name one" {
		t.Errorf("Only(top) = %v", err)
	}
	if _, err := cfg.Only("empty"); err == nil || !strings.HasPrefix(err.Error(), "no d1_databases in env.empty of conf/wrangler.toml (it has none; d1_databases is not inherited") {
		t.Errorf("Only(empty) = %v", err)
	}
}

func TestID(t *testing.T) {
	d := Database{D1Database: D1Database{Binding: "DB", DatabaseID: "id"}}
	if id, err := d.ID(false); id != "id" || err != nil {
		t.Errorf("ID(false) = %q, %v", id, err)
	}
	if _, err := d.ID(true); err == nil || err.Error() != `database "DB" has no preview_database_id` {
		t.Errorf("ID(true) = %v", err)
	}
	d = Database{D1Database: D1Database{DatabaseName: "n", PreviewDatabaseID: "p"}}
	if id, err := d.ID(true); id != "p" || err != nil {
		t.Errorf("ID(true) = %q, %v", id, err)
	}
	if _, err := d.ID(false); err == nil || err.Error() != `database "n" has no database_id` {
		t.Errorf("ID(false) = %v", err)
	}
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct{ path, body, want string }{
		{"w.yaml", "", "expected a .toml, .json or .jsonc file"},
		{"w.toml", "d1_databases = 3", "parsing w.toml"},
		{"w.jsonc", `{"d1_databases": [}`, "parsing w.jsonc"},
		{"w.json", `{"d1_databases": [{"database_id": 7}]}`, "parsing w.json"},
	} {
		if _, err := Parse(tc.path, []byte(tc.body)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%s): %v; want %q", tc.path, err, tc.want)
		}
	}
	if _, err := Load(filepath.Join(t.TempDir(), "wrangler.toml")); err == nil || !strings.Contains(err.Error(), "reading the wrangler config") {
		t.Errorf("Load of a missing file: %v", err)
	}
}

// TestFind follows wrangler: each name is looked for in the directory and
// its parents before the next name.
func TestFind(t *testing.T) {
	root := t.TempDir()
	sub := filepath.Join(root, "a", "b")
	if err := os.MkdirAll(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(p string) {
		t.Helper()
		if err := os.WriteFile(p, []byte("{}"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := Find(sub); !errors.Is(err, ErrNoConfig) {
		t.Fatalf("empty tree: %v", err)
	}
	write(filepath.Join(sub, "wrangler.toml"))
	write(filepath.Join(root, "a", "wrangler.jsonc"))
	for _, tc := range []struct{ add, want string }{
		{"", filepath.Join(root, "a", "wrangler.jsonc")},
		{filepath.Join(root, "wrangler.json"), filepath.Join(root, "wrangler.json")},
		{filepath.Join(sub, "wrangler.json"), filepath.Join(sub, "wrangler.json")},
	} {
		if tc.add != "" {
			write(tc.add)
		}
		if got, err := Find(sub); got != tc.want || err != nil {
			t.Errorf("Find = %q, %v; want %q", got, err, tc.want)
		}
	}
}

// TestWithPrefixAndByID: the databases a prefix of their name or binding
// chooses, in the file's order; the one an ID names.
func TestWithPrefixAndByID(t *testing.T) {
	cfg, err := Parse("conf/wrangler.toml", []byte(tomlConfig))
	if err != nil {
		t.Fatal(err)
	}
	for prefix, want := range map[string][]string{"": {"orders-db", "audit-db"}, "orders": {"orders-db"}, "AUD": {"audit-db"}} {
		dbs, err := cfg.WithPrefix("", prefix)
		var names []string
		for _, d := range dbs {
			names = append(names, d.Name())
		}
		if err != nil || !reflect.DeepEqual(names, want) {
			t.Errorf("WithPrefix(%q) = %v, %v; want %v", prefix, names, err, want)
		}
	}
	for env, want := range map[string]string{
		"":        `no database of the d1_databases of conf/wrangler.toml has a name or binding beginning with "x" (it has: orders-db, audit-db)`,
		"staging": `no database of the d1_databases of env.staging of conf/wrangler.toml has a name or binding beginning with "x" (it has: orders-staging)`,
		"prod":    `no environment "prod" in conf/wrangler.toml (it has: empty, staging)`,
	} {
		if _, err := cfg.WithPrefix(env, "x"); err == nil || err.Error() != want {
			t.Errorf("WithPrefix(%q, x) = %v; want %s", env, err, want)
		}
	}
	for _, tc := range []struct {
		env, id, want string
	}{{"", "id-audit", "audit-db"}, {"", "id-top-preview", "orders-db"}, {"staging", "id-staging", "orders-staging"}, {"staging", "id-top", ""}} {
		d, ok, err := cfg.ByID(tc.env, tc.id)
		if err != nil || ok != (tc.want != "") || ok && d.Name() != tc.want {
			t.Errorf("ByID(%q, %q) = %s, %v, %v; want %q", tc.env, tc.id, d.Name(), ok, err, tc.want)
		}
	}
	if _, ok, err := cfg.ByID("prod", "id-top"); ok || err == nil {
		t.Errorf("ByID in a missing environment: %v, %v", ok, err)
	}
}
