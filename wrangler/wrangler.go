// Package wrangler reads a wrangler configuration file (wrangler.json,
// wrangler.jsonc or wrangler.toml) as wrangler reads it for its d1
// commands: the file wrangler would use from a directory (Find), the
// account ID and the D1 databases of the top level and of each environment,
// with wrangler's defaults and inheritance (Config.Databases), the
// database a name or binding means (Config.Database), those a prefix of
// their names chooses (Config.WithPrefix) and the one an ID names
// (Config.ByID). A Go service or tool can then reach the databases its
// Worker is bound to with the IDs the Worker is deployed with, as the
// d1idem command line does with --database:
//
//	path, err := wrangler.Find(".")
//	...
//	cfg, err := wrangler.Load(path)
//	...
//	d, err := cfg.Database(os.Getenv(wrangler.EnvVar), "orders-db")
//	...
//	id, err := d.ID(false) // preview_database_id with true
//	...
//	db, err := d1client.New(d1client.Config{AccountID: d.AccountID, DatabaseID: id, APIToken: token})
//
// It reads only what d1 needs (account_id, d1_databases and its
// migrations settings, name and main) and imports no other package of this
// module.
//
// # API stability
//
// The exported names follow the module's semantic versioning; the wording
// of errors does not.
package wrangler

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/BurntSushi/toml"
	"github.com/tailscale/hujson"
)

// Defaults wrangler applies to a d1_databases entry.
const (
	DefaultMigrationsDir   = "migrations"
	DefaultMigrationsTable = "d1_migrations"
)

// EnvVar is the environment variable wrangler reads for the environment when
// no --env is given.
const EnvVar = "CLOUDFLARE_ENV"

// ErrNoConfig is returned by Find when no configuration file is found.
var ErrNoConfig = errors.New("no wrangler.json, wrangler.jsonc or wrangler.toml in this directory or above")

// configFiles are the names wrangler looks for, in its order of preference.
var configFiles = [...]string{"wrangler.json", "wrangler.jsonc", "wrangler.toml"}

// Config is a parsed wrangler configuration file.
type Config struct {
	// Path is the file the configuration was read from.
	Path string
	// Name and Main are the top level's name (the Worker's) and main (its
	// entry module).
	Name, Main string
	// AccountID is the top level's account_id.
	AccountID string
	// D1Databases are the top level's d1_databases.
	D1Databases []D1Database
	// Env holds the environments ([env.NAME] in TOML, "env" in JSON).
	Env map[string]Env
}

// Env is one environment of a configuration.
type Env struct {
	AccountID   string       `json:"account_id" toml:"account_id"`
	D1Databases []D1Database `json:"d1_databases" toml:"d1_databases"`
}

// D1Database is one entry of d1_databases, as written.
type D1Database struct {
	Binding           string `json:"binding" toml:"binding"`
	DatabaseName      string `json:"database_name" toml:"database_name"`
	DatabaseID        string `json:"database_id" toml:"database_id"`
	PreviewDatabaseID string `json:"preview_database_id" toml:"preview_database_id"`
	MigrationsDir     string `json:"migrations_dir" toml:"migrations_dir"`
	MigrationsTable   string `json:"migrations_table" toml:"migrations_table"`
}

// Database is a D1 database of one environment, resolved the way wrangler
// resolves it for a command.
type Database struct {
	D1Database
	// ConfigPath is the configuration file's path.
	ConfigPath string
	// Env is the environment ("" for the top level).
	Env string
	// AccountID is the environment's account_id, or the top level's when
	// the environment has none (account_id is inherited; d1_databases is
	// not).
	AccountID string
	// MigrationsDir is migrations_dir (default "migrations") resolved
	// against the directory of the configuration file.
	MigrationsDir string
	// MigrationsTable is migrations_table (default "d1_migrations").
	MigrationsTable string
}

// Name returns database_name, or the binding when the entry has no name.
func (d Database) Name() string {
	if d.DatabaseName != "" {
		return d.DatabaseName
	}
	return d.Binding
}

