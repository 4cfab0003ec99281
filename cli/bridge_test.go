package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"

	"github.com/d1idem/d1idem/bridge"
	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/internal/d1test"
	"github.com/d1idem/d1idem/wrangler"
)

const (
	ordersID  = "6b4c8e3e-0000-4000-8000-000000000000"
	stagingID = "7c5d9f4f-0000-4000-8000-000000000000"
	auditID   = "8d6e0a5a-0000-4000-8000-000000000000"
)

// appConfig is an application's wrangler.toml, with an environment.
const appConfig = `name = "orders-api"
main = "src/index.ts"
account_id = "0123456789abcdef0123456789abcdef"

[[d1_databases]]
binding = "DB"
database_name = "orders-db"
database_id = "` + ordersID + `"

[[d1_databases]]
binding = "AUDIT"
database_name = "audit-db"
database_id = "` + auditID + `"

[env.staging]
account_id = "fedcba9876543210fedcba9876543210"

[[env.staging.d1_databases]]
binding = "DB"
database_name = "orders-staging"
database_id = "` + stagingID + `"
`

// bridgeVars are the [vars] of a bridge's wrangler.toml.
type bridgeVars struct {
	Vars struct {
		BridgeMode      string            `toml:"BRIDGE_MODE"`
		BridgeDatabases map[string]string `toml:"BRIDGE_DATABASES"`
	} `toml:"vars"`
	CompatibilityDate string `toml:"compatibility_date"`
	WorkersDev        bool   `toml:"workers_dev"`
}

// readBridge parses dir's wrangler.toml with wrangler's own rules
// (internal/wrangler) and as TOML for its [vars], and checks the Worker's
// modules are the shipped ones and .gitignore keeps the secrets out.
func readBridge(t *testing.T, dir string) (*wrangler.Config, bridgeVars) {
	t.Helper()
	cfg, err := wrangler.Load(filepath.Join(dir, "wrangler.toml"))
	if err != nil {
		t.Fatal(err)
	}
	var v bridgeVars
	if _, err := toml.DecodeFile(filepath.Join(dir, "wrangler.toml"), &v); err != nil {
		t.Fatal(err)
	}
	if cfg.Main != "worker.js" || v.CompatibilityDate != bridge.CompatibilityDate || !v.WorkersDev {
		t.Errorf("main %q, compatibility_date %q, workers_dev %v", cfg.Main, v.CompatibilityDate, v.WorkersDev)
	}
	for _, f := range bridge.WorkerFiles() {
		data, err := os.ReadFile(filepath.Join(dir, f.Name))
		if err != nil || !bytes.Equal(data, f.Data) {
			t.Errorf("%s is not the shipped module (%v)", f.Name, err)
		}
	}
	ignore, err := os.ReadFile(filepath.Join(dir, ".gitignore"))
	for _, l := range []string{".bridge-secret", ".dev.vars", ".wrangler/"} {
		if err != nil || !strings.Contains("\n"+string(ignore), "\n"+l+"\n") {
			t.Errorf(".gitignore lacks %s: %q (%v)", l, ignore, err)
		}
	}
	return cfg, v
}

// bridge init with NAME=ID needs no wrangler config.
func TestBridgeInitExplicitDatabases(t *testing.T) {
	t.Chdir(t.TempDir())
	r := mustRun(t, nil, "bridge", "init", "bridge", "--database", "orders-db="+ordersID, "--database", "2024-audit="+auditID)
	golden(t, "bridge_init_explicit", r.stdout)
	cfg, v := readBridge(t, "bridge")
	if cfg.Name != "d1idem-bridge" || cfg.AccountID != "" || len(cfg.D1Databases) != 2 || v.Vars.BridgeMode != "full" {
		t.Fatalf("config %+v, vars %+v", cfg, v)
	}
	want := map[string]string{ordersID: "ORDERS_DB", "orders-db": "ORDERS_DB", auditID: "DB_2024_AUDIT", "2024-audit": "DB_2024_AUDIT"}
	if len(v.Vars.BridgeDatabases) != len(want) {
		t.Fatalf("BRIDGE_DATABASES = %v, want %v", v.Vars.BridgeDatabases, want)
	}
	for k, b := range want {
		if v.Vars.BridgeDatabases[k] != b {
			t.Errorf("BRIDGE_DATABASES[%s] = %q, want %q", k, v.Vars.BridgeDatabases[k], b)
		}
	}
	if d := cfg.D1Databases[1]; d.Binding != "DB_2024_AUDIT" || d.DatabaseName != "2024-audit" || d.DatabaseID != auditID {
		t.Errorf("second database: %+v", d)
	}
	// The development secret wrangler dev reads: kept across a --force.
	secret := devVarsSecret(t)
	mustRun(t, nil, "bridge", "init", "bridge", "--database", "orders-db="+ordersID, "--force")
	if again := devVarsSecret(t); again != secret {
		t.Errorf("bridge init --force changed the development secret")
	}
	if !strings.Contains(readFile(t, "bridge/.gitignore"), ".dev.vars\n") {
		t.Errorf(".dev.vars is not left out of git")
	}
}

