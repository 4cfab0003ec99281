package cli

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/wrangler"
)

// target is a Cloudflare database and the credentials to reach it.
type target struct {
	accountID, token, databaseID string
	bridgeURL                    string // for d1client.Config.BridgeURL; see bridgeURL
	where                        string
	wrangler                     *wrangler.Database
}

// Format implements fmt.Formatter: whatever the verb, a target prints as
// the database it names and where it was found, never with its token or
// the bridge URL's secret.
func (t target) Format(f fmt.State, _ rune) {
	fmt.Fprintf(f, "target{account %s, %s}", t.accountID, t.where)
}

// bridgeURL returns the bridge URL of the connection flags, for
// d1client.Config.BridgeURL, and whether a bridge is to be used at all.
// --bridge-url is returned as given; $D1IDEM_BRIDGE_URL is left to d1client
// to read (the URL is then ""), which refuses it beside a base-URL
// variable. A --base-url on the command line wins over the variable, as
// flags win over the environment; with --bridge-url it is a usage error.
func bridgeURL(c *cli.Context) (url string, bridge bool, err error) {
	u, given := onCommandLine(c, flagBridgeURL, d1client.BridgeURLEnv)
	if u == "" {
		return "", false, nil
	}
	fromEnv := !given
	switch {
	case c.String(flagBaseURL) == "" && fromEnv:
		return "", true, nil
	case c.String(flagBaseURL) == "":
		return u, true, nil
	case fromEnv:
		return "", false, nil
	}
	return "", false, usagef("--%s and --%s both say where D1 is; pass one (a bridge URL is its base URL with its secret)", flagBridgeURL, flagBaseURL)
}

// cloudflareTargets resolves the databases of --database (each given
// name), --database-id (each ID) and --databases-prefix, in that order, and
// the account and token to reach them (none is needed through a bridge),
// and lists what is missing. One --database and one --database-id name one
// database, whose IDs must agree; otherwise a database named twice is
// refused.
func cloudflareTargets(c *cli.Context, bridge bool) ([]target, error) {
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
	if !severalDatabases(c) && len(ts) == 1 && len(ids) == 1 {
		if ids[0] != ts[0].databaseID {
			return nil, usagef("--database %s is %s in %s, but --database-id says %s", c.String(flagDatabase), ts[0].databaseID, ts[0].wrangler.ConfigPath, ids[0])
		}
		ids = nil
	}
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
	return ts, namedOnce(named, how)
}

// entryTarget returns the database ID of a wrangler config's entry (its
// preview_database_id with --preview) and a description for people.
func entryTarget(c *cli.Context, d *wrangler.Database) (id, where string, err error) {
	if id, err = d.ID(c.Bool(flagPreview)); err != nil {
		return "", "", usagef("%v in %s", err, d.ConfigPath)
	}
	var notes []string
	if d.Env != "" {
		notes = append(notes, "env "+d.Env)
	}
	if c.Bool(flagPreview) {
		notes = append(notes, "preview")
	}
	notes = append(notes, "from "+d.ConfigPath)
	return id, fmt.Sprintf("%s (%s, %s)", d.Name(), id, strings.Join(notes, ", ")), nil
}

// missingSettings lists, as a usage error, what Cloudflare needs and the
// flags lack: the account ID, an API token (token: there is one, or a
// bridge that stands for it) and a database.
func missingSettings(accountID string, token, database bool) error {
	var missing []string
	if accountID == "" {
		missing = append(missing, "the account ID (--account-id or CLOUDFLARE_ACCOUNT_ID)")
	}
	if !token {
		missing = append(missing, "an API token (--api-token or CLOUDFLARE_API_TOKEN)")
	}
	if !database {
		missing = append(missing, "the database (--database-id, D1_DATABASE_ID, or --database NAME with a wrangler config)")
	}
	if len(missing) > 0 {
		return usagef("cannot reach D1: missing %s; or pass --local DIR to use the embedded d1local", strings.Join(missing, ", "))
	}
	return nil
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

// noEnvDatabaseID refuses D1_DATABASE_ID beside a command line that names
// several databases: it would add a database nobody named there.
func noEnvDatabaseID(c *cli.Context) error {
	if ids, env := multiValues(c, flagDatabaseID); env && len(ids) > 0 {
		return usagef("D1_DATABASE_ID is set (%s) while the command line names several databases: unset it, or pass it as --%s too", strings.Join(ids, ","), flagDatabaseID)
	}
	return nil
}

// envWithoutDatabase reports, as a usage error, --env or --preview given on
// the command line without --database, which they would not affect.
// CLOUDFLARE_ENV alone is not an error: wrangler users may set it for every
// command.
func envWithoutDatabase(c *cli.Context) error {
	if c.String(flagDatabase) != "" || c.String(flagDatabasesPrefix) != "" {
		return nil
	}
	if _, given := onCommandLine(c, flagEnv, wrangler.EnvVar); given {
		return usagef("--%s selects a wrangler environment for --%s; pass --%s NAME too", flagEnv, flagDatabase, flagDatabase)
	}
	if c.Bool(flagPreview) {
		return usagef("--%s takes the preview_database_id of --%s; pass --%s NAME too", flagPreview, flagDatabase, flagDatabase)
	}
	return nil
}

// localOnly refuses, beside --local, a flag of the command line that would
// choose a Cloudflare database and be ignored. Their environment variables
// are ignored without a word: a shell set up for Cloudflare can use --local.
// No value is shown: the token and the bridge URL are secrets.
func localOnly(c *cli.Context) error {
	for _, f := range []struct{ name, env string }{
		{flagAccountID, envAccountID},
		{flagAPIToken, envAPIToken},
		{flagBridgeURL, d1client.BridgeURLEnv},
		{flagBaseURL, ""},
		{flagConfig, ""},
	} {
		if _, given := onCommandLine(c, f.name, f.env); given {
			return usagef("--%s has no use with --%s: d1local needs no Cloudflare account, API or wrangler config; leave one of them out", f.name, flagLocal)
		}
	}
	return nil
}

// loadWrangler reads the wrangler config: --config, or the file wrangler
// would use from the current directory.
func loadWrangler(c *cli.Context) (*wrangler.Config, error) { return loadWranglerFor(c, flagDatabase) }

// loadWranglerFor is loadWrangler for the flag that needs the config.
func loadWranglerFor(c *cli.Context, flagName string) (*wrangler.Config, error) {
	path := c.String(flagConfig)
	if path == "" {
		var err error
		if path, err = wrangler.Find("."); errors.Is(err, wrangler.ErrNoConfig) {
			return nil, usagef("--%s needs a wrangler config: there is %v; pass --%s FILE", flagName, err, flagConfig)
		} else if err != nil {
			return nil, err
		}
		path = relPath(path)
	}
	return wrangler.Load(path)
}

// relPath returns p relative to the current directory when it is inside
// it, for messages.
func relPath(p string) string {
	wd, err := os.Getwd()
	if err != nil {
		return p
	}
	if r, err := filepath.Rel(wd, p); err == nil && !strings.HasPrefix(r, "..") {
		return r
	}
	return p
}
