package d1idem_test

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The TestLint tests hold the tree to the layering rules of CONTRIBUTING.md
// and to its size limits; `make lint` runs them (go test -run '^TestLint' .),
// and so does `make test`.

const module = "github.com/d1idem/d1idem"

// Package sets of the layering rules.
var (
	// core are the library packages a user's production binary imports.
	core = []string{module, module + "/d1client", module + "/d1client/budget", module + "/idem", module + "/idem/idemhttp", module + "/schema", module + "/idemclient",
		module + "/console"}
	// libraries are every public package that is not a program or an
	// example: core, the local D1 with its test server, and the wrangler
	// config reader.
	libraries = append(slices.Clone(core), module+"/d1local", module+"/d1local/d1localtest", module+"/wrangler")
	// testHelpers are imported by tests only.
	testHelpers = []string{module + "/internal/d1test", module + "/internal/specseq", module + "/internal/oteltest"}
	// leafHelpers are the internal packages the library shares: each
	// imports no package of this module.
	leafHelpers = []string{module + "/internal/jsonstr", module + "/internal/jsonscan", module + "/internal/textcache", module + "/internal/sqlite",
		module + "/internal/redact", module + "/internal/loopback", module + "/internal/otelscope", module + "/internal/human", module + "/internal/textsafe"}
	// ordersAPI is the example's orders API, which the demo plays against,
	// and ordersDemo the story it plays.
	ordersAPI  = module + "/examples/orders/ordersapi"
	ordersDemo = module + "/examples/orders/ordersdemo"
)

// goList runs `go list` with args in the module's root and returns its
// output's lines.
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
	return strings.Split(strings.TrimSpace(string(out)), "\n")
}

// deps maps every package of the module to its dependencies (not those of
// its tests).
func deps(t *testing.T) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, line := range goList(t, "-f", `{{.ImportPath}} {{join .Deps " "}}`, "./...") {
		f := strings.Fields(line)
		out[f[0]] = f[1:]
	}
	return out
}

// under reports whether pkg is prefix or a package below it.
func under(pkg, prefix string) bool { return pkg == prefix || strings.HasPrefix(pkg, prefix+"/") }

