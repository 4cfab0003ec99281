package bridge

import (
	"strings"
	"testing"

	"github.com/d1idem/d1idem/wrangler"
)

// The names, checks and secret format of a bridge's configuration.
func TestConfig(t *testing.T) {
	for name, want := range map[string]string{"orders-db": "ORDERS_DB", "2024-audit": "DB_2024_AUDIT", "DB": "DB"} {
		if got := BindingName(name); got != want || !ValidBinding(got) {
			t.Errorf("BindingName(%q) = %q, want %q", name, got, want)
		}
	}
	if ValidWorkerName("My_Bridge") || !ValidWorkerName("d1idem-bridge-staging") {
		t.Error("ValidWorkerName")
	}
	for _, tc := range []struct {
		dbs  []Database
		want string
	}{
		{[]Database{{"a", "1", "A"}, {"b", "2", "B"}}, ""},
		{[]Database{{"a", "1", "BRIDGE_MODE"}}, "would clash with the bridge's settings"},
		{[]Database{{"a", "1", "A"}, {"b", "2", "A"}}, "databases a and b would share the binding A"},
		{[]Database{{"a", "1", "A"}, {"b", "a", "B"}}, `"a" names two databases`},
	} {
		err := Config{Databases: tc.dbs}.CheckDatabases()
		if (err == nil) != (tc.want == "") || err != nil && !strings.Contains(err.Error(), tc.want) {
			t.Errorf("CheckDatabases(%v) = %v, want %q", tc.dbs, err, tc.want)
		}
	}
	toml := string(Config{Worker: "w", Mode: "ledger-only", Databases: []Database{{"orders-db", "6b4c", "ORDERS_DB"}}}.WranglerTOML("wrangler.toml"))
	for _, want := range []string{"Written by 'd1idem bridge init' from wrangler.toml.", `name = "w"`, `compatibility_date = "` + CompatibilityDate + `"`,
		"binding = \"ORDERS_DB\"\ndatabase_name = \"orders-db\"\ndatabase_id = \"6b4c\"\n", `BRIDGE_MODE = "ledger-only"`, "\"6b4c\" = \"ORDERS_DB\"\n\"orders-db\" = \"ORDERS_DB\"\n"} {
		if !strings.Contains(toml, want) {
			t.Errorf("wrangler.toml lacks %q:\n%s", want, toml)
		}
	}
	if s := NewSecret(); !ValidSecret(s) || len(s) != 64 || ValidSecret("short") || ValidSecret(strings.Repeat("a,", 10)) {
		t.Error("secrets")
	}
}

// TestDatabaseOf: a database given as NAME=ID, or by its name or binding
// in a wrangler config, and the Worker's default name.
func TestDatabaseOf(t *testing.T) {
	cfg, err := wrangler.Parse("app/wrangler.toml", []byte(`account_id = "acc"
[[d1_databases]]
binding = "DB"
database_name = "orders-db"
database_id = "6b4c"
[[d1_databases]]
binding = "bad-binding"
database_name = "audit"
database_id = "77aa"
[[d1_databases]]
binding = "NOID"
database_name = "noid"
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		arg     string
		want    Database
		account string
	}{
		{"orders=6b4c", Database{"orders", "6b4c", "ORDERS"}, ""},
		{"orders-db", Database{"orders-db", "6b4c", "DB"}, "acc"},
		{"DB", Database{"orders-db", "6b4c", "DB"}, "acc"},
	} {
		d, account, err := DatabaseOf(cfg, "", tc.arg)
		if err != nil || d != tc.want || account != tc.account {
			t.Errorf("DatabaseOf(%q) = %+v, %q, %v; want %+v, %q", tc.arg, d, account, err, tc.want, tc.account)
		}
	}
	for arg, want := range map[string]string{
		"orders db=1": "expected NAME or NAME=ID",
		"a=b c":       "expected NAME or NAME=ID",
		"nope":        `no database named "nope" in the d1_databases of app/wrangler.toml (it has: orders-db, audit, noid); or give it as nope=ID`,
		"audit":       `database "audit" of app/wrangler.toml: its binding, database_id or account_id is not one the bridge can use`,
		"noid":        `database "noid" has no database_id in app/wrangler.toml`,
	} {
		if _, _, err := DatabaseOf(cfg, "", arg); err == nil || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("DatabaseOf(%q) = %v; want %s", arg, err, want)
		}
	}
	if _, _, err := DatabaseOf(nil, "", "orders"); err == nil || !strings.Contains(err.Error(), "orders=ID") {
		t.Errorf("DatabaseOf without a config: %v", err)
	}
	if WorkerName("") != DefaultWorker || WorkerName("Staging") != "d1idem-bridge-staging" || !ValidWorkerName(WorkerName("Staging")) {
		t.Errorf("WorkerName: %q, %q", WorkerName(""), WorkerName("Staging"))
	}
}
