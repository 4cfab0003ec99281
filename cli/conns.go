package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/d1idem/d1idem/cli/internal/embedded"
	"github.com/d1idem/d1idem/cli/internal/wrangler"
	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1client/budget"
	"github.com/d1idem/d1idem/idem"
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

// dbSet is the databases the connection flags name, open: one, or the
// several of a sharded ledger, in the order the flags name them.
type dbSet struct {
	conns []*conn
	// local is the embedded d1local serving every database of a --local
	// set of several.
	local *embedded.Server
}

func (s *dbSet) close() {
	for _, cn := range s.conns {
		cn.close()
	}
	if s.local != nil {
		_ = s.local.Close()
	}
}

// label names a database for people: its name in the wrangler config, or
// its ID.
func (c *conn) label() string {
	if c.wrangler != nil {
		return c.wrangler.Name()
	}
	return c.databaseID
}

// label names the database with this ID (a home of the ring) for people;
// an ID that is none of the set's, read from a ring, is shown as display
// shows a ledger value.
func (s *dbSet) label(id string) string {
	if cn := s.byID(id); cn != nil {
		return cn.label()
	}
	return display(id)
}

// labels names the databases with these IDs, comma-separated.
func (s *dbSet) labels(ids []string) string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = s.label(id)
	}
	return strings.Join(out, ", ")
}

// where describes the set for people: "3 databases (a, b, c)".
func (s *dbSet) where() string {
	if len(s.conns) == 1 {
		return s.conns[0].where
	}
	return fmt.Sprintf("%d databases (%s)", len(s.conns), s.labels(s.ids()))
}

// calls is the D1 calls the set's clients have made.
func (s *dbSet) calls() int64 {
	var n int64
	for _, cn := range s.conns {
		n += cn.db.Stats().Calls
	}
	return n
}

// shardedLedger is a sharded ledger whose homes are the set's databases,
// each under its database ID (the ID idem.Home gives a database by
// default, as the application's ledger does), with the CLI's clock.
func shardedLedger(o *options, s *dbSet, cfg idem.Config) (*idem.Ledger, error) {
	homes := make([]idem.Home, len(s.conns))
	for i, cn := range s.conns {
		homes[i] = idem.Home{DB: cn.db}
	}
	cfg.Clock = o.now
	// The ledger logs the rings it adopts; the commands say what matters.
	cfg.Logger = slog.New(slog.DiscardHandler)
	l, err := idem.NewSharded(homes, cfg)
	if err != nil {
		return nil, configUsage(err)
	}
	return l, nil
}

// withDatabases runs one on the database the flags name, as every command
// always has, or many on the several they name (a set that turns out to
// hold one database runs one).
func withDatabases(c *cli.Context, o *options, acc access, one func(*conn) error, many func(*dbSet) error, mods ...func(*d1client.Config)) error {
	if !severalDatabases(c) {
		return withConn(c, o, acc, one, mods...)
	}
	return withSet(c, o, acc, func(s *dbSet) error {
		if len(s.conns) == 1 {
			return one(s.conns[0]) // withSet names a missing database
		}
		return many(s)
	}, mods...)
}

// withSet opens the databases the flags name, runs fn, and closes them.
func withSet(c *cli.Context, o *options, acc access, fn func(*dbSet) error, mods ...func(*d1client.Config)) error {
	s, err := openSet(c, o, acc, mods...)
	if err != nil {
		return err
	}
	defer s.close()
	if len(s.conns) == 1 {
		return s.conns[0].named(c, fn(s))
	}
	return fn(s)
}

// named turns D1's "no such database" in err into an error naming the
// connection's database with those there are, and gives an SQL error the
// schema apply that the connection flags need (see applyHint).
func (cn *conn) named(c *cli.Context, err error) error {
	var de *d1client.Error
	switch {
	case errors.Is(err, d1client.ErrNoDatabase):
		return cn.missing(c.Context, err)
	case errors.As(err, &de) && errors.Is(de, d1client.ErrSQL):
		return applyHint{err: err, command: "d1idem schema apply" + connHint(c)}
	}
	return err
}

// openSet connects to the databases the flags name. All Cloudflare clients
// share one budget.Account (the account's API budget, --max-calls's
// included), and so do all local ones.
func openSet(c *cli.Context, o *options, acc access, mods ...func(*d1client.Config)) (*dbSet, error) {
	if !severalDatabases(c) {
		cn, err := openConn(c, o, acc, mods...)
		if err != nil {
			return nil, err
		}
		return &dbSet{conns: []*conn{cn}}, nil
	}
	if err := envWithoutDatabase(c); err != nil {
		return nil, err
	}
	if err := noEnvDatabaseID(c); err != nil {
		return nil, err
	}
	if dir := c.String(flagLocal); dir != "" {
		if err := localOnly(c); err != nil {
			return nil, err
		}
		return openLocalSet(c, dir, acc, mods...)
	}
	return openCloudflareSet(c, o, mods...)
}

