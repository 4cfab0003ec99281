package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"

	"github.com/urfave/cli/v2"

	"github.com/d1idem/d1idem/bridge"
	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/wrangler"
)

// wranglerVersion is the wrangler the bridge is tested with
// (conformance/package.json); npx runs it when wrangler is not on PATH.
const wranglerVersion = "4.86.0"

func bridgeDeployCommand() *cli.Command {
	return &cli.Command{
		Name:      "deploy",
		Usage:     "deploy the bridge in DIR with wrangler, and set its secret",
		ArgsUsage: "[DIR]",
		Description: `Runs 'wrangler deploy' in DIR (default: here), then 'wrangler secret put
BRIDGE_SECRET' with the bridge's secret on its standard input. The secret is
made on the first deploy (32 random bytes, hex) and kept in DIR/.bridge-secret,
mode 0600, which DIR/.gitignore keeps out of git; later deploys reuse it. It is
never printed: the command that sets D1IDEM_BRIDGE_URL, printed at the end,
reads it from that file. --rotate-secret makes a new one, and keeps the old one
accepted (as BRIDGE_SECRET_PREVIOUS) until you retire it, so that clients can
move to the new one without a refusal.

wrangler is the one on PATH, else 'npx --yes wrangler@4.86.0'. With neither,
nothing is deployed: it prints the commands to run, and exits 1. wrangler
needs a Cloudflare login ('wrangler login') or CLOUDFLARE_API_TOKEN.

   d1idem bridge deploy bridge
   d1idem bridge deploy bridge --rotate-secret   # then update D1IDEM_BRIDGE_URL everywhere`,
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "rotate-secret", Usage: "make and set a new secret; the old one stays accepted (BRIDGE_SECRET_PREVIOUS) until you delete it", DisableDefaultText: true},
			&cli.StringFlag{Name: "url", Usage: "the Worker's `URL`, for the D1IDEM_BRIDGE_URL printed at the end, when it is served on a route of yours (default: the workers.dev URL wrangler prints)"},
		},
		Action: deployBridge,
	}
}

// deployment is one bridge deploy, for its renderers.
type deployment struct {
	dir, worker, secretPath string
	url                     *url.URL // the Worker's; nil when unknown
	created                 bool     // the secret is new
	previous                bool     // the old secret was kept as BRIDGE_SECRET_PREVIOUS
	wrangler                string   // how the commands run wrangler
}

func deployBridge(c *cli.Context) error {
	dir, cfg, err := bridgeDir(c)
	if err != nil {
		return err
	}
	d := &deployment{dir: dir, worker: cfg.Name, secretPath: filepath.Join(dir, bridgeSecretFile), wrangler: "wrangler"}
	if d.url, err = workerURL(c.String("url")); err != nil {
		return err
	}
	old, err := readSecret(d.secretPath)
	if err != nil {
		return err
	}
	noteStaleModules(c.App.ErrWriter, dir)
	w := wranglerCommand()
	switch {
	case w == nil && c.Bool("rotate-secret"):
		return errors.New("bridge deploy: --rotate-secret runs wrangler, and neither wrangler nor npx is on PATH; nothing was changed")
	case w == nil:
		return d.printCommands(c.App.Writer, old)
	case len(w) > 1:
		d.wrangler = "npx --yes wrangler@" + wranglerVersion
	}
	if err := d.run(c, w, old, c.Bool("rotate-secret")); err != nil {
		return err
	}
	return renderDeploy(c.App.Writer, d)
}

// run deploys the bridge with wrangler w and sets its secret: old, the one
// in the secret file, or a new one when there is none or rotate is set.
// Rotating keeps old as BRIDGE_SECRET_PREVIOUS, which the bridge accepts
// too, and writes the new secret to the file only once old is kept there:
// whatever step fails, running deploy again completes the rotation.
func (d *deployment) run(c *cli.Context, w []string, old string, rotate bool) error {
	secret := old
	if old == "" || rotate {
		secret, d.created = bridge.NewSecret(), true
	}
	if old == "" {
		if err := writeSecret(d.secretPath, secret); err != nil {
			return err
		}
	}
	out, err := runWrangler(c.Context, w, d.dir, nil, c.App.ErrWriter, "deploy")
	if err != nil {
		return fmt.Errorf("bridge deploy: 'wrangler deploy' failed (%w; its output is above); nothing else was done", err)
	}
	if d.url == nil {
		d.url = deployedURL(out)
	}
	if rotate && old != "" {
		if _, err := runWrangler(c.Context, w, d.dir, strings.NewReader(old), c.App.ErrWriter, "secret", "put", "BRIDGE_SECRET_PREVIOUS"); err != nil {
			return fmt.Errorf("bridge deploy: 'wrangler secret put BRIDGE_SECRET_PREVIOUS' failed (%w; its output is above); the secret was not rotated", err)
		}
		d.previous = true
		if err := writeSecret(d.secretPath, secret); err != nil {
			return err
		}
	}
	if _, err := runWrangler(c.Context, w, d.dir, strings.NewReader(secret), c.App.ErrWriter, "secret", "put", "BRIDGE_SECRET"); err != nil {
		return fmt.Errorf("bridge deploy: the Worker is deployed, but 'wrangler secret put BRIDGE_SECRET' failed (%w; its output is above), so it does not accept %s's secret: run 'd1idem bridge deploy %s' again",
			err, d.secretPath, shellQuote(d.dir))
	}
	return nil
}

