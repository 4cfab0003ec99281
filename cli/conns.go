package cli

import (
	"flag"
	"slices"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/d1idem/d1idem/cli/internal/wrangler"
	"github.com/d1idem/d1idem/d1local"
)

// flagDatabasesPrefix chooses every database of the wrangler config (or,
// with --local, under DIR) whose name begins with a prefix.
const flagDatabasesPrefix = "databases-prefix"

// multiValue is the value of a connection flag that may be given several
// times (--database, --database-id). Its String joins the values with
// commas, so that c.String reads a flag given once as it reads a string
// flag.
type multiValue struct {
	vals []string
	// fromEnv reports values from the environment: a value on the command
	// line replaces them, as it replaces a string flag's.
	fromEnv bool
}

func (m *multiValue) Set(v string) error {
	if m.fromEnv {
		m.vals, m.fromEnv = nil, false
	}
	m.vals = append(m.vals, v)
	return nil
}

func (m *multiValue) String() string {
	if m == nil {
		return ""
	}
	return strings.Join(m.vals, ",")
}

// multiFlag is a string flag that may be repeated.
type multiFlag struct{ cli.GenericFlag }

// newMultiFlag returns a repeatable connection flag.
func newMultiFlag(name, usage string, envVars ...string) *multiFlag {
	return &multiFlag{cli.GenericFlag{Name: name, Usage: usage, EnvVars: envVars, Category: "Connection:", Value: &multiValue{}}}
}

// Apply registers the flag, and marks values taken from the environment.
func (f *multiFlag) Apply(set *flag.FlagSet) error {
	if err := f.GenericFlag.Apply(set); err != nil {
		return err
	}
	if v, ok := f.Value.(*multiValue); ok && len(v.vals) > 0 {
		v.fromEnv = true
	}
	return nil
}

// multiValues returns the values of a repeatable flag, and whether they
// came from the environment.
func multiValues(c *cli.Context, name string) ([]string, bool) {
	if v, ok := c.Generic(name).(*multiValue); ok && v != nil {
		return slices.Clone(v.vals), v.fromEnv
	}
	return nil, false
}

// severalDatabases reports whether the flags may name more than one
// database: --databases-prefix, or --database or --database-id given more
// than once. Otherwise a command runs on one database, as it always has.
func severalDatabases(c *cli.Context) bool {
	names, _ := multiValues(c, flagDatabase)
	ids, _ := multiValues(c, flagDatabaseID)
	return c.String(flagDatabasesPrefix) != "" || len(names) > 1 || len(ids) > 1
}

// noEnvDatabaseID refuses D1_DATABASE_ID beside a command line that names
// several databases: it would add a database nobody named there.
func noEnvDatabaseID(c *cli.Context) error {
	if ids, env := multiValues(c, flagDatabaseID); env && len(ids) > 0 {
		return usagef("D1_DATABASE_ID is set (%s) while the command line names several databases: unset it, or pass it as --%s too", strings.Join(ids, ","), flagDatabaseID)
	}
	return nil
}

// cloudflareTargets resolves the databases of --database (each given
// name), --database-id (each ID) and --databases-prefix, in that order, and
// the account and token to reach them (none is needed through a bridge).
// A database named twice is refused.
func cloudflareTargets(c *cli.Context, bridge bool) ([]target, error) {
	if !severalDatabases(c) {
		t, err := cloudflareTarget(c)
		return []target{t}, err
	}
	accountID, token := c.String(flagAccountID), c.String(flagAPIToken)
	entries, how, err := wranglerEntries(c)
	if err != nil {
		return nil, err
	}
	var ts []target
	for _, d := range entries {
		id, where, err := entryTarget(c, d)
		if err != nil {
			return nil, err
		}
		ts = append(ts, target{databaseID: id, where: where, wrangler: d})
		if accountID == "" {
			accountID = d.AccountID
		}
	}
	ids, _ := multiValues(c, flagDatabaseID)
	for _, id := range ids {
		ts = append(ts, target{databaseID: id, where: "database " + id})
		how = append(how, "--"+flagDatabaseID+" "+id)
	}
	if err := missingSettings(accountID, token != "" || bridge, len(ts) > 0); err != nil {
		return nil, err
	}
	named := make([]string, len(ts))
	for i := range ts {
		ts[i].accountID, ts[i].token = accountID, token
		named[i] = ts[i].databaseID
	}
	if err := namedOnce(named, how); err != nil {
		return nil, err
	}
	return ts, nil
}

