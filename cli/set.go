package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1client/budget"
	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/internal/human"
	"github.com/d1idem/d1idem/internal/textsafe"
	"github.com/d1idem/d1idem/wrangler"
)

// access says whether a command may create the database it names.
type access int

const (
	existing access = iota // it must exist: every command but schema apply
	create                 // schema apply: see schema.Options.CreateLocal
)

// dbSet is the databases the connection flags name, open, in their order:
// one is a set of one.
type dbSet struct {
	conns []*conn
	local *d1local.Listening // the embedded d1local serving a --local set
	dir   string             // --local's directory
}

// conn is one open database of a set.
type conn struct {
	db         *d1client.Client
	databaseID string             // D1's UUID, or the local database's name
	where      string             // the database for people, without secrets
	wrangler   *wrangler.Database // the wrangler config's entry, when --database chose it
	set        *dbSet
}

func (s *dbSet) close() {
	if s.local != nil {
		_ = s.local.Close()
	}
}

// one reports whether the set is one database: no row per database then.
func (s *dbSet) one() bool { return len(s.conns) == 1 }

// withSet runs fn on the databases the flags name. On a set of one, a
// missing database or ledger table in fn's error is named (conn.named).
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

// openSet connects to the databases the flags name: the embedded d1local's
// with --local, Cloudflare's otherwise, never falling back silently. The
// clients of a set share one budget.Account, adjusted by mods (--max-calls);
// o's clientMods apply to Cloudflare clients only. Close it when done.
func (o *options) openSet(c *cli.Context, acc access, mods ...func(*d1client.Config)) (*dbSet, error) {
	if err := checkConnFlags(c); err != nil {
		return nil, err
	}
	if dir := c.String(flagLocal); dir != "" {
		return openLocalSet(c, dir, acc, mods)
	}
	return o.openCloudflareSet(c, mods)
}

// openCloudflareSet connects to databases of one account, directly or through a bridge.
func (o *options) openCloudflareSet(c *cli.Context, mods []func(*d1client.Config)) (*dbSet, error) {
	bridgeURL, bridge, err := bridgeURL(c)
	if err != nil {
		return nil, err
	}
	ts, err := cloudflareTargets(c)
	if err != nil {
		return nil, err
	}
	accountID, token := c.String(flagAccountID), c.String(flagAPIToken)
	for _, t := range ts {
		if accountID == "" && t.wrangler != nil {
			accountID = t.wrangler.AccountID
		}
	}
	if err := missingSettings(accountID, token != "" || bridge, len(ts) > 0); err != nil {
		return nil, err
	}
	limit := budget.Budget{} // Cloudflare's API limit
	if bridge {
		limit = budget.Unlimited()
	}
	mods = append(slices.Clone(mods), o.clientMods...)
	share, err := sharedAccount(limit, mods)
	if err != nil {
		return nil, err
	}
	s := &dbSet{}
	for _, t := range ts {
		cfg := d1client.Config{BaseURL: c.String(flagBaseURL), BridgeURL: bridgeURL, APIToken: token, AccountID: accountID, DatabaseID: t.databaseID}
		for _, m := range append(mods, share) {
			m(&cfg)
		}
		if t.db, err = d1client.New(cfg); err != nil {
			return nil, clientError(err)
		}
		if t.db.Bridge() {
			t.where += " through the bridge at " + strings.TrimSuffix(t.db.BaseURL(), "/")
		}
		t.set, s.conns = s, append(s.conns, t)
	}
	return s, nil
}

// sharedAccount returns the adjustment that gives every client of a set
// one Account, of the budget that mods make of base.
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

// clientError is an error of d1client.New: a setting it refuses is the caller's to fix.
func clientError(err error) error {
	var de *d1client.Error
	if errors.As(err, &de) {
		// The library's field names are the CLI's flags here.
		msg := strings.NewReplacer("Config.BridgeURL", "--"+flagBridgeURL, "Config.BaseURL", "--"+flagBaseURL).Replace(de.Message)
		return usagef("cannot reach D1: %s", msg)
	}
	return err
}

// openLocalSet starts the embedded d1local on dir with the databases the
// flags name. Unless acc is create, the directory and databases must exist.
func openLocalSet(c *cli.Context, dir string, acc access, mods []func(*d1client.Config)) (*dbSet, error) {
	if err := localOnly(c); err != nil {
		return nil, err
	}
	if acc == create {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("--local %s: %w", dir, err)
		}
	} else if _, err := os.Stat(dir); err != nil {
		return nil, &noDirectoryError{dir: dir, apply: "d1idem schema apply" + connHint(c)}
	}
	srv, err := d1local.Listen(d1local.Config{Dir: dir, NoAutoCreate: true}, "")
	if err != nil {
		return nil, err
	}
	s := &dbSet{local: srv, dir: dir}
	if err := s.addLocal(c, acc, mods); err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