// printCommands prints the commands that deploy the bridge by hand, once
// the secret file holds a secret, and fails: nothing was deployed.
func (d *deployment) printCommands(w io.Writer, old string) error {
	if old == "" {
		d.created = true
		if err := writeSecret(d.secretPath, bridge.NewSecret()); err != nil {
			return err
		}
	}
	d.wrangler = "npx --yes wrangler@" + wranglerVersion
	if err := renderDeployCommands(w, d); err != nil {
		return err
	}
	return errors.New("bridge deploy: nothing was deployed: neither wrangler nor npx is on PATH; run the commands above")
}

// bridgeDir returns the bridge directory of deploy and serve, [DIR] or
// here, and its wrangler config, once it has checked that bridge init
// wrote it.
func bridgeDir(c *cli.Context) (string, *wrangler.Config, error) {
	if c.NArg() > 1 {
		return "", nil, usagef("%s takes at most one argument, the bridge's directory (got %d)", commandPath(c), c.NArg())
	}
	dir := c.Args().First()
	if dir == "" {
		dir = "."
	}
	for _, name := range []string{bridgeConfigFile, "worker.js", "ledger-statements.js"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			return "", nil, fmt.Errorf("%s has no %s: write the bridge there first with 'd1idem bridge init %s --database NAME'", dir, name, shellQuote(dir))
		}
	}
	cfg, err := wrangler.Load(filepath.Join(dir, bridgeConfigFile))
	if err != nil {
		return "", nil, err
	}
	if cfg.Main != "worker.js" || cfg.Name == "" {
		return "", nil, fmt.Errorf("%s is not a bridge's wrangler config (its main is %q, its name %q); write one with 'd1idem bridge init'", cfg.Path, cfg.Main, cfg.Name)
	}
	return dir, cfg, nil
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

// readSecret returns the secret kept at path, "" when there is none.
func readSecret(path string) (string, error) {
	data, err := os.ReadFile(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return "", nil
	case err != nil:
		return "", err
	}
	return checkSecretFile(path, data)
}

// writeSecret writes secret to the file at path, readable by its owner
// only.
func writeSecret(path, secret string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	return errors.Join(f.Chmod(0o600), writeString(f, secret), f.Close())
}

func writeString(w io.Writer, s string) error {
	_, err := io.WriteString(w, s)
	return err
}

// checkSecretFile returns the secret of a secret file, refusing one that
// others may read or that the bridge would not accept.
func checkSecretFile(path string, data []byte) (string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	if runtime.GOOS != "windows" && fi.Mode().Perm()&0o077 != 0 {
		return "", fmt.Errorf("%s is readable by others (mode %04o): 'chmod 600 %s' (and, if others did read it, rotate the secret: see docs/bridge.md)", path, fi.Mode().Perm(), shellQuote(path))
	}
	secret := strings.TrimSpace(string(data))
	if !bridge.ValidSecret(secret) {
		return "", fmt.Errorf("%s does not hold a secret the bridge accepts (16 to 4096 visible ASCII characters, no commas); delete it for a new one", path)
	}
	return secret, nil
}

// noteStaleModules says on w when dir's Worker modules are not this
// program's: another version of d1idem wrote them, or someone edited them.
func noteStaleModules(w io.Writer, dir string) {
	for _, f := range bridge.WorkerFiles() {
		data, err := os.ReadFile(filepath.Join(dir, f.Name))
		if err == nil && !bytes.Equal(data, f.Data) {
			fmt.Fprintf(w, "note: %s is not the one this d1idem ships (edited, or written by another version); 'd1idem bridge init %s --database ... --force' rewrites the bridge's files\n",
				filepath.Join(dir, f.Name), shellQuote(dir))
		}
	}
}

// wranglerCommand is how wrangler is run: wrangler on PATH, else npx
// running the tested version; nil when neither is on PATH.
func wranglerCommand() []string {
	if p, err := exec.LookPath("wrangler"); err == nil {
		return []string{p}
	}
	if p, err := exec.LookPath("npx"); err == nil {
		return []string{p, "--yes", "wrangler@" + wranglerVersion}
	}
	return nil
}

