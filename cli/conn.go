package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/d1idem/d1idem/cli/internal/wrangler"
	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1local"
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
	flagBridgeURL  = "bridge-url"
	flagLocal      = "local"
	flagJSON       = "json"
)

// The environment variables of the connection flags: wrangler's.
const (
	envAccountID = "CLOUDFLARE_ACCOUNT_ID"
	envAPIToken  = "CLOUDFLARE_API_TOKEN"
)

// onCommandLine returns the value of string flag name, and whether the
// command line gave it: set, and not merely to the value of its
// environment variable env ("" for a flag without one).
func onCommandLine(c *cli.Context, name, env string) (string, bool) {
	v := c.String(name)
	return v, v != "" && (env == "" || v != os.Getenv(env))
}

// connFlags are the flags of every command that talks to D1. They are the
// flags and environment variables wrangler users already know. The base
// URL's variables (CLOUDFLARE_API_BASE_URL, CLOUDFLARE_BASE_URL) are read by
// d1client, which refuses them when they differ, and so is the bridge's
// (D1IDEM_BRIDGE_URL) unless --bridge-url is given.
func connFlags() []cli.Flag {
	return append([]cli.Flag{
		&cli.StringFlag{Name: flagAccountID, Usage: "Cloudflare account `ID`", EnvVars: []string{envAccountID}, Category: "Connection:"},
		&cli.StringFlag{Name: flagAPIToken, Usage: "API `TOKEN` with D1 edit permission (never printed)", EnvVars: []string{envAPIToken}, Category: "Connection:"},
		&multiFlag{cli.GenericFlag{Name: flagDatabaseID, Usage: "D1 database `ID` (a UUID); with --local, the database under DIR; repeat it for a ledger across several databases",
			EnvVars: []string{"D1_DATABASE_ID"}, Category: "Connection:", Value: &multiValue{}, DefaultText: "with --local, " + d1local.LocalDatabaseID}},
	}, append(wranglerFlags(),
		&cli.StringFlag{Name: flagDatabasesPrefix, Usage: "every database of the wrangler config's d1_databases whose name or binding begins with `PREFIX` (with --local, every database under DIR whose name does): a ledger across several databases", Category: "Connection:"},
		&cli.BoolFlag{Name: flagPreview, Usage: "with --database, use its preview_database_id", DisableDefaultText: true, Category: "Connection:"},
		&cli.StringFlag{Name: flagBaseURL, Usage: "Cloudflare API base `URL`; without it, $" + d1client.APIBaseURLEnv + " or $" + d1client.BaseURLEnv +
			" (refused when both are set and differ), else " + d1client.DefaultBaseURL, Category: "Connection:"},
		&cli.StringFlag{Name: flagBridgeURL, Usage: "reach D1 through a d1idem bridge: its `URL` with its secret, https://:SECRET@HOST (never printed); it stands for --base-url and --api-token, and lifts the API budget (see 'd1idem bridge --help')",
			EnvVars: []string{d1client.BridgeURLEnv}, Category: "Connection:"},
		&cli.StringFlag{Name: flagLocal, Usage: "use the embedded d1local with its databases under `DIR` (" + d1local.LocalDir + " for the demo and the example API) instead of Cloudflare", Category: "Connection:"},
	)...)
}

// wranglerFlags choose a database of a wrangler config.
func wranglerFlags() []cli.Flag {
	return []cli.Flag{
		newMultiFlag(flagDatabase, "D1 database `NAME` (or binding) from the d1_databases of the wrangler config; repeat it for a ledger across several databases"),
		&cli.StringFlag{Name: flagConfig, Usage: "wrangler config `FILE` (default: the one wrangler uses: wrangler.json, wrangler.jsonc or wrangler.toml here or in a parent directory)", Category: "Connection:"},
		&cli.StringFlag{Name: flagEnv, Usage: "wrangler environment `NAME` ([env.NAME] of the config) to take --database from", EnvVars: []string{wrangler.EnvVar}, Category: "Connection:"},
	}
}

