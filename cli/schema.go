package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/d1idem/d1idem"
	"github.com/d1idem/d1idem/cli/internal/embedded"
	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/schema"
	"github.com/d1idem/d1idem/wrangler"
)

func schemaCommand(o *options) *cli.Command {
	return &cli.Command{
		Name:  "schema",
		Usage: "apply, verify and print the ledger schema",
		Description: `Manages the ledger table (idempotency_keys) and its updated_at index. In CI,
apply then verify before a deploy; both exit non-zero on failure:

   d1idem schema apply --database my-db
   d1idem schema verify --database my-db

With several databases (--database or --database-id repeated, or
--databases-prefix), apply and verify run on each, report each, and exit
non-zero if any failed.

   d1idem schema apply --databases-prefix ledger-`,
		Subcommands: []*cli.Command{
			schemaApplyCommand(o),
			schemaVerifyCommand(o),
			schemaPrintCommand(),
		},
	}
}

// flagMigrationsDir names wrangler's migrations directory.
const flagMigrationsDir = "migrations-dir"

func migrationsDirFlag() cli.Flag {
	return &cli.StringFlag{Name: flagMigrationsDir, Usage: "wrangler's migrations `DIR` (default: the migrations_dir of the database in the wrangler config)"}
}

// migrationsFor returns wrangler's migrations table and directory for the
// connection: those of the wrangler config's entry for the database (chosen
// by --database, or else found by its database ID), with --migrations-dir
// over the directory. dir is "" when nothing names one.
func migrationsFor(c *cli.Context, cn *conn) (table, dir string, err error) {
	table = schema.MigrationsTable
	d := cn.wrangler
	if d == nil && cn.databaseID != "" {
		if d, err = databaseByID(c, cn.databaseID); err != nil {
			return "", "", err
		}
	}
	if d != nil {
		table, dir = d.MigrationsTable, relPath(d.MigrationsDir)
	}
	if f := c.String(flagMigrationsDir); f != "" {
		dir = f
	}
	return table, dir, nil
}

// databaseByID returns the entry of the wrangler config whose database_id
// or preview_database_id is id, in the environment --env names; nil when
// there is none. The config is --config, or else the one wrangler would use,
// if any; a config found that way but unreadable, or without that
// environment, is passed over, since nothing asked for it.
func databaseByID(c *cli.Context, id string) (*wrangler.Database, error) {
	explicit := c.String(flagConfig) != ""
	if !explicit && !findsConfig() {
		return nil, nil
	}
	cfg, err := loadWrangler(c, flagDatabase)
	if err != nil {
		if explicit {
			return nil, err
		}
		return nil, nil
	}
	dbs, err := cfg.Databases(c.String(flagEnv))
	if err != nil {
		if explicit {
			return nil, usageError{err}
		}
		return nil, nil
	}
	for _, d := range dbs {
		if d.DatabaseID == id || d.PreviewDatabaseID == id {
			return &d, nil
		}
	}
	return nil, nil
}

func schemaApplyCommand(o *options) *cli.Command {
	return &cli.Command{
		Name:  "apply",
		Usage: "create the ledger table and index if needed, recorded as a wrangler migration",
		Description: `Creates idempotency_keys and its updated_at index, and records the migration in
wrangler's migrations table (d1_migrations, or the migrations_table of the
wrangler config), in one transaction. It is idempotent, and it leaves the live
table matching schema.sql or fails: it reads the table's shape even once the
migration is recorded, creates again an index of schema.sql that was dropped,
and does nothing more when the shape matches. A table made by hand with the
right shape is only recorded; one with another shape is reported and left alone
(exit 1).

The migration is recorded under the name of the file of wrangler's migrations
directory that holds the schema, whatever its name (compared by content), so
that 'wrangler d1 migrations apply' does not run it again; without such a file,
as ` + schema.MigrationName + `. The directory is the migrations_dir of the
database in the wrangler config (with --database, or found by its database ID),
or --migrations-dir.

   d1idem schema print --migration --database my-db   # write the migration file
   d1idem schema apply --database my-db
   d1idem schema apply --dry-run --database my-db     # print the SQL, change nothing`,
		Flags: append([]cli.Flag{
			&cli.BoolFlag{Name: "dry-run", Usage: "print the SQL that apply would run, and change nothing", DisableDefaultText: true},
			migrationsDirFlag(),
			jsonFlag(),
		}, connFlags()...),
		Action: o.schemaApply,
	}
}

