// Package schema applies and verifies the ledger schema (schema.sql: the
// idempotency_keys table and its updated_at index) on a D1 database.
//
// Apply is the one call a service makes at start-up, or a CI job before a
// deploy:
//
//	if _, err := schema.Apply(ctx, db, schema.Options{}); err != nil {
//		return err
//	}
//
// It is idempotent, and records the schema as a wrangler migration in
// wrangler's migrations table, so that wrangler and d1idem agree whichever
// applies it first. Given wrangler's migrations directory
// (Options.Migrations), it records the schema under the name of the file
// there that holds it, whatever that name is (see IsMigration); without one,
// under MigrationName.
//
// Verify compares the live table with Expected, the shape schema.sql gives
// it. That shape is generated from schema.sql into this package (go generate
// runs ./internal/shapegen), so neither call needs a scratch database, and
// the package does not link SQLite.
//
// # API stability
//
// The exported names of this package are meant to stay: from v1.0.0 on, they
// change only by addition. Not covered: the wording of errors and of Diff's
// lines, and the exact SQL of Result.Statements. Match errors with
// errors.Is(err, ErrDrift) or errors.As with a *DriftError.
package schema

//go:generate go run ./internal/shapegen

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strings"

	"github.com/d1idem/d1idem"
	"github.com/d1idem/d1idem/d1client"
)

// MigrationName is the migration name Apply records when no file of the
// migrations directory holds the schema: a wrangler migration file name.
const MigrationName = "0001_d1idem_idempotency_keys.sql"

// MigrationsTable is wrangler's default migrations table.
const MigrationsTable = "d1_migrations"

// Options adjust Apply. The zero value records the schema under
// MigrationName in d1_migrations.
type Options struct {
	// MigrationsTable is wrangler's migrations table: the migrations_table
	// of the wrangler config. Empty means MigrationsTable.
	MigrationsTable string
	// Migrations is wrangler's migrations directory: os.DirFS("migrations"),
	// say, or an embed.FS through fs.Sub. When .sql files in it hold the
	// schema (see FindMigrations), Apply records the schema under their
	// names, so that `wrangler d1 migrations apply` does not run them again.
	Migrations fs.FS
	// DryRun makes Apply read the database and return what it would run,
	// changing nothing.
	DryRun bool
	// CreateLocal makes Apply create the database first where it is
	// missing on a d1local server (d1client.Client.CreateLocalDatabase),
	// as 'wrangler d1 create' would. On D1, which gives a database its
	// UUID, a missing database stays an error (d1client.ErrNoDatabase).
	CreateLocal bool
}

// Action is what Apply does, or with Options.DryRun would do.
type Action int

// The actions of Apply.
const (
	// Nothing: the schema is recorded; nothing to do.
	Nothing Action = iota
	// CreateAndRecord: create the table and index and record the
	// migration, in one batch (one transaction).
	CreateAndRecord
	// RecordOnly: the table exists with the expected shape but the
	// migration is not recorded (the table was made by hand, by a Worker,
	// or recorded under another name); record it.
	RecordOnly
	// Repair: the table has the expected columns but lacks an index of
	// schema.sql (dropped by hand, say); create it, and record the
	// migration if it is not.
	Repair
)

// String describes the action for people.
func (a Action) String() string {
	switch a {
	case CreateAndRecord:
		return "create the ledger table and index, and record the migration"
	case RecordOnly:
		return "record the migration (the table already exists with the expected shape)"
	case Repair:
		return "create the missing index of schema.sql (the table has the expected columns)"
	}
	return "nothing: the migration is already recorded"
}

// Result is what Apply did, or with Options.DryRun would do.
type Result struct {
	Action Action
	// DryRun reports that nothing was run (Options.DryRun).
	DryRun bool
	// Migrations are the names the schema is recorded under in the
	// migrations table: those Apply records, or for Nothing those it found.
	Migrations []string
	// MigrationsTable is the migrations table.
	MigrationsTable string
	// Statements are the statements Apply ran (or would run) as one batch;
	// none for Nothing.
	Statements []d1client.Statement
	// CreatedDatabase reports that Apply created the database first
	// (Options.CreateLocal).
	CreatedDatabase bool
}

