package cli

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/internal/embedded"
	"github.com/d1idem/d1idem/internal/wrangler"
)

// Connection flag names.
const (
	flagAccountID  = "account-id"
	flagAPIToken   = "api-token"
	flagDatabaseID = "database-id"
	flagDatabase   = "database"
	flagConfig     = "config"
	flagEnv        = "env"
	flagPreview    = "preview"
	flagBaseURL    = "base-url"
	flagLocal      = "local"
	flagJSON       = "json"
)

// connFlags are the flags of every command that talks to D1. They are the
// flags and environment variables wrangler users already know.
func connFlags() []cli.Flag {
	return append([]cli.Flag{
		&cli.StringFlag{Name: flagAccountID, Usage: "Cloudflare account `ID`", EnvVars: []string{"CLOUDFLARE_ACCOUNT_ID"}, Category: "Connection:"},
		&cli.StringFlag{Name: flagAPIToken, Usage: "API `TOKEN` with D1 edit permission (never printed)", EnvVars: []string{"CLOUDFLARE_API_TOKEN"}, Category: "Connection:"},
		&cli.StringFlag{Name: flagDatabaseID, Usage: "D1 database `ID` (a UUID)", EnvVars: []string{"D1_DATABASE_ID"}, Category: "Connection:"},
	}, append(wranglerFlags(),
		&cli.BoolFlag{Name: flagPreview, Usage: "with --database, use its preview_database_id", DisableDefaultText: true, Category: "Connection:"},
		&cli.StringFlag{Name: flagBaseURL, Usage: "Cloudflare API base `URL` (default: https://api.cloudflare.com/client/v4/)", EnvVars: []string{d1client.BaseURLEnv}, Category: "Connection:"},
		&cli.StringFlag{Name: flagLocal, Usage: "use the embedded d1local with its databases under `DIR` instead of Cloudflare", Category: "Connection:"},
	)...)
}

// wranglerFlags choose a database of a wrangler config.
func wranglerFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: flagDatabase, Usage: "D1 database `NAME` (or binding) from the d1_databases of the wrangler config", Category: "Connection:"},
		&cli.StringFlag{Name: flagConfig, Usage: "wrangler config `FILE` (default: the one wrangler uses: wrangler.json, wrangler.jsonc or wrangler.toml here or in a parent directory)", Category: "Connection:"},
		&cli.StringFlag{Name: flagEnv, Usage: "wrangler environment `NAME` ([env.NAME] of the config) to take --database from", EnvVars: []string{wrangler.EnvVar}, Category: "Connection:"},
	}
}

func jsonFlag() cli.Flag {
	return &cli.BoolFlag{Name: flagJSON, Usage: "print JSON with stable field names, for scripts", DisableDefaultText: true}
}

// conn is an open connection to one D1 database.
type conn struct {
	db *d1client.Client
	// where describes the target for people, without secrets.
	where string
	// databaseID is the Cloudflare database ID ("" with --local).
	databaseID string
	// wrangler is the wrangler config's entry for the database, when
	// --database chose it.
	wrangler *wrangler.Database
	local    *embedded.Server
}

func (c *conn) close() {
	if c.local != nil {
		_ = c.local.Close()
	}
}

// loadWrangler reads the wrangler config: --config, or the file wrangler
// would use from the current directory.
func loadWrangler(c *cli.Context) (*wrangler.Config, error) {
	path := c.String(flagConfig)
	if path == "" {
		var err error
		if path, err = wrangler.Find("."); errors.Is(err, wrangler.ErrNoConfig) {
			return nil, usagef("--%s needs a wrangler config: there is %v; pass --%s FILE", flagDatabase, err, flagConfig)
		} else if err != nil {
			return nil, err
		}
		path = relPath(path)
	}
	return wrangler.Load(path)
}

// wranglerDatabase returns the database --database names in the wrangler
// config, in the environment --env names.
func wranglerDatabase(c *cli.Context) (*wrangler.Database, error) {
	cfg, err := loadWrangler(c)
	if err != nil {
		return nil, err
	}
	d, err := cfg.Database(c.String(flagEnv), c.String(flagDatabase))
	if err != nil {
		return nil, usageError{err}
	}
	return &d, nil
}

// envWithoutDatabase reports, as a usage error, --env or --preview given on
// the command line without --database, which they would not affect.
// CLOUDFLARE_ENV alone is not an error: wrangler users may set it for every
// command.
func envWithoutDatabase(c *cli.Context) error {
	if c.String(flagDatabase) != "" {
		return nil
	}
	if env := c.String(flagEnv); env != "" && env != os.Getenv(wrangler.EnvVar) {
		return usagef("--%s selects a wrangler environment for --%s; pass --%s NAME too", flagEnv, flagDatabase, flagDatabase)
	}
	if c.Bool(flagPreview) {
		return usagef("--%s takes the preview_database_id of --%s; pass --%s NAME too", flagPreview, flagDatabase, flagDatabase)
	}
	return nil
}

