package d1idem_test

import (
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// goList runs `go list` with args in the module's root and returns the
// package paths it prints.
func goList(t *testing.T, args ...string) []string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("the go command is needed in CI: %v", err)
		}
		t.Skipf("the go command is not in PATH: %v", err)
	}
	out, err := exec.Command(goBin, append([]string{"list"}, args...)...).Output()
	if err != nil {
		t.Fatalf("go list %s: %v", strings.Join(args, " "), err)
	}
	return strings.Fields(string(out))
}

// TestLibrariesDoNotLinkSQLite: what a production binary imports never pulls
// in SQLite. Only d1local links it (and so the CLI, tests and the example's
// --local mode).
func TestLibrariesDoNotLinkSQLite(t *testing.T) {
	links := func(pkg string) bool {
		return slices.ContainsFunc(goList(t, "-deps", pkg), func(p string) bool { return strings.HasPrefix(p, "modernc.org/sqlite") })
	}
	if !links("./d1local") {
		t.Fatal("the check is broken: d1local should link modernc.org/sqlite")
	}
	for _, pkg := range []string{".", "./d1client", "./idem", "./schema", "./examples/orders/ordersapi"} {
		if links(pkg) {
			t.Errorf("%s links modernc.org/sqlite; find the import with `go list -deps -f '{{.ImportPath}}: {{.Imports}}' %s`", pkg, pkg)
		}
	}
}

// TestExamplesImportOnlyPublicPackages: a user can copy examples/ out of the
// module, tests included.
func TestExamplesImportOnlyPublicPackages(t *testing.T) {
	internal := func(pkg string) []string {
		var out []string
		for _, p := range goList(t, "-deps", "-test", pkg) {
			if strings.HasPrefix(p, "github.com/d1idem/d1idem/") && strings.Contains(p+"/", "/internal/") {
				out = append(out, p)
			}
		}
		return out
	}
	if len(internal("./internal/cli")) == 0 {
		t.Fatal("the check is broken: cli imports internal packages")
	}
	if got := internal("./examples/..."); len(got) > 0 {
		t.Errorf("examples/ import internal packages: %s", strings.Join(got, ", "))
	}
}
