package cli

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/d1idem/d1idem/bridge"
	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/wrangler"
)

// The files of a bridge directory.
const (
	bridgeConfigFile = "wrangler.toml"
	bridgeSecretFile = ".bridge-secret" // the deployed Worker's secret, 0600
	bridgeDevVars    = ".dev.vars"      // wrangler dev's secrets: the development secret
	defaultWorker    = "d1idem-bridge"
)

// bridgeIgnored are the .gitignore lines of a bridge directory: its secrets
// and wrangler's local state.
var bridgeIgnored = []string{bridgeSecretFile, bridgeDevVars, ".wrangler/"}

func bridgeCommand() *cli.Command {
	return &cli.Command{
		Name:  "bridge",
		Usage: "write and deploy the bridge: a Worker serving D1's REST API past the API budget",
		Description: `The bridge is a Cloudflare Worker that serves the D1 REST API's query endpoints
on the D1 bindings it is deployed with. d1client, this tool and the idem
middleware use it in place of Cloudflare's API, by one environment variable,
D1IDEM_BRIDGE_URL=https://:SECRET@HOST, which stands for the API base URL and
token. Calls through it are not metered by the account's API budget (1200 calls
per 5 minutes). See docs/bridge.md.

   d1idem bridge init bridge --database orders-db   # the Worker and its wrangler.toml
   d1idem bridge deploy bridge                      # wrangler deploy, and its secret

To run it on this machine, in workerd, use wrangler itself: 'wrangler dev
--local' in DIR, with the development secret bridge init keeps in DIR/.dev.vars.`,
		Subcommands: []*cli.Command{bridgeInitCommand(), bridgeDeployCommand()},
	}
}

func bridgeInitCommand() *cli.Command {
	return &cli.Command{
		Name:      "init",
		Usage:     "write the bridge's Worker and a wrangler.toml binding the databases into DIR",
		ArgsUsage: "DIR",
		Description: `Writes the bridge Worker (worker.js, ledger-statements.js) and a wrangler.toml
that binds each --database into DIR, and a .gitignore that keeps its secrets
out of git. A --database NAME is looked up in your wrangler config (the one
wrangler would use here, or --config FILE; --env NAME for one of its
environments), which also gives the account ID; NAME=ID names a database
without one. It overwrites nothing without --force. It adds a development
secret to DIR/.dev.vars (mode 0600, out of git), which 'wrangler dev' reads,
and prints how to run the bridge on this machine with it.

   d1idem bridge init bridge --database orders-db
   d1idem bridge init bridge-staging --database orders-db --env staging
   d1idem bridge init bridge --database orders-db=6b4c8e3e-... --ledger-only`,
		Flags: []cli.Flag{
			&cli.StringSliceFlag{Name: flagDatabase, Usage: "a D1 database `NAME` of the wrangler config (its database_name or binding), or NAME=ID; repeat it for each database (required)"},
			&cli.StringFlag{Name: flagConfig, Usage: "wrangler config `FILE` to read the databases from (default: the one wrangler uses here)"},
			&cli.StringFlag{Name: flagEnv, Usage: "wrangler environment `NAME` of the config to take the databases from", EnvVars: []string{wrangler.EnvVar}},
			&cli.StringFlag{Name: "name", Usage: "the Worker's `NAME` (default: d1idem-bridge, with -ENV after it for --env)"},
			&cli.BoolFlag{Name: "ledger-only", Usage: "accept only the ledger's own statements (BRIDGE_MODE = \"ledger-only\"), so that a leaked secret cannot touch other tables", DisableDefaultText: true},
			&cli.BoolFlag{Name: "force", Usage: "overwrite the bridge's files in DIR", DisableDefaultText: true},
			jsonFlag(),
		},
		Action: initBridge,
	}
}

// bridgePlan is what bridge init writes.
type bridgePlan struct {
	Dir   string   `json:"dir"`
	Files []string `json:"files"`
	bridge.Config
	ConfigPath string `json:"wrangler_config,omitempty"` // where the databases came from
	Env        string `json:"env,omitempty"`
}