// localClient is a client of the embedded d1local's database id, with no API budget.
func localClient(l *d1local.Listening, id string, mods ...func(*d1client.Config)) (*d1client.Client, error) {
	cfg := d1client.Config{BaseURL: l.URL, AccountID: d1local.DefaultAccountID, DatabaseID: id, Budget: budget.Unlimited()}
	for _, m := range mods {
		m(&cfg)
	}
	return d1client.New(cfg)
}

// addLocal opens a client on each local database the flags name.
func (s *dbSet) addLocal(c *cli.Context, acc access, mods []func(*d1client.Config)) error {
	have, err := s.local.D1.Databases()
	if err != nil {
		return err
	}
	ids, err := localIDs(c, s.dir, have)
	if err != nil {
		return err
	}
	share, err := sharedAccount(budget.Unlimited(), mods)
	if err != nil {
		return err
	}
	for _, id := range ids {
		if acc != create && !slices.Contains(have, id) {
			return &noDatabaseError{id: id, where: "under " + s.dir, have: slices.Clone(have)}
		}
		db, err := localClient(s.local, id, append(slices.Clone(mods), share)...)
		if err != nil {
			return clientError(err)
		}
		s.conns = append(s.conns, &conn{db: db, databaseID: id, where: fmt.Sprintf("local database %q under %s", id, s.dir), set: s})
	}
	return nil
}

// cloudflareTargets are the databases of --database, --databases-prefix
// and --database-id, in that order, not yet open.
func cloudflareTargets(c *cli.Context) ([]*conn, error) {
	entries, how, err := wranglerEntries(c)
	if err != nil {
		return nil, err
	}
	var ts []*conn
	for _, d := range entries {
		id, where, err := entryTarget(c, d)
		if err != nil {
			return nil, err
		}
		ts = append(ts, &conn{databaseID: id, where: where, wrangler: d})
	}
	ids, _ := multiValues(c, flagDatabaseID)
	if !severalDatabases(c) && len(ts) == 1 && len(ids) == 1 {
		if ids[0] != ts[0].databaseID {
			return nil, usagef("--database %s is %s in %s, but --database-id says %s", c.String(flagDatabase), ts[0].databaseID, ts[0].wrangler.ConfigPath, ids[0])
		}
		ids = nil
	}
	for _, id := range ids {
		ts = append(ts, &conn{databaseID: id, where: "database " + id})
		how = append(how, "--"+flagDatabaseID+" "+id)
	}
	named := make([]string, len(ts))
	for i, t := range ts {
		named[i] = t.databaseID
	}
	return ts, namedOnce(named, how)
}

// entryTarget returns the database ID of a wrangler config's entry (with
// --preview, its preview_database_id) and a description for people.
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

// wranglerEntries returns the wrangler config's entries --database and
// --databases-prefix name, and the flag that named each.
func wranglerEntries(c *cli.Context) ([]*wrangler.Database, []string, error) {
	names, _ := multiValues(c, flagDatabase)
	prefix := c.String(flagDatabasesPrefix)
	if len(names) == 0 && prefix == "" {
		return nil, nil, nil
	}
	cfg, err := loadWrangler(c, pick(len(names) > 0, flagDatabase, flagDatabasesPrefix))
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
	dbs, err := cfg.WithPrefix(c.String(flagEnv), prefix)
	if err != nil {
		return nil, nil, usagef("--%s %s: %v", flagDatabasesPrefix, prefix, err)
	}
	for _, d := range dbs {
		out, how = append(out, &d), append(how, "--"+flagDatabasesPrefix+" "+prefix)
	}
	return out, how, nil
}