// SQL renders the statements as a script, with their parameters inlined
// as SQL string literals.
func (r Result) SQL() string {
	var b strings.Builder
	for _, s := range r.Statements {
		sql := s.SQL
		for _, v := range s.Params {
			sql = strings.Replace(sql, "?", "'"+strings.ReplaceAll(fmt.Sprint(v), "'", "''")+"'", 1)
		}
		b.WriteString(sql)
		b.WriteString(";\n")
	}
	return b.String()
}

// Apply makes the ledger schema present and recorded, idempotently, and
// leaves the live table matching Expected or fails: on a database without
// the table it creates the table and index and records the migration in
// one batch (one transaction); on one with the table it reads its shape
// (as Verify does) and records it if it matches Expected, creates an index
// of schema.sql that is missing (Repair), refuses any other difference (a
// *DriftError), and does nothing when the migration is recorded and the
// shape matches.
//
// Concurrent Applies are safe: the loser's batch fails as a whole, and it
// finds the winner's work.
func Apply(ctx context.Context, db *d1client.Client, opts Options) (Result, error) {
	r, err := apply(ctx, db, opts)
	if opts.CreateLocal && !opts.DryRun && errors.Is(err, d1client.ErrNoDatabase) {
		created, cerr := db.CreateLocalDatabase(ctx)
		if cerr != nil || !created {
			return r, cmp.Or(cerr, err)
		}
		r, err = apply(ctx, db, opts)
		r.CreatedDatabase = true
	}
	return r, err
}

// apply is Apply on a database that exists.
func apply(ctx context.Context, db *d1client.Client, opts Options) (Result, error) {
	if opts.MigrationsTable == "" {
		opts.MigrationsTable = MigrationsTable
	}
	if !isIdentifier(opts.MigrationsTable) {
		return Result{}, fmt.Errorf("schema: migrations table %q is not a plain SQL identifier", opts.MigrationsTable)
	}
	names := []string{MigrationName}
	if opts.Migrations != nil {
		found, err := FindMigrations(opts.Migrations)
		if err != nil {
			return Result{}, fmt.Errorf("schema: reading the migrations directory: %w", err)
		}
		if len(found) > 0 {
			names = found
		}
	}
	for attempt := 0; ; attempt++ {
		r, err := plan(ctx, db, opts.MigrationsTable, names)
		r.DryRun = opts.DryRun
		if err != nil || r.Action == Nothing || opts.DryRun {
			return r, err
		}
		_, err = db.Exec(ctx, r.Statements)
		if err == nil {
			return r, nil
		}
		if attempt == 0 && errors.Is(err, d1client.ErrSQL) {
			continue // lost a race with another Apply: look again
		}
		return r, fmt.Errorf("schema: apply: %w", err)
	}
}

// plan reads the database, without writing, and returns what Apply must run
// for the schema to be recorded under names in table.
func plan(ctx context.Context, db *d1client.Client, table string, names []string) (Result, error) {
	exists, recorded, err := readState(ctx, db, table)
	if err != nil {
		return Result{}, err
	}
	r := Result{MigrationsTable: table}
	var missing, found []string
	for _, n := range names {
		if recorded[n] {
			found = append(found, n)
		} else {
			missing = append(missing, n)
		}
	}
	if !exists {
		var stale []string
		for _, n := range append([]string{MigrationName}, names...) {
			if recorded[n] && !slices.Contains(stale, n) {
				stale = append(stale, n)
			}
		}
		if len(stale) > 0 {
			return Result{}, fmt.Errorf("schema: %s is recorded in %s but the table %s is missing; it was dropped by hand: restore it, or delete the record and apply again",
				strings.Join(stale, ", "), table, d1idem.Table)
		}
		r.Action = CreateAndRecord
		r.Statements = append(r.Statements, d1client.Statement{SQL: migrationsTableSQL(table)})
		for _, s := range d1idem.SchemaStatements() {
			r.Statements = append(r.Statements, d1client.Statement{SQL: s})
		}
	} else {
		got, err := Inspect(ctx, db)
		if err != nil {
			return Result{}, err
		}
		fix, err := repairs(got)
		if drift := (*DriftError)(nil); errors.As(err, &drift) {
			drift.Recorded = len(missing) == 0
		}
		switch {
		case err != nil && len(missing) > 0:
			return Result{}, fmt.Errorf("schema: not recording the migration: %w", err)
		case err != nil:
			return Result{}, fmt.Errorf("schema: %s is recorded in %s, but: %w", strings.Join(found, ", "), table, err)
		case len(missing) == 0 && len(fix) == 0:
			r.Migrations = found
			return r, nil // Nothing
		case len(fix) > 0:
			r.Action, r.Statements = Repair, fix
		default:
			r.Action = RecordOnly
		}
		if len(missing) == 0 {
			r.Migrations = found
			return r, nil
		}
		r.Statements = append(r.Statements, d1client.Statement{SQL: migrationsTableSQL(table)})
	}
	r.Migrations = missing
	for _, n := range missing {
		r.Statements = append(r.Statements, d1client.Statement{SQL: "INSERT INTO " + table + " (name) VALUES (?)", Params: []any{n}})
	}
	return r, nil
}