// namedOnce refuses a set of databases (their IDs) that names one twice:
// each database is one home of the ring, and a repeat is most likely a
// slip for another. how says how the flags named each.
func namedOnce(ids, how []string) error {
	for i, id := range ids {
		if j := slices.Index(ids[:i], id); j >= 0 {
			same := how[j] + " and " + how[i]
			if how[j] == how[i] {
				same = how[i] + " twice"
			}
			return usagef("database %s is named twice (%s): name each database of the ledger once", id, same)
		}
	}
	return nil
}

// wranglerEntries returns the wrangler config's entries that --database
// (each given) and --databases-prefix name, in the environment --env
// names, and the flag that named each; none without those flags.
func wranglerEntries(c *cli.Context) ([]*wrangler.Database, []string, error) {
	names, _ := multiValues(c, flagDatabase)
	prefix := c.String(flagDatabasesPrefix)
	if len(names) == 0 && prefix == "" {
		return nil, nil, nil
	}
	flagName := flagDatabase
	if len(names) == 0 {
		flagName = flagDatabasesPrefix
	}
	cfg, err := loadWranglerFor(c, flagName)
	if err != nil {
		return nil, nil, err
	}
	var out []*wrangler.Database
	var how []string
	for _, name := range names {
		d, err := cfg.Database(c.String(flagEnv), name)
		if err != nil {
			return nil, nil, usageError{err}
		}
		out, how = append(out, &d), append(how, "--"+flagDatabase+" "+name)
	}
	if prefix == "" {
		return out, how, nil
	}
	dbs, err := cfg.Databases(c.String(flagEnv))
	if err != nil {
		return nil, nil, usageError{err}
	}
	var have []string
	for _, d := range dbs {
		have = append(have, d.Name())
		if strings.HasPrefix(d.Name(), prefix) || strings.HasPrefix(d.Binding, prefix) {
			out, how = append(out, &d), append(how, "--"+flagDatabasesPrefix+" "+prefix)
		}
	}
	if len(how) == len(names) {
		return nil, nil, usagef("--%s %s names no database of the d1_databases of %s (have: %s)", flagDatabasesPrefix, prefix, cfg.Path, orNone(have))
	}
	return out, how, nil
}

// orNone joins names, or says there is none.
func orNone(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

// localIDs are the local databases the flags name: each --database-id, each
// --database, then those under dir (have) that begin with
// --databases-prefix. A database named twice is refused.
func localIDs(c *cli.Context, dir string, have []string) ([]string, error) {
	if !severalDatabases(c) {
		return []string{localDatabaseID(c)}, nil
	}
	var ids, how []string
	for _, name := range []string{flagDatabaseID, flagDatabase} {
		vals, _ := multiValues(c, name)
		for _, v := range vals {
			ids, how = append(ids, v), append(how, "--"+name+" "+v)
		}
	}
	if prefix := c.String(flagDatabasesPrefix); prefix != "" {
		named := len(ids)
		for _, id := range have {
			if strings.HasPrefix(id, prefix) {
				ids, how = append(ids, id), append(how, "--"+flagDatabasesPrefix+" "+prefix)
			}
		}
		if len(ids) == named {
			return nil, usagef("--%s %s names no database under %s (have: %s)", flagDatabasesPrefix, prefix, dir, orNone(have))
		}
	}
	if err := namedOnce(ids, how); err != nil {
		return nil, err
	}
	return ids, nil
}

// localDatabaseID is the one database --local names: --database-id (or
// --database), else the one the demo and the example API use.
func localDatabaseID(c *cli.Context) string {
	for _, id := range []string{c.String(flagDatabaseID), c.String(flagDatabase)} {
		if id != "" {
			return id
		}
	}
	return d1local.LocalDatabaseID
}
