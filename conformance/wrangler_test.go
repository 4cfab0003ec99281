package conformance

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	osexec "os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/internal/d1test"
)

// The wrangler-interop tests run the wrangler pinned in package.json
// (4.86.0) against a d1local server on 127.0.0.1, as a user would point it
// there with CLOUDFLARE_API_BASE_URL. Each wrangler run starts Node afresh
// (about a second), so the groups run in parallel, each in its own project
// directory and HOME, so that nothing touches the real user's config.

// wranglerToken is the API token d1local requires in these tests.
const wranglerToken = "interop-token"

// wranglerEnv is a d1local server and the pinned wrangler to drive it.
type wranglerEnv struct {
	node, script string
	srv          *d1local.Server
	url          string // the server's base URL, without /client/v4
}

// newWranglerEnv starts d1local (with a token, databases in a temporary
// directory) and finds Node and wrangler. Without them the test is skipped,
// or fails when the CI environment variable is set.
func newWranglerEnv(t *testing.T) *wranglerEnv {
	t.Helper()
	skip := func(reason string) {
		t.Helper()
		if os.Getenv("CI") != "" {
			t.Fatalf("wrangler interop cannot run in CI: %s; install Node >= 20 and run `npm ci` in conformance/ (or `make test`)", reason)
		}
		t.Skipf("wrangler interop skipped: %s; run `make test` with Node 20 and npm to include it", reason)
	}
	node := os.Getenv(d1test.EnvNode)
	if node == "" {
		node = "node"
	}
	node, err := osexec.LookPath(node)
	if err != nil {
		skip("node not found in PATH")
	}
	dir := os.Getenv(d1test.EnvConformanceDir)
	if dir == "" {
		root, err := d1test.RepoRoot()
		if err != nil {
			skip(err.Error())
		}
		dir = filepath.Join(root, "conformance")
	}
	script := filepath.Join(dir, "node_modules", "wrangler", "bin", "wrangler.js")
	if _, err := os.Stat(script); err != nil {
		skip(script + " is missing")
	}
	srv, err := d1local.New(d1local.Config{Dir: t.TempDir(), Token: wranglerToken})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv) // 127.0.0.1
	t.Cleanup(func() {
		ts.Close()
		if err := srv.Close(); err != nil {
			t.Errorf("closing d1local: %v", err)
		}
	})
	return &wranglerEnv{node: node, script: script, srv: srv, url: ts.URL}
}