// wranglerTarget resolves --database (with --config, --env and --preview)
// to its wrangler config entry, its database ID and a description for
// people. databaseID, from --database-id, must agree when set.
func wranglerTarget(c *cli.Context, databaseID string) (d *wrangler.Database, id, where string, err error) {
	if d, err = wranglerDatabase(c); err != nil {
		return nil, "", "", err
	}
	if id, err = d.ID(c.Bool(flagPreview)); err != nil {
		return nil, "", "", usagef("%v in %s", err, d.ConfigPath)
	}
	if databaseID != "" && databaseID != id {
		return nil, "", "", usagef("--database %s is %s in %s, but --database-id says %s", c.String(flagDatabase), id, d.ConfigPath, databaseID)
	}
	var notes []string
	if d.Env != "" {
		notes = append(notes, "env "+d.Env)
	}
	if c.Bool(flagPreview) {
		notes = append(notes, "preview")
	}
	notes = append(notes, "from "+d.ConfigPath)
	return d, id, fmt.Sprintf("%s (%s, %s)", d.Name(), id, strings.Join(notes, ", ")), nil
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

// openConn connects to the database the flags name: the embedded d1local
// with --local, Cloudflare otherwise. It never falls back silently: missing
// settings are listed in the error. mods adjust the client's configuration
// (a request budget, say); o's clientMods apply to Cloudflare clients only.
func openConn(c *cli.Context, o *options, mods ...func(*d1client.Config)) (*conn, error) {
	if dir := c.String(flagLocal); dir != "" {
		return openLocal(c, dir, mods...)
	}
	if err := envWithoutDatabase(c); err != nil {
		return nil, err
	}
	accountID, token, databaseID := c.String(flagAccountID), c.String(flagAPIToken), c.String(flagDatabaseID)
	var wdb *wrangler.Database
	where := ""
	if c.String(flagDatabase) != "" {
		var err error
		if wdb, databaseID, where, err = wranglerTarget(c, databaseID); err != nil {
			return nil, err
		}
		if accountID == "" {
			accountID = wdb.AccountID
		}
	}
	var missing []string
	if accountID == "" {
		missing = append(missing, "the account ID (--account-id or CLOUDFLARE_ACCOUNT_ID)")
	}
	if token == "" {
		missing = append(missing, "an API token (--api-token or CLOUDFLARE_API_TOKEN)")
	}
	if databaseID == "" {
		missing = append(missing, "the database (--database-id, D1_DATABASE_ID, or --database NAME with a wrangler config)")
	}
	if len(missing) > 0 {
		return nil, usagef("cannot reach D1: missing %s; or pass --local DIR to use the embedded d1local", strings.Join(missing, ", "))
	}
	cfg := d1client.Config{
		BaseURL:    c.String(flagBaseURL),
		APIToken:   token,
		AccountID:  accountID,
		DatabaseID: databaseID,
		// No logger: retries and rate-limit blocks reach the operator in
		// the one error line of a failed call (see describe), not as log
		// lines around it.
	}
	for _, m := range mods {
		m(&cfg)
	}
	for _, m := range o.clientMods {
		m(&cfg)
	}
	db, err := d1client.New(cfg)
	if err != nil {
		return nil, err
	}
	if where == "" {
		where = "database " + databaseID
	}
	return &conn{db: db, where: where, databaseID: databaseID, wrangler: wdb}, nil
}

func openLocal(c *cli.Context, dir string, mods ...func(*d1client.Config)) (*conn, error) {
	if err := envWithoutDatabase(c); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("--local %s: %w", dir, err)
	}
	srv, err := embedded.Start(d1local.Config{Dir: dir}, "")
	if err != nil {
		return nil, err
	}
	id := c.String(flagDatabaseID)
	if id == "" {
		id = c.String(flagDatabase)
	}
	if id == "" {
		id = embedded.DatabaseID
	}
	db, err := srv.Client(id, mods...)
	if err != nil {
		_ = srv.Close()
		return nil, err
	}
	return &conn{db: db, where: fmt.Sprintf("local database %q under %s", id, dir), local: srv}, nil
}

// connHint repeats the flags that chose a database without credentials
// (--local, --database, --config), for the commands a hint suggests; it
// never includes the API token.
func connHint(c *cli.Context) string {
	var b strings.Builder
	for _, name := range []string{flagLocal, flagDatabase, flagConfig, flagEnv} {
		if c.IsSet(name) && c.String(name) != "" {
			b.WriteString(" --" + name + " " + shellQuote(c.String(name)))
		}
	}
	if c.String(flagLocal) != "" && c.IsSet(flagDatabaseID) {
		b.WriteString(" --" + flagDatabaseID + " " + shellQuote(c.String(flagDatabaseID)))
	}
	return b.String()
}