func initBridge(c *cli.Context) error {
	if c.NArg() != 1 {
		return usagef("bridge init takes one argument, the directory to write the bridge into (got %d); see 'd1idem bridge init --help'", c.NArg())
	}
	dir := c.Args().First()
	if dir == "" {
		return usagef("bridge init's directory is empty: name one, such as bridge")
	}
	if fi, err := os.Stat(dir); err == nil && !fi.IsDir() {
		return usagef("bridge init: %s is a file, not a directory: choose another directory", dir)
	}
	p, err := planBridge(c, dir)
	if err != nil {
		return err
	}
	source := p.ConfigPath
	if source != "" && p.Env != "" {
		source += " (env " + p.Env + ")"
	}
	files := map[string][]byte{bridgeConfigFile: p.WranglerTOML(source)}
	for _, f := range bridge.WorkerFiles() {
		files[f.Name] = f.Data
	}
	if err := writeBridgeFiles(p.Dir, files, c.Bool("force")); err != nil {
		return err
	}
	for name := range files {
		p.Files = append(p.Files, filepath.Join(p.Dir, name))
	}
	if _, err := devSecret(filepath.Join(p.Dir, bridgeDevVars)); err != nil {
		return err
	}
	p.Files = append(p.Files, filepath.Join(p.Dir, ".gitignore"), filepath.Join(p.Dir, bridgeDevVars))
	slices.Sort(p.Files)
	if c.Bool(flagJSON) {
		return printJSON(c.App.Writer, p)
	}
	return renderBridgeInit(c.App.Writer, p)
}

// planBridge resolves bridge init's flags.
func planBridge(c *cli.Context, dir string) (*bridgePlan, error) {
	args := c.StringSlice(flagDatabase)
	if len(args) == 0 {
		return nil, usagef("bridge init needs --%s NAME (or NAME=ID), once for each database the bridge serves", flagDatabase)
	}
	p := &bridgePlan{Dir: dir, Config: bridge.Config{Mode: "full"}, Env: c.String(flagEnv)}
	if c.Bool("ledger-only") {
		p.Mode = "ledger-only"
	}
	var cfg *wrangler.Config
	for _, a := range args {
		name, id, explicit := strings.Cut(a, "=")
		if !explicit && cfg == nil {
			var err error
			if cfg, err = loadWrangler(c); err != nil {
				return nil, err
			}
			p.ConfigPath = cfg.Path
		}
		d, account, err := bridgeDatabaseOf(cfg, p.Env, name, id, explicit)
		if err != nil {
			return nil, err
		}
		p.Databases = append(p.Databases, d)
		if p.AccountID == "" {
			p.AccountID = account
		}
	}
	if err := p.CheckDatabases(); err != nil {
		return nil, usageError{err}
	}
	return p, workerName(c, p)
}

// idLike is what a database name, ID or account ID may look like here.
var idLike = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// bridgeDatabaseOf resolves one --database: NAME=ID as given, NAME from the
// wrangler config's environment env. It returns the account ID the config
// gives, if any.
func bridgeDatabaseOf(cfg *wrangler.Config, env, name, id string, explicit bool) (bridge.Database, string, error) {
	if !idLike.MatchString(name) || explicit && !idLike.MatchString(id) {
		given := name
		if explicit {
			given += "=" + id
		}
		return bridge.Database{}, "", usagef("--%s %q: expected NAME or NAME=ID, each of letters, digits, '.', '_' and '-'", flagDatabase, given)
	}
	if explicit {
		return bridge.Database{Name: name, ID: id, Binding: bridge.BindingName(name)}, "", nil
	}
	d, err := cfg.Database(env, name)
	if err != nil {
		return bridge.Database{}, "", usagef("%v; or pass --%s %s=ID", err, flagDatabase, name)
	}
	if id, err = d.ID(false); err != nil {
		return bridge.Database{}, "", usagef("%v in %s", err, d.ConfigPath)
	}
	if !idLike.MatchString(id) || !bridge.ValidBinding(d.Binding) || d.AccountID != "" && !idLike.MatchString(d.AccountID) {
		return bridge.Database{}, "", fmt.Errorf("database %q of %s: its binding, database_id or account_id is not one the bridge can use", name, d.ConfigPath)
	}
	return bridge.Database{Name: d.Name(), ID: id, Binding: d.Binding}, d.AccountID, nil
}

// workerName sets p.Worker from --name, or the default for --env.
func workerName(c *cli.Context, p *bridgePlan) error {
	p.Worker = c.String("name")
	if p.Worker == "" {
		p.Worker = defaultWorker
		if p.Env != "" {
			p.Worker += "-" + strings.ToLower(p.Env)
		}
	}
	if !bridge.ValidWorkerName(p.Worker) {
		return usagef("the Worker name %q is not one Cloudflare accepts: lower-case letters, digits and '-', at most 63; pass --name NAME", p.Worker)
	}
	return nil
}

// writeBridgeFiles writes files into dir, refusing to overwrite any
// without force, and adds the bridge's lines to dir/.gitignore.
func writeBridgeFiles(dir string, files map[string][]byte, force bool) error {
	for _, other := range []string{"wrangler.json", "wrangler.jsonc"} {
		if _, err := os.Stat(filepath.Join(dir, other)); err == nil {
			return fmt.Errorf("%s has a %s, which wrangler would read instead of the bridge's wrangler.toml; choose another directory", dir, other)
		}
	}
	var existing []string
	for name := range files {
		if _, err := os.Lstat(filepath.Join(dir, name)); err == nil {
			existing = append(existing, filepath.Join(dir, name))
		}
	}
	slices.Sort(existing)
	if len(existing) > 0 && !force {
		return fmt.Errorf("%s already exist; nothing was written: pass --force to overwrite them", strings.Join(existing, ", "))
	}
	if err := notAppConfig(filepath.Join(dir, bridgeConfigFile)); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			return err
		}
	}
	return ensureLines(filepath.Join(dir, ".gitignore"), bridgeIgnored)
}

