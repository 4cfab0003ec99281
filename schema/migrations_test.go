package schema_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/d1idem/d1idem"
	"github.com/d1idem/d1idem/schema"
)

func TestIsMigration(t *testing.T) {
	sql := d1idem.Schema()
	stmts := d1idem.SchemaStatements()
	for _, tc := range []struct {
		name string
		sql  string
		want bool
	}{
		{"schema.sql", sql, true},
		{"CRLF and a BOM", "\ufeff" + strings.ReplaceAll(sql, "\n", "\r\n"), true},
		{"no comments, one line", "CREATE TABLE idempotency_keys (principal TEXT NOT NULL, key TEXT NOT NULL, fingerprint TEXT NOT NULL, status TEXT NOT NULL DEFAULT 'pending', generation INTEGER NOT NULL DEFAULT 1, response_status INTEGER, response_body TEXT, response_headers TEXT, created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL, PRIMARY KEY (principal, key)); CREATE INDEX idx_idempotency_keys_updated_at ON idempotency_keys (updated_at)", true},
		{"a header comment and a block comment", "-- Migration number: 0002\n/* the ledger; see schema.sql */\n" + sql, true},
		{"lower case, quoted identifiers", strings.Replace(strings.ToLower(sql), "idempotency_keys (", `"idempotency_keys" (`, 1), true},
		{"IF NOT EXISTS", strings.Replace(strings.Replace(sql, "CREATE TABLE ", "CREATE TABLE IF NOT EXISTS ", 1), "CREATE INDEX ", "create index if not exists ", 1), true},
		{"no trailing semicolon", strings.TrimSuffix(strings.TrimSpace(sql), ";"), true},
		{"another default", strings.Replace(sql, "'pending'", "'PENDING'", 1), false},
		{"another type", strings.Replace(sql, "response_body     TEXT", "response_body BLOB", 1), false},
		{"without the index", stmts[0] + ";", false},
		{"the index first", stmts[1] + ";\n" + stmts[0] + ";", false},
		{"and another table", sql + "CREATE TABLE orders (id TEXT);\n", false},
		{"a -- inside a string", strings.Replace(sql, "'pending'", "'pending -- x'", 1), false},
		{"a no-break space, part of a name to SQLite", strings.Replace(sql, "CREATE TABLE", "CREATE\u00a0TABLE", 1), false},
		{"a trigger after", sql + "CREATE TRIGGER tr AFTER INSERT ON idempotency_keys BEGIN SELECT 1; END;\n", false},
		{"empty", "", false},
		{"only comments", "-- nothing\n", false},
	} {
		if got := schema.IsMigration([]byte(tc.sql)); got != tc.want {
			t.Errorf("%s: IsMigration = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestFindMigrations(t *testing.T) {
	dir := fstest.MapFS{
		"0003_ledger.sql":          {Data: []byte(d1idem.Schema())},
		"0001_init.sql":            {Data: []byte("CREATE TABLE orders (id TEXT);")},
		"0002_idempotency.sql":     {Data: []byte(d1idem.Schema())},
		"schema.sql.bak":           {Data: []byte(d1idem.Schema())},
		"sub/0004_nested.sql":      {Data: []byte(d1idem.Schema())},
		"0005_d1idem_ledger.sql/x": {Data: []byte("a directory named like a migration")},
	}
	got, err := schema.FindMigrations(dir)
	if err != nil || !reflect.DeepEqual(got, []string{"0002_idempotency.sql", "0003_ledger.sql"}) {
		t.Errorf("FindMigrations = %q, %v", got, err)
	}
	if got, err := schema.FindMigrations(fstest.MapFS{}); got != nil || err != nil {
		t.Errorf("empty: %q, %v", got, err)
	}
	sub, _ := fs.Sub(dir, "missing")
	if got, err := schema.FindMigrations(sub); got != nil || err != nil {
		t.Errorf("missing directory: %q, %v", got, err)
	}
	bad := fstest.MapFS{"0001_x.sql": {Mode: fs.ModeSymlink}}
	if _, err := schema.FindMigrations(errFS{bad}); !errors.Is(err, errRead) {
		t.Errorf("unreadable file: %v", err)
	}
}

var errRead = errors.New("read failed")

// errFS lists its files but cannot read them.
type errFS struct{ fs.ReadDirFS }

func (errFS) Open(string) (fs.File, error) { return nil, errRead }

// TestWriteMigration: the schema is written as the next migration, numbered
// as wrangler numbers, once; a file that holds it already is kept.
func TestWriteMigration(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "migrations") // made by the first write
	write := func(name, data string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if name, written, err := schema.WriteMigration(dir); name != "0001_d1idem_idempotency_keys.sql" || !written || err != nil {
		t.Fatalf("into a missing directory: %q, %v, %v", name, written, err)
	}
	if data, err := os.ReadFile(filepath.Join(dir, "0001_d1idem_idempotency_keys.sql")); err != nil || string(data) != d1idem.Schema() {
		t.Fatalf("the file holds %q, %v", data, err)
	}
	if name, written, err := schema.WriteMigration(dir); name != "0001_d1idem_idempotency_keys.sql" || written || err != nil {
		t.Errorf("again: %q, %v, %v", name, written, err)
	}
	if err := os.Remove(filepath.Join(dir, "0001_d1idem_idempotency_keys.sql")); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ add, want string }{
		{"0001_init.sql", "0002_d1idem_idempotency_keys.sql"},
		{"0007-orders.sql", "0008_d1idem_idempotency_keys.sql"}, // wrangler's parseInt reads the leading digits
		{"0042_notes.txt", "0008_d1idem_idempotency_keys.sql"},  // only .sql files count
		{"readme.sql", "0008_d1idem_idempotency_keys.sql"},
		{"12_big.sql", "0013_d1idem_idempotency_keys.sql"},
	} {
		write(tc.add, "CREATE TABLE t (x);")
		name, written, err := schema.WriteMigration(dir)
		if name != tc.want || !written || err != nil {
			t.Errorf("after %q: %q, %v, %v; want %q", tc.add, name, written, err, tc.want)
		}
		if err := os.Remove(filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	write("0005_ledger.sql", "-- by hand\n"+d1idem.Schema())
	if name, written, err := schema.WriteMigration(dir); name != "0005_ledger.sql" || written || err != nil {
		t.Errorf("with the schema under another name: %q, %v, %v", name, written, err)
	}
}