// schemaApply is schema apply's action. With --dry-run it creates nothing;
// on a local database that does not exist yet, it shows what apply would
// do on the empty database apply would create.
func (o *options) schemaApply(c *cli.Context) error {
	if err := noArgs(c); err != nil {
		return err
	}
	acc := create
	if c.Bool("dry-run") {
		acc = existing
	}
	err := o.withSet(c, acc, func(s *dbSet) error { return applySet(c, s) })
	if dir := c.String(flagLocal); dir != "" && acc == existing && !severalDatabases(c) &&
		(errors.As(err, new(*noDatabaseError)) || errors.As(err, new(*noDirectoryError))) {
		return dryRunFresh(c, dir)
	}
	return err
}

// dryRunFresh is schema apply --dry-run for a local database that does not
// exist yet: on an empty one, in memory.
func dryRunFresh(c *cli.Context, dir string) error {
	srv, err := embedded.Start(d1local.Config{}, "")
	if err != nil {
		return err
	}
	s := &dbSet{local: srv, dir: dir}
	defer s.close()
	ids, _ := localIDs(c, dir, nil)
	cn := &conn{databaseID: ids[0], set: s}
	if cn.db, err = srv.Client(cn.databaseID); err != nil {
		return err
	}
	cn.where = fmt.Sprintf("local database %q under %s (not there yet: apply creates it)", cn.databaseID, dir)
	s.conns = []*conn{cn}
	return applySet(c, s)
}

// applied is schema apply's work on one database.
type applied struct {
	cn      *conn
	res     schema.Result
	dir     string // the migrations directory
	created string // the database apply created, for people
	err     error
}

// applySet applies the schema to each database of s (or with --dry-run
// says what it would do), reports each, and fails if any failed: a table
// of another shape is shown on stdout.
func applySet(c *cli.Context, s *dbSet) error {
	var all []applied
	for _, cn := range s.conns {
		a := applyOne(c, cn)
		if !s.one() {
			a.err = cn.named(c, a.err)
		}
		all = append(all, a)
	}
	if c.Bool(flagJSON) {
		if err := printApplyJSON(c.App.Writer, s, all); err != nil {
			return err
		}
	} else if err := renderApplied(c.App.Writer, s, all); err != nil {
		return err
	}
	if s.one() {
		if drift := (*schema.DriftError)(nil); errors.As(all[0].err, &drift) {
			return fmt.Errorf("%s differs from schema.sql (%s, shown on stdout): %s; fix the table by hand or restore it, then apply again",
				d1idem.Table, plural(int64(len(drift.Diff)), "difference", "differences"), notRecording(all[0].err))
		}
		if all[0].err != nil {
			return all[0].err
		}
	}
	var failed []string
	for _, a := range all {
		if a.err != nil {
			failed = append(failed, a.cn.label()+": "+applyFailure(a.err))
		}
	}
	if !c.Bool(flagJSON) && !c.Bool("dry-run") && len(failed) < len(all) {
		if err := checkLine(c); err != nil {
			return err
		}
	}
	return failedOn("schema apply", failed, len(all))
}

// notRecording says what apply did not do on a drifted table.
func notRecording(err error) string {
	if strings.Contains(err.Error(), "not recording the migration") {
		return "not recording the migration"
	}
	return "the migration is recorded, but the table is not what it made"
}

// applyFailure is one database's failure in schema apply's error.
func applyFailure(err error) string {
	var drift *schema.DriftError
	if errors.As(err, &drift) {
		return fmt.Sprintf("%s differs from schema.sql (%s)", d1idem.Table, plural(int64(len(drift.Diff)), "difference", "differences"))
	}
	return describe(err)
}

// failedOn is the error of a command that failed on some of n databases.
func failedOn(cmd string, failed []string, n int) error {
	if len(failed) == 0 {
		return nil
	}
	return fmt.Errorf("%s failed on %d of %d databases: %s", cmd, len(failed), n, strings.Join(failed, "; "))
}

// renderApplied writes what schema apply did on each database, or why not.
func renderApplied(w io.Writer, s *dbSet, all []applied) error {
	for _, a := range all {
		var drift *schema.DriftError
		switch {
		case errors.As(a.err, &drift):
			if !s.one() {
				fmt.Fprintf(w, "On %s: ", a.cn.where)
			}
			if err := printDiff(w, drift.Diff); err != nil {
				return err
			}
		case a.err != nil:
		default:
			if a.created != "" {
				fmt.Fprintf(w, "Created %s: there was no database of that name.\n", a.created)
			}
			if err := renderApply(w, a.res, a.cn.where); err != nil {
				return err
			}
		}
	}
	return nil
}

