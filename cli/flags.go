package cli

import (
	"flag"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/internal/human"
	"github.com/d1idem/d1idem/internal/textsafe"
	"github.com/d1idem/d1idem/wrangler"
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

// flagDatabasesPrefix chooses every database of the wrangler config (or,
// with --local, under DIR) whose name begins with a prefix.
const flagDatabasesPrefix = "databases-prefix"

// onCommandLine returns the value of string flag name, and whether the
// command line gave it: set, and not merely to the value of its
// environment variable env ("" for a flag without one).
func onCommandLine(c *cli.Context, name, env string) (string, bool) {
	v := c.String(name)
	return v, v != "" && (env == "" || v != os.Getenv(env))
}

// connFlags are the flags of every command that talks to D1: wrangler's
// flags and variables. d1client reads the base URL's variables (refusing
// two that differ), and the bridge's unless --bridge-url is given.
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

// multiValues returns a repeatable flag's values, and whether they came from the environment.
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

// checkConnFlags refuses connection flags that contradict each other or would be ignored.
func checkConnFlags(c *cli.Context) error {
	if err := envWithoutDatabase(c); err != nil || !severalDatabases(c) {
		return err
	}
	return noEnvDatabaseID(c)
}

// bridgeURL returns --bridge-url for d1client.Config.BridgeURL ("" leaves
// $D1IDEM_BRIDGE_URL to d1client), and whether a bridge is used. A
// --base-url wins over the variable; beside --bridge-url it is refused.
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

// Flag readers that turn bad values into usage errors.

func positiveDuration(c *cli.Context, name string) (time.Duration, error) {
	d := c.Duration(name)
	if d <= 0 {
		return 0, usagef("--%s %s must be positive", name, d)
	}
	return d, nil
}

// ledgerFlags refuses arguments and reads --ttl and --retention, both positive.
func ledgerFlags(c *cli.Context) (ttl, retention time.Duration, err error) {
	if err := noArgs(c); err != nil {
		return 0, 0, err
	}
	if ttl, err = positiveDuration(c, "ttl"); err != nil {
		return 0, 0, err
	}
	retention, err = positiveDuration(c, "retention")
	return ttl, retention, err
}

func noArgs(c *cli.Context) error {
	if c.Args().Present() {
		return usagef("%s takes no arguments (got %q); values go in flags, see 'd1idem %s --help'", commandPath(c), c.Args().First(), commandPath(c))
	}
	return nil
}

// setDurations repeats the duration flags of names that the command line
// set, " --name DURATION" each, for a command a hint suggests.
func setDurations(c *cli.Context, names ...string) string {
	var h string
	for _, name := range names {
		if c.IsSet(name) {
			h += " --" + name + " " + human.Arg(c.Duration(name))
		}
	}
	return h
}

// connHint repeats the flags that chose the databases, for the commands a
// hint suggests to run when pasted (the environment gives its own). A token
// or bridge URL is never repeated: on the command line, it becomes its
// variable in double quotes ("$CLOUDFLARE_API_TOKEN") for the shell to fill.
func connHint(c *cli.Context) string {
	var b strings.Builder
	add := func(name, v string) { b.WriteString(" --" + name + " " + textsafe.ShellQuote(v)) }
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

// hintValues are the values of a flag that is set.
func hintValues(c *cli.Context, name string) []string {
	if !c.IsSet(name) || c.String(name) == "" {
		return nil
	}
	if vals, _ := multiValues(c, name); vals != nil {
		return vals
	}
	return []string{c.String(name)}
}
