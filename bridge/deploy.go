package bridge

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

	"github.com/d1idem/d1idem/internal/textsafe"
	"github.com/d1idem/d1idem/wrangler"
)

// WranglerVersion is the wrangler the bridge is tested with
// (conformance/package.json); Wrangler runs it through npx when wrangler
// is not on PATH.
const WranglerVersion = "4.86.0"

// Worker returns the name of the Worker of the bridge in dir, after
// checking that Init wrote it there: its files, and a bridge's wrangler.toml.
func Worker(dir string) (string, error) {
	for _, f := range append([]string{configFile}, workerModules...) {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			return "", fmt.Errorf("%s has no %s: write the bridge there first with 'd1idem bridge init %s --database NAME'", dir, f, textsafe.ShellQuote(dir))
		}
	}
	cfg, err := wrangler.Load(filepath.Join(dir, configFile))
	if err != nil {
		return "", err
	}
	if cfg.Main != "worker.js" || cfg.Name == "" {
		return "", fmt.Errorf("%s is not a bridge's wrangler config (its main is %q, its name %q); write one with 'd1idem bridge init'", cfg.Path, cfg.Main, cfg.Name)
	}
	return cfg.Name, nil
}

// StaleModules returns the paths of dir's Worker modules that are not the
// ones this package embeds: another version wrote them, or someone edited
// them.
func StaleModules(dir string) []string {
	var out []string
	for _, f := range WorkerFiles() {
		data, err := os.ReadFile(filepath.Join(dir, f.Name))
		if err == nil && !bytes.Equal(data, f.Data) {
			out = append(out, filepath.Join(dir, f.Name))
		}
	}
	return out
}

// ReadSecret returns the secret kept in dir's secret file (SecretFile), ""
// when there is none. A file others may read, or a secret the bridge would
// refuse, is an error.
func ReadSecret(dir string) (string, error) {
	path := filepath.Join(dir, SecretFile)
	data, err := os.ReadFile(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return "", nil
	case err != nil:
		return "", err
	}
	fi, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	if runtime.GOOS != "windows" && fi.Mode().Perm()&0o077 != 0 {
		return "", &ReadableError{Path: path, Mode: fi.Mode().Perm()}
	}
	secret := strings.TrimSpace(string(data))
	if !ValidSecret(secret) {
		return "", fmt.Errorf("%s does not hold a secret the bridge accepts (16 to 4096 visible ASCII characters, no commas); delete it for a new one", path)
	}
	return secret, nil
}

// ReadableError is ReadSecret's error for a secret file that others may
// read.
type ReadableError struct {
	Path string
	Mode os.FileMode
}

func (e *ReadableError) Error() string {
	return fmt.Sprintf("%s is readable by others (mode %04o)", e.Path, e.Mode)
}

// EnsureSecret makes dir's secret file hold a new secret when it holds
// none, and reports whether it did.
func EnsureSecret(dir string) (bool, error) {
	old, err := ReadSecret(dir)
	if err != nil || old != "" {
		return false, err
	}
	return true, writeSecret(dir, NewSecret())
}

// writeSecret writes secret to dir's secret file, readable by its owner
// only.
func writeSecret(dir, secret string) error {
	f, err := os.OpenFile(filepath.Join(dir, SecretFile), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, werr := f.WriteString(secret)
	return errors.Join(f.Chmod(0o600), werr, f.Close())
}

// Wrangler is the command that runs wrangler: wrangler on PATH, else npx
// running WranglerVersion; nil when neither is on PATH.
func Wrangler() []string {
	if p, err := exec.LookPath("wrangler"); err == nil {
		return []string{p}
	}
	if p, err := exec.LookPath("npx"); err == nil {
		return []string{p, "--yes", "wrangler@" + WranglerVersion}
	}
	return nil
}

// Deployment is what Deploy did.
type Deployment struct {
	// URL is the Worker's, as wrangler deploy printed it (its workers.dev
	// URL first); nil when it printed none.
	URL *url.URL
	// NewSecret reports a secret made by this deploy.
	NewSecret bool
	// Previous reports that the old secret stays accepted, as
	// BRIDGE_SECRET_PREVIOUS.
	Previous bool
}

// SecretError is Deploy's error when the Worker is deployed but its secret
// could not be set: it accepts no request with the secret file's secret
// until a deploy succeeds.
type SecretError struct {
	Path string // the secret file
	Err  error
}

func (e *SecretError) Error() string {
	return fmt.Sprintf("the Worker is deployed, but 'wrangler secret put BRIDGE_SECRET' failed (%v; its output is above), so it does not accept %s's secret", e.Err, e.Path)
}

func (e *SecretError) Unwrap() error { return e.Err }

// Deploy deploys the bridge in dir with the wrangler command w (see
// Wrangler), passing wrangler's output to out, then sets its secret with
// `wrangler secret put BRIDGE_SECRET`, on wrangler's standard input: the
// one of dir's secret file, or a new one when there is none or rotate is
// set. Rotating keeps the old secret accepted as BRIDGE_SECRET_PREVIOUS,
// and writes the new one to the file only once the old one is set there:
// whatever step fails, deploying again completes the rotation. wrangler
// runs without CLOUDFLARE_ENV (a bridge's wrangler.toml has no
// environments) and without D1IDEM_BRIDGE_URL, a secret it has no use for.
func Deploy(ctx context.Context, dir string, w []string, rotate bool, out io.Writer) (Deployment, error) {
	var d Deployment
	old, err := ReadSecret(dir)
	if err != nil {
		return d, err
	}
	secret := old
	if old == "" || rotate {
		secret, d.NewSecret = NewSecret(), true
	}
	if old == "" {
		if err := writeSecret(dir, secret); err != nil {
			return d, err
		}
	}
	stdout, err := run(ctx, w, dir, nil, out, "deploy")
	if err != nil {
		return d, fmt.Errorf("'wrangler deploy' failed (%w; its output is above); nothing else was done", err)
	}
	d.URL = deployedURL(stdout)
	if rotate && old != "" {
		if _, err := run(ctx, w, dir, strings.NewReader(old), out, "secret", "put", "BRIDGE_SECRET_PREVIOUS"); err != nil {
			return d, fmt.Errorf("'wrangler secret put BRIDGE_SECRET_PREVIOUS' failed (%w; its output is above); the secret was not rotated", err)
		}
		d.Previous = true
		if err := writeSecret(dir, secret); err != nil {
			return d, err
		}
	}
	if _, err := run(ctx, w, dir, strings.NewReader(secret), out, "secret", "put", "BRIDGE_SECRET"); err != nil {
		return d, &SecretError{Path: filepath.Join(dir, SecretFile), Err: err}
	}
	return d, nil
}

// run runs wrangler with args in dir, stdin as its standard input, its
// output passed to out; it returns its standard output.
func run(ctx context.Context, w []string, dir string, stdin io.Reader, out io.Writer, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, w[0], append(w[1:len(w):len(w)], args...)...)
	cmd.Dir, cmd.Stdin = dir, stdin
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, wrangler.EnvVar+"=") && !strings.HasPrefix(kv, "D1IDEM_BRIDGE_URL=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
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