// project makes a project directory with a wrangler.toml whose
// d1_databases name each of dbs (database_id = database_name, as d1local
// names databases), and files relative to it.
func (w *wranglerEnv) project(t *testing.T, dbs []string, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	toml := "name = \"interop\"\ncompatibility_date = \"2026-04-26\"\n"
	for _, db := range dbs {
		toml += "\n[[d1_databases]]\nbinding = \"" + strings.ToUpper(db) + "\"\ndatabase_name = \"" + db + "\"\ndatabase_id = \"" + db + "\"\n"
	}
	files["wrangler.toml"] = toml
	for name, content := range files {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// wranglerRun is the outcome of one wrangler command.
type wranglerRun struct {
	stdout, output string // stdout alone; stdout then stderr, colors removed
	err            error  // non-nil for a non-zero exit
}

var ansi = regexp.MustCompile("\x1b\\[[0-9;]*m")

// run runs wrangler args in project dir. env holds overrides of the
// defaults (token, account ID); an empty value removes the variable.
func (w *wranglerEnv) run(t *testing.T, dir string, env map[string]string, args ...string) wranglerRun {
	t.Helper()
	home := t.TempDir()
	vars := map[string]string{
		"PATH":                        os.Getenv("PATH"),
		"HOME":                        home,
		"XDG_CONFIG_HOME":             filepath.Join(home, ".config"),
		"WRANGLER_SEND_METRICS":       "false",
		"WRANGLER_SEND_ERROR_REPORTS": "false",
		"WRANGLER_HIDE_BANNER":        "true",
		"NO_COLOR":                    "1",
		"FORCE_COLOR":                 "0",
		"CLOUDFLARE_API_BASE_URL":     w.url + "/client/v4",
		"CLOUDFLARE_API_TOKEN":        wranglerToken,
		"CLOUDFLARE_ACCOUNT_ID":       d1local.DefaultAccountID,
	}
	for k, v := range env {
		vars[k] = v
	}
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	cmd := osexec.CommandContext(ctx, w.node, append([]string{w.script}, args...)...)
	cmd.Dir = dir
	cmd.Env = []string{}
	for k, v := range vars {
		if v != "" {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	r := wranglerRun{stdout: stdout.String(), output: ansi.ReplaceAllString(stdout.String()+stderr.String(), ""), err: err}
	t.Logf("wrangler %s: %v\n%s", strings.Join(args, " "), err, r.output)
	return r
}

// mustJSON decodes a run's stdout, failing the test on a failed run.
func (r wranglerRun) mustJSON(t *testing.T, v any) {
	t.Helper()
	if r.err != nil {
		t.Fatalf("wrangler failed: %v\n%s", r.err, r.output)
	}
	// d1 execute --file prints its progress to stdout before the JSON.
	out := r.stdout
	if !strings.HasPrefix(out, "[") && !strings.HasPrefix(out, "{") {
		if j := strings.IndexAny(out, "[{"); j > 0 && out[j-1] == '\n' {
			out = out[j:]
		}
	}
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("wrangler's output is not the JSON expected: %v\n%s", err, r.stdout)
	}
}

// query runs SQL on a d1local database directly.
func (w *wranglerEnv) query(t *testing.T, db, sql string) string {
	t.Helper()
	body, _ := json.Marshal(map[string]string{"sql": sql})
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost,
		w.url+"/client/v4/accounts/"+d1local.DefaultAccountID+"/d1/database/"+db+"/query", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+wranglerToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var env struct {
		Result []struct {
			Results json.RawMessage `json:"results"`
		} `json:"result"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&env); err != nil || resp.StatusCode != 200 || len(env.Result) != 1 {
		t.Fatalf("%s: status %d, %v", sql, resp.StatusCode, err)
	}
	return string(env.Result[0].Results)
}

// TestWrangler: the pinned wrangler's D1 commands against d1local.
func TestWrangler(t *testing.T) {
	w := newWranglerEnv(t)

	t.Run("execute, info and export", func(t *testing.T) { t.Parallel(); wranglerExecuteInfoExport(t, w) })
	t.Run("create, list and delete", func(t *testing.T) { t.Parallel(); wranglerCreateListDelete(t, w) })
	t.Run("migrations apply", func(t *testing.T) { t.Parallel(); wranglerMigrationsApply(t, w) })

	t.Run("a wrong token", func(t *testing.T) {
		t.Parallel()
		dir := w.project(t, []string{"notes"}, map[string]string{})
		r := w.run(t, dir, map[string]string{"CLOUDFLARE_API_TOKEN": "wrong"},
			"d1", "execute", "notes", "--remote", "--command", "SELECT 1")
		if r.err == nil || !strings.Contains(r.output, "Authentication error [code: 10000]") ||
			strings.Contains(r.output, "No route for that URI") {
			t.Errorf("wrong token: %v", r.err)
		}
	})

	t.Run("no account ID", func(t *testing.T) {
		t.Parallel()
		noAccount := map[string]string{"CLOUDFLARE_ACCOUNT_ID": ""}
		var list []struct{ UUID string }
		w.run(t, w.project(t, nil, map[string]string{}), noAccount, "d1", "list", "--json").mustJSON(t, &list)

		noAccount["CLOUDFLARE_API_TOKEN"] = "wrong"
		r := w.run(t, w.project(t, nil, map[string]string{}), noAccount, "d1", "list")
		if r.err == nil || !strings.Contains(r.output, "A request to the Cloudflare API (/memberships) failed.") ||
			!strings.Contains(r.output, "Authentication error [code: 10000]") {
			t.Errorf("no account ID and a wrong token: %v", r.err)
		}
	})
}

// wranglerExecuteInfoExport: d1 execute (--file, through the import flow,
// and --command), d1 info and d1 export on one database.
func wranglerExecuteInfoExport(t *testing.T, w *wranglerEnv) {
	dir := w.project(t, []string{"notes"}, map[string]string{
		"data.sql": "CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT);\n" +
			"INSERT INTO notes (body) VALUES ('hello'), ('it''s; fine');\n-- the end\n",
	})
	// --file: the import flow (init, upload, ingest).
	var file []struct {
		Results []map[string]any `json:"results"`
		Success bool             `json:"success"`
	}
	w.run(t, dir, nil, "d1", "execute", "notes", "--remote", "--file", "data.sql", "--json").mustJSON(t, &file)
	if len(file) != 1 || !file[0].Success || len(file[0].Results) != 1 || file[0].Results[0]["Total queries executed"] != 2.0 {
		t.Errorf("execute --file: %+v", file)
	}
	var cmd []struct {
		Results []map[string]any `json:"results"`
		Success bool             `json:"success"`
	}
	w.run(t, dir, nil, "d1", "execute", "notes", "--remote", "--json",
		"--command", "SELECT body FROM notes ORDER BY id").mustJSON(t, &cmd)
	if len(cmd) != 1 || !cmd[0].Success || len(cmd[0].Results) != 2 || cmd[0].Results[1]["body"] != "it's; fine" {
		t.Errorf("execute --command: %+v", cmd)
	}
	var info map[string]any
	w.run(t, dir, nil, "d1", "info", "notes", "--json").mustJSON(t, &info)
	if info["uuid"] != "notes" || info["num_tables"] != 1.0 || info["database_size"] == nil {
		t.Errorf("info: %v", info)
	}
	r := w.run(t, dir, nil, "d1", "export", "notes", "--remote", "--output", "dump.sql", "-y")
	if r.err != nil {
		t.Fatalf("export: %v", r.err)
	}
	dump, err := os.ReadFile(filepath.Join(dir, "dump.sql"))
	want := "PRAGMA defer_foreign_keys=TRUE;\n" +
		"CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT);\n" +
		"INSERT INTO \"notes\" VALUES(1,'hello');\n" +
		"INSERT INTO \"notes\" VALUES(2,'it''s; fine');\n"
	if err != nil || string(dump) != want {
		t.Errorf("dump.sql (%v):\n%s\nwant:\n%s", err, dump, want)
	}
}

// wranglerCreateListDelete: d1 create (and its refusal of an existing
// name), d1 list and d1 delete.
func wranglerCreateListDelete(t *testing.T, w *wranglerEnv) {
	dir := w.project(t, nil, map[string]string{})
	r := w.run(t, dir, nil, "d1", "create", "made")
	if r.err != nil || !strings.Contains(r.output, "Successfully created DB 'made'") ||
		!strings.Contains(r.output, `database_id = "made"`) {
		t.Fatalf("create: %v", r.err)
	}
	if r := w.run(t, dir, nil, "d1", "create", "made"); r.err == nil ||
		!strings.Contains(r.output, "A database with that name already exists") {
		t.Errorf("create of an existing name: %v", r.err)
	}
	var list []struct{ UUID, Name, Version string }
	w.run(t, dir, nil, "d1", "list", "--json").mustJSON(t, &list)
	if !slices.ContainsFunc(list, func(d struct{ UUID, Name, Version string }) bool {
		return d.UUID == "made" && d.Name == "made" && d.Version == "production"
	}) {
		t.Errorf("list: %+v", list)
	}
	r = w.run(t, dir, nil, "d1", "delete", "made", "-y")
	if r.err != nil || !strings.Contains(r.output, "Deleted 'made' successfully.") {
		t.Errorf("delete: %v", r.err)
	}
	if ids, _ := w.srv.Databases(); slices.Contains(ids, "made") {
		t.Errorf("made still exists after delete: %q", ids)
	}
}

// wranglerMigrationsApply: d1 migrations apply runs both migrations and
// records them in d1_migrations.
func wranglerMigrationsApply(t *testing.T, w *wranglerEnv) {
	dir := w.project(t, []string{"migr"}, map[string]string{
		"migrations/0001_init.sql":   "CREATE TABLE m (x INTEGER);\n-- a comment after the last statement\n",
		"migrations/0002_rename.sql": "ALTER TABLE m RENAME COLUMN x TO y;\nINSERT INTO m (y) VALUES (1);\n",
	})
	r := w.run(t, dir, nil, "d1", "migrations", "apply", "migr", "--remote")
	if r.err != nil || strings.Count(r.output, "0002_rename.sql │ ✅") != 1 {
		t.Fatalf("migrations apply: %v", r.err)
	}
	if got := w.query(t, "migr", "SELECT name FROM d1_migrations ORDER BY id"); got != `[{"name":"0001_init.sql"},{"name":"0002_rename.sql"}]` {
		t.Errorf("d1_migrations: %s", got)
	}
	if got := w.query(t, "migr", "SELECT y FROM m"); got != `[{"y":1}]` {
		t.Errorf("m: %s", got)
	}
}