// notAppConfig refuses to overwrite a wrangler.toml that is not a bridge's
// (its main is not worker.js), even with --force: it is an application's.
func notAppConfig(path string) error {
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	cfg, err := wrangler.Load(path)
	if err != nil {
		return fmt.Errorf("%s exists and is not a bridge's wrangler config (%v); choose another directory", path, err)
	}
	if cfg.Main != "worker.js" {
		return fmt.Errorf("%s is not a bridge's wrangler config (its main is %q, not \"worker.js\"); choose another directory, even with --force", path, cfg.Main)
	}
	return nil
}

// ensureLines appends to the file at path those of lines it lacks,
// creating it if needed.
func ensureLines(path string, lines []string) error {
	data, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	have := strings.Split(strings.ReplaceAll(string(data), "\r\n", "\n"), "\n")
	var add strings.Builder
	if len(data) > 0 && !strings.HasSuffix(string(data), "\n") {
		add.WriteString("\n")
	}
	for _, l := range lines {
		if !slices.Contains(have, l) {
			add.WriteString(l + "\n")
		}
	}
	if strings.TrimSpace(add.String()) == "" {
		return nil
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	_, err = f.WriteString(add.String())
	return errors.Join(err, f.Close())
}

// renderBridgeInit says what bridge init wrote and what comes next.
func renderBridgeInit(w io.Writer, p *bridgePlan) error {
	names := make([]string, len(p.Files))
	for i, f := range p.Files {
		names[i] = filepath.Base(f)
	}
	fmt.Fprintf(w, "Wrote the bridge into %s: %s.\n", p.Dir, strings.Join(names, ", "))
	account := "account " + p.AccountID
	if p.AccountID == "" {
		account = "no account_id (wrangler uses CLOUDFLARE_ACCOUNT_ID, or asks)"
	}
	mode := "full mode: any SQL"
	if p.Mode == "ledger-only" {
		mode = "ledger-only mode: the ledger's statements only"
	}
	fmt.Fprintf(w, "Worker %s, %s, %s, serving:\n\n", p.Worker, account, mode)
	rows := make([][]string, len(p.Databases))
	for i, d := range p.Databases {
		rows[i] = []string{"  " + d.Name, d.ID, d.Binding}
	}
	if err := printTable(w, []string{"  DATABASE", "ID", "BINDING"}, rows); err != nil {
		return err
	}
	if p.ConfigPath != "" {
		from := p.ConfigPath
		if p.Env != "" {
			from += ", env " + p.Env
		}
		fmt.Fprintf(w, "\n(databases from %s)\n", from)
	}
	dir := shellQuote(p.Dir)
	fmt.Fprintf(w, "\nNext: 'd1idem bridge deploy %s' deploys it, with a secret of its own.\n", dir)
	_, err := fmt.Fprintf(w, "To run it here, in workerd, with the development secret of %s:\n\n   (cd %s && npx wrangler dev --local --port 8788)\n   export %s=\"http://:$(sed -n 's/^BRIDGE_SECRET=//p' %s)@127.0.0.1:8788\"\n",
		filepath.Join(p.Dir, bridgeDevVars), dir, d1client.BridgeURLEnv, shellQuote(filepath.Join(p.Dir, bridgeDevVars)))
	return err
}

// devSecret returns BRIDGE_SECRET of the .dev.vars file at path (wrangler
// dev's secrets), adding a new one (and making the file, mode 0600) when
// it has none.
func devSecret(path string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), "=")
		if !ok || strings.TrimSpace(strings.TrimPrefix(k, "export ")) != "BRIDGE_SECRET" {
			continue
		}
		v = strings.Trim(strings.TrimSpace(v), `"'`)
		if !bridge.ValidSecret(v) {
			return "", fmt.Errorf("%s: BRIDGE_SECRET must be 16 to 4096 visible ASCII characters, no commas; delete the line for a new one", path)
		}
		return v, nil
	}
	secret := bridge.NewSecret()
	line := "BRIDGE_SECRET=" + secret + "\n"
	if len(data) > 0 && !bytes.HasSuffix(data, []byte("\n")) {
		line = "\n" + line
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return "", err
	}
	return secret, errors.Join(writeString(f, line), f.Close())
}