// TestLintLayering: the arrows of CONTRIBUTING.md point one way.
func TestLintLayering(t *testing.T) {
	all := deps(t)
	if !slices.Contains(all[module+"/cmd/d1idem"], module+"/cli") {
		t.Fatal("the check is broken: cmd/d1idem should depend on cli")
	}
	forbid := func(pkgs []string, why string, bad func(dep string) bool) {
		t.Helper()
		for _, pkg := range pkgs {
			for _, dep := range all[pkg] {
				if bad(dep) {
					t.Errorf("%s imports %s: %s; find the import with `go list -deps -f '{{.ImportPath}}: {{.Imports}}' %s`", pkg, dep, why, pkg)
				}
			}
		}
	}
	forbid(libraries, "a library imports neither the CLI, nor an example, nor a test helper, nor a development tool", func(dep string) bool {
		return under(dep, module+"/cli") || under(dep, module+"/examples") || slices.Contains(testHelpers, dep) || under(dep, module+"/tools")
	})
	// internal/ holds leaf helpers, which import nothing above them, and
	// test helpers, which only tests import.
	forbid(leafHelpers, "a leaf helper of internal/ imports no package of this module", func(dep string) bool { return under(dep, module) })
	for pkg := range all {
		if under(pkg, module+"/internal") && !slices.Contains(leafHelpers, pkg) && !slices.Contains(testHelpers, pkg) {
			t.Errorf("%s is neither a leaf helper nor a test helper: internal/ holds only those (CONTRIBUTING.md); add it to the lists of deps_test.go, or move it", pkg)
		}
		if !slices.Contains(testHelpers, pkg) {
			forbid([]string{pkg}, "only tests import a test helper", func(dep string) bool { return slices.Contains(testHelpers, dep) })
		}
	}
	forbid(core, "a core library does not import the local D1 (d1local, d1localtest)", func(dep string) bool {
		return under(dep, module+"/d1local")
	})
	// The API budget is a package of its own, which never depends on the
	// client that spends it.
	if !slices.Contains(all[module+"/d1client"], module+"/d1client/budget") {
		t.Fatal("the check is broken: d1client should depend on d1client/budget")
	}
	forbid([]string{module + "/d1client/budget"}, "the API budget imports no package of this module", func(dep string) bool {
		return under(dep, module)
	})
	// The wrangler config reader is a leaf any program can use.
	forbid([]string{module + "/wrangler"}, "the wrangler config reader imports no package of this module", func(dep string) bool {
		return under(dep, module)
	})
	// The client half of the protocol is for any Go client: it links
	// nothing of the server's (this module, D1, OpenTelemetry), only the
	// standard library.
	if !slices.Contains(all[module+"/idemclient"], "net/http") {
		t.Fatal("the check is broken: idemclient should depend on net/http")
	}
	forbid([]string{module + "/idemclient"}, "the client imports only the standard library", func(dep string) bool {
		return !standard(dep)
	})
	// The ledger knows no transport: the middleware is built on its
	// exported API, as any other transport would be.
	if !slices.Contains(all[module+"/idem/idemhttp"], module+"/idem") {
		t.Fatal("the check is broken: idem/idemhttp should depend on idem")
	}
	forbid([]string{module + "/idem"}, "the ledger imports none of its transports", func(dep string) bool {
		return strings.HasPrefix(dep, module+"/idem/")
	})
	// The console is a handler an application can mount in its own admin
	// server: built on idem's administrative API, it imports neither the
	// CLI nor the CLI's flag library.
	if !slices.Contains(all[module+"/console"], module+"/idem") {
		t.Fatal("the check is broken: console should depend on idem")
	}
	forbid([]string{module + "/console"}, "the console imports neither the CLI nor urfave/cli", func(dep string) bool {
		return under(dep, module+"/cli") || under(dep, "github.com/urfave/cli")
	})
	// A library uses OpenTelemetry's API only; the application picks the
	// SDK and the exporter (docs/observability.md).
	forbid(core, "a core library links no telemetry SDK, exporter or Prometheus client", telemetrySDK)
	if !slices.Contains(all[module+"/examples/orders"], "go.opentelemetry.io/otel/exporters/prometheus") {
		t.Fatal("the check is broken: examples/orders should link the Prometheus exporter")
	}
	programs := []string{module + "/cli", module + "/cmd/d1idem"}
	if !slices.Contains(all[module+"/cli"], ordersAPI) || !slices.Contains(all[module+"/cli"], ordersDemo) {
		t.Fatal("the check is broken: the CLI's demo should play " + ordersDemo + " against " + ordersAPI)
	}
	forbid(programs, "the CLI imports no example but the orders API and the story its demo plays, and no test helper", func(dep string) bool {
		return under(dep, module+"/examples") && dep != ordersAPI && dep != ordersDemo || slices.Contains(testHelpers, dep) || under(dep, module+"/tools")
	})
	// The CLI is a program: its demo reads the story's metrics with the
	// SDK's ManualReader. The first `go run ./cmd/d1idem demo` compiles all
	// of it: no exporter, Prometheus client or trace SDK.
	forbid(programs, "the CLI links no telemetry exporter, Prometheus client or trace SDK", func(dep string) bool {
		return telemetrySDK(dep) && !under(dep, "go.opentelemetry.io/otel/sdk/metric") && dep != "go.opentelemetry.io/otel/sdk" &&
			!under(dep, "go.opentelemetry.io/otel/sdk/resource") && !under(dep, "go.opentelemetry.io/otel/sdk/instrumentation") &&
			!under(dep, "go.opentelemetry.io/otel/sdk/internal")
	})
}

// standard reports whether a package is in the standard library (its
// vendored packages included): the first element of its path has no dot.
func standard(pkg string) bool {
	first, _, _ := strings.Cut(pkg, "/")
	return !strings.Contains(first, ".")
}

// telemetrySDK reports whether a package is an OpenTelemetry SDK or
// exporter, or Prometheus's client: what an application, never a library,
// chooses.
func telemetrySDK(dep string) bool {
	return under(dep, "go.opentelemetry.io/otel/sdk") || under(dep, "go.opentelemetry.io/otel/exporters") ||
		under(dep, "github.com/prometheus")
}

