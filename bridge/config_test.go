package bridge

import (
	"strings"
	"testing"
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
