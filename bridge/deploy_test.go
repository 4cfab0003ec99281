package bridge

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/d1idem/d1idem/internal/d1test"
	"github.com/d1idem/d1idem/internal/textsafe"
)

// The wrangler that Deploy runs through npx is the one the tests pin
// (conformance/package.json).
func TestWranglerVersionIsThePinnedOne(t *testing.T) {
	root, err := d1test.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(root, "conformance", "package.json"))
	if err != nil {
		t.Fatal(err)
	}
	var pkg struct {
		Dependencies map[string]string `json:"dependencies"`
	}
	if err := json.Unmarshal(data, &pkg); err != nil {
		t.Fatal(err)
	}
	if got := pkg.Dependencies["wrangler"]; got != WranglerVersion {
		t.Errorf("conformance/package.json pins wrangler %q; Deploy runs %q", got, WranglerVersion)
	}
}

// Init writes the Worker, its wrangler.toml, the .gitignore lines and a
// development secret, once; it overwrites the bridge's files only with
// force, and never an application's wrangler.toml.
func TestInit(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "bridge")
	cfg := Config{Worker: "w", Mode: "full", Databases: []Database{{"orders-db", "6b4c", "ORDERS_DB"}}}
	files, err := Init(dir, cfg, "", false)
	want := []string{".dev.vars", ".gitignore", "ledger-statements.js", "worker.js", "wrangler.toml"}
	for i := range want {
		want[i] = filepath.Join(dir, want[i])
	}
	if err != nil || !slices.Equal(files, want) {
		t.Fatalf("Init = %q, %v", files, err)
	}
	secret, err := devSecret(filepath.Join(dir, DevVars))
	if err != nil || !ValidSecret(secret) {
		t.Fatalf("the development secret %q, %v", secret, err)
	}
	if fi, _ := os.Stat(filepath.Join(dir, DevVars)); runtime.GOOS != "windows" && fi.Mode().Perm() != 0o600 {
		t.Errorf(".dev.vars has mode %04o", fi.Mode().Perm())
	}
	if _, err := Init(dir, cfg, "", false); err == nil || !strings.Contains(err.Error(), "already exist; nothing was written: pass --force") {
		t.Errorf("a second Init without force: %v", err)
	}
	if _, err := Init(dir, cfg, "", true); err != nil {
		t.Fatal(err)
	}
	if s, _ := devSecret(filepath.Join(dir, DevVars)); s != secret {
		t.Error("Init with force replaced the development secret")
	}
	if data, _ := os.ReadFile(filepath.Join(dir, ".gitignore")); string(data) != ".bridge-secret\n.dev.vars\n.wrangler/\n" {
		t.Errorf(".gitignore after two writes: %q", data)
	}
	app := t.TempDir()
	if err := os.WriteFile(filepath.Join(app, "wrangler.toml"), []byte("name = \"app\"\nmain = \"src/index.ts\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Init(app, cfg, "", true); err == nil || !strings.Contains(err.Error(), "is not a bridge's wrangler config") {
		t.Errorf("over an application's wrangler.toml: %v", err)
	}
	// Worker names the bridge Init wrote, and a file it lacks.
	if w, err := Worker(dir); w != "w" || err != nil {
		t.Errorf("Worker = %q, %v", w, err)
	}
	if err := os.Remove(filepath.Join(dir, "worker.js")); err != nil {
		t.Fatal(err)
	}
	if _, err := Worker(dir); err == nil || err.Error() != dir+" has no worker.js: write the bridge there first with 'd1idem bridge init "+dir+" --database NAME'" {
		t.Errorf("Worker without worker.js: %v", err)
	}
	// A directory the shell would split is quoted in the command to paste.
	spaced := filepath.Join(t.TempDir(), "my bridge's dir")
	if _, err := Worker(spaced); err == nil || !strings.HasSuffix(err.Error(), "'d1idem bridge init "+textsafe.ShellQuote(spaced)+" --database NAME'") || textsafe.ShellQuote(spaced) == spaced {
		t.Errorf("Worker in %q: %v", spaced, err)
	}
}

// ReadSecret refuses a secret file others may read, and a secret the
// bridge would refuse; EnsureSecret makes one once.
func TestSecretFile(t *testing.T) {
	dir := t.TempDir()
	if s, err := ReadSecret(dir); s != "" || err != nil {
		t.Fatalf("no file: %q, %v", s, err)
	}
	for i, want := range []bool{true, false} {
		if made, err := EnsureSecret(dir); made != want || err != nil {
			t.Fatalf("EnsureSecret %d = %v, %v", i, made, err)
		}
	}
	if s, err := ReadSecret(dir); !ValidSecret(s) || err != nil {
		t.Fatalf("ReadSecret = %q, %v", s, err)
	}
	if runtime.GOOS != "windows" {
		if err := os.Chmod(filepath.Join(dir, SecretFile), 0o640); err != nil {
			t.Fatal(err)
		}
		var re *ReadableError
		if _, err := ReadSecret(dir); !errors.As(err, &re) || re.Mode != 0o640 {
			t.Errorf("a secret others may read: %v", err)
		}
	}
	if err := writeSecret(dir, "short"); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadSecret(dir); err == nil || !strings.Contains(err.Error(), "does not hold a secret the bridge accepts") {
		t.Errorf("a short secret: %v", err)
	}
}

// The Worker's URL in wrangler deploy's output: its workers.dev URL first.
func TestDeployedURL(t *testing.T) {
	for out, want := range map[string]string{
		"Uploaded w\n  https://d1.example.com\n  https://w.acct.workers.dev\nCurrent Version ID: x\n": "https://w.acct.workers.dev",
		"Deployed w triggers\n  https://d1.example.com/bridge\n":                                      "https://d1.example.com/bridge",
		"see https://dash.cloudflare.com for more\n  https://:secret@x.workers.dev\n":                 "",
	} {
		got := ""
		if u := deployedURL(out); u != nil {
			got = u.String()
		}
		if got != want {
			t.Errorf("deployedURL(%q) = %q, want %q", out, got, want)
		}
	}
}
