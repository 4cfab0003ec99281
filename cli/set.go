package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/d1idem/d1idem/cli/internal/embedded"
	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1client/budget"
	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/wrangler"
)

// access says whether a command may create the database it names.
type access int

const (
	// existing: the database must exist; nothing is created (every command
	// but schema apply).
	existing access = iota
	// create: the database, and with --local its directory, are created if
	// needed (schema apply): locally, or on a d1local server, never on D1
	// (see conn.create).
	create
)

// conn is one open database of a set.
type conn struct {
	db *d1client.Client
	// where describes the database for people, without secrets.
	where string
	// databaseID is the database's ID: the Cloudflare UUID, or the d1local
	// database under --local.
	databaseID string
	// wrangler is the wrangler config's entry for the database, when
	// --database chose it.
	wrangler *wrangler.Database
	// scope says where a missing database was looked for ("under DIR"),
	// and list lists the databases there are, for the error.
	scope string
	list  func(context.Context) ([]string, error)
	// create, called once the database turned out to be missing, creates
	// it where that is the CLI's to do (under --local with access create,
	// or on a d1local server) and says what it created ("" for nothing).
	// nil where nothing may be created: D1 gives a database its UUID when
	// wrangler or the dashboard creates it.
	create func(context.Context) (string, error)
}

// dbSet is the databases the connection flags name, open, in the order the
// flags name them: one, or the several of a ledger across databases. A
// command works on a set; one database is a set of one.
type dbSet struct {
	conns []*conn
	// local is the embedded d1local serving a --local set.
	local *embedded.Server
}

func (s *dbSet) close() {
	if s.local != nil {
		_ = s.local.Close()
	}
}

// one reports whether the set is one database: its commands then print
// what they always have, without a row per database.
func (s *dbSet) one() bool { return len(s.conns) == 1 }

// withSet opens the databases the flags name, runs fn, and closes them. On
// a set of one, a missing database or ledger table in fn's error is named
// (see conn.named); on several, fn names each.
func (o *options) withSet(c *cli.Context, acc access, fn func(*dbSet) error, mods ...func(*d1client.Config)) error {
	s, err := o.openSet(c, acc, mods...)
	if err != nil {
		return err
	}
	defer s.close()
	if s.one() {
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

// openSet connects to the databases the flags name: the embedded d1local's
// with --local, Cloudflare's otherwise. It never falls back silently:
// missing settings are listed in the error. All the clients of a set share
// one budget.Account (the account's API budget, with the adjustments of
// mods: --max-calls's); o's clientMods apply to Cloudflare clients only.
func (o *options) openSet(c *cli.Context, acc access, mods ...func(*d1client.Config)) (*dbSet, error) {
	if err := envWithoutDatabase(c); err != nil {
		return nil, err
	}
	if severalDatabases(c) {
		if err := noEnvDatabaseID(c); err != nil {
			return nil, err
		}
	}
	if dir := c.String(flagLocal); dir != "" {
		if err := localOnly(c); err != nil {
			return nil, err
		}
		return openLocalSet(c, dir, acc, mods...)
	}
	return o.openCloudflareSet(c, mods...)
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

// openCloudflareSet connects to Cloudflare databases of one account,
// directly or all through one bridge (--bridge-url or $D1IDEM_BRIDGE_URL):
// the bridge serves each database it binds under its ID, as the REST API
// does, and is not metered by the API budget.
func (o *options) openCloudflareSet(c *cli.Context, mods ...func(*d1client.Config)) (*dbSet, error) {
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

// cloudflareConn makes the client of cfg for the target t.
func cloudflareConn(cfg d1client.Config, t target) (*conn, error) {
	db, err := d1client.New(cfg)
	if err != nil {
		return nil, clientError(err)
	}
	cn := &conn{db: db, where: t.where, databaseID: t.databaseID, wrangler: t.wrangler}
	if t.wrangler != nil {
		cn.scope = "(--database " + t.wrangler.Name() + " of " + t.wrangler.ConfigPath + ")"
	}
	cn.list = func(ctx context.Context) ([]string, error) { return listNames(ctx, db) }
	cn.create = func(ctx context.Context) (string, error) {
		if created, err := db.CreateLocalDatabase(ctx); !created || err != nil {
			return "", err
		}
		return fmt.Sprintf("database %q on the d1local at %s", db.DatabaseID(), db.BaseURL()), nil
	}
	if db.Bridge() {
		cn.create = nil
		cn.where += " through the bridge at " + strings.TrimSuffix(db.BaseURL(), "/")
	}
	return cn, nil
}

// maxListed bounds the databases a missing-database error names.
const maxListed = 50

// listNames lists the account's databases for people: "name (uuid)", or
// the name where it is the ID (on d1local).
func listNames(ctx context.Context, db *d1client.Client) ([]string, error) {
	dbs, err := db.ListDatabases(ctx, maxListed)
	if err != nil {
		return nil, err
	}
	out := make([]string, len(dbs))
	for i, d := range dbs {
		out[i] = d.Name
		if d.UUID != d.Name && d.UUID != "" {
			out[i] += " (" + d.UUID + ")"
		}
	}
	return out, nil
}

// openLocalSet starts the embedded d1local on dir with the databases
// --database-id, --database and --databases-prefix name (the demo's when
// none). Unless acc is create, it creates nothing: the directory and the
// databases must exist.
func openLocalSet(c *cli.Context, dir string, acc access, mods ...func(*d1client.Config)) (*dbSet, error) {
	if acc == create {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("--local %s: %w", dir, err)
		}
	} else if _, err := os.Stat(dir); err != nil {
		return nil, &noDirectoryError{dir: dir, apply: "d1idem schema apply" + connHint(c)}
	}
	srv, err := embedded.Start(d1local.Config{Dir: dir, NoAutoCreate: true}, "")
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
			list: func(context.Context) ([]string, error) { return s.local.D1.Databases() }, create: s.localCreate(dir, id, acc)})
	}
	return nil
}

