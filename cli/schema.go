package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/d1idem/d1idem"
	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/internal/human"
	"github.com/d1idem/d1idem/internal/textsafe"
	"github.com/d1idem/d1idem/schema"
	"github.com/d1idem/d1idem/wrangler"
)

func schemaCommand(o *options) *cli.Command {
	return &cli.Command{
		Name:        "schema",
		Usage:       "apply, verify and print the ledger schema",
		Description: help("schema"),
		Subcommands: []*cli.Command{schemaApplyCommand(o), schemaVerifyCommand(o), schemaPrintCommand()},
	}
}

// flagMigrationsDir names wrangler's migrations directory.
const flagMigrationsDir = "migrations-dir"

func migrationsDirFlag() cli.Flag {
	return &cli.StringFlag{Name: flagMigrationsDir, Usage: "wrangler's migrations `DIR` (default: the migrations_dir of the database in the wrangler config)"}
}

func schemaApplyCommand(o *options) *cli.Command {
	return &cli.Command{
		Name:        "apply",
		Usage:       "create the ledger table and index if needed, recorded as a wrangler migration",
		Description: help("schema apply"),
		Flags: append([]cli.Flag{
			&cli.BoolFlag{Name: "dry-run", Usage: "print the SQL that apply would run, and change nothing", DisableDefaultText: true},
			migrationsDirFlag(), jsonFlag(),
		}, connFlags()...),
		Action: o.schemaApply,
	}
}

func schemaVerifyCommand(o *options) *cli.Command {
	return &cli.Command{
		Name:        "verify",
		Usage:       "check that the live table and its indexes match schema.sql",
		Description: help("schema verify"),
		Flags:       append([]cli.Flag{jsonFlag()}, connFlags()...),
		Action:      o.schemaVerify,
	}
}