// ID returns database_id, or preview_database_id when preview is true. It
// is an error when the one asked for is not set.
func (d Database) ID(preview bool) (string, error) {
	if preview {
		if d.PreviewDatabaseID == "" {
			return "", fmt.Errorf("database %q has no preview_database_id", d.Name())
		}
		return d.PreviewDatabaseID, nil
	}
	if d.DatabaseID == "" {
		return "", fmt.Errorf("database %q has no database_id", d.Name())
	}
	return d.DatabaseID, nil
}

// Find returns the configuration file wrangler would use from dir: the
// first of wrangler.json, wrangler.jsonc and wrangler.toml found in dir or
// its nearest parent, in that order of names. It returns ErrNoConfig when
// there is none.
func Find(dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	for _, name := range configFiles {
		for d := abs; ; d = filepath.Dir(d) {
			p := filepath.Join(d, name)
			if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
				return p, nil
			}
			if filepath.Dir(d) == d {
				break
			}
		}
	}
	return "", ErrNoConfig
}

// Load reads and parses the configuration file at path.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the wrangler config: %w", err)
	}
	return Parse(path, data)
}

// Parse parses a configuration in the format given by the extension of
// path: TOML for .toml, JSON with comments and trailing commas for .json and
// .jsonc.
func Parse(path string, data []byte) (*Config, error) {
	var raw struct {
		Name        string         `json:"name" toml:"name"`
		Main        string         `json:"main" toml:"main"`
		AccountID   string         `json:"account_id" toml:"account_id"`
		D1Databases []D1Database   `json:"d1_databases" toml:"d1_databases"`
		Env         map[string]Env `json:"env" toml:"env"`
	}
	switch strings.ToLower(filepath.Ext(path)) {
	case ".toml":
		if _, err := toml.NewDecoder(bytes.NewReader(data)).Decode(&raw); err != nil {
			return nil, fmt.Errorf("parsing %s: %w", path, err)
		}
	case ".json", ".jsonc":
		std, err := hujson.Standardize(data)
		if err != nil {
			return nil, fmt.Errorf("parsing %s: %w", path, err)
		}
		if err := json.Unmarshal(std, &raw); err != nil {
			return nil, fmt.Errorf("parsing %s: %w", path, err)
		}
	default:
		return nil, fmt.Errorf("wrangler config %s: expected a .toml, .json or .jsonc file", path)
	}
	return &Config{Path: path, Name: raw.Name, Main: raw.Main, AccountID: raw.AccountID, D1Databases: raw.D1Databases, Env: raw.Env}, nil
}