// printApplyJSON writes schema apply --json: for one database, what apply
// did (or, for a drifted table, the differences); for several, each one's,
// or its error.
func printApplyJSON(w io.Writer, s *dbSet, all []applied) error {
	var drift *schema.DriftError
	if s.one() && errors.As(all[0].err, &drift) {
		return printObject(w, verifyFields(drift)...)
	}
	if s.one() {
		if all[0].err != nil {
			return nil
		}
		return printObject(w, all[0].fields()...)
	}
	dbs := make([]any, len(all))
	for i, a := range all {
		parts := []any{field{"database", a.cn.where}, field{"id", a.cn.databaseID}, field{"error", describeOrNil(a.err)}}
		switch {
		case errors.As(a.err, &drift):
			parts = append(parts, field{"diff", drift.Diff})
		case a.err == nil:
			parts = append(a.fields(), parts[1:]...)
		}
		dbs[i], _ = object(parts...)
	}
	return printObject(w, field{"databases", dbs})
}

// describeOrNil is describe's line for err, or nil (JSON null) for none.
func describeOrNil(err error) any {
	if err == nil {
		return nil
	}
	return describe(err)
}

// fields are the members of apply's JSON for one database: schema's
// Result, the migrations directory, the database and whether apply created
// it.
func (a applied) fields() []any {
	return []any{a.res, field{"migrations_dir", a.dir}, field{"database", a.cn.where}, field{"created_database", a.created != ""}}
}

// applyOne applies the schema to one database (or with --dry-run, says
// what it would do); a table of another shape is a *schema.DriftError.
func applyOne(c *cli.Context, cn *conn) applied {
	a := applied{cn: cn}
	table, dir, err := migrationsFor(c, cn)
	if err != nil {
		a.err = err
		return a
	}
	a.dir = dir
	opts := schema.Options{MigrationsTable: table, DryRun: c.Bool("dry-run")}
	if dir != "" {
		opts.Migrations = os.DirFS(dir)
	}
	a.res, a.created, a.err = applyCreating(c.Context, cn, opts)
	return a
}

// applyCreating is schema.Apply, which first creates the database where it
// is missing and the CLI may create it (see conn.create), and says what it
// created. A dry run creates nothing.
func applyCreating(ctx context.Context, cn *conn, opts schema.Options) (schema.Result, string, error) {
	res, err := schema.Apply(ctx, cn.db, opts)
	if opts.DryRun || !errors.Is(err, d1client.ErrNoDatabase) {
		return res, "", err
	}
	created, cerr := cn.create(ctx)
	if cerr != nil {
		return res, "", cerr
	}
	if created == "" {
		return res, "", err
	}
	res, err = schema.Apply(ctx, cn.db, opts)
	return res, created, err
}

// checkLine writes the command that checks the result of schema apply.
func checkLine(c *cli.Context) error {
	_, err := fmt.Fprintf(c.App.Writer, "Check the live shape with 'd1idem schema verify%s'.\n", connHint(c))
	return err
}

// renderApply writes what schema apply did, or would do with --dry-run.
func renderApply(w io.Writer, res schema.Result, where string) error {
	names := escapeText(strings.Join(res.Migrations, ", ")) // file names
	table := res.MigrationsTable
	switch {
	case res.DryRun && res.Action == schema.Nothing:
		_, err := fmt.Fprintf(w, "-- nothing to do on %s: %s is already recorded in %s\n", where, names, table)
		return err
	case res.DryRun:
		fmt.Fprintf(w, "-- schema apply on %s would %s, in one transaction:\n", where, res.Action)
		_, err := fmt.Fprint(w, res.SQL())
		return err
	case res.Action == schema.CreateAndRecord:
		fmt.Fprintf(w, "Created %s and %s, and recorded %s in %s, on %s.\n", d1idem.Table, d1idem.UpdatedAtIndex, names, table, where)
	case res.Action == schema.RecordOnly:
		fmt.Fprintf(w, "%s already had the expected shape; recorded %s in %s, on %s.\n", d1idem.Table, names, table, where)
	case res.Action == schema.Repair:
		fmt.Fprintf(w, "%s had the expected columns but not its index %s, which was created again; %s is recorded in %s, on %s.\n",
			d1idem.Table, d1idem.UpdatedAtIndex, names, table, where)
	default:
		fmt.Fprintf(w, "Nothing to do on %s: %s is already recorded in %s.\n", where, names, table)
	}
	return nil
}

// printDiff writes the differences of a drifted table. Their lines show
// names, types and defaults read from the live table: escaped.
func printDiff(w io.Writer, lines []string) error {
	fmt.Fprintf(w, "%s differs from schema.sql (- schema.sql, + live table):\n", d1idem.Table)
	for _, l := range lines {
		if _, err := fmt.Fprintf(w, "  %s\n", escapeText(l)); err != nil {
			return err
		}
	}
	return nil
}