// TestLintNoSQLiteInLibraries: what a production binary imports never pulls
// in SQLite. Only d1local links it (and so the CLI, tests and the example's
// --local mode).
func TestLintNoSQLiteInLibraries(t *testing.T) {
	all := deps(t)
	links := func(pkg string) bool {
		return slices.ContainsFunc(all[pkg], func(p string) bool { return under(p, "modernc.org/sqlite") })
	}
	if !links(module + "/d1local") {
		t.Fatal("the check is broken: d1local should link modernc.org/sqlite")
	}
	for _, pkg := range append(slices.Clone(core), ordersAPI, ordersDemo) {
		if links(pkg) {
			t.Errorf("%s links modernc.org/sqlite; find the import with `go list -deps -f '{{.ImportPath}}: {{.Imports}}' %s`", pkg, pkg)
		}
	}
}

// TestLintExamplesPublicOnly: a user can copy examples/ out of the module,
// tests included: no package of examples/ imports an internal package
// itself (the public packages it imports may use their own).
func TestLintExamplesPublicOnly(t *testing.T) {
	internal := func(pattern string) []string {
		var out []string
		for _, line := range goList(t, "-f", "{{.ImportPath}} {{.Imports}} {{.TestImports}} {{.XTestImports}}", pattern) {
			for _, p := range strings.Fields(strings.NewReplacer("[", " ", "]", " ").Replace(line))[1:] {
				if under(p, module) && strings.Contains(p+"/", "/internal/") {
					out = append(out, line[:strings.IndexByte(line, ' ')]+" imports "+p)
				}
			}
		}
		return out
	}
	if len(internal("./cli")) == 0 {
		t.Fatal("the check is broken: cli imports cli/internal/...")
	}
	if got := internal("./examples/..."); len(got) > 0 {
		t.Errorf("examples/ import internal packages: %s", strings.Join(got, ", "))
	}
}

// maxFuncLines bounds the functions of the CLI: one function per command,
// each doing one thing.
const maxFuncLines = 60

// TestLintShortFunctions: no function of cli (tests aside) is
// longer than maxFuncLines lines, from its func keyword to its closing
// brace.
func TestLintShortFunctions(t *testing.T) {
	fset := token.NewFileSet()
	checked := 0
	err := filepath.WalkDir("cli", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok {
				continue
			}
			checked++
			if n := fset.Position(fn.End()).Line - fset.Position(fn.Pos()).Line + 1; n > maxFuncLines {
				t.Errorf("%s: %s is %d lines long; split it (at most %d)", fset.Position(fn.Pos()), fn.Name.Name, n, maxFuncLines)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 50 {
		t.Fatalf("the check is broken: only %d functions found under cli", checked)
	}
}

// maxCLILines bounds the CLI: every line (comments and blank lines
// included) of its files but the tests and their testdata, the commands'
// help texts (help.txt) with its Go. It resolves flags, calls the library
// and prints; what is not about flags or printing belongs in the library
// packages.
const maxCLILines = 5000

// TestLintCLISize: cli (tests and testdata aside) holds at most
// maxCLILines lines.
func TestLintCLISize(t *testing.T) {
	lines, files, goFiles := 0, 0, 0
	err := filepath.WalkDir("cli", func(path string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case d.IsDir() && d.Name() == "testdata":
			return filepath.SkipDir
		case d.IsDir() || strings.HasSuffix(path, "_test.go"):
			return nil
		}
		b, err := os.ReadFile(path)
		files++
		if strings.HasSuffix(path, ".go") {
			goFiles++
		}
		lines += strings.Count(string(b), "\n")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if goFiles < 10 || files == goFiles || lines < 1000 {
		t.Fatalf("the check is broken: %d lines in %d files (%d of Go) under cli", lines, files, goFiles)
	}
	if lines > maxCLILines {
		t.Errorf("cli holds %d lines (tests and testdata aside, help.txt included), more than %d: move what is not about flags or printing into the library", lines, maxCLILines)
	}
}

// frameworks are the module paths of the web frameworks and RPC systems the
// adapters of contrib/ bring; the core module requires none of them.
var frameworks = []string{"github.com/gin-gonic/", "github.com/labstack/", "google.golang.org/grpc"}

// goCmd runs the go command outside any workspace (go.work), in dir, and
// returns its output.
func goCmd(t *testing.T, dir string, args ...string) []byte {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("the go command is needed in CI: %v", err)
		}
		t.Skipf("the go command is not in PATH: %v", err)
	}
	cmd := exec.Command(goBin, args...)
	cmd.Dir, cmd.Env = dir, append(os.Environ(), "GOWORK=off")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go %s in %s: %v", strings.Join(args, " "), dir, err)
	}
	return out
}