// noEnvDatabaseID refuses D1_DATABASE_ID beside a command line that names
// several databases: it would add a database nobody named there.
func noEnvDatabaseID(c *cli.Context) error {
	if ids, env := multiValues(c, flagDatabaseID); env && len(ids) > 0 {
		return usagef("D1_DATABASE_ID is set (%s) while the command line names several databases: unset it, or pass it as --%s too", strings.Join(ids, ","), flagDatabaseID)
	}
	return nil
}

// sharedAccount returns the Account every client of a set spends, made
// from the budget that mods give a configuration starting with base, and
// the adjustment that gives a client's configuration that Account.
func sharedAccount(base budget.Budget, mods []func(*d1client.Config)) (func(*d1client.Config), error) {
	scratch := d1client.Config{Budget: base}
	for _, m := range mods {
		m(&scratch)
	}
	account, err := budget.NewAccount(scratch.Budget)
	if err != nil {
		return nil, clientError(err)
	}
	return func(cfg *d1client.Config) { cfg.Budget, cfg.Account = budget.Budget{}, account }, nil
}

// clientError is an error of d1client.New: a setting it refuses (two
// base-URL variables that disagree, say) is the caller's to fix.
func clientError(err error) error {
	var de *d1client.Error
	if errors.As(err, &de) {
		// The library's field names are the CLI's flags here.
		msg := strings.NewReplacer("Config.BridgeURL", "--"+flagBridgeURL, "Config.BaseURL", "--"+flagBaseURL).Replace(de.Message)
		return usagef("cannot reach D1: %s", msg)
	}
	return err
}

// openCloudflareSet connects to several Cloudflare databases of one
// account, directly or all through one bridge (--bridge-url or
// $D1IDEM_BRIDGE_URL): the bridge serves each database it binds under its
// ID, as the REST API does, and is not metered by the API budget.
func openCloudflareSet(c *cli.Context, o *options, mods ...func(*d1client.Config)) (*dbSet, error) {
	bridgeURL, bridge, err := bridgeURL(c)
	if err != nil {
		return nil, err
	}
	ts, err := cloudflareTargets(c, bridge)
	if err != nil {
		return nil, err
	}
	all := append(slices.Clone(mods), o.clientMods...)
	limit := budget.Budget{} // Cloudflare's API limit
	if bridge {
		limit = budget.Unlimited()
	}
	share, err := sharedAccount(limit, all)
	if err != nil {
		return nil, err
	}
	s := &dbSet{}
	for _, t := range ts {
		cfg := d1client.Config{BaseURL: c.String(flagBaseURL), BridgeURL: bridgeURL, APIToken: t.token, AccountID: t.accountID, DatabaseID: t.databaseID}
		for _, m := range append(all, share) {
			m(&cfg)
		}
		cn, err := cloudflareConn(cfg, t)
		if err != nil {
			return nil, err
		}
		s.conns = append(s.conns, cn)
	}
	return s, nil
}

// cloudflareTargets resolves the databases of --database (each given
// name), --database-id (each ID) and --databases-prefix, in that order, and
// the account and token to reach them (none is needed through a bridge).
// A database named twice is refused.
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

// openLocalSet starts the embedded d1local on dir with the databases
// --database-id, --database and --databases-prefix name. Unless acc is
// create, it creates nothing: the directory and the databases must exist.
func openLocalSet(c *cli.Context, dir string, acc access, mods ...func(*d1client.Config)) (*dbSet, error) {
	srv, err := startLocal(c, dir, acc)
	if err != nil {
		return nil, err
	}
	s := &dbSet{local: srv}
	if err := s.addLocal(c, dir, acc, mods); err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

// addLocal opens a client on each local database the flags name.
func (s *dbSet) addLocal(c *cli.Context, dir string, acc access, mods []func(*d1client.Config)) error {
	have, err := s.local.D1.Databases()
	if err != nil {
		return err
	}
	ids, err := localIDs(c, dir, have)
	if err != nil {
		return err
	}
	share, err := sharedAccount(budget.Unlimited(), mods)
	if err != nil {
		return err
	}
	for _, id := range ids {
		if acc != create && !slices.Contains(have, id) {
			return &noDatabaseError{id: id, where: "under " + dir, have: slices.Clone(have)}
		}
		db, err := s.local.Client(id, append(slices.Clone(mods), share)...)
		if err != nil {
			return clientError(err)
		}
		s.conns = append(s.conns, &conn{db: db, where: fmt.Sprintf("local database %q under %s", id, dir), databaseID: id, scope: "under " + dir,
			list: func(context.Context) ([]string, error) { return s.local.D1.Databases() }, create: localCreate(s.local, dir, id, acc)})
	}
	return nil
}

// localIDs are the local databases the flags name: each --database-id, each
// --database, then those under dir (have) that begin with
// --databases-prefix. A database named twice is refused.
func localIDs(c *cli.Context, dir string, have []string) ([]string, error) {
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
