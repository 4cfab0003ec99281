// Package schema applies, inspects and verifies the ledger schema (the
// spec's table and index, embedded from schema.sql by the root package) on a
// D1 database.
//
// Apply is idempotent and records itself the way wrangler records migrations,
// in a d1_migrations table (id, name, applied_at), so that `wrangler d1
// migrations list` agrees when the migrations directory holds the schema
// under MigrationName:
//
//	d1idem schema print > migrations/0001_d1idem_idempotency_keys.sql
//
// Verify compares the live PRAGMA table_info and index_list (with each
// index's columns) with the shape schema.sql produces.
package schema

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/d1idem/d1idem"
	"github.com/d1idem/d1idem/d1client"
)

// MigrationName is the name Apply records in the migrations table: a
// wrangler migration file name.
const MigrationName = "0001_d1idem_idempotency_keys.sql"

// MigrationsTable is wrangler's default migrations table.
const MigrationsTable = "d1_migrations"

// Options adjust Apply.
type Options struct {
	// MigrationsTable defaults to MigrationsTable ("d1_migrations"); set it
	// to match wrangler's migrations_table setting.
	MigrationsTable string
	// MigrationName defaults to MigrationName.
	MigrationName string
}

func (o Options) withDefaults() (Options, error) {
	if o.MigrationsTable == "" {
		o.MigrationsTable = MigrationsTable
	}
	if o.MigrationName == "" {
		o.MigrationName = MigrationName
	}
	if !isIdentifier(o.MigrationsTable) {
		return o, fmt.Errorf("schema: migrations table %q is not a plain SQL identifier", o.MigrationsTable)
	}
	return o, nil
}

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

// migrationsTableSQL is wrangler's DDL for its migrations table.
func migrationsTableSQL(table string) string {
	return `CREATE TABLE IF NOT EXISTS ` + table + `(
		id         INTEGER PRIMARY KEY AUTOINCREMENT,
		name       TEXT UNIQUE,
		applied_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP NOT NULL
)`
}

// State is what Apply found, and Plan what it will run.
type State struct {
	Recorded    bool // the migration is recorded in the migrations table
	TableExists bool // idempotency_keys exists
}

// Action is what Apply does (or, dry, would do).
type Action int

// The actions of Apply.
const (
	// Nothing: the migration is recorded; nothing to do.
	Nothing Action = iota
	// CreateAndRecord: create the table and index and record the migration,
	// in one batch (one transaction).
	CreateAndRecord
	// RecordOnly: the table exists with the right shape but the migration is
	// not recorded (it was created by hand or by a Worker); record it.
	RecordOnly
)

func (a Action) String() string {
	switch a {
	case CreateAndRecord:
		return "create the ledger table and index, and record the migration"
	case RecordOnly:
		return "record the migration (the table already exists with the expected shape)"
	}
	return "nothing: the migration is already recorded"
}

// Plan is what Apply will run.
type Plan struct {
	State      State
	Action     Action
	Statements []d1client.Statement
}

// SQL renders the plan's statements as a script.
func (p Plan) SQL() string {
	var b strings.Builder
	for _, s := range p.Statements {
		sql := s.SQL
		for _, v := range s.Params {
			sql = strings.Replace(sql, "?", "'"+strings.ReplaceAll(fmt.Sprint(v), "'", "''")+"'", 1)
		}
		b.WriteString(sql)
		b.WriteString(";\n")
	}
	return b.String()
}

// ErrDrift is returned when an existing table does not have the schema's
// shape; the error's text lists the differences.
var ErrDrift = errors.New("schema: the live ledger table differs from schema.sql")

// MakePlan reads the database's state (one read-only call, besides creating
// nothing) and returns what Apply would run. want is the shape schema.sql
// produces (see ShapeOf); it is only consulted when the table exists but the
// migration is not recorded.
func MakePlan(ctx context.Context, db *d1client.Client, want Shape, opts Options) (Plan, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return Plan{}, err
	}
	st, err := readState(ctx, db, opts)
	if err != nil {
		return Plan{}, err
	}
	p := Plan{State: st}
	record := d1client.Statement{SQL: "INSERT INTO " + opts.MigrationsTable + " (name) VALUES (?)", Params: []any{opts.MigrationName}}
	switch {
	case st.Recorded && !st.TableExists:
		return Plan{}, fmt.Errorf("schema: %s is recorded in %s but the table %s is missing; it was dropped by hand: restore it, or delete the record and apply again",
			opts.MigrationName, opts.MigrationsTable, d1idem.Table)
	case st.Recorded:
		p.Action = Nothing
	case st.TableExists:
		got, err := Inspect(ctx, db)
		if err != nil {
			return Plan{}, err
		}
		if diff := Diff(want, got); len(diff) > 0 {
			return Plan{}, fmt.Errorf("%w; not recording the migration:\n%s", ErrDrift, strings.Join(diff, "\n"))
		}
		p.Action = RecordOnly
		p.Statements = []d1client.Statement{{SQL: migrationsTableSQL(opts.MigrationsTable)}, record}
	default:
		p.Action = CreateAndRecord
		p.Statements = append(p.Statements, d1client.Statement{SQL: migrationsTableSQL(opts.MigrationsTable)})
		for _, s := range d1idem.SchemaStatements() {
			p.Statements = append(p.Statements, d1client.Statement{SQL: s})
		}
		p.Statements = append(p.Statements, record)
	}
	return p, nil
}

// readState reads, without writing, whether the migration is recorded and
// whether the table exists.
func readState(ctx context.Context, db *d1client.Client, opts Options) (State, error) {
	res, err := db.Exec(ctx, []d1client.Statement{
		d1client.Statement{SQL: "SELECT name FROM sqlite_master WHERE type = 'table' AND name IN (?, ?) ORDER BY name", Params: []any{d1idem.Table, opts.MigrationsTable}},
	})
	if err != nil {
		return State{}, fmt.Errorf("schema: reading the database: %w", err)
	}
	var st State
	migrations := false
	for _, row := range res[0].Rows {
		name, _ := row[0].Text()
		switch name {
		case d1idem.Table:
			st.TableExists = true
		case opts.MigrationsTable:
			migrations = true
		}
	}
	if migrations {
		res, err := db.Query(ctx, "SELECT count(*) FROM "+opts.MigrationsTable+" WHERE name = ?", opts.MigrationName)
		if err != nil {
			return State{}, fmt.Errorf("schema: reading %s: %w", opts.MigrationsTable, err)
		}
		n, _ := res.Rows[0][0].Int64()
		st.Recorded = n > 0
	}
	return st, nil
}

// Apply makes the schema present and recorded, idempotently: it creates the
// table and index and records the migration in one batch (one transaction),
// records an existing table whose shape matches, or does nothing when the
// migration is recorded. Two concurrent Applies are safe: the loser's batch
// fails as a whole and it finds the winner's work.
func Apply(ctx context.Context, db *d1client.Client, want Shape, opts Options) (Plan, error) {
	for attempt := 0; ; attempt++ {
		p, err := MakePlan(ctx, db, want, opts)
		if err != nil || p.Action == Nothing {
			return p, err
		}
		_, err = db.Exec(ctx, p.Statements)
		if err == nil {
			return p, nil
		}
		if attempt == 0 && errors.Is(err, d1client.ErrSQL) {
			continue // lost a race with another Apply: look again
		}
		return p, fmt.Errorf("schema: apply: %w", err)
	}
}
