package d1client

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/jarcoal/httpmock"

	"github.com/d1idem/d1idem/d1client/budget"
	"github.com/d1idem/d1idem/d1local"
)

// localClient returns a client of database id on a d1local server that
// creates no database on first use, as Cloudflare, holding the databases
// have.
func localClient(t *testing.T, id string, have ...string) (*Client, *d1local.Server) {
	t.Helper()
	d, err := d1local.New(d1local.Config{NoAutoCreate: true})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(d)
	t.Cleanup(func() { srv.Close(); d.Close() })
	for _, h := range have {
		if err := d.CreateDatabase(h); err != nil {
			t.Fatal(err)
		}
	}
	c, err := New(Config{BaseURL: srv.URL, AccountID: "acct", DatabaseID: id, Budget: budget.Unlimited()})
	if err != nil {
		t.Fatal(err)
	}
	return c, d
}

// TestListDatabases: the account's databases, at most the limit; a
// d1local's under their names.
func TestListDatabases(t *testing.T) {
	c, _ := localClient(t, "orders", "orders", "audit", "ledger-a")
	got, err := c.ListDatabases(t.Context(), 50)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, d := range got {
		names = append(names, d.Name)
		if d.UUID != d.Name {
			t.Errorf("d1local's database %q has UUID %q", d.Name, d.UUID)
		}
	}
	slices.Sort(names)
	if !slices.Equal(names, []string{"audit", "ledger-a", "orders"}) {
		t.Errorf("ListDatabases = %v", got)
	}
	if got, err := c.ListDatabases(t.Context(), 2); len(got) != 2 || err != nil {
		t.Errorf("ListDatabases(2) = %v, %v", got, err)
	}
}

// TestListDatabasesPages: Cloudflare's list comes a page at a time, until
// the total count; a failure names its status.
func TestListDatabasesPages(t *testing.T) {
	pages := 0
	c, tr := mockClient(t, nil)
	tr.RegisterResponder(http.MethodGet, testBaseURL+"/accounts/"+testAccount+"/d1/database", func(req *http.Request) (*http.Response, error) {
		pages++
		if req.Header.Get("Authorization") != "Bearer "+testToken || req.URL.Query().Get("per_page") != "100" {
			return httpmock.NewStringResponse(http.StatusForbidden, `{"success":false}`), nil
		}
		var dbs []string
		for i := range 100 {
			if n := (pages-1)*100 + i; n < 150 {
				dbs = append(dbs, fmt.Sprintf(`{"uuid":"u%d","name":"db%d"}`, n, n))
			}
		}
		return httpmock.NewStringResponse(http.StatusOK, `{"success":true,"result":[`+strings.Join(dbs, ",")+`],"result_info":{"total_count":150}}`), nil
	})
	got, err := c.ListDatabases(t.Context(), 1000)
	if err != nil || len(got) != 150 || pages != 2 || got[149] != (Database{UUID: "u149", Name: "db149"}) {
		t.Errorf("ListDatabases = %d databases (last %v) in %d pages, %v", len(got), got[len(got)-1], pages, err)
	}
	c, tr = mockClient(t, nil, func(cfg *Config) { cfg.APIToken = "another" })
	tr.RegisterResponder(http.MethodGet, testBaseURL+"/accounts/"+testAccount+"/d1/database", httpmock.NewStringResponder(http.StatusForbidden, `{"success":false}`))
	if _, err := c.ListDatabases(t.Context(), 10); err == nil || err.Error() != "listing the databases: HTTP 403" {
		t.Errorf("a refused list: %v", err)
	}
}

// TestCreateLocalDatabase: on d1local, the client's database is created
// once; on any other server nothing is created.
func TestCreateLocalDatabase(t *testing.T) {
	c, d := localClient(t, "ordres", "orders")
	for i, want := range []bool{true, false} {
		if created, err := c.CreateLocalDatabase(t.Context()); created != want || err != nil {
			t.Errorf("call %d: CreateLocalDatabase = %v, %v; want %v", i, created, err, want)
		}
	}
	if have, _ := d.Databases(); !slices.Equal(have, []string{"orders", "ordres"}) {
		t.Errorf("databases: %v", have)
	}

	// Cloudflare answers a missing database 404 too, but is not d1local.
	c, tr := mockClient(t, nil)
	tr.RegisterResponder(http.MethodGet, testBaseURL+"/accounts/"+testAccount+"/d1/database/"+testDatabase, func(req *http.Request) (*http.Response, error) {
		res, err := replay(t, "database_7404")(req)
		res.Header.Set("Server", "cloudflare")
		return res, err
	})
	tr.RegisterResponder(http.MethodPost, testBaseURL+"/accounts/"+testAccount+"/d1/database", httpmock.NewStringResponder(http.StatusOK, `{"success":true,"result":{"uuid":"x"}}`))
	if created, err := c.CreateLocalDatabase(t.Context()); created || err != nil {
		t.Errorf("on Cloudflare: CreateLocalDatabase = %v, %v", created, err)
	}
	if n := tr.GetCallCountInfo()["POST "+testBaseURL+"/accounts/"+testAccount+"/d1/database"]; n != 0 {
		t.Errorf("on Cloudflare: %d create calls", n)
	}
}

// TestBridgeListsNoDatabase: a bridge serves the databases it binds; it
// neither lists nor creates any.
func TestBridgeListsNoDatabase(t *testing.T) {
	c, tr := mockClient(t, nil, func(cfg *Config) {
		cfg.BaseURL, cfg.APIToken, cfg.BridgeURL = "", "", "https://:0123456789abcdef0123@bridge.test"
	})
	if _, err := c.ListDatabases(t.Context(), 10); err == nil || !strings.Contains(err.Error(), "lists none") {
		t.Errorf("ListDatabases through a bridge: %v", err)
	}
	if created, err := c.CreateLocalDatabase(t.Context()); created || err != nil {
		t.Errorf("CreateLocalDatabase through a bridge: %v, %v", created, err)
	}
	if n := tr.GetTotalCallCount(); n != 0 {
		t.Errorf("%d calls through the bridge", n)
	}
}

// A database shows as its name and UUID, or its name alone where that is
// its UUID (d1local).
func TestDatabaseString(t *testing.T) {
	for d, want := range map[Database]string{
		{UUID: "6b4c8e3e-0000-4000-8000-000000000001", Name: "orders"}: "orders (6b4c8e3e-0000-4000-8000-000000000001)",
		{UUID: "orders", Name: "orders"}:                               "orders",
	} {
		if got := d.String(); got != want {
			t.Errorf("%#v.String() = %q, want %q", d, got, want)
		}
	}
}