// EnvNames returns the names of the configuration's environments, sorted.
func (c *Config) EnvNames() []string {
	names := make([]string, 0, len(c.Env))
	for n := range c.Env {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Databases returns the D1 databases of environment env ("" for the top
// level), resolved. An environment that does not exist is an error; one
// without d1_databases has none, since wrangler does not inherit them from
// the top level.
func (c *Config) Databases(env string) ([]Database, error) {
	e := Env{AccountID: c.AccountID, D1Databases: c.D1Databases}
	if env != "" {
		var ok bool
		if e, ok = c.Env[env]; !ok {
			has := "it has none"
			if len(c.Env) > 0 {
				has = "it has: " + strings.Join(c.EnvNames(), ", ")
			}
			return nil, fmt.Errorf("no environment %q in %s (%s)", env, c.Path, has)
		}
		if e.AccountID == "" {
			e.AccountID = c.AccountID
		}
	}
	dir := filepath.Dir(c.Path)
	out := make([]Database, 0, len(e.D1Databases))
	for _, d := range e.D1Databases {
		db := Database{D1Database: d, ConfigPath: c.Path, Env: env, AccountID: e.AccountID, MigrationsDir: d.MigrationsDir, MigrationsTable: d.MigrationsTable}
		if db.MigrationsDir == "" {
			db.MigrationsDir = DefaultMigrationsDir
		}
		if !filepath.IsAbs(db.MigrationsDir) {
			db.MigrationsDir = filepath.Join(dir, db.MigrationsDir)
		}
		if db.MigrationsTable == "" {
			db.MigrationsTable = DefaultMigrationsTable
		}
		out = append(out, db)
	}
	return out, nil
}

// Database returns the D1 database of environment env ("" for the top level)
// whose database_name or binding is name, as wrangler finds it; a name that
// several entries answer to is an error, not the first of them.
func (c *Config) Database(env, name string) (Database, error) {
	dbs, err := c.Databases(env)
	if err != nil {
		return Database{}, err
	}
	var found []Database
	for _, d := range dbs {
		if d.DatabaseName == name || d.Binding == name {
			found = append(found, d)
		}
	}
	switch {
	case len(found) == 1:
		return found[0], nil
	case len(found) > 1:
		// wrangler would take the first; which one is meant is a guess.
		entries := make([]string, len(found))
		for i, d := range found {
			entries[i] = fmt.Sprintf("binding %q, database_name %q, database_id %q", d.Binding, d.DatabaseName, d.DatabaseID)
		}
		return Database{}, fmt.Errorf("%q names %d entries of the d1_databases of %s (%s): give each a binding and a database_name of its own", name, len(found), c.where(env), strings.Join(entries, "; "))
	}
	return Database{}, fmt.Errorf("no database named %q in the d1_databases of %s (%s)", name, c.where(env), c.describe(env, dbs))
}

// WithPrefix returns the D1 databases of environment env ("" for the top
// level) whose database_name or binding begins with prefix, in the file's
// order: the databases of a ledger spread across several, named alike.
// None is an error that lists the databases there are.
func (c *Config) WithPrefix(env, prefix string) ([]Database, error) {
	dbs, err := c.Databases(env)
	if err != nil {
		return nil, err
	}
	var out []Database
	for _, d := range dbs {
		if strings.HasPrefix(d.Name(), prefix) || strings.HasPrefix(d.Binding, prefix) {
			out = append(out, d)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no database of the d1_databases of %s has a name or binding beginning with %q (%s)", c.where(env), prefix, c.describe(env, dbs))
	}
	return out, nil
}

// ByID returns the D1 database of environment env ("" for the top level)
// whose database_id or preview_database_id is id, and whether there is one.
func (c *Config) ByID(env, id string) (Database, bool, error) {
	dbs, err := c.Databases(env)
	for _, d := range dbs {
		if d.DatabaseID == id || d.PreviewDatabaseID == id {
			return d, true, nil
		}
	}
	return Database{}, false, err
}

// Only returns the single D1 database of environment env, and an error when
// it has none or several.
func (c *Config) Only(env string) (Database, error) {
	dbs, err := c.Databases(env)
	if err != nil {
		return Database{}, err
	}
	if len(dbs) == 1 {
		return dbs[0], nil
	}
	if len(dbs) == 0 {
		return Database{}, fmt.Errorf("no d1_databases in %s (%s)", c.where(env), c.describe(env, dbs))
	}
	return Database{}, fmt.Errorf("%s has several d1_databases (%s); name one", c.where(env), c.describe(env, dbs))
}

// where names the part of the file an environment is: "wrangler.toml" or
// "env.staging of wrangler.toml".
func (c *Config) where(env string) string {
	if env == "" {
		return c.Path
	}
	return "env." + env + " of " + c.Path
}

// describe lists the databases for an error, and explains an environment
// that has none while the top level has some.
func (c *Config) describe(env string, dbs []Database) string {
	if len(dbs) == 0 {
		if env != "" && len(c.D1Databases) > 0 {
			return "it has none; d1_databases is not inherited from the top level, as in wrangler"
		}
		return "it has none"
	}
	names := make([]string, 0, len(dbs))
	for _, d := range dbs {
		names = append(names, d.Name())
	}
	return "it has: " + strings.Join(names, ", ")
}