// goMod is what `go mod edit -json` says of a go.mod.
type goMod struct {
	Module  struct{ Path string }
	Require []requirement
	Replace []struct {
		Old, New struct{ Path, Version string }
	}
}

type requirement struct {
	Path, Version string
	Indirect      bool
}

func readGoMod(t *testing.T, dir string) goMod {
	t.Helper()
	var m goMod
	if err := json.Unmarshal(goCmd(t, dir, "mod", "edit", "-json"), &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// TestLintCoreRequiresNoFramework: the core module requires no framework,
// directly or not: the adapters are modules of their own, under contrib/.
func TestLintCoreRequiresNoFramework(t *testing.T) {
	m := readGoMod(t, ".")
	if m.Module.Path != module || len(m.Require) < 5 {
		t.Fatalf("the check is broken: go.mod read as %+v", m)
	}
	all := strings.Fields(string(goCmd(t, ".", "list", "-m", "-f", "{{.Path}}", "all")))
	if !slices.Contains(all, "modernc.org/sqlite") {
		t.Fatal("the check is broken: the core's build list should hold modernc.org/sqlite")
	}
	for _, p := range all {
		if slices.ContainsFunc(frameworks, func(f string) bool { return strings.HasPrefix(p, f) }) {
			t.Errorf("the core module's build list holds %s; an adapter belongs in a module of its own under contrib/ (`go mod why -m %s`)", p, p)
		}
	}
}

// TestLintContribModules: each module of contrib/ requires the core at
// v0.0.0 with a replace to this tree (until the first tag), is in go.work,
// and imports only the core's public packages (Go's internal rule would let
// it, being under this tree, but a user's build pairs it with a released
// core whose internals differ).
func TestLintContribModules(t *testing.T) {
	mods, err := filepath.Glob("contrib/*/go.mod")
	if err != nil || len(mods) < 2 {
		t.Fatalf("the check is broken: contrib modules %v, %v", mods, err)
	}
	work, err := os.ReadFile("go.work")
	if err != nil {
		t.Fatal(err)
	}
	for _, gm := range mods {
		dir := filepath.Dir(gm)
		m := readGoMod(t, dir)
		if m.Module.Path != module+"/"+filepath.ToSlash(dir) {
			t.Errorf("%s: module %s, want %s", gm, m.Module.Path, module+"/"+filepath.ToSlash(dir))
		}
		if !slices.Contains(m.Require, requirement{module, "v0.0.0", false}) {
			t.Errorf("%s does not require %s v0.0.0", gm, module)
		}
		if len(m.Replace) != 1 || m.Replace[0].Old.Path != module || m.Replace[0].New.Path != "../.." {
			t.Errorf("%s: replace %+v, want %s => ../..", gm, m.Replace, module)
		}
		if !strings.Contains(string(work), "./"+filepath.ToSlash(dir)+"\n") {
			t.Errorf("go.work does not use ./%s: run `go work use ./%s`", dir, dir)
		}
		out := goCmd(t, dir, "list", "-f", "{{.ImportPath}} {{.Imports}} {{.TestImports}} {{.XTestImports}}", "./...")
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			for _, p := range strings.Fields(strings.NewReplacer("[", " ", "]", " ").Replace(line))[1:] {
				if under(p, module+"/internal") {
					t.Errorf("%s imports %s: an adapter uses the core's public API only", strings.Fields(line)[0], p)
				}
			}
		}
	}
}