// localIDs are the local databases the flags name: each --database-id, each
// --database, then those of have beginning with --databases-prefix; for one,
// the demo's when none is named.
func localIDs(c *cli.Context, dir string, have []string) ([]string, error) {
	if !severalDatabases(c) {
		for _, id := range []string{c.String(flagDatabaseID), c.String(flagDatabase)} {
			if id != "" {
				return []string{id}, nil
			}
		}
		return []string{d1local.LocalDatabaseID}, nil
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
	return ids, namedOnce(ids, how)
}

// namedOnce refuses a set of database IDs that names one twice (a slip for
// another, most likely); how says how the flags named each.
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

// missingSettings lists, as a usage error, what Cloudflare needs and the flags lack.
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

// orNone joins names, or says there is none.
func orNone(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

// loadWrangler reads --config, or the wrangler config wrangler would use here.
func loadWrangler(c *cli.Context, flagName string) (*wrangler.Config, error) {
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

// relPath is p relative to the current directory when inside it.
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

// ledger is the ledger on the set, with the CLI's clock: idem.New's on one
// database unless sharded (the ring commands), else idem.NewSharded's.
func (o *options) ledger(s *dbSet, cfg idem.Config, sharded bool) (*idem.Ledger, error) {
	cfg.Clock = o.now
	// The ledger logs the rings it adopts; the commands say what matters.
	cfg.Logger = slog.New(slog.DiscardHandler)
	if s.one() && !sharded {
		l, err := idem.New(s.conns[0].db, cfg)
		return l, configUsage(err)
	}
	homes := make([]idem.Home, len(s.conns))
	for i, cn := range s.conns {
		homes[i] = idem.Home{DB: cn.db}
	}
	l, err := idem.NewSharded(homes, cfg)
	return l, configUsage(err)
}

// label names a database for people: its wrangler name, or its ID.
func (cn *conn) label() string {
	if cn.wrangler != nil {
		return cn.wrangler.Name()
	}
	return cn.databaseID
}

// label names the database with this ID (one not in the set as a ledger value).
func (s *dbSet) label(id string) string {
	if cn := s.byID(id); cn != nil {
		return cn.label()
	}
	return textsafe.Display(id)
}

// labels names the databases with these IDs, comma-separated.
func (s *dbSet) labels(ids []string) string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = s.label(id)
	}
	return strings.Join(out, ", ")
}

// where describes the set: "3 databases (a, b, c)".
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

// inOrder returns items (each of the database id names) in the flags' order.
func inOrder[T any](s *dbSet, items []T, id func(T) string) []T {
	out := make([]T, 0, len(items))
	for _, cn := range s.conns {
		for _, it := range items {
			if id(it) == cn.databaseID {
				out = append(out, it)
			}
		}
	}
	return out
}

// ids are the set's database IDs.
func (s *dbSet) ids() []string {
	out := make([]string, len(s.conns))
	for i, cn := range s.conns {
		out[i] = cn.databaseID
	}
	return out
}

// couldNotRead is cmd's error for the databases whose read failed (errOf
// their IDs), each "label: cause"; nil for none.
func (s *dbSet) couldNotRead(c *cli.Context, cmd string, errOf func(id string) error) error {
	var bad []string
	for _, cn := range s.conns {
		if err := errOf(cn.databaseID); err != nil {
			bad = append(bad, cn.label()+": "+describe(cn.named(c, err)))
		}
	}
	if len(bad) == 0 {
		return nil
	}
	return fmt.Errorf("%s: %s could not be read: %s", cmd, human.Plural(int64(len(bad)), "database", "databases"), strings.Join(bad, "; "))
}

// named turns D1's "no such database" in err into one naming the database
// (see missing), and gives a missing ledger table the schema apply these
// flags need.
func (cn *conn) named(c *cli.Context, err error) error {
	switch {
	case errors.Is(err, d1client.ErrNoDatabase):
		return cn.missing(c.Context, err)
	case missingTable(err):
		return hintedError{err, applyHint(connHint(c))}
	}
	return err
}

// missing turns D1's "no such database" into an error naming the database
// and those there are, keeping the command's prefix ("stats: ").
func (cn *conn) missing(ctx context.Context, err error) error {
	nd := &noDatabaseError{id: cn.databaseID, cause: err}
	switch {
	case cn.set.local != nil:
		nd.where = "under " + cn.set.dir
	case cn.wrangler != nil:
		nd.where = "(--database " + cn.wrangler.Name() + " of " + cn.wrangler.ConfigPath + ")"
	}
	if have, lerr := listNames(ctx, cn.db); lerr != nil {
		nd.listErr = describe(lerr)
	} else {
		nd.have = have
	}
	var de *d1client.Error
	if errors.As(err, &de) && strings.HasSuffix(err.Error(), de.Error()) {
		return fmt.Errorf("%s%w", strings.TrimSuffix(err.Error(), de.Error()), nd)
	}
	return nd
}

// maxListed bounds the databases a missing-database error names.
const maxListed = 50

// listNames lists the account's databases (on d1local, those under its
// directory), as d1client.Database shows them; never nil without an error.
func listNames(ctx context.Context, db *d1client.Client) ([]string, error) {
	dbs, err := db.ListDatabases(ctx, maxListed)
	out := make([]string, len(dbs))
	for i, d := range dbs {
		out[i] = d.String()
	}
	return out, err
}

// noDirectoryError is a missing --local directory; apply is the command that makes it.
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