// repairs returns the statements that give got the indexes of schema.sql
// it lacks (each CREATE INDEX of schema.sql, made IF NOT EXISTS), or a
// *DriftError when it differs from Expected otherwise.
func repairs(got Shape) ([]d1client.Statement, error) {
	want := Expected()
	has := map[string]bool{}
	for _, ix := range got.Indexes {
		has[ix.Name] = true
	}
	var fix []d1client.Statement
	kept := want.Indexes[:0:0]
	for _, ix := range want.Indexes {
		if stmt := createIndex(ix.Name); ix.Origin == "c" && !has[ix.Name] && stmt != "" {
			fix = append(fix, d1client.Statement{SQL: stmt})
			continue
		}
		kept = append(kept, ix)
	}
	if len(Diff(Shape{Exists: want.Exists, Columns: want.Columns, Indexes: kept}, got)) > 0 {
		return nil, check(got)
	}
	return fix, nil
}

// createIndex is schema.sql's CREATE INDEX of the index name, made IF NOT
// EXISTS; "" when it has none.
func createIndex(name string) string {
	for _, st := range d1idem.SchemaStatements() {
		if rest, ok := strings.CutPrefix(st, "CREATE INDEX "+name+" "); ok {
			return "CREATE INDEX IF NOT EXISTS " + name + " " + rest
		}
	}
	return ""
}

// readState reports whether the ledger table exists, and which migrations
// the migrations table records.
func readState(ctx context.Context, db *d1client.Client, table string) (exists bool, recorded map[string]bool, err error) {
	res, err := db.Query(ctx, "SELECT name FROM sqlite_master WHERE type = 'table' AND name IN (?, ?)", d1idem.Table, table)
	if err != nil {
		return false, nil, fmt.Errorf("schema: reading the database: %w", err)
	}
	migrations := false
	for _, row := range res.Rows {
		switch name, _ := row[0].Text(); name {
		case d1idem.Table:
			exists = true
		case table:
			migrations = true
		}
	}
	recorded = map[string]bool{}
	if !migrations {
		return exists, recorded, nil
	}
	res, err = db.Query(ctx, "SELECT name FROM "+table)
	if err != nil {
		return false, nil, fmt.Errorf("schema: reading %s: %w", table, err)
	}
	for _, row := range res.Rows {
		if name, ok := row[0].Text(); ok {
			recorded[name] = true
		}
	}
	return exists, recorded, nil
}

// migrationsTableSQL is wrangler's DDL for its migrations table.
func migrationsTableSQL(table string) string {
	return `CREATE TABLE IF NOT EXISTS ` + table + `(
		id         INTEGER PRIMARY KEY AUTOINCREMENT,
		name       TEXT UNIQUE,
		applied_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP NOT NULL
)`
}

// isIdentifier reports whether s can be a migrations table name as is: a
// plain SQL identifier outside the names SQLite and D1 reserve.
func isIdentifier(s string) bool {
	if s == "" || strings.HasPrefix(strings.ToLower(s), "_cf_") || strings.HasPrefix(strings.ToLower(s), "sqlite_") {
		return false
	}
	for i, c := range s {
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || i > 0 && c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}
