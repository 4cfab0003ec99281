package cli

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/internal/d1test"
)

// wranglerCmd runs the wrangler pinned in conformance/package.json.
type wranglerCmd struct {
	bin, home string
	baseURL   string // the d1local server standing in for api.cloudflare.com
}

// pinnedWrangler returns the pinned wrangler aimed at b, or skips t when
// Node or conformance/node_modules is missing (and fails it in CI).
func pinnedWrangler(t *testing.T, b *d1test.Backend) *wranglerCmd {
	t.Helper()
	missing := func(why string) {
		t.Helper()
		if os.Getenv("CI") != "" {
			t.Fatalf("the wrangler interop test cannot run in CI: %s; install Node >= 20 and run `npm ci` in conformance/", why)
		}
		t.Skipf("wrangler interop skipped: %s; run `make test` with Node 20 and npm to include it", why)
	}
	if _, err := exec.LookPath("node"); err != nil {
		missing("node is not in PATH")
	}
	root, err := d1test.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(root, "conformance", "node_modules", ".bin", "wrangler")
	if _, err := os.Stat(bin); err != nil {
		missing(bin + " is missing")
	}
	return &wranglerCmd{bin: bin, home: t.TempDir(), baseURL: b.BaseURL}
}

// run runs wrangler in dir with `--remote` pointed at the d1local server:
// wrangler's own base-URL variable, a token, the account ID (`d1 migrations
// list --remote` does not read it from the config, and would look it up
// with /memberships), and nothing of the caller's Cloudflare environment.
func (w *wranglerCmd) run(t *testing.T, dir string, args ...string) string {
	t.Helper()
	return w.runArgs(t, dir, append(args, "--remote")...)
}

// runArgs is run without the --remote that commands on a database take.
func (w *wranglerCmd) runArgs(t *testing.T, dir string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, w.bin, args...)
	cmd.Dir = dir
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CLOUDFLARE_") && !strings.HasPrefix(kv, "WRANGLER_") && !strings.HasPrefix(kv, "HOME=") && !strings.HasPrefix(kv, "XDG_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "CLOUDFLARE_API_BASE_URL="+w.baseURL+"/client/v4", "CLOUDFLARE_API_TOKEN=tok",
		"CLOUDFLARE_ACCOUNT_ID="+d1test.AccountID, "CI=1",
		"WRANGLER_SEND_METRICS=false", "HOME="+w.home, "XDG_CONFIG_HOME="+filepath.Join(w.home, ".config"), "NO_COLOR=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("wrangler %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// TestWranglerAgrees: with the real wrangler (4.86.0, `d1 migrations apply