// verifyFields are the members of schema verify's JSON for one database:
// whether it matches, the differences, and when it does, the columns and
// indexes it has.
func verifyFields(drift *schema.DriftError) []any {
	if drift != nil {
		return []any{field{"matches", false}, field{"diff", drift.Diff}}
	}
	want := schema.Expected()
	return []any{field{"matches", true}, field{"diff", []string{}}, field{"columns", len(want.Columns)}, field{"indexes", len(want.Indexes)}}
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
		Flags:  append([]cli.Flag{jsonFlag()}, connFlags()...),
		Action: o.schemaVerify,
	}
}

// verified is schema verify's work on one database.
type verified struct {
	cn    *conn
	drift *schema.DriftError // the table differs, or is missing
	err   error              // the database could not be read
}

// schemaVerify verifies each database, reporting each, and fails if any
// differs from schema.sql or cannot be read.
func (o *options) schemaVerify(c *cli.Context) error {
	if err := noArgs(c); err != nil {
		return err
	}
	return o.withSet(c, existing, func(s *dbSet) error {
		var all []verified
		for _, cn := range s.conns {
			v := verified{cn: cn}
			if err := schema.Verify(c.Context, cn.db); !errors.As(err, &v.drift) {
				v.err = err
			}
			if s.one() && v.err != nil {
				return v.err
			}
			if !s.one() {
				v.err = cn.named(c, v.err)
			}
			all = append(all, v)
		}
		if err := printVerified(c, s, all); err != nil {
			return err
		}
		return verifyError(c, s, all)
	})
}

// printVerified writes that each table matches, or its differences; or
// their JSON.
func printVerified(c *cli.Context, s *dbSet, all []verified) error {
	w := c.App.Writer
	if c.Bool(flagJSON) {
		if s.one() {
			return printObject(w, verifyFields(all[0].drift)...)
		}
		dbs := make([]any, len(all))
		for i, v := range all {
			parts := []any{field{"database", v.cn.where}, field{"id", v.cn.databaseID}}
			if v.err != nil {
				parts = append(parts, field{"error", describe(v.err)})
			} else {
				parts = append(append(parts, verifyFields(v.drift)...), field{"error", nil})
			}
			dbs[i], _ = object(parts...)
		}
		return printObject(w, field{"databases", dbs})
	}
	for _, v := range all {
		if v.err != nil {
			continue
		}
		if v.drift != nil && !s.one() {
			fmt.Fprintf(w, "On %s: ", v.cn.where)
		}
		if err := renderVerify(w, v.drift, v.cn.where); err != nil {
			return err
		}
	}
	return nil
}

