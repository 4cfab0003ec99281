package schema_test

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"sync"
	"testing"
	"testing/fstest"

	"github.com/d1idem/d1idem"
	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/internal/d1test"
	"github.com/d1idem/d1idem/schema"
)

var ctx = context.Background()

// migrations returns the names recorded in table, in order.
func migrations(t *testing.T, db *d1client.Client, table string) []string {
	t.Helper()
	res, err := db.Query(ctx, "SELECT name FROM "+table+" ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, r := range res.Rows {
		names = append(names, r[0].String())
	}
	return names
}

func TestApplyIsIdempotentAndRecorded(t *testing.T) {
	d1test.ForEach(t, func(t *testing.T, b *d1test.Backend) {
		db := b.NewClient(t)
		r, err := schema.Apply(ctx, db, schema.Options{})
		if err != nil || r.Action != schema.CreateAndRecord || !reflect.DeepEqual(r.Migrations, []string{schema.MigrationName}) || r.MigrationsTable != "d1_migrations" {
			t.Fatalf("first apply: %+v %v", r, err)
		}
		r, err = schema.Apply(ctx, db, schema.Options{})
		if err != nil || r.Action != schema.Nothing || len(r.Statements) != 0 || !reflect.DeepEqual(r.Migrations, []string{schema.MigrationName}) {
			t.Fatalf("second apply: %+v %v", r, err)
		}
		// Recorded the way wrangler records migrations.
		res, err := db.Query(ctx, "SELECT id, name, typeof(applied_at) FROM d1_migrations")
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Rows) != 1 || res.Rows[0][1] != d1client.TextValue(schema.MigrationName) || res.Rows[0][2] != d1client.TextValue("text") {
			t.Fatalf("d1_migrations = %v", res.Rows)
		}
		if err := schema.Verify(ctx, db); err != nil {
			t.Fatalf("verify after apply: %v", err)
		}
		got, err := schema.Inspect(ctx, db)
		if err != nil || !reflect.DeepEqual(got, schema.Expected()) {
			t.Fatalf("live shape %+v, %v; want %+v", got, err, schema.Expected())
		}
	})
}

func TestApplyRecordsAnExistingTableOrRefusesDrift(t *testing.T) {
	d1test.ForEach(t, func(t *testing.T, b *d1test.Backend) {
		// A table created by hand (or by a Worker) with the right shape is
		// recorded, not recreated.
		db := b.NewClientSchema(t)
		r, err := schema.Apply(ctx, db, schema.Options{})
		if err != nil || r.Action != schema.RecordOnly || !reflect.DeepEqual(r.Migrations, []string{schema.MigrationName}) {
			t.Fatalf("existing table: %+v %v", r, err)
		}
		// A drifted table is refused, with a readable diff.
		drifted := b.NewClient(t)
		if _, err := drifted.Exec(ctx, []d1client.Statement{
			{SQL: strings.Replace(d1idem.SchemaStatements()[0], "status            TEXT NOT NULL DEFAULT 'pending'", "status TEXT", 1)},
		}); err != nil {
			t.Fatal(err)
		}
		_, err = schema.Apply(ctx, drifted, schema.Options{})
		var de *schema.DriftError
		if !errors.Is(err, schema.ErrDrift) || !errors.As(err, &de) || de.Missing || de.Recorded {
			t.Fatalf("drift: %v", err)
		}
		want := []string{"- column status TEXT NOT NULL DEFAULT 'pending'", "+ column status TEXT", "- index idx_idempotency_keys_updated_at on (updated_at)"}
		if !reflect.DeepEqual(de.Diff, want) {
			t.Errorf("diff %q; want %q", de.Diff, want)
		}
		if err.Error() != "schema: not recording the migration: schema: idempotency_keys differs from schema.sql (- schema.sql, + live table): "+strings.Join(want, "; ") {
			t.Errorf("error text: %v", err)
		}
		if res, _ := drifted.Query(ctx, "SELECT count(*) FROM sqlite_master WHERE name = 'd1_migrations'"); res.Rows[0][0] != d1client.IntValue(0) {
			t.Error("a drifted table was recorded")
		}
	})
}

