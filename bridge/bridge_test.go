package bridge_test

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/d1idem/d1idem/bridge"
	"github.com/d1idem/d1idem/internal/d1test"
)

// The files `d1idem bridge init` writes are the ones every workerd test
// runs: conformance/server.mjs loads <repo>/bridge/worker.js (and what it
// imports) unless BRIDGE_DIR says otherwise, and d1test never says
// otherwise. Every module worker.js imports is embedded, and every .js
// file here is one of the Worker's modules. The compatibility date is the
// tests' and the template's.
func TestEmbeddedFilesAreTheTestedOnes(t *testing.T) {
	root, err := d1test.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	server, err := os.ReadFile(filepath.Join(root, "conformance", "server.mjs"))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{`process.env.BRIDGE_DIR || path.join(here, "..", "bridge")`, `scriptPath: path.join(bridgeDir, "worker.js")`,
		`const compatibilityDate = "` + bridge.CompatibilityDate + `"`} {
		if !bytes.Contains(server, []byte(s)) {
			t.Errorf("conformance/server.mjs no longer says %s: check that the tests still run this directory's Worker", s)
		}
	}
	d1test, err := os.ReadFile(filepath.Join(root, "internal", "d1test", "workerd.go"))
	if err != nil || bytes.Contains(d1test, []byte("BRIDGE_DIR")) {
		t.Errorf("internal/d1test sets BRIDGE_DIR, or could not be read (%v): the tests would not run this directory's Worker", err)
	}
	var names []string
	for _, f := range bridge.WorkerFiles() {
		names = append(names, f.Name)
		disk, err := os.ReadFile(filepath.Join(root, "bridge", f.Name))
		if err != nil || !bytes.Equal(disk, f.Data) {
			t.Errorf("the embedded %s differs from bridge/%s (%v)", f.Name, f.Name, err)
		}
	}
	if names[0] != "worker.js" {
		t.Errorf("the main module comes first: %v", names)
	}
	imports := regexp.MustCompile(`(?m)^import .* from "\./([^"]+)";`).FindAllStringSubmatch(string(bridge.WorkerFiles()[0].Data), -1)
	if len(imports) == 0 {
		t.Fatal("the check is broken: worker.js imports ledger-statements.js")
	}
	for _, m := range imports {
		if !slices.Contains(names, m[1]) {
			t.Errorf("worker.js imports ./%s, which is not embedded", m[1])
		}
	}
	js, _ := filepath.Glob("*.js")
	for _, f := range js {
		if !slices.Contains(names, f) {
			t.Errorf("%s is not one of the embedded modules", f)
		}
	}
	if !bytes.Contains(bridge.WranglerExample(), []byte(`compatibility_date = "`+bridge.CompatibilityDate+`"`)) {
		t.Errorf("wrangler.toml.example's compatibility_date is not %s", bridge.CompatibilityDate)
	}
	if disk, _ := os.ReadFile("wrangler.toml.example"); !bytes.Equal(disk, bridge.WranglerExample()) {
		t.Error("the embedded wrangler.toml.example differs from the file")
	}
	if !strings.HasPrefix(string(bridge.WorkerFiles()[1].Data), "// Code generated") {
		t.Error("ledger-statements.js is not the generated list")
	}
}