// localCreate is a conn's create for the local database id under dir, with
// access acc: nil unless acc is create.
func (s *dbSet) localCreate(dir, id string, acc access) func(context.Context) (string, error) {
	if acc != create {
		return nil
	}
	return func(context.Context) (string, error) {
		if err := s.local.D1.CreateDatabase(id); err != nil {
			return "", err
		}
		return fmt.Sprintf("database %q under %s", id, dir), nil
	}
}

// ledger is the ledger on the set, with the CLI's clock (D1's own unless a
// test injects one): idem.New's on one database, unless sharded says a
// ledger across databases even on one (the ring commands); else
// idem.NewSharded's, each database under its ID (the ID idem.Home gives it
// by default, as the application's ledger does). The ledger, not the CLI,
// owns every statement, clock expression and status.
func (o *options) ledger(s *dbSet, cfg idem.Config, sharded bool) (*idem.Ledger, error) {
	cfg.Clock = o.now
	// The ledger logs the rings it adopts; the commands say what matters.
	cfg.Logger = slog.New(slog.DiscardHandler)
	var l *idem.Ledger
	var err error
	if s.one() && !sharded {
		l, err = idem.New(s.conns[0].db, cfg)
	} else {
		homes := make([]idem.Home, len(s.conns))
		for i, cn := range s.conns {
			homes[i] = idem.Home{DB: cn.db}
		}
		l, err = idem.NewSharded(homes, cfg)
	}
	return l, configUsage(err)
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
	if s.one() {
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

// byID is the set's database with this ID; nil when there is none.
func (s *dbSet) byID(id string) *conn {
	for _, cn := range s.conns {
		if cn.databaseID == id {
			return cn
		}
	}
	return nil
}

// named is the set's database with this label or ID; nil when none.
func (s *dbSet) named(name string) *conn {
	for _, cn := range s.conns {
		if cn.label() == name || cn.databaseID == name {
			return cn
		}
	}
	return nil
}

// ids are the set's database IDs.
func (s *dbSet) ids() []string {
	out := make([]string, len(s.conns))
	for i, cn := range s.conns {
		out[i] = cn.databaseID
	}
	return out
}

// failed names a database's failure for an error that lists those that
// failed: "label: what happened", with a missing database or ledger table
// named as a set of one names it.
func (s *dbSet) failed(c *cli.Context, id string, err error) string {
	cn := s.byID(id)
	if cn == nil {
		return display(id) + ": " + describe(err)
	}
	return cn.label() + ": " + describe(cn.named(c, err))
}

// noDirectoryError is a --local directory that does not exist; apply is
// the schema apply that would make it, and the database.
type noDirectoryError struct{ dir, apply string }

func (e *noDirectoryError) Error() string {
	return fmt.Sprintf("no directory %s: nothing has kept a database there yet (the demo with --dir, the example API with --local, or '%s' do)",
		e.dir, e.apply)
}

// noDatabaseError is a database that does not exist, with those that do.
type noDatabaseError struct {
	id, where string
	have      []string // nil when they were not listed
	listErr   string   // why they could not be listed
	cause     error
}

func (e *noDatabaseError) Error() string {
	s := fmt.Sprintf("no database %q", e.id)
	if e.where != "" {
		s += " " + e.where
	}
	switch {
	case len(e.have) > 0:
		s += " (have: " + strings.Join(e.have, ", ") + ")"
	case e.have != nil:
		s += " (there is none)"
	case e.listErr != "":
		s += " (the databases could not be listed: " + e.listErr + ")"
	}
	return s
}

func (e *noDatabaseError) Unwrap() error { return e.cause }

// missing turns D1's "no such database" (HTTP 404, code 7404) into an error
// naming the database and listing those there are, when they can be listed.
// It keeps the command's prefix ("stats: ").
func (c *conn) missing(ctx context.Context, err error) error {
	nd := &noDatabaseError{id: c.databaseID, where: c.scope, cause: err}
	have, lerr := c.list(ctx)
	if lerr != nil {
		nd.listErr = describe(lerr)
	} else {
		nd.have = append([]string{}, have...)
	}
	var de *d1client.Error
	if errors.As(err, &de) && strings.HasSuffix(err.Error(), de.Error()) {
		return fmt.Errorf("%s%w", strings.TrimSuffix(err.Error(), de.Error()), nd)
	}
	return nd
}