// A table whose migration is recorded is still checked: an index of
// schema.sql dropped by hand is created again (Repair), recorded or not,
// and any other difference fails; Apply never reports success on a table
// Verify refuses.
func TestApplyRepairsOrRefusesARecordedTable(t *testing.T) {
	d1test.ForEach(t, func(t *testing.T, b *d1test.Backend) {
		db := b.NewClient(t)
		if _, err := schema.Apply(ctx, db, schema.Options{}); err != nil {
			t.Fatal(err)
		}
		if _, err := db.Query(ctx, "DROP INDEX idx_idempotency_keys_updated_at"); err != nil {
			t.Fatal(err)
		}
		if err := schema.Verify(ctx, db); !errors.Is(err, schema.ErrDrift) {
			t.Fatalf("Verify after the drop: %v", err)
		}
		dry, err := schema.Apply(ctx, db, schema.Options{DryRun: true})
		if err != nil || dry.Action != schema.Repair || !dry.DryRun || len(dry.Statements) != 1 ||
			dry.Statements[0].SQL != "CREATE INDEX IF NOT EXISTS idx_idempotency_keys_updated_at ON idempotency_keys (updated_at)" {
			t.Fatalf("dry run: %+v, %v", dry, err)
		}
		if b, err := json.Marshal(dry); err != nil || string(b) != `{"action":"repair","description":"create the missing index of schema.sql (the table has the expected columns)",`+
			`"dry_run":true,"migration":"0001_d1idem_idempotency_keys.sql","migrations":["0001_d1idem_idempotency_keys.sql"],"migrations_table":"d1_migrations",`+
			`"sql":"CREATE INDEX IF NOT EXISTS idx_idempotency_keys_updated_at ON idempotency_keys (updated_at);\n"}` {
			t.Errorf("JSON: %s, %v", b, err)
		}
		r, err := schema.Apply(ctx, db, schema.Options{})
		if err != nil || r.Action != schema.Repair || !reflect.DeepEqual(r.Migrations, []string{schema.MigrationName}) {
			t.Fatalf("apply: %+v, %v", r, err)
		}
		if err := schema.Verify(ctx, db); err != nil {
			t.Fatalf("Verify after the repair: %v", err)
		}
		if r, err := schema.Apply(ctx, db, schema.Options{}); err != nil || r.Action != schema.Nothing {
			t.Fatalf("apply again: %+v, %v", r, err)
		}
		if got := migrations(t, db, "d1_migrations"); !reflect.DeepEqual(got, []string{schema.MigrationName}) {
			t.Errorf("recorded %v", got)
		}

		// Unrecorded, and without the index: created and recorded.
		bare := b.NewClient(t)
		if _, err := bare.Query(ctx, d1idem.SchemaStatements()[0]); err != nil {
			t.Fatal(err)
		}
		if r, err := schema.Apply(ctx, bare, schema.Options{}); err != nil || r.Action != schema.Repair || len(r.Statements) != 3 {
			t.Fatalf("apply on a table without its index: %+v, %v", r, err)
		}
		if err := schema.Verify(ctx, bare); err != nil {
			t.Fatalf("Verify: %v", err)
		}

		// Recorded, with a column changed: refused.
		if _, err := db.Query(ctx, "ALTER TABLE idempotency_keys ADD COLUMN note TEXT"); err != nil {
			t.Fatal(err)
		}
		_, err = schema.Apply(ctx, db, schema.Options{})
		var recorded *schema.DriftError
		if !errors.As(err, &recorded) || !recorded.Recorded || !strings.Contains(err.Error(), "+ column note TEXT") || !strings.Contains(err.Error(), "is recorded in d1_migrations, but") {
			t.Fatalf("apply on a drifted, recorded table: %v", err)
		}
	})
}

