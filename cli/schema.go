package cli

import (
	"errors"
	"fmt"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/d1idem/d1idem"
	"github.com/d1idem/d1idem/schema"
)

func schemaCommand(o *options) *cli.Command {
	return &cli.Command{
		Name:  "schema",
		Usage: "apply, verify and print the ledger schema",
		Description: `Manages the ledger table (idempotency_keys) and its updated_at index. In CI,
apply then verify before a deploy; both exit non-zero on failure:

   d1idem schema apply --database my-db
   d1idem schema verify --database my-db`,
		Subcommands: []*cli.Command{
			schemaApplyCommand(o),
			schemaVerifyCommand(o),
			schemaPrintCommand(),
		},
	}
}

// migrationsTable is wrangler's migrations table for the connection: the
// wrangler config's migrations_table, or d1_migrations.
func migrationsTable(cn *conn) string {
	if cn.migrationsTable != "" {
		return cn.migrationsTable
	}
	return schema.MigrationsTable
}

// applyJSON is schema apply --json.
type applyJSON struct {
	Action      string `json:"action"` // create, record or nothing
	Description string `json:"description"`
	DryRun      bool   `json:"dry_run"`
	// Migration is the first of Migrations.
	Migration       string   `json:"migration"`
	Migrations      []string `json:"migrations"`
	MigrationsTable string   `json:"migrations_table"`
	Database        string   `json:"database"`
	SQL             string   `json:"sql"`
}

func actionName(a schema.Action) string {
	switch a {
	case schema.CreateAndRecord:
		return "create"
	case schema.RecordOnly:
		return "record"
	}
	return "nothing"
}

func schemaApplyCommand(o *options) *cli.Command {
	return &cli.Command{
		Name:  "apply",
		Usage: "create the ledger table and index if needed, recorded as a wrangler migration",
		Description: `Creates idempotency_keys and its updated_at index, and records the migration
` + schema.MigrationName + ` in wrangler's migrations table (d1_migrations, or the
migrations_table of the wrangler config with --database), in one transaction.
It is idempotent: once recorded, it does nothing. A table made by hand with the
right shape is only recorded; one with another shape is reported and left alone
(exit 1). With the schema in the migrations directory under that name,
'wrangler d1 migrations list' agrees:

   d1idem schema print > migrations/` + schema.MigrationName + `
   d1idem schema apply --database my-db
   d1idem schema apply --dry-run --database my-db   # print the SQL, change nothing`,
		Flags: append([]cli.Flag{
			&cli.BoolFlag{Name: "dry-run", Usage: "print the SQL that apply would run, and change nothing", DisableDefaultText: true},
			jsonFlag(),
		}, connFlags()...),
		Action: func(c *cli.Context) error {
			if err := noArgs(c); err != nil {
				return err
			}
			return withConn(c, o, func(cn *conn) error { return schemaApply(c, cn) })
		},
	}
}

func schemaApply(c *cli.Context, cn *conn) error {
	table := migrationsTable(cn)
	opts := schema.Options{MigrationsTable: table, DryRun: c.Bool("dry-run")}
	res, err := schema.Apply(c.Context, cn.db, opts)
	if err != nil {
		var drift *schema.DriftError
		if errors.As(err, &drift) {
			return driftError(c, drift)
		}
		return err
	}
	w := c.App.Writer
	names := strings.Join(res.Migrations, ", ")
	if c.Bool(flagJSON) {
		return printJSON(w, applyJSON{Action: actionName(res.Action), Description: res.Action.String(), DryRun: opts.DryRun,
			Migration: res.Migrations[0], Migrations: res.Migrations, MigrationsTable: table, Database: cn.where, SQL: res.SQL()})
	}
	if opts.DryRun {
		if res.Action == schema.Nothing {
			fmt.Fprintf(w, "-- nothing to do on %s: %s is already recorded in %s\n", cn.where, names, table)
			return nil
		}
		fmt.Fprintf(w, "-- schema apply on %s would %s, in one transaction:\n", cn.where, res.Action)
		fmt.Fprint(w, res.SQL())
		return nil
	}
	switch res.Action {
	case schema.CreateAndRecord:
		fmt.Fprintf(w, "Created %s and %s, and recorded %s in %s, on %s.\n", d1idem.Table, d1idem.UpdatedAtIndex, names, table, cn.where)
	case schema.RecordOnly:
		fmt.Fprintf(w, "%s already had the expected shape; recorded %s in %s, on %s.\n", d1idem.Table, names, table, cn.where)
	default:
		fmt.Fprintf(w, "Nothing to do on %s: %s is already recorded in %s. 'd1idem schema verify' checks the live shape.\n", cn.where, names, table)
	}
	return nil
}