func jsonFlag() cli.Flag {
	return &cli.BoolFlag{Name: flagJSON, Usage: "print JSON with stable field names, for scripts (errors too, on stderr)", DisableDefaultText: true}
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

// cloudflareTarget resolves the Cloudflare flags, --database through the
// wrangler config included, and lists what is missing.
func cloudflareTarget(c *cli.Context) (target, error) {
	t := target{accountID: c.String(flagAccountID), token: c.String(flagAPIToken), databaseID: c.String(flagDatabaseID)}
	bridgeURL, bridge, err := bridgeURL(c)
	if err != nil {
		return t, err
	}
	t.bridgeURL = bridgeURL
	if c.String(flagDatabase) != "" {
		if t.wrangler, t.databaseID, t.where, err = wranglerTarget(c, t.databaseID); err != nil {
			return t, err
		}
		if t.accountID == "" {
			t.accountID = t.wrangler.AccountID
		}
	}
	if err := missingSettings(t.accountID, t.token != "" || bridge, t.databaseID != ""); err != nil {
		return t, err
	}
	if t.where == "" {
		t.where = "database " + t.databaseID
	}
	return t, nil
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

// maxListed bounds the databases a missing-database error names.
const maxListed = 50

// listCloudflare lists the account's D1 databases, "name (uuid)" each, with
// the client's base URL and the token: Cloudflare's database list
// (GET accounts/{account}/d1/database, paged), or a d1local server's (where a
// database's name is its ID).
func listCloudflare(ctx context.Context, db *d1client.Client, hc *http.Client, token string) ([]string, error) {
	out := []string{}
	for page := 1; len(out) < maxListed; page++ {
		dbs, more, err := listPage(ctx, hc, db.BaseURL(), db.AccountID(), token, page)
		if err != nil {
			return nil, err
		}
		for _, d := range dbs {
			if d.Name == d.UUID || d.UUID == "" {
				out = append(out, d.Name)
			} else {
				out = append(out, d.Name+" ("+d.UUID+")")
			}
		}
		if !more || len(dbs) == 0 {
			break
		}
	}
	return out[:min(len(out), maxListed)], nil
}

// listedDatabase is one entry of Cloudflare's database list.
type listedDatabase struct {
	UUID string `json:"uuid"`
	Name string `json:"name"`
}

// listPage fetches one page of the database list and reports whether more
// pages follow.
func listPage(ctx context.Context, hc *http.Client, base, account, token string, page int) ([]listedDatabase, bool, error) {
	const perPage = 100
	u := fmt.Sprintf("%saccounts/%s/d1/database?per_page=%d&page=%d", base, url.PathEscape(account), perPage, page)
	res, body, err := apiRequest(ctx, hc, http.MethodGet, u, token, nil)
	if err != nil {
		return nil, false, fmt.Errorf("listing the databases: %w", err)
	}
	var env struct {
		Success    bool             `json:"success"`
		Result     []listedDatabase `json:"result"`
		ResultInfo struct {
			Page       int `json:"page"`
			TotalCount int `json:"total_count"`
		} `json:"result_info"`
	}
	if err := json.Unmarshal(body, &env); err != nil || !env.Success {
		return nil, false, fmt.Errorf("listing the databases: HTTP %d", res.StatusCode)
	}
	more := len(env.Result) == perPage && page*perPage < env.ResultInfo.TotalCount
	return env.Result, more, nil
}

// apiRequest makes a call of Cloudflare's API that d1client does not make
// (the database list, a database's creation), with the token, and returns
// the response with its body (at most 8 MiB), read and closed.
func apiRequest(ctx context.Context, hc *http.Client, method, u, token string, body []byte) (*http.Response, []byte, error) {
	if hc == nil {
		hc = http.DefaultClient
	}
	req, err := http.NewRequestWithContext(ctx, method, u, bytes.NewReader(body))
	if err != nil {
		return nil, nil, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := hc.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer res.Body.Close()
	data, err := io.ReadAll(io.LimitReader(res.Body, 8<<20))
	return res, data, err
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

// wranglerTarget resolves --database (with --config, --env and --preview)
// to its wrangler config entry, its database ID and a description for
// people. databaseID, from --database-id, must agree when set.
func wranglerTarget(c *cli.Context, databaseID string) (d *wrangler.Database, id, where string, err error) {
	if d, err = wranglerDatabase(c); err != nil {
		return nil, "", "", err
	}
	if id, where, err = entryTarget(c, d); err != nil {
		return nil, "", "", err
	}
	if databaseID != "" && databaseID != id {
		return nil, "", "", usagef("--database %s is %s in %s, but --database-id says %s", c.String(flagDatabase), id, d.ConfigPath, databaseID)
	}
	return d, id, where, nil
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

// connHint repeats the flags that chose a database (--local, --database,
// --config, --env, and the base URL and IDs given on the command line: the
// environment gives its own to the suggested command too), for the
// commands a hint suggests, so that they run when pasted. It never includes
// the API token, the bridge URL or a URL's user information: a token or
// bridge URL given on the command line is repeated as a placeholder, its
// environment variable in double quotes ("$CLOUDFLARE_API_TOKEN"), for the
// shell to fill in.
func connHint(c *cli.Context) string {
	var b strings.Builder
	add := func(name, v string) { b.WriteString(" --" + name + " " + shellQuote(v)) }
	local := c.String(flagLocal) != ""
	if !local {
		if u, err := url.Parse(c.String(flagBaseURL)); err == nil && u.String() != "" && u.User == nil {
			add(flagBaseURL, u.String())
		}
		if a, given := onCommandLine(c, flagAccountID, envAccountID); given {
			add(flagAccountID, a)
		}
		for _, secret := range []struct{ name, env string }{{flagAPIToken, envAPIToken}, {flagBridgeURL, d1client.BridgeURLEnv}} {
			if _, given := onCommandLine(c, secret.name, secret.env); given {
				b.WriteString(" --" + secret.name + ` "$` + secret.env + `"`)
			}
		}
	}
	for _, name := range []string{flagLocal, flagDatabase, flagDatabasesPrefix, flagConfig, flagEnv} {
		for _, v := range hintValues(c, name) {
			add(name, v)
		}
	}
	if _, env := multiValues(c, flagDatabaseID); local || severalDatabases(c) || !env {
		for _, v := range hintValues(c, flagDatabaseID) {
			add(flagDatabaseID, v)
		}
	}
	return b.String()
}

// hintValues are the values of a flag that is set: each of a repeatable
// one.
func hintValues(c *cli.Context, name string) []string {
	if !c.IsSet(name) || c.String(name) == "" {
		return nil
	}
	if vals, _ := multiValues(c, name); vals != nil {
		return vals
	}
	return []string{c.String(name)}
}