func TestVerify(t *testing.T) {
	d1test.ForEach(t, func(t *testing.T, b *d1test.Backend) {
		db := b.NewClient(t)
		err := schema.Verify(ctx, db)
		var de *schema.DriftError
		if !errors.As(err, &de) || !de.Missing || !reflect.DeepEqual(de.Diff, []string{"- table idempotency_keys (missing)"}) ||
			err.Error() != "schema: table idempotency_keys does not exist" {
			t.Fatalf("missing table: %#v", err)
		}
		if _, err := db.Query(ctx, `CREATE TABLE idempotency_keys (
  principal TEXT NOT NULL, key TEXT NOT NULL, fingerprint TEXT NOT NULL,
  status TEXT NOT NULL DEFAULT 'pending', generation INTEGER NOT NULL DEFAULT 1,
  response_status INTEGER, response_body BLOB, response_headers TEXT,
  created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL, note TEXT,
  PRIMARY KEY (principal, key))`); err != nil {
			t.Fatal(err)
		}
		err = schema.Verify(ctx, db)
		want := []string{"- column response_body TEXT", "+ column response_body BLOB", "+ column note TEXT", "- index idx_idempotency_keys_updated_at on (updated_at)"}
		if !errors.As(err, &de) || de.Missing || !reflect.DeepEqual(de.Diff, want) {
			t.Fatalf("drifted table: %v", err)
		}
		if err := schema.Verify(ctx, b.NewClientSchema(t)); err != nil {
			t.Fatalf("schema.sql's table: %v", err)
		}
	})
}

func TestApplyDryRun(t *testing.T) {
	db := d1test.Local(t).NewClient(t)
	r, err := schema.Apply(ctx, db, schema.Options{DryRun: true, MigrationsTable: "custom_migrations"})
	if err != nil || r.Action != schema.CreateAndRecord || len(r.Statements) != 4 {
		t.Fatalf("dry run: %+v %v", r, err)
	}
	sql := r.SQL()
	for _, s := range []string{"CREATE TABLE IF NOT EXISTS custom_migrations(", d1idem.SchemaStatements()[0] + ";\n", d1idem.SchemaStatements()[1] + ";\n",
		"INSERT INTO custom_migrations (name) VALUES ('" + schema.MigrationName + "');\n"} {
		if !strings.Contains(sql, s) {
			t.Errorf("dry-run SQL lacks %q:\n%s", s, sql)
		}
	}
	res, _ := db.Query(ctx, "SELECT count(*) FROM sqlite_master")
	if res.Rows[0][0] != d1client.IntValue(0) {
		t.Error("the dry run changed the database")
	}
}

// TestApplyCreateLocal: with CreateLocal, Apply creates a missing
// database on d1local first, once; without it, or with DryRun, a missing
// database stays an error and nothing is created.
func TestApplyCreateLocal(t *testing.T) {
	b := d1test.LocalConfig(t, d1local.Config{NoAutoCreate: true})
	db := b.Database("fresh").Client(t)
	for _, opts := range []schema.Options{{}, {CreateLocal: true, DryRun: true}} {
		if _, err := schema.Apply(ctx, db, opts); !errors.Is(err, d1client.ErrNoDatabase) {
			t.Fatalf("Apply(%+v) on a missing database: %v", opts, err)
		}
	}
	r, err := schema.Apply(ctx, db, schema.Options{CreateLocal: true})
	if err != nil || !r.CreatedDatabase || r.Action != schema.CreateAndRecord {
		t.Fatalf("Apply with CreateLocal: %+v, %v", r, err)
	}
	if r, err := schema.Apply(ctx, db, schema.Options{CreateLocal: true}); err != nil || r.CreatedDatabase || r.Action != schema.Nothing {
		t.Errorf("Apply again: %+v, %v", r, err)
	}
}