// verifyError is schema verify's error: the databases that differ from
// schema.sql or could not be read; nil when none.
func verifyError(c *cli.Context, s *dbSet, all []verified) error {
	var failed []string
	for _, v := range all {
		name := v.cn.label() + ": "
		if s.one() {
			name = ""
		}
		switch {
		case v.err != nil:
			failed = append(failed, name+describe(v.err))
		case v.drift != nil && v.drift.Missing && s.one():
			return fmt.Errorf("schema drift: %s does not exist on %s; run 'd1idem schema apply%s'", d1idem.Table, v.cn.where, connHint(c))
		case v.drift != nil && v.drift.Missing:
			failed = append(failed, fmt.Sprintf("%s%s does not exist (run 'd1idem schema apply%s')", name, d1idem.Table, connHint(c)))
		case v.drift != nil && s.one():
			return fmt.Errorf("schema drift: %s on %s differs from schema.sql (%s, shown on stdout)",
				d1idem.Table, v.cn.where, plural(int64(len(v.drift.Diff)), "difference", "differences"))
		case v.drift != nil:
			failed = append(failed, fmt.Sprintf("%s%s differs from schema.sql (%s, shown on stdout)", name, d1idem.Table, plural(int64(len(v.drift.Diff)), "difference", "differences")))
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("schema drift on %d of %d databases: %s", len(failed), len(all), strings.Join(failed, "; "))
	}
	return nil
}

// renderVerify writes that the table matches, or the differences.
func renderVerify(w io.Writer, drift *schema.DriftError, where string) error {
	if drift != nil {
		return printDiff(w, drift.Diff)
	}
	want := schema.Expected()
	_, err := fmt.Fprintf(w, "%s on %s matches schema.sql: %s, %s.\n", d1idem.Table, where,
		plural(int64(len(want.Columns)), "column", "columns"), plural(int64(len(want.Indexes)), "index", "indexes"))
	return err
}

func schemaPrintCommand() *cli.Command {
	return &cli.Command{
		Name:  "print",
		Usage: "print the ledger schema (schema.sql), or write it as a wrangler migration; needs no connection",
		Description: `Prints schema.sql exactly: the spec's CREATE TABLE idempotency_keys and its
updated_at index.

With --migration it writes the schema into wrangler's migrations directory
instead, as the next migration (NNNN_d1idem_idempotency_keys.sql, numbered as
'wrangler d1 migrations create' numbers), unless a file there already holds it.
The directory is --migrations-dir, or the migrations_dir of the database in the
wrangler config (--database, or the config's only database), or ./migrations.
Apply it with wrangler or with 'd1idem schema apply': each records it under the
file's name, so the other agrees.

   d1idem schema print --migration --database my-db
   d1idem schema print > schema.sql`,
		Flags: append([]cli.Flag{
			&cli.BoolFlag{Name: "migration", Usage: "write the schema into wrangler's migrations directory as the next migration", DisableDefaultText: true},
			migrationsDirFlag(),
			jsonFlag(),
		}, wranglerFlags()...),
		Action: func(c *cli.Context) error {
			if err := noArgs(c); err != nil {
				return err
			}
			if c.Bool("migration") {
				return writeMigration(c)
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

// writeMigration is schema print --migration.
func writeMigration(c *cli.Context) error {
	dir, d, err := printMigrationsDir(c)
	if err != nil {
		return err
	}
	if fi, err := os.Stat(dir); err == nil && !fi.IsDir() {
		return usagef("the migrations directory %s is a file, not a directory", dir)
	}
	name, written, err := schema.WriteMigration(dir)
	if err != nil {
		return err
	}
	path := filepath.Join(dir, name)
	w := c.App.Writer
	if c.Bool(flagJSON) {
		return printJSON(w, struct {
			Migration string `json:"migration"`
			Path      string `json:"path"`
			Written   bool   `json:"written"`
		}{name, path, written})
	}
	if !written {
		fmt.Fprintf(w, "%s already holds the ledger schema; nothing written.\n", path)
		return nil
	}
	wranglerArgs, d1idemArgs := applyArgs(c, d)
	fmt.Fprintf(w, "Wrote %s (the ledger schema).\n", path)
	fmt.Fprintf(w, "Apply it with 'wrangler d1 migrations apply %s --remote' or 'd1idem schema apply%s'. Where the table already exists, run 'd1idem schema apply%[2]s' first: it records the file as applied.\n",
		wranglerArgs, d1idemArgs)
	return nil
}

// applyArgs returns the arguments that name database d (nil: unknown) to
// 'wrangler d1 migrations apply' and to 'd1idem schema apply'.
func applyArgs(c *cli.Context, d *wrangler.Database) (wranglerArgs, d1idemArgs string) {
	if d == nil {
		return "DATABASE", ""
	}
	wranglerArgs, d1idemArgs = d.Name(), " --database "+shellQuote(d.Name())
	if d.Env != "" {
		wranglerArgs += " --env " + shellQuote(d.Env)
		d1idemArgs += " --env " + shellQuote(d.Env)
	}
	if config := c.String(flagConfig); config != "" {
		wranglerArgs += " --config " + shellQuote(config)
		d1idemArgs += " --config " + shellQuote(config)
	}
	return wranglerArgs, d1idemArgs
}

// printMigrationsDir returns the migrations directory of schema print
// --migration, and the wrangler config's entry it comes from (nil when none).
func printMigrationsDir(c *cli.Context) (dir string, d *wrangler.Database, err error) {
	switch {
	case c.String(flagDatabase) != "":
		entries, _, err := wranglerEntries(c)
		if err != nil {
			return "", nil, err
		}
		d = entries[0]
	case c.String(flagConfig) != "" || findsConfig():
		cfg, err := loadWrangler(c, flagDatabase)
		if err != nil {
			return "", nil, err
		}
		only, err := cfg.Only(c.String(flagEnv))
		if err != nil && c.String(flagMigrationsDir) == "" {
			return "", nil, usagef("%v; pass --%s NAME or --%s DIR", err, flagDatabase, flagMigrationsDir)
		}
		if err == nil {
			d = &only
		}
	}
	if d != nil {
		dir = relPath(d.MigrationsDir)
	}
	if f := c.String(flagMigrationsDir); f != "" {
		dir = f
	}
	if dir == "" {
		dir = wrangler.DefaultMigrationsDir
	}
	return dir, d, nil
}

// findsConfig reports whether wrangler would find a config from the current
// directory.
func findsConfig() bool {
	_, err := wrangler.Find(".")
	return err == nil
}
