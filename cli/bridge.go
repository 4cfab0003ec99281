package cli

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/d1idem/d1idem/bridge"
	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/internal/textsafe"
	"github.com/d1idem/d1idem/wrangler"
)

func bridgeCommand() *cli.Command {
	return &cli.Command{
		Name:        "bridge",
		Usage:       "write and deploy the bridge: a Worker serving D1's REST API past the API budget",
		Description: help("bridge"),
		Subcommands: []*cli.Command{bridgeInitCommand(), bridgeDeployCommand()},
	}
}

func bridgeInitCommand() *cli.Command {
	return &cli.Command{
		Name:        "init",
		Usage:       "write the bridge's Worker and a wrangler.toml binding the databases into DIR",
		ArgsUsage:   "DIR",
		Description: help("bridge init"),
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
	if p.Files, err = bridge.Init(p.Dir, p.Config, source, c.Bool("force")); err != nil {
		return err
	}
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
		if !strings.Contains(a, "=") && cfg == nil {
			var err error
			if cfg, err = loadWrangler(c, flagDatabase); err != nil {
				return nil, err
			}
			p.ConfigPath = cfg.Path
		}
		d, account, err := bridge.DatabaseOf(cfg, p.Env, a)
		if err != nil {
			return nil, usagef("--%s %q: %v", flagDatabase, a, err)
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

// workerName sets p.Worker from --name, or the default for --env.
func workerName(c *cli.Context, p *bridgePlan) error {
	p.Worker = cmp.Or(c.String("name"), bridge.WorkerName(p.Env))
	if !bridge.ValidWorkerName(p.Worker) {
		return usagef("the Worker name %q is not one Cloudflare accepts: lower-case letters, digits and '-', at most 63; pass --name NAME", p.Worker)
	}
	return nil
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
	dir := textsafe.ShellQuote(p.Dir)
	fmt.Fprintf(w, "\nNext: 'd1idem bridge deploy %s' deploys it, with a secret of its own.\n", dir)
	_, err := fmt.Fprintf(w, "To run it here, in workerd, with the development secret of %s:\n\n   (cd %s && npx wrangler dev --local --port 8788)\n   export %s=\"http://:$(sed -n 's/^BRIDGE_SECRET=//p' %s)@127.0.0.1:8788\"\n",
		filepath.Join(p.Dir, bridge.DevVars), dir, d1client.BridgeURLEnv, textsafe.ShellQuote(filepath.Join(p.Dir, bridge.DevVars)))
	return err
}

func bridgeDeployCommand() *cli.Command {
	return &cli.Command{
		Name:        "deploy",
		Usage:       "deploy the bridge in DIR with wrangler, and set its secret",
		ArgsUsage:   "[DIR]",
		Description: help("bridge deploy"),
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "rotate-secret", Usage: "make and set a new secret; the old one stays accepted (BRIDGE_SECRET_PREVIOUS) until you delete it", DisableDefaultText: true},
			&cli.StringFlag{Name: "url", Usage: "the Worker's `URL`, for the D1IDEM_BRIDGE_URL printed at the end, when it is served on a route of yours (default: the workers.dev URL wrangler prints)"},
		},
		Action: deployBridge,
	}
}

// deployment is one bridge deploy, for its renderers.
type deployment struct {
	bridge.Deployment
	dir, worker string
	wrangler    string // how the commands run wrangler
}

func (d *deployment) secretPath() string { return filepath.Join(d.dir, bridge.SecretFile) }

func deployBridge(c *cli.Context) error {
	dir, worker, err := bridgeDir(c)
	if err != nil {
		return err
	}
	d := &deployment{dir: dir, worker: worker, wrangler: "wrangler"}
	if d.URL, err = workerURL(c.String("url")); err != nil {
		return err
	}
	if _, err := bridge.ReadSecret(dir); err != nil {
		return secretError(err)
	}
	for _, p := range bridge.StaleModules(dir) {
		fmt.Fprintf(c.App.ErrWriter, "note: %s is not the one this d1idem ships (edited, or written by another version); 'd1idem bridge init %s --database ... --force' rewrites the bridge's files\n",
			p, textsafe.ShellQuote(dir))
	}
	w := bridge.Wrangler()
	switch {
	case w == nil && c.Bool("rotate-secret"):
		return errors.New("bridge deploy: --rotate-secret runs wrangler, and neither wrangler nor npx is on PATH; nothing was changed")
	case w == nil:
		return d.printCommands(c.App.Writer)
	case len(w) > 1:
		d.wrangler = "npx --yes wrangler@" + bridge.WranglerVersion
	}
	done, err := bridge.Deploy(c.Context, dir, w, c.Bool("rotate-secret"), c.App.ErrWriter)
	var se *bridge.SecretError
	switch {
	case errors.As(err, &se):
		return fmt.Errorf("bridge deploy: %w: run 'd1idem bridge deploy %s' again", err, textsafe.ShellQuote(dir))
	case err != nil:
		return fmt.Errorf("bridge deploy: %w", secretError(err))
	}
	if d.URL == nil {
		d.URL = done.URL
	}
	d.NewSecret, d.Previous = done.NewSecret, done.Previous
	return renderDeploy(c.App.Writer, d)
}

// secretError adds to an error of the secret file what to do about it.
func secretError(err error) error {
	var re *bridge.ReadableError
	if errors.As(err, &re) {
		return fmt.Errorf("%w: 'chmod 600 %s' (and, if others did read it, rotate the secret: see docs/bridge.md)", err, textsafe.ShellQuote(re.Path))
	}
	return err
}

// printCommands prints the commands that deploy the bridge by hand, once
// the secret file holds a secret, and fails: nothing was deployed.
func (d *deployment) printCommands(w io.Writer) error {
	var err error
	if d.NewSecret, err = bridge.EnsureSecret(d.dir); err != nil {
		return err
	}
	d.wrangler = "npx --yes wrangler@" + bridge.WranglerVersion
	if err := renderDeployCommands(w, d); err != nil {
		return err
	}
	return errors.New("bridge deploy: nothing was deployed: neither wrangler nor npx is on PATH; run the commands above")
}

// bridgeDir returns the bridge directory of deploy, [DIR] or here, and its
// Worker's name, once it has checked that bridge init wrote it.
func bridgeDir(c *cli.Context) (string, string, error) {
	if c.NArg() > 1 {
		return "", "", usagef("%s takes at most one argument, the bridge's directory (got %d)", commandPath(c), c.NArg())
	}
	dir := c.Args().First()
	if dir == "" {
		dir = "."
	}
	worker, err := bridge.Worker(dir)
	return dir, worker, err
}

// workerURL reads --url: an https URL with no user, query or fragment.
func workerURL(s string) (*url.URL, error) {
	if s == "" {
		return nil, nil
	}
	u, err := url.Parse(s)
	if err == nil && u.Scheme == "https" && u.Host != "" && u.User == nil && u.RawQuery == "" && u.Fragment == "" {
		return u, nil
	}
	if strings.ContainsAny(s, "@?#") {
		// A user, query or fragment may be a secret: a bridge URL pasted
		// whole, say. It is not repeated.
		return nil, usagef("--url: expected the Worker's https://HOST[/PATH], without a secret; the URL given is not shown, as it has a user, query or fragment (the bridge URL with its secret is D1IDEM_BRIDGE_URL's)")
	}
	return nil, usagef("--url %q: expected the Worker's https://HOST[/PATH], without a secret", s)
}

// bridgeURLCommand is the shell command that sets D1IDEM_BRIDGE_URL with
// the secret read from its file, so that the secret itself is not shown.
func (d *deployment) bridgeURLCommand() string {
	host := d.worker + ".<your-subdomain>.workers.dev"
	if d.URL != nil {
		host = d.URL.Host + strings.TrimSuffix(d.URL.EscapedPath(), "/")
	}
	return fmt.Sprintf(`export %s="https://:$(cat %s)@%s"`, d1client.BridgeURLEnv, textsafe.ShellQuote(d.secretPath()), host)
}

// renderDeploy reports a deployment and the one variable to set.
func renderDeploy(w io.Writer, d *deployment) error {
	where := "(wrangler printed no URL for it; pass --url)"
	if d.URL != nil {
		where = "to " + d.URL.String()
	}
	secret := "its secret"
	if d.NewSecret {
		secret = "a new secret"
	}
	fmt.Fprintf(w, "Deployed %s %s, with %s (BRIDGE_SECRET) from %s.\n", d.worker, where, secret, d.secretPath())
	fmt.Fprintf(w, "That file is the secret's only readable copy: mode 0600, left out of git by %s, never printed.\n", filepath.Join(d.dir, ".gitignore"))
	fmt.Fprintf(w, "Point your service and d1idem at the bridge with one variable, in place of the API base URL and token:\n\n   %s\n", d.bridgeURLCommand())
	if d.URL == nil {
		fmt.Fprintf(w, "\n(with the Worker's host in place of the one above)\n")
	}
	if d.Previous {
		fmt.Fprintf(w, "\nThe previous secret is still accepted (BRIDGE_SECRET_PREVIOUS): once every D1IDEM_BRIDGE_URL has the new one, retire it with\n\n   cd %s && %s secret delete BRIDGE_SECRET_PREVIOUS\n",
			textsafe.ShellQuote(d.dir), d.wrangler)
	}
	return nil
}

// renderDeployCommands prints the commands that deploy the bridge by hand.
func renderDeployCommands(w io.Writer, d *deployment) error {
	fmt.Fprintf(w, "Nothing was deployed: neither wrangler nor npx (Node.js 20 or later) is on PATH. With them, run:\n\n")
	fmt.Fprintf(w, "   cd %s\n   %s deploy\n   %s secret put BRIDGE_SECRET < %s\n\n", textsafe.ShellQuote(d.dir), d.wrangler, d.wrangler, bridge.SecretFile)
	fmt.Fprintf(w, "%s holds the bridge's secret: mode 0600, left out of git by %s, never printed.\n", d.secretPath(), filepath.Join(d.dir, ".gitignore"))
	_, err := fmt.Fprintf(w, "Then point your service and d1idem at the bridge with one variable, in place of the API base URL and token:\n\n   %s\n", d.bridgeURLCommand())
	return err
}