// devVarsSecret returns the development secret of bridge/.dev.vars,
// checking that others may not read the file and the bridge accepts it.
func devVarsSecret(t *testing.T) string {
	t.Helper()
	fi, err := os.Stat("bridge/.dev.vars")
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("bridge/.dev.vars: %v %v", fi, err)
	}
	secret, ok := strings.CutPrefix(strings.TrimSpace(readFile(t, "bridge/.dev.vars")), "BRIDGE_SECRET=")
	if !ok || !bridge.ValidSecret(secret) {
		t.Fatalf("bridge/.dev.vars holds no valid BRIDGE_SECRET")
	}
	return secret
}

// bridge init reads the databases, and the account, from the wrangler
// config wrangler would use here, from --config (JSON with comments too),
// and from an environment with --env (or CLOUDFLARE_ENV).
func TestBridgeInitFromWranglerConfig(t *testing.T) {
	project := t.TempDir()
	writeFiles(t, project, map[string]string{
		"wrangler.toml": appConfig,
		"other/wrangler.jsonc": `{
  // the same databases, in JSON
  "account_id": "0123456789abcdef0123456789abcdef",
  "d1_databases": [{"binding": "DB", "database_name": "orders-db", "database_id": "` + ordersID + `"},],
}`,
	})
	t.Chdir(project)
	t.Setenv(wrangler.EnvVar, "")
	r := mustRun(t, nil, "bridge", "init", "bridge", "--database", "orders-db", "--database", "AUDIT")
	golden(t, "bridge_init_wrangler", r.stdout)
	cfg, v := readBridge(t, "bridge")
	if cfg.AccountID != "0123456789abcdef0123456789abcdef" || len(cfg.D1Databases) != 2 || cfg.D1Databases[1].Binding != "AUDIT" ||
		v.Vars.BridgeDatabases["audit-db"] != "AUDIT" || v.Vars.BridgeDatabases[ordersID] != "DB" {
		t.Fatalf("config %+v, vars %+v", cfg, v)
	}

	r = mustRun(t, nil, "bridge", "init", "bridge-staging", "--env", "staging", "--database", "DB", "--ledger-only", "--json")
	for _, s := range []string{`"worker": "d1idem-bridge-staging"`, `"account_id": "fedcba9876543210fedcba9876543210"`, `"mode": "ledger-only"`,
		`"env": "staging"`, `"name": "orders-staging"`, `"wrangler_config": "wrangler.toml"`} {
		if !strings.Contains(r.stdout, s) {
			t.Errorf("--json lacks %s:\n%s", s, r.stdout)
		}
	}
	cfg, v = readBridge(t, "bridge-staging")
	if cfg.Name != "d1idem-bridge-staging" || cfg.AccountID != "fedcba9876543210fedcba9876543210" || v.Vars.BridgeMode != "ledger-only" ||
		v.Vars.BridgeDatabases[stagingID] != "DB" || v.Vars.BridgeDatabases["orders-staging"] != "DB" || len(cfg.Env) != 0 {
		t.Fatalf("config %+v, vars %+v", cfg, v)
	}

	t.Setenv(wrangler.EnvVar, "staging")
	mustRun(t, nil, "bridge", "init", "from-env", "--database", "orders-staging", "--name", "my-bridge")
	if cfg, _ := readBridge(t, "from-env"); cfg.Name != "my-bridge" || cfg.D1Databases[0].DatabaseID != stagingID {
		t.Fatalf("CLOUDFLARE_ENV=staging: %+v", cfg)
	}
	t.Setenv(wrangler.EnvVar, "")
	mustRun(t, nil, "bridge", "init", "from-jsonc", "--config", "other/wrangler.jsonc", "--database", "orders-db")
	if cfg, _ := readBridge(t, "from-jsonc"); cfg.D1Databases[0].DatabaseID != ordersID || !strings.Contains(readFile(t, "from-jsonc/wrangler.toml"), "from other/wrangler.jsonc") {
		t.Fatalf("--config wrangler.jsonc: %+v", cfg)
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// bridge init overwrites nothing without --force, never an application's
// wrangler config, and writes nothing wrangler would not read.
func TestBridgeInitRefusesToOverwrite(t *testing.T) {
	t.Chdir(t.TempDir())
	args := []string{"bridge", "init", "bridge", "--database", "orders-db=" + ordersID}
	mustRun(t, nil, args...)
	edited := "// edited\n"
	writeFiles(t, "bridge", map[string]string{"worker.js": edited, ".gitignore": ".bridge-secret\n/node_modules\n"})
	r := runCLI(t, nil, args...)
	if r.code != exitError || r.stderr != "d1idem: bridge/ledger-statements.js, bridge/worker.js, bridge/wrangler.toml already exist; nothing was written: pass --force to overwrite them\n" {
		t.Fatalf("a second init: %s", r)
	}
	if readFile(t, "bridge/worker.js") != edited {
		t.Fatal("worker.js was overwritten")
	}
	mustRun(t, nil, append(args, "--force")...)
	readBridge(t, "bridge")
	if got := readFile(t, "bridge/.gitignore"); got != ".bridge-secret\n/node_modules\n.dev.vars\n.wrangler/\n" {
		t.Errorf(".gitignore = %q: its lines are kept, the missing ones added once", got)
	}

	writeFiles(t, "app", map[string]string{"wrangler.toml": appConfig})
	r = runCLI(t, nil, "bridge", "init", "app", "--config", "app/wrangler.toml", "--database", "orders-db", "--force")
	if r.code != exitError || !strings.Contains(r.stderr, `app/wrangler.toml is not a bridge's wrangler config (its main is "src/index.ts"`) {
		t.Fatalf("over an application's config: %s", r)
	}
	writeFiles(t, "jsonapp", map[string]string{"wrangler.json": `{"name": "x"}`})
	r = runCLI(t, nil, "bridge", "init", "jsonapp", "--database", "orders-db="+ordersID)
	if r.code != exitError || !strings.Contains(r.stderr, "jsonapp has a wrangler.json, which wrangler would read instead") {
		t.Fatalf("beside a wrangler.json: %s", r)
	}
	if _, err := os.Stat("jsonapp/worker.js"); err == nil {
		t.Fatal("files were written beside a wrangler.json")
	}
}

// bridge init's usage errors: one line, exit 2, nothing written.
func TestBridgeInitUsageErrors(t *testing.T) {
	project := t.TempDir()
	writeFiles(t, project, map[string]string{"app/wrangler.toml": appConfig})
	t.Chdir(project)
	t.Setenv(wrangler.EnvVar, "")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--database", "a=b"}, "bridge init takes one argument, the directory to write the bridge into (got 0)"},
		{[]string{"x", "y", "--database", "a=b"}, "(got 2)"},
		{[]string{"x"}, "bridge init needs --database NAME (or NAME=ID), once for each database the bridge serves"},
		{[]string{"x", "--database", "orders db=1"}, `--database "orders db=1": expected NAME or NAME=ID`},
		{[]string{"x", "--database", "orders-db"}, "--database needs a wrangler config: there is no wrangler.json, wrangler.jsonc or wrangler.toml in this directory or above; pass --config FILE"},
		{[]string{"x", "--config", "app/wrangler.toml", "--database", "orders"}, `--database "orders": no database named "orders" in the d1_databases of app/wrangler.toml (it has: orders-db, audit-db); or give it as orders=ID`},
		{[]string{"x", "--config", "app/wrangler.toml", "--env", "prod", "--database", "DB"}, `no environment "prod" in app/wrangler.toml (it has: staging)`},
		{[]string{"x", "--database", "orders-db=" + ordersID, "--database", "orders_db=" + auditID}, "databases orders-db and orders_db would share the binding ORDERS_DB"},
		{[]string{"x", "--database", "a=" + ordersID, "--database", "b=a"}, `"a" names two databases`},
		{[]string{"x", "--database", "bridge-mode=" + ordersID}, "its binding BRIDGE_MODE would clash with the bridge's settings"},
		{[]string{"x", "--database", "a=" + ordersID, "--name", "My_Bridge"}, `the Worker name "My_Bridge" is not one Cloudflare accepts`},
		{[]string{"", "--database", "a=" + ordersID}, "bridge init's directory is empty: name one, such as bridge"},
		{[]string{filepath.Join("app", "wrangler.toml"), "--database", "a=" + ordersID}, "bridge init: " + filepath.Join("app", "wrangler.toml") + " is a file, not a directory: choose another directory"},
	} {
		r := runCLI(t, nil, append([]string{"bridge", "init"}, tc.args...)...)
		if r.code != exitUsage || !strings.HasPrefix(r.stderr, "d1idem: ") || strings.Count(r.stderr, "\n") != 1 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("bridge init %s: %s\nwant exit 2 with %q", strings.Join(tc.args, " "), r, tc.want)
		}
	}
	if entries, _ := os.ReadDir("."); len(entries) != 1 {
		t.Errorf("something was written: %v", entries)
	}
}

