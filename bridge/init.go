package bridge

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/d1idem/d1idem/wrangler"
)

// The files of a bridge directory beside the Worker's modules.
const (
	configFile = "wrangler.toml"
	gitIgnore  = ".gitignore"
	// SecretFile holds the deployed Worker's secret, mode 0600.
	SecretFile = ".bridge-secret"
	// DevVars holds wrangler dev's secrets: the development secret.
	DevVars = ".dev.vars"
)

// ignored are the .gitignore lines of a bridge directory: its secrets and
// wrangler's local state.
var ignored = []string{SecretFile, DevVars, ".wrangler/"}

// Init writes the bridge of cfg into dir: the Worker's modules, its
// wrangler.toml (source, if not "", says where its databases came from), a
// .gitignore that keeps its secrets out of git, and a development secret
// in .dev.vars (mode 0600), which `wrangler dev` reads, unless it holds
// one. It returns the paths of the files it wrote or completed, sorted.
//
// It overwrites none of the bridge's files unless force is set, and never
// an application's wrangler.toml (one whose main is not worker.js), nor
// writes beside a wrangler.json or wrangler.jsonc, which wrangler would
// read instead.
func Init(dir string, cfg Config, source string, force bool) ([]string, error) {
	files := map[string][]byte{configFile: cfg.WranglerTOML(source)}
	for _, f := range WorkerFiles() {
		files[f.Name] = f.Data
	}
	if err := checkInit(dir, files, force); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	paths := []string{filepath.Join(dir, gitIgnore), filepath.Join(dir, DevVars)}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			return nil, err
		}
		paths = append(paths, filepath.Join(dir, name))
	}
	if err := ensureLines(filepath.Join(dir, gitIgnore), ignored); err != nil {
		return nil, err
	}
	if _, err := devSecret(filepath.Join(dir, DevVars)); err != nil {
		return nil, err
	}
	slices.Sort(paths)
	return paths, nil
}

// checkInit refuses to write files into dir beside another wrangler config,
// over existing files without force, or over an application's
// wrangler.toml.
func checkInit(dir string, files map[string][]byte, force bool) error {
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
	path := filepath.Join(dir, configFile)
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
	if len(data) > 0 && !bytes.HasSuffix(data, []byte("\n")) {
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
	return appendFile(path, add.String(), 0o644)
}

// appendFile appends s to the file at path, creating it with mode perm.
func appendFile(path, s string, perm os.FileMode) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, perm)
	if err != nil {
		return err
	}
	_, err = f.WriteString(s)
	return errors.Join(err, f.Close())
}

// devSecret returns BRIDGE_SECRET of the .dev.vars file at path (wrangler
// dev's secrets), adding a new one, and making the file with mode 0600,
// when it has none. A secret there that the bridge would refuse is an
// error.
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
		if !ValidSecret(v) {
			return "", fmt.Errorf("%s: BRIDGE_SECRET must be 16 to 4096 visible ASCII characters, no commas; delete the line for a new one", path)
		}
		return v, nil
	}
	secret := NewSecret()
	line := "BRIDGE_SECRET=" + secret + "\n"
	if len(data) > 0 && !bytes.HasSuffix(data, []byte("\n")) {
		line = "\n" + line
	}
	return secret, appendFile(path, line, 0o600)
}