// driftError prints the differences on stdout and returns the one-line
// error of apply.
func driftError(c *cli.Context, drift *schema.DriftError) error {
	if c.Bool(flagJSON) {
		_ = printJSON(c.App.Writer, verifyJSON{Matches: false, Diff: drift.Diff})
	} else {
		printDiff(c, drift.Diff)
	}
	return fmt.Errorf("%s differs from schema.sql (%s, shown on stdout): not recording the migration; fix the table by hand or restore it, then apply again",
		d1idem.Table, plural(int64(len(drift.Diff)), "difference", "differences"))
}

func printDiff(c *cli.Context, lines []string) {
	w := c.App.Writer
	fmt.Fprintf(w, "%s differs from schema.sql (- schema.sql, + live table):\n", d1idem.Table)
	for _, l := range lines {
		fmt.Fprintf(w, "  %s\n", l)
	}
}

// verifyJSON is schema verify --json.
type verifyJSON struct {
	Matches bool     `json:"matches"`
	Diff    []string `json:"diff"`
	Columns int      `json:"columns,omitempty"`
	Indexes int      `json:"indexes,omitempty"`
}

func schemaVerifyCommand(o *options) *cli.Command {
	return &cli.Command{
		Name:  "verify",
		Usage: "check that the live table and its indexes match schema.sql",
		Description: `Compares the live PRAGMA table_info and index_list (with each index's columns)
of idempotency_keys with the shape schema.sql produces. Exit 0 and one line when
they match; exit 1 with a diff ("-" what schema.sql has, "+" what the live table
has instead) when they differ or the table is missing.

   d1idem schema verify --database my-db`,
		Flags: append([]cli.Flag{jsonFlag()}, connFlags()...),
		Action: func(c *cli.Context) error {
			if err := noArgs(c); err != nil {
				return err
			}
			return withConn(c, o, func(cn *conn) error { return schemaVerify(c, cn) })
		},
	}
}

func schemaVerify(c *cli.Context, cn *conn) error {
	err := schema.Verify(c.Context, cn.db)
	var drift *schema.DriftError
	if err != nil && !errors.As(err, &drift) {
		return err
	}
	w := c.App.Writer
	want := schema.Expected()
	if c.Bool(flagJSON) {
		out := verifyJSON{Matches: drift == nil, Diff: []string{}}
		if drift != nil {
			out.Diff = drift.Diff
		} else {
			out.Columns, out.Indexes = len(want.Columns), len(want.Indexes)
		}
		if err := printJSON(w, out); err != nil {
			return err
		}
	} else if drift == nil {
		fmt.Fprintf(w, "%s on %s matches schema.sql: %s, %s.\n", d1idem.Table, cn.where,
			plural(int64(len(want.Columns)), "column", "columns"), plural(int64(len(want.Indexes)), "index", "indexes"))
	} else {
		printDiff(c, drift.Diff)
	}
	switch {
	case drift == nil:
		return nil
	case drift.Missing:
		return fmt.Errorf("schema drift: %s does not exist on %s; run 'd1idem schema apply'", d1idem.Table, cn.where)
	}
	return fmt.Errorf("schema drift: %s on %s differs from schema.sql (%s, shown on stdout)",
		d1idem.Table, cn.where, plural(int64(len(drift.Diff)), "difference", "differences"))
}

func schemaPrintCommand() *cli.Command {
	return &cli.Command{
		Name:  "print",
		Usage: "print the ledger schema (schema.sql); needs no connection",
		Description: `Prints schema.sql exactly: the spec's CREATE TABLE idempotency_keys and its
updated_at index. Save it as a wrangler migration so that wrangler and
'd1idem schema apply' agree:

   d1idem schema print > migrations/` + schema.MigrationName,
		Flags: []cli.Flag{jsonFlag()},
		Action: func(c *cli.Context) error {
			if err := noArgs(c); err != nil {
				return err
			}
			if c.Bool(flagJSON) {
				return printJSON(c.App.Writer, struct {
					Migration  string   `json:"migration"`
					SQL        string   `json:"sql"`
					Statements []string `json:"statements"`
				}{schema.MigrationName, d1idem.Schema(), d1idem.SchemaStatements()})
			}
			_, err := fmt.Fprint(c.App.Writer, d1idem.Schema())
			return err
		},
	}
}