// --remote` against d1local), whichever of wrangler and d1idem applies the
// schema first, the other agrees, whatever the migration file is called.
func TestWranglerAgrees(t *testing.T) {
	b := d1test.LocalConfig(t, d1local.Config{Token: "tok"})
	w := pinnedWrangler(t, b)
	const initSQL = "CREATE TABLE orders (id TEXT PRIMARY KEY);\n"

	t.Run("wrangler first", func(t *testing.T) {
		// A wrangler environment with its own migrations table; the
		// migration file written by d1idem schema print --migration.
		l := &ledgerDB{b: b, id: "6b4c8e3e-4444-4000-8000-000000000001"}
		l.client = b.Database(l.id).Client(t, func(c *d1client.Config) { c.APIToken = "tok" })
		dir := t.TempDir()
		config := filepath.Join(dir, "wrangler.toml")
		writeFiles(t, dir, map[string]string{
			"wrangler.toml": `name = "orders"
account_id = "0123456789abcdef0123456789abcdef"

[env.staging]
[[env.staging.d1_databases]]
binding = "DB"
database_name = "orders-staging"
database_id = "` + l.id + `"
migrations_table = "staging_migrations"
`,
			"migrations/0001_init.sql": initSQL,
		})
		r := mustRun(t, nil, "schema", "print", "--migration", "--config", config, "--env", "staging")
		if !strings.HasPrefix(r.stdout, "Wrote "+filepath.Join(dir, "migrations", "0002_d1idem_idempotency_keys.sql")) {
			t.Fatalf("print --migration: %s", r)
		}

		out := w.run(t, dir, "d1", "migrations", "apply", "orders-staging", "--env", "staging")
		if !strings.Contains(out, "0002_d1idem_idempotency_keys.sql") || strings.Contains(out, "❌") {
			t.Fatalf("wrangler apply:\n%s", out)
		}
		conn := []string{"--database", "orders-staging", "--env", "staging", "--config", config, "--base-url", b.BaseURL, "--api-token", "tok"}
		r = mustRun(t, nil, append([]string{"schema", "apply"}, conn...)...)
		if !strings.HasPrefix(r.stdout, "Nothing to do on orders-staging ("+l.id+", env staging, from "+config+"): 0002_d1idem_idempotency_keys.sql is already recorded in staging_migrations.") {
			t.Errorf("d1idem apply after wrangler: %s", r)
		}
		mustRun(t, nil, append([]string{"schema", "verify"}, conn...)...)
		if got := l.recorded(t, "staging_migrations"); !reflect.DeepEqual(got, []string{"0001_init.sql", "0002_d1idem_idempotency_keys.sql"}) {
			t.Errorf("staging_migrations: %q", got)
		}
		if out := w.run(t, dir, "d1", "migrations", "list", "orders-staging", "--env", "staging"); !strings.Contains(out, "No migrations to apply") {
			t.Errorf("wrangler list:\n%s", out)
		}
	})

	t.Run("d1idem first", func(t *testing.T) {
		// The schema saved by hand under a name of the user's choosing,
		// in wrangler.jsonc's default migrations directory.
		l := &ledgerDB{b: b, id: "6b4c8e3e-4444-4000-8000-000000000002"}
		l.client = b.Database(l.id).Client(t, func(c *d1client.Config) { c.APIToken = "tok" })
		dir := t.TempDir()
		config := filepath.Join(dir, "wrangler.jsonc")
		writeFiles(t, dir, map[string]string{
			"wrangler.jsonc": `{
  "name": "orders",
  "account_id": "0123456789abcdef0123456789abcdef",
  "d1_databases": [{"binding": "DB", "database_name": "orders-db", "database_id": "` + l.id + `"}],
}`,
			"migrations/0001_init.sql":        initSQL,
			"migrations/0002_idempotency.sql": mustRun(t, nil, "schema", "print").stdout,
		})
		conn := []string{"--database", "orders-db", "--config", config, "--base-url", b.BaseURL, "--api-token", "tok"}
		r := mustRun(t, nil, append([]string{"schema", "apply"}, conn...)...)
		if !strings.HasPrefix(r.stdout, "Created idempotency_keys and idx_idempotency_keys_updated_at, and recorded 0002_idempotency.sql in d1_migrations,") {
			t.Errorf("d1idem apply: %s", r)
		}

		out := w.run(t, dir, "d1", "migrations", "apply", "orders-db")
		if !strings.Contains(out, "0001_init.sql") || strings.Contains(out, "0002_idempotency.sql") || strings.Contains(out, "❌") {
			t.Fatalf("wrangler apply ran the schema again, or failed:\n%s", out)
		}
		if out := w.run(t, dir, "d1", "migrations", "list", "orders-db"); !strings.Contains(out, "No migrations to apply") {
			t.Errorf("wrangler list:\n%s", out)
		}
		if got := l.recorded(t, "d1_migrations"); !reflect.DeepEqual(got, []string{"0002_idempotency.sql", "0001_init.sql"}) {
			t.Errorf("d1_migrations: %q", got)
		}
		r = mustRun(t, nil, append([]string{"schema", "apply"}, conn...)...)
		if !strings.HasPrefix(r.stdout, "Nothing to do") {
			t.Errorf("second d1idem apply: %s", r)
		}
		if r := mustRun(t, nil, "schema", "print", "--migration", "--config", config); !strings.Contains(r.stdout, "0002_idempotency.sql already holds the ledger schema") {
			t.Errorf("print --migration: %s", r)
		}
	})
}
