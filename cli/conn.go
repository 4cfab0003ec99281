package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/BurntSushi/toml"
	"github.com/tailscale/hujson"
	"github.com/urfave/cli/v2"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/internal/embedded"
)

// Connection flag names.
const (
	flagAccountID  = "account-id"
	flagAPIToken   = "api-token"
	flagDatabaseID = "database-id"
	flagDatabase   = "database"
	flagConfig     = "config"
	flagBaseURL    = "base-url"
	flagLocal      = "local"
	flagJSON       = "json"
)

// connFlags are the flags of every command that talks to D1. They are the
// flags and environment variables wrangler users already know.
func connFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: flagAccountID, Usage: "Cloudflare account `ID`", EnvVars: []string{"CLOUDFLARE_ACCOUNT_ID"}, Category: "Connection:"},
		&cli.StringFlag{Name: flagAPIToken, Usage: "API `TOKEN` with D1 edit permission (never printed)", EnvVars: []string{"CLOUDFLARE_API_TOKEN"}, Category: "Connection:"},
		&cli.StringFlag{Name: flagDatabaseID, Usage: "D1 database `ID` (a UUID)", EnvVars: []string{"D1_DATABASE_ID"}, Category: "Connection:"},
		&cli.StringFlag{Name: flagDatabase, Usage: "D1 database `NAME` (or binding) from the d1_databases of the wrangler config", Category: "Connection:"},
		&cli.StringFlag{Name: flagConfig, Usage: "wrangler config `FILE` (default: wrangler.jsonc, wrangler.json or wrangler.toml in the current directory)", Category: "Connection:"},
		&cli.StringFlag{Name: flagBaseURL, Usage: "Cloudflare API base `URL` (default: https://api.cloudflare.com/client/v4/)", EnvVars: []string{d1client.BaseURLEnv}, Category: "Connection:"},
		&cli.StringFlag{Name: flagLocal, Usage: "use the embedded d1local with its databases under `DIR` instead of Cloudflare", Category: "Connection:"},
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
	// migrationsTable comes from the wrangler config's migrations_table.
	migrationsTable string
	local           *embedded.Server
}

func (c *conn) close() {
	if c.local != nil {
		_ = c.local.Close()
	}
}

// wranglerDB is one entry of a wrangler config's d1_databases.
type wranglerDB struct {
	Binding         string `json:"binding" toml:"binding"`
	DatabaseName    string `json:"database_name" toml:"database_name"`
	DatabaseID      string `json:"database_id" toml:"database_id"`
	MigrationsTable string `json:"migrations_table" toml:"migrations_table"`
}

type wranglerConfig struct {
	AccountID   string       `json:"account_id" toml:"account_id"`
	D1Databases []wranglerDB `json:"d1_databases" toml:"d1_databases"`
}

// readWranglerConfig reads wrangler.toml, wrangler.json or wrangler.jsonc
// (comments and trailing commas allowed).
func readWranglerConfig(path string) (wranglerConfig, string, error) {
	var cfg wranglerConfig
	if path == "" {
		for _, name := range []string{"wrangler.jsonc", "wrangler.json", "wrangler.toml"} {
			if _, err := os.Stat(name); err == nil {
				path = name
				break
			}
		}
		if path == "" {
			return cfg, "", usagef("--database needs a wrangler config: none of wrangler.jsonc, wrangler.json, wrangler.toml is in the current directory; pass --config FILE")
		}
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return cfg, path, fmt.Errorf("reading the wrangler config: %w", err)
	}
	switch strings.ToLower(filepath.Ext(path)) {
	case ".toml":
		if _, err := toml.NewDecoder(bytes.NewReader(data)).Decode(&cfg); err != nil {
			return cfg, path, fmt.Errorf("parsing %s: %w", path, err)
		}
	case ".json", ".jsonc":
		std, err := hujson.Standardize(data)
		if err != nil {
			return cfg, path, fmt.Errorf("parsing %s: %w", path, err)
		}
		if err := json.Unmarshal(std, &cfg); err != nil {
			return cfg, path, fmt.Errorf("parsing %s: %w", path, err)
		}
	default:
		return cfg, path, usagef("wrangler config %s: expected a .toml, .json or .jsonc file", path)
	}
	return cfg, path, nil
}

// openConn connects to the database the flags name: the embedded d1local
// with --local, Cloudflare otherwise. It never falls back silently: missing
// settings are listed in the error. mods adjust the client's configuration
// (a request budget, say); o's clientMods apply to Cloudflare clients only.
func openConn(c *cli.Context, o *options, mods ...func(*d1client.Config)) (*conn, error) {
	if dir := c.String(flagLocal); dir != "" {
		return openLocal(c, dir, mods...)
	}
	accountID, token, databaseID := c.String(flagAccountID), c.String(flagAPIToken), c.String(flagDatabaseID)
	var migrationsTable string
	where := ""
	if name := c.String(flagDatabase); name != "" {
		cfg, path, err := readWranglerConfig(c.String(flagConfig))
		if err != nil {
			return nil, err
		}
		var found *wranglerDB
		var names []string
		for i, d := range cfg.D1Databases {
			names = append(names, d.DatabaseName)
			if d.DatabaseName == name || d.Binding == name {
				found = &cfg.D1Databases[i]
			}
		}
		if found == nil {
			return nil, usagef("no database named %q in the d1_databases of %s (it has: %s)", name, path, strings.Join(names, ", "))
		}
		if found.DatabaseID == "" {
			return nil, usagef("database %q in %s has no database_id", name, path)
		}
		if databaseID != "" && databaseID != found.DatabaseID {
			return nil, usagef("--database %s is %s in %s, but --database-id says %s", name, found.DatabaseID, path, databaseID)
		}
		databaseID = found.DatabaseID
		migrationsTable = found.MigrationsTable
		if accountID == "" {
			accountID = cfg.AccountID
		}
		where = fmt.Sprintf("%s (%s, from %s)", found.DatabaseName, databaseID, path)
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
	return &conn{db: db, where: where, migrationsTable: migrationsTable}, nil
}

func openLocal(c *cli.Context, dir string, mods ...func(*d1client.Config)) (*conn, error) {
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
	for _, name := range []string{flagLocal, flagDatabase, flagConfig} {
		if c.IsSet(name) && c.String(name) != "" {
			b.WriteString(" --" + name + " " + shellQuote(c.String(name)))
		}
	}
	if c.String(flagLocal) != "" && c.IsSet(flagDatabaseID) {
		b.WriteString(" --" + flagDatabaseID + " " + shellQuote(c.String(flagDatabaseID)))
	}
	return b.String()
}