func schemaPrintCommand() *cli.Command {
	return &cli.Command{
		Name:        "print",
		Usage:       "print the ledger schema (schema.sql), or write it as a wrangler migration; needs no connection",
		Description: help("schema print"),
		Flags: append([]cli.Flag{
			&cli.BoolFlag{Name: "migration", Usage: "write the schema into wrangler's migrations directory as the next migration", DisableDefaultText: true},
			migrationsDirFlag(), jsonFlag(),
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

// schemaResult is schema apply's or verify's work on one database.
type schemaResult struct {
	cn    *conn
	res   schema.Result      // apply's
	dir   string             // apply's migrations directory
	drift *schema.DriftError // the table differs from schema.sql, or is missing
	err   error              // the database could not be read or changed
}

// schemaApply is schema apply's action. With --dry-run on a local database
// not there yet, it shows what apply would do on a new one.
func (o *options) schemaApply(c *cli.Context) error {
	if err := noArgs(c); err != nil {
		return err
	}
	acc := create
	if c.Bool("dry-run") {
		acc = existing
	}
	err := o.withSet(c, acc, func(s *dbSet) error { return schemaEach(c, s, applyOne) })
	if dir := c.String(flagLocal); dir != "" && acc == existing && !severalDatabases(c) &&
		(errors.As(err, new(*noDatabaseError)) || errors.As(err, new(*noDirectoryError))) {
		return dryRunFresh(c, dir)
	}
	return err
}

// dryRunFresh is schema apply --dry-run on an empty database in memory.
func dryRunFresh(c *cli.Context, dir string) error {
	srv, err := d1local.Listen(d1local.Config{}, "")
	if err != nil {
		return err
	}
	s := &dbSet{local: srv, dir: dir}
	defer s.close()
	ids, _ := localIDs(c, dir, nil)
	cn := &conn{databaseID: ids[0], set: s}
	if cn.db, err = localClient(srv, cn.databaseID); err != nil {
		return err
	}
	cn.where = fmt.Sprintf("local database %q under %s (not there yet: apply creates it)", cn.databaseID, dir)
	s.conns = []*conn{cn}
	return schemaEach(c, s, applyOne)
}

// applyOne applies the schema to one database, first creating it where it
// is missing on d1local (never on D1, which gives a database its UUID).
func applyOne(c *cli.Context, cn *conn) schemaResult {
	r := schemaResult{cn: cn}
	table, dir, err := migrationsFor(c, cn)
	if err != nil {
		r.err = err
		return r
	}
	r.dir = dir
	opts := schema.Options{MigrationsTable: table, DryRun: c.Bool("dry-run"), CreateLocal: true}
	if dir != "" {
		opts.Migrations = os.DirFS(dir)
	}
	r.res, r.err = schema.Apply(c.Context, cn.db, opts)
	if errors.As(r.err, &r.drift) {
		r.err = nil
	}
	return r
}

func (o *options) schemaVerify(c *cli.Context) error {
	if err := noArgs(c); err != nil {
		return err
	}
	return o.withSet(c, existing, func(s *dbSet) error {
		return schemaEach(c, s, func(c *cli.Context, cn *conn) schemaResult {
			r := schemaResult{cn: cn}
			if err := schema.Verify(c.Context, cn.db); !errors.As(err, &r.drift) {
				r.err = err
			}
			return r
		})
	})
}

// schemaEach runs apply or verify (work) on each database of s, shows
// each one's result, and fails if any failed. On one database, an error
// other than a drift is the command's, and nothing is shown.
func schemaEach(c *cli.Context, s *dbSet, work func(*cli.Context, *conn) schemaResult) error {
	var all []schemaResult
	for _, cn := range s.conns {
		r := work(c, cn)
		if s.one() && r.err != nil {
			return r.err
		}
		r.err = cn.named(c, r.err)
		all = append(all, r)
	}
	if err := printSchemaResults(c, s, all); err != nil {
		return err
	}
	ok, err := schemaError(c, s, all)
	if commandPath(c) == "schema apply" && !c.Bool(flagJSON) && !c.Bool("dry-run") && ok > 0 {
		fmt.Fprintf(c.App.Writer, "Check the live shape with 'd1idem schema verify%s'.\n", connHint(c))
	}
	return err
}

// printSchemaResults writes what apply or verify found on each database.
func printSchemaResults(c *cli.Context, s *dbSet, all []schemaResult) error {
	w, apply := c.App.Writer, commandPath(c) == "schema apply"
	if c.Bool(flagJSON) && s.one() {
		return printObject(w, all[0].fields(apply)...)
	}
	if c.Bool(flagJSON) {
		dbs := make([]any, len(all))
		for i, r := range all {
			where, id := field{"database", r.cn.where}, field{"id", r.cn.databaseID}
			var parts []any
			switch {
			case r.err != nil:
				parts = []any{where, id, field{"error", describe(r.err)}}
			case apply && r.drift != nil:
				parts = []any{where, id, field{"error", describe(r.drift)}, field{"diff", r.drift.Diff}}
			case apply:
				parts = append(r.fields(apply), id, field{"error", nil})
			default:
				parts = append(append([]any{where, id}, r.fields(apply)...), field{"error", nil})
			}
			dbs[i], _ = object(parts...)
		}
		return printObject(w, field{"databases", dbs})
	}
	for _, r := range all {
		if err := r.render(w, s.one(), apply); err != nil {
			return err
		}
	}
	return nil
}

// fields are the members of a database's JSON: whether the table matches
// schema.sql, or what apply did.
func (r schemaResult) fields(apply bool) []any {
	switch {
	case r.drift != nil:
		return []any{field{"matches", false}, field{"diff", r.drift.Diff}}
	case !apply:
		want := schema.Expected()
		return []any{field{"matches", true}, field{"diff", []string{}}, field{"columns", len(want.Columns)}, field{"indexes", len(want.Indexes)}}
	}
	return []any{r.res, field{"migrations_dir", r.dir}, field{"database", r.cn.where}, field{"created_database", r.res.CreatedDatabase}}
}

// render writes what apply or verify found on one database, for people.
func (r schemaResult) render(w io.Writer, one, apply bool) error {
	switch {
	case r.err != nil:
		return nil
	case r.drift != nil:
		if !one {
			fmt.Fprintf(w, "On %s: ", r.cn.where)
		}
		fmt.Fprintf(w, "%s differs from schema.sql (- schema.sql, + live table):\n", d1idem.Table)
		for _, l := range r.drift.Diff {
			fmt.Fprintf(w, "  %s\n", textsafe.Escape(l)) // names, types and defaults of the live table
		}
		return nil
	case !apply:
		want := schema.Expected()
		_, err := fmt.Fprintf(w, "%s on %s matches schema.sql: %s, %s.\n", d1idem.Table, r.cn.where,
			human.Plural(int64(len(want.Columns)), "column", "columns"), human.Plural(int64(len(want.Indexes)), "index", "indexes"))
		return err
	case r.res.CreatedDatabase && r.cn.set.local != nil:
		fmt.Fprintf(w, "Created database %q under %s: there was no database of that name.\n", r.cn.databaseID, r.cn.set.dir)
	case r.res.CreatedDatabase:
		fmt.Fprintf(w, "Created database %q on the d1local at %s: there was no database of that name.\n", r.cn.databaseID, r.cn.db.BaseURL())
	}
	return renderApply(w, r.res, r.cn.where)
}

// renderApply writes what schema apply did, or would do with --dry-run.
func renderApply(w io.Writer, res schema.Result, where string) error {
	names := textsafe.Escape(strings.Join(res.Migrations, ", ")) // file names
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

// driftText says how a table differs: missing (with the apply that makes
// it), or how many differences stdout shows.
func driftText(drift *schema.DriftError, hint string) string {
	if drift.Missing {
		return fmt.Sprintf("%s does not exist (run 'd1idem schema apply%s')", d1idem.Table, hint)
	}
	return fmt.Sprintf("%s differs from schema.sql (%s, shown on stdout)", d1idem.Table, human.Plural(int64(len(drift.Diff)), "difference", "differences"))
}

// schemaError is apply's or verify's error: the databases that differ from
// schema.sql or failed; nil when none. ok counts the others.
func schemaError(c *cli.Context, s *dbSet, all []schemaResult) (ok int, err error) {
	apply := commandPath(c) == "schema apply"
	if r := all[0]; s.one() && r.drift != nil {
		switch {
		case apply && r.drift.Recorded:
			return 0, fmt.Errorf("%s: the migration is recorded, but the table is not what it made; fix the table by hand or restore it, then apply again", driftText(r.drift, ""))
		case apply:
			return 0, fmt.Errorf("%s: not recording the migration; fix the table by hand or restore it, then apply again", driftText(r.drift, ""))
		case r.drift.Missing:
			return 0, fmt.Errorf("schema drift: %s does not exist on %s; run 'd1idem schema apply%s'", d1idem.Table, r.cn.where, connHint(c))
		}
		return 0, fmt.Errorf("schema drift: %s on %s differs from schema.sql (%s, shown on stdout)", d1idem.Table, r.cn.where, human.Plural(int64(len(r.drift.Diff)), "difference", "differences"))
	}
	var failed []string
	for _, r := range all {
		switch {
		case r.err != nil:
			failed = append(failed, r.cn.label()+": "+describe(r.err))
		case r.drift != nil:
			failed = append(failed, r.cn.label()+": "+driftText(r.drift, connHint(c)))
		}
	}
	switch {
	case len(failed) == 0:
		return len(all), nil
	case apply:
		return len(all) - len(failed), fmt.Errorf("schema apply failed on %d of %d databases: %s", len(failed), len(all), strings.Join(failed, "; "))
	}
	return len(all) - len(failed), fmt.Errorf("schema drift on %d of %d databases: %s", len(failed), len(all), strings.Join(failed, "; "))
}

// migrationsFor returns wrangler's migrations table and directory for the
// database: its wrangler config entry's, --migrations-dir over the
// directory; dir is "" when nothing names one.
func migrationsFor(c *cli.Context, cn *conn) (table, dir string, err error) {
	table = schema.MigrationsTable
	d := cn.wrangler
	if d == nil {
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

// databaseByID returns the entry of --config, or of the config wrangler
// would use (passed over if unreadable: nothing asked for it), whose
// database_id or preview_database_id is id, in --env; nil when none.
func databaseByID(c *cli.Context, id string) (*wrangler.Database, error) {
	explicit := c.String(flagConfig) != ""
	if !explicit && !findsConfig() {
		return nil, nil
	}
	cfg, err := loadWrangler(c, flagDatabase)
	if err != nil && explicit {
		return nil, err
	} else if err != nil {
		return nil, nil
	}
	d, ok, err := cfg.ByID(c.String(flagEnv), id)
	switch {
	case err != nil && explicit:
		return nil, usageError{err}
	case !ok:
		return nil, nil
	}
	return &d, nil
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
	rest := ""
	if d.Env != "" {
		rest += " --env " + textsafe.ShellQuote(d.Env)
	}
	if config := c.String(flagConfig); config != "" {
		rest += " --config " + textsafe.ShellQuote(config)
	}
	return d.Name() + rest, " --database " + textsafe.ShellQuote(d.Name()) + rest
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

// findsConfig reports whether wrangler would find a config here.
func findsConfig() bool {
	_, err := wrangler.Find(".")
	return err == nil
}