// The connection flags reach D1 through a bridge by its URL alone: the
// secret is sent as the bearer token (here d1local stands in for the
// bridge, with the secret as its token), no API token is needed, and the
// commands say they went through the bridge. Ambiguous settings are usage
// errors that never show the secret.
func TestConnectionThroughABridge(t *testing.T) {
	const secret = "dev-secret-0123456789abcdef"
	b := d1test.LocalConfig(t, d1local.Config{Token: secret})
	d1test.ApplySchema(t, b.Database(ordersID).Client(t, func(c *d1client.Config) { c.APIToken = secret }))
	bridgeURL := "http://:" + secret + "@" + strings.TrimPrefix(b.BaseURL, "http://")
	for _, v := range []string{d1client.BridgeURLEnv, d1client.BaseURLEnv, d1client.APIBaseURLEnv, "CLOUDFLARE_API_TOKEN"} {
		t.Setenv(v, "")
	}
	conn := []string{"--account-id", d1test.AccountID, "--database-id", ordersID}
	r := mustRun(t, nil, append([]string{"stats", "--bridge-url", bridgeURL}, conn...)...)
	if !strings.Contains(r.stdout, "database "+ordersID+" through the bridge at "+b.BaseURL+"\n") {
		t.Errorf("stats --bridge-url: %s", r)
	}
	t.Setenv(d1client.BridgeURLEnv, bridgeURL)
	// No API budget through a bridge: sweep's --max-calls may be 0 there.
	mustRun(t, nil, append([]string{"sweep", "--max-calls", "0"}, conn...)...)
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"--bridge-url", bridgeURL, "--base-url", b.BaseURL}, nil, "--bridge-url and --base-url both say where D1 is"},
		{nil, map[string]string{d1client.BridgeURLEnv: bridgeURL, d1client.BaseURLEnv: b.BaseURL}, "D1IDEM_BRIDGE_URL and CLOUDFLARE_BASE_URL are both set"},
		{[]string{"--bridge-url", "http://" + secret + "@127.0.0.1:1"}, nil, "--bridge-url has the secret where the user name goes"},
		{[]string{"--bridge-url", "http://:" + secret + "@192.0.2.1"}, nil, "must be https://"},
		// --base-url wins over the variable, and then the API token is needed.
		{[]string{"--base-url", b.BaseURL}, map[string]string{d1client.BridgeURLEnv: bridgeURL}, "missing an API token"},
	} {
		for _, k := range []string{d1client.BridgeURLEnv, d1client.BaseURLEnv} {
			t.Setenv(k, tc.env[k])
		}
		r := runCLI(t, nil, append(append([]string{"stats"}, tc.args...), conn...)...)
		if r.code != exitUsage || !strings.Contains(r.stderr, tc.want) || strings.Contains(r.stderr+r.stdout, secret) {
			t.Errorf("stats %s: %s\nwant exit 2 with %q, without the secret", strings.Join(tc.args, " "), r, tc.want)
		}
	}
}