// wranglerEnv is wrangler's environment: this process's without
// CLOUDFLARE_ENV, since a bridge's wrangler.toml has no environments, and
// without D1IDEM_BRIDGE_URL, a secret wrangler has no use for.
func wranglerEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, wrangler.EnvVar+"=") && !strings.HasPrefix(kv, d1client.BridgeURLEnv+"=") {
			env = append(env, kv)
		}
	}
	return env
}

// runWrangler runs wrangler with args in dir, stdin as its standard input,
// its output passed to out; it returns its standard output.
func runWrangler(ctx context.Context, w []string, dir string, stdin io.Reader, out io.Writer, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, w[0], append(w[1:len(w):len(w)], args...)...)
	cmd.Dir, cmd.Env, cmd.Stdin = dir, wranglerEnv(), stdin
	var stdout bytes.Buffer
	// Both streams reach out, from two goroutines: one at a time.
	lw := &lockedWriter{w: out}
	cmd.Stdout, cmd.Stderr = io.MultiWriter(lw, &stdout), lw
	err := cmd.Run()
	return stdout.String(), err
}

// lockedWriter serializes the writes to w.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// deployedLine is a line of wrangler deploy's output naming one of the
// Worker's URLs.
var deployedLine = regexp.MustCompile(`(?m)^\s*(https://\S+)\s*$`)

// deployedURL returns the Worker's URL in wrangler deploy's output: its
// workers.dev URL, else the first https URL alone on a line; nil if none.
func deployedURL(out string) *url.URL {
	var found *url.URL
	for _, m := range deployedLine.FindAllStringSubmatch(out, -1) {
		u, err := url.Parse(m[1])
		if err != nil || u.Host == "" || u.User != nil {
			continue
		}
		if strings.HasSuffix(u.Hostname(), ".workers.dev") {
			return u
		}
		if found == nil {
			found = u
		}
	}
	return found
}

// bridgeURLCommand is the shell command that sets D1IDEM_BRIDGE_URL with
// the secret read from its file, so that the secret itself is not shown.
func (d *deployment) bridgeURLCommand() string {
	host := d.worker + ".<your-subdomain>.workers.dev"
	if d.url != nil {
		host = d.url.Host + strings.TrimSuffix(d.url.EscapedPath(), "/")
	}
	return fmt.Sprintf(`export %s="https://:$(cat %s)@%s"`, d1client.BridgeURLEnv, shellQuote(d.secretPath), host)
}

// renderDeploy reports a deployment and the one variable to set.
func renderDeploy(w io.Writer, d *deployment) error {
	where := "(wrangler printed no URL for it; pass --url)"
	if d.url != nil {
		where = "to " + d.url.String()
	}
	secret := "its secret"
	if d.created {
		secret = "a new secret"
	}
	fmt.Fprintf(w, "Deployed %s %s, with %s (BRIDGE_SECRET) from %s.\n", d.worker, where, secret, d.secretPath)
	fmt.Fprintf(w, "That file is the secret's only readable copy: mode 0600, left out of git by %s, never printed.\n", filepath.Join(d.dir, ".gitignore"))
	fmt.Fprintf(w, "Point your service and d1idem at the bridge with one variable, in place of the API base URL and token:\n\n   %s\n", d.bridgeURLCommand())
	if d.url == nil {
		fmt.Fprintf(w, "\n(with the Worker's host in place of the one above)\n")
	}
	if d.previous {
		fmt.Fprintf(w, "\nThe previous secret is still accepted (BRIDGE_SECRET_PREVIOUS): once every D1IDEM_BRIDGE_URL has the new one, retire it with\n\n   cd %s && %s secret delete BRIDGE_SECRET_PREVIOUS\n",
			shellQuote(d.dir), d.wrangler)
	}
	return nil
}

// renderDeployCommands prints the commands that deploy the bridge by hand.
func renderDeployCommands(w io.Writer, d *deployment) error {
	fmt.Fprintf(w, "Nothing was deployed: neither wrangler nor npx (Node.js 20 or later) is on PATH. With them, run:\n\n")
	fmt.Fprintf(w, "   cd %s\n   %s deploy\n   %s secret put BRIDGE_SECRET < %s\n\n", shellQuote(d.dir), d.wrangler, d.wrangler, bridgeSecretFile)
	fmt.Fprintf(w, "%s holds the bridge's secret: mode 0600, left out of git by %s, never printed.\n", d.secretPath, filepath.Join(d.dir, ".gitignore"))
	_, err := fmt.Fprintf(w, "Then point your service and d1idem at the bridge with one variable, in place of the API base URL and token:\n\n   %s\n", d.bridgeURLCommand())
	return err
}