// TestApplyUnderWranglersName: with the migrations directory, the schema is
// recorded under the name of the file that holds it, and a record wrangler
// made under that name is recognised.
func TestApplyUnderWranglersName(t *testing.T) {
	dir := fstest.MapFS{
		"0001_init.sql":        {Data: []byte("CREATE TABLE orders (id TEXT PRIMARY KEY);\n")},
		"0002_idempotency.sql": {Data: []byte(strings.ReplaceAll(d1idem.Schema(), "\n", "\r\n"))},
		"notes.txt":            {Data: []byte(d1idem.Schema())},
	}
	d1test.ForEach(t, func(t *testing.T, b *d1test.Backend) {
		// d1idem first: recorded under the file's name, so wrangler will
		// not run the file again.
		db := b.NewClient(t)
		r, err := schema.Apply(ctx, db, schema.Options{Migrations: dir, MigrationsTable: "custom_migrations"})
		if err != nil || r.Action != schema.CreateAndRecord || !reflect.DeepEqual(r.Migrations, []string{"0002_idempotency.sql"}) {
			t.Fatalf("apply: %+v %v", r, err)
		}
		if got := migrations(t, db, "custom_migrations"); !reflect.DeepEqual(got, []string{"0002_idempotency.sql"}) {
			t.Errorf("recorded %q", got)
		}

		// wrangler first: the file and its record, as `wrangler d1
		// migrations apply` leaves them, are recognised.
		db = b.NewClientSchema(t)
		if _, err := db.Exec(ctx, []d1client.Statement{
			{SQL: "CREATE TABLE d1_migrations(id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT UNIQUE, applied_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP NOT NULL)"},
			{SQL: "INSERT INTO d1_migrations (name) VALUES ('0001_init.sql'), ('0002_idempotency.sql')"},
		}); err != nil {
			t.Fatal(err)
		}
		r, err = schema.Apply(ctx, db, schema.Options{Migrations: dir})
		if err != nil || r.Action != schema.Nothing || !reflect.DeepEqual(r.Migrations, []string{"0002_idempotency.sql"}) {
			t.Fatalf("after wrangler: %+v %v", r, err)
		}
		// Without the directory, nothing says that 0002_idempotency.sql is
		// the schema: the table is checked and recorded under MigrationName.
		r, err = schema.Apply(ctx, db, schema.Options{})
		if err != nil || r.Action != schema.RecordOnly || !reflect.DeepEqual(r.Migrations, []string{schema.MigrationName}) {
			t.Fatalf("without the directory: %+v %v", r, err)
		}

		// Recorded under MigrationName by an Apply without the directory,
		// then the file appears: it is recorded too.
		db = b.NewClient(t)
		if _, err := schema.Apply(ctx, db, schema.Options{}); err != nil {
			t.Fatal(err)
		}
		r, err = schema.Apply(ctx, db, schema.Options{Migrations: dir})
		if err != nil || r.Action != schema.RecordOnly || !reflect.DeepEqual(r.Migrations, []string{"0002_idempotency.sql"}) {
			t.Fatalf("file added later: %+v %v", r, err)
		}
		if got := migrations(t, db, "d1_migrations"); !reflect.DeepEqual(got, []string{schema.MigrationName, "0002_idempotency.sql"}) {
			t.Errorf("recorded %q", got)
		}
	})
}

func TestConcurrentApplies(t *testing.T) {
	d := d1test.Local(t).NewDatabase(t)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := schema.Apply(ctx, d.Client(t), schema.Options{}); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := migrations(t, d.Client(t), "d1_migrations"); len(got) != 1 {
		t.Errorf("%d migration records", len(got))
	}
}

func TestRecordedButMissingTable(t *testing.T) {
	db := d1test.Local(t).NewClient(t)
	if _, err := schema.Apply(ctx, db, schema.Options{}); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Query(ctx, "DROP TABLE idempotency_keys"); err != nil {
		t.Fatal(err)
	}
	dir := fstest.MapFS{"0002_idempotency.sql": {Data: []byte(d1idem.Schema())}}
	for _, opts := range []schema.Options{{}, {Migrations: dir}} {
		if _, err := schema.Apply(ctx, db, opts); err == nil || !strings.Contains(err.Error(), schema.MigrationName+" is recorded in d1_migrations but the table idempotency_keys is missing") {
			t.Fatalf("err = %v", err)
		}
	}
	for _, bad := range []string{"bad name", "sqlite_x", "_cf_KV", "1x", `x"`} {
		if _, err := schema.Apply(ctx, db, schema.Options{MigrationsTable: bad}); err == nil || !strings.Contains(err.Error(), "not a plain SQL identifier") {
			t.Errorf("migrations table %q: %v", bad, err)
		}
	}
}

func TestExpectedIsAFreshCopy(t *testing.T) {
	a := schema.Expected()
	a.Columns[0].Name = "changed"
	a.Indexes[0].Columns[0] = "changed"
	b := schema.Expected()
	if b.Columns[0].Name != "principal" || b.Indexes[0].Columns[0] != "updated_at" {
		t.Errorf("Expected shares its slices: %+v", b)
	}
}
