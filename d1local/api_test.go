package d1local

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

// result decodes a successful envelope's result into v.
func (r response) decode(t *testing.T, v any) {
	t.Helper()
	if r.status != http.StatusOK || r.env.Success == nil || !*r.env.Success {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	if err := json.Unmarshal(r.env.Result, v); err != nil {
		t.Fatalf("decode result %s: %v", r.env.Result, err)
	}
}

func TestTokenVerifyAndAccounts(t *testing.T) {
	h := newHarness(t, Config{Token: "s3cret"})
	good := []string{"Authorization", "Bearer s3cret"}
	bad := []string{"Authorization", "Bearer nope"}

	t.Run("verify", func(t *testing.T) {
		for _, path := range []string{"/client/v4/user/tokens/verify", "/accounts/acc/tokens/verify"} {
			r := h.do(t, "GET", path, nil, good...)
			var v struct{ ID, Status string }
			r.decode(t, &v)
			if v.Status != "active" || v.ID == "" {
				t.Errorf("%s: result %s", path, r.env.Result)
			}
			if string(r.env.Messages) != `[{"code":10000,"message":"This API Token is valid and active","type":null}]` {
				t.Errorf("%s: messages %s", path, r.env.Messages)
			}
			r = h.do(t, "GET", path, nil, bad...)
			checkError(t, r, 401, 1000)
			if r.env.Errors[0].Message != "Invalid API Token" {
				t.Errorf("message %q", r.env.Errors[0].Message)
			}
			checkError(t, h.do(t, "GET", path, nil), 401, 1000)
			checkError(t, h.do(t, "GET", path, nil, "Authorization", "Basic eA=="), 400, 6003)
		}
	})
	t.Run("memberships and accounts", func(t *testing.T) {
		var ms []struct {
			Account struct{ ID, Name string }
			Status  string
		}
		r := h.do(t, "GET", "/memberships", nil, good...)
		r.decode(t, &ms)
		if len(ms) != 1 || ms[0].Account.ID != DefaultAccountID || ms[0].Account.Name != "d1local" || ms[0].Status != "accepted" {
			t.Errorf("memberships = %s", r.env.Result)
		}
		if !json.Valid(r.body) || !strings.Contains(string(r.body), `"result_info":{"count":1,"page":1,"per_page":20,"total_count":1,"total_pages":1}`) {
			t.Errorf("result_info: %s", r.body)
		}
		var as []struct{ ID, Name string }
		h.do(t, "GET", "/accounts", nil, good...).decode(t, &as)
		if len(as) != 1 || as[0].ID != DefaultAccountID {
			t.Errorf("accounts = %+v", as)
		}
		checkError(t, h.do(t, "GET", "/memberships", nil, bad...), 403, 10000)
		checkError(t, h.do(t, "GET", "/accounts", nil, bad...), 403, 10000)
	})
	t.Run("user", func(t *testing.T) {
		r := h.do(t, "GET", "/user", nil, good...)
		checkError(t, r, 403, 9109)
		r = h.do(t, "GET", "/user", nil, bad...)
		checkError(t, r, 403, 9109)
		if r.env.Errors[0].Message != "Invalid access token" {
			t.Errorf("message %q", r.env.Errors[0].Message)
		}
	})
	t.Run("account ID", func(t *testing.T) {
		h := newHarness(t, Config{AccountID: "0123456789abcdef0123456789abcdef"})
		var ms []struct{ Account struct{ ID string } }
		h.do(t, "GET", "/memberships", nil).decode(t, &ms)
		if ms[0].Account.ID != "0123456789abcdef0123456789abcdef" {
			t.Errorf("memberships = %+v", ms)
		}
		if _, err := New(Config{AccountID: "a/b"}); err == nil {
			t.Error("New accepted an invalid AccountID")
		}
	})
}

// dbObject is a database as the list, get and create endpoints give it.
type dbObject struct {
	UUID            string          `json:"uuid"`
	Name            string          `json:"name"`
	Version         string          `json:"version"`
	NumTables       *int            `json:"num_tables"`
	FileSize        *int64          `json:"file_size"`
	ReadReplication json.RawMessage `json:"read_replication"`
}

func TestDatabaseEndpoints(t *testing.T) {
	for _, dir := range []string{"", t.TempDir()} {
		t.Run("dir="+filepath.Base(dir), func(t *testing.T) { databaseEndpoints(t, dir) })
	}
}

// databasesPath is the path of the database management endpoints.
const databasesPath = "/client/v4/accounts/acc/d1/database"

// databaseEndpoints is TestDatabaseEndpoints on a server keeping its
// databases in dir (in memory when it is empty): create, list, get and
// delete, in that order.
func databaseEndpoints(t *testing.T, dir string) {
	h := newHarness(t, Config{Dir: dir})
	if got := listDatabases(t, h, ""); len(got) != 0 {
		t.Fatalf("list of a new server = %+v", got)
	}
	createDatabases(t, h)
	listDatabasesPaged(t, h)

	// Get.
	var got dbObject
	h.do(t, "GET", databasesPath+"/beta", nil).decode(t, &got)
	if got.UUID != "beta" || got.NumTables == nil || *got.NumTables != 2 || *got.FileSize <= 0 {
		t.Errorf("get beta = %+v", got)
	}
	r := h.do(t, "GET", databasesPath+"/gamma", nil)
	checkError(t, r, 404, 7404)
	if r.env.Errors[0].Message != "The database gamma could not be found" {
		t.Errorf("message %q", r.env.Errors[0].Message)
	}

	deleteDatabase(t, h, dir)
}

// listDatabases returns the list endpoint's databases for query.
func listDatabases(t *testing.T, h *harness, query string) []dbObject {
	t.Helper()
	var dbs []dbObject
	h.do(t, "GET", databasesPath+query, nil).decode(t, &dbs)
	return dbs
}

// createDatabases creates "alpha" through the endpoint, checks what it
// answers and what it refuses, and creates "beta", with two tables, on
// first use.
func createDatabases(t *testing.T, h *harness) {
	t.Helper()
	var created dbObject
	h.do(t, "POST", databasesPath, `{"name":"alpha","primary_location_hint":"weur"}`).decode(t, &created)
	if created.UUID != "alpha" || created.Name != "alpha" || created.Version != "production" ||
		created.NumTables == nil || *created.NumTables != 0 || created.FileSize == nil || *created.FileSize < 0 ||
		string(created.ReadReplication) != `{"mode":"disabled"}` {
		t.Errorf("created = %+v", created)
	}
	r := h.do(t, "POST", databasesPath, `{"name":"alpha"}`)
	checkError(t, r, 400, 7502)
	if r.env.Errors[0].Message != "A database with that name already exists." {
		t.Errorf("message %q", r.env.Errors[0].Message)
	}
	checkError(t, h.do(t, "POST", databasesPath, `{"name":"../x"}`), 400, 7400)
	checkError(t, h.do(t, "POST", databasesPath, `{}`), 400, 7400)
	checkError(t, h.do(t, "POST", databasesPath, `not json`), 400, 7400)
	h.exec(t, "beta", "CREATE TABLE a (x)", "CREATE TABLE b (x)") // created on first use
}

// listDatabasesPaged checks the list of "alpha" and "beta", paginated and
// filtered, and its refusals.
func listDatabasesPaged(t *testing.T, h *harness) {
	t.Helper()
	var names []string
	for _, d := range listDatabases(t, h, "") {
		names = append(names, d.Name)
	}
	if !slices.Equal(names, []string{"alpha", "beta"}) {
		t.Errorf("list = %q", names)
	}
	if got := listDatabases(t, h, "?per_page=1&page=2"); len(got) != 1 || got[0].UUID != "beta" {
		t.Errorf("page 2 of 1 = %+v", got)
	}
	if got := listDatabases(t, h, "?per_page=1&page=3"); len(got) != 0 {
		t.Errorf("page 3 of 1 = %+v", got)
	}
	if got := listDatabases(t, h, "?name=beta"); len(got) != 1 || got[0].UUID != "beta" {
		t.Errorf("name=beta: %+v", got)
	}
	if got := listDatabases(t, h, "?name=gamma"); len(got) != 0 {
		t.Errorf("name=gamma: %+v", got)
	}
	checkError(t, h.do(t, "GET", databasesPath+"?page=0", nil), 400, 7400)
	checkError(t, h.do(t, "GET", "/accounts/a%20b/d1/database", nil), 400, 7003)
}

// deleteDatabase deletes "beta" and checks that it is gone, its files too
// (in dir), and that it is recreated empty on its next query (auto-create
// is on); deleting a missing database is ErrNoDatabase.
func deleteDatabase(t *testing.T, h *harness, dir string) {
	t.Helper()
	r := h.do(t, "DELETE", databasesPath+"/beta", nil)
	if r.status != 200 || string(r.env.Result) != "null" {
		t.Fatalf("delete: %d %s", r.status, r.body)
	}
	checkError(t, h.do(t, "DELETE", databasesPath+"/beta", nil), 404, 7404)
	checkError(t, h.do(t, "GET", databasesPath+"/beta", nil), 404, 7404)
	if ids, err := h.srv.Databases(); err != nil || !slices.Equal(ids, []string{"alpha"}) {
		t.Errorf("Databases() = %q, %v", ids, err)
	}
	if dir != "" {
		matches, _ := filepath.Glob(filepath.Join(dir, "beta.sqlite*"))
		if len(matches) != 0 {
			t.Errorf("files left by delete: %q", matches)
		}
	}
	// Recreated empty on its next query (auto-create is on).
	if got := h.rows(t, "beta", q("SELECT count(*) AS n FROM sqlite_master")); got != `[{"n":0}]` {
		t.Errorf("recreated beta: %s", got)
	}
	if err := h.srv.DeleteDatabase("nope"); !errors.Is(err, ErrNoDatabase) {
		t.Errorf("DeleteDatabase(missing) = %v, want ErrNoDatabase", err)
	}
}

// TestNoAutoCreateCreatesNothing: with NoAutoCreate, no directory and no
// database is ever created by reads, and a missing one is reported with the
// list of what exists.
func TestNoAutoCreateCreatesNothing(t *testing.T) {
	parent := t.TempDir()
	missing := filepath.Join(parent, "missing")
	if _, err := New(Config{Dir: missing, NoAutoCreate: true}); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("New with a missing Dir = %v, want an error wrapping ErrNotExist", err)
	}
	if _, err := os.Stat(missing); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("New created the directory: %v", err)
	}
	file := filepath.Join(parent, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{Dir: file, NoAutoCreate: true}); err == nil {
		t.Error("New accepted a file as Dir")
	}

	dir := filepath.Join(parent, "data")
	setup := newHarness(t, Config{Dir: dir})
	setup.exec(t, "a", "CREATE TABLE t (x)")
	setup.exec(t, "b", "CREATE TABLE t (x)")
	if err := setup.srv.Close(); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadDir(dir)

	h := newHarness(t, Config{Dir: dir, NoAutoCreate: true})
	checkError(t, h.post(t, "x", "query", q("SELECT 1")), 404, 7404)
	checkError(t, h.post(t, "x", "raw", q("SELECT 1")), 404, 7404)
	checkError(t, h.do(t, "GET", "/accounts/acc/d1/database/x", nil), 404, 7404)
	checkError(t, h.do(t, "POST", "/accounts/acc/d1/database/x/export", `{"output_format":"polling"}`), 404, 7404)
	checkError(t, h.do(t, "POST", "/accounts/acc/d1/database/x/import", `{"action":"init","etag":"00"}`), 404, 7404)
	if ids, err := h.srv.Databases(); err != nil || !slices.Equal(ids, []string{"a", "b"}) {
		t.Errorf("Databases() = %q, %v", ids, err)
	}
	if got := h.rows(t, "a", q("SELECT count(*) AS n FROM t")); got != `[{"n":0}]` {
		t.Errorf("existing database: %s", got)
	}
	after, _ := os.ReadDir(dir)
	var names []string
	for _, e := range after {
		names = append(names, e.Name())
	}
	for _, n := range names {
		if filepath.Ext(n) == ".sqlite" && !slices.ContainsFunc(before, func(e os.DirEntry) bool { return e.Name() == n }) {
			t.Errorf("a database file appeared: %s (dir: %q)", n, names)
		}
	}
	// Explicit creation still works.
	r := h.do(t, "POST", "/accounts/acc/d1/database", `{"name":"c"}`)
	if r.status != 200 {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	h.ok(t, "c", q("SELECT 1"))
}

// TestDeleteWhileInUse: calls racing a delete either run before it or
// answer 404/7404, never an internal error, and the database is gone after.
func TestDeleteWhileInUse(t *testing.T) {
	for _, dir := range []string{"", t.TempDir()} {
		h := newHarness(t, Config{Dir: dir, NoAutoCreate: true})
		if err := h.srv.CreateDatabase("x"); err != nil {
			t.Fatal(err)
		}
		h.exec(t, "x", "CREATE TABLE t (v)")
		var wg sync.WaitGroup
		statuses := make(chan string, 400)
		for range 8 {
			wg.Go(func() {
				for range 50 {
					resp, err := http.Post(h.url+"/accounts/acc/d1/database/x/query", "application/json",
						strings.NewReader(`{"sql":"INSERT INTO t VALUES (1)"}`))
					if err != nil {
						t.Error(err)
						return
					}
					body, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					if resp.StatusCode != 200 {
						statuses <- fmt.Sprintf("%d %s", resp.StatusCode, body)
					}
				}
			})
		}
		if err := h.srv.DeleteDatabase("x"); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		close(statuses)
		for s := range statuses {
			if !strings.HasPrefix(s, `404 {"result":null,"success":false,"errors":[{"code":7404,`) {
				t.Errorf("a call racing the delete: %s", s)
			}
		}
		if ids, _ := h.srv.Databases(); len(ids) != 0 {
			t.Errorf("Databases() after delete = %q", ids)
		}
	}
}

// TestMatchRoute: each of the API's paths finds its route and its
// parameters (account, database, endpoint, as far as the path has them);
// any other path, one with an empty segment included, finds none.
func TestMatchRoute(t *testing.T) {
	for _, tc := range []struct {
		path, route string
		args        []string
	}{
		{"/user/tokens/verify", routeVerify, nil},
		{"/user", routeUser, nil},
		{"/memberships", routeMemberships, nil},
		{"/accounts", routeAccounts, nil},
		{"/accounts/acc/tokens/verify", routeVerify, []string{"acc"}},
		{"/accounts/acc/d1/database", routeDatabases, []string{"acc"}},
		{"/accounts/acc/d1/database/db", routeDatabase, []string{"acc", "db"}},
		{"/accounts/acc/d1/database/query", routeDatabase, []string{"acc", "query"}},
		{"/accounts/tokens/tokens/verify", routeVerify, []string{"tokens"}},
		{"/accounts/acc/d1/database/db/query", routeQuery, []string{"acc", "db", "query"}},
		{"/accounts/acc/d1/database/db/raw", routeQuery, []string{"acc", "db", "raw"}},
		{"/accounts/acc/d1/database/db/import", routeImport, []string{"acc", "db", "import"}},
		{"/accounts/acc/d1/database/db/export", routeExport, []string{"acc", "db", "export"}},
		{"", "", nil},
		{"/", "", nil},
		{"user", "", nil},
		{"/user/", "", nil},
		{"//user", "", nil},
		{"/user/tokens", "", nil},
		{"/user/tokens/verify/x", "", nil},
		{"/users", "", nil},
		{"/memberships/x", "", nil},
		{"/accounts/acc", "", nil},
		{"/accounts/acc/tokens", "", nil},
		{"/accounts/acc/tokens/verify/x", "", nil},
		{"/accounts/acc/d1", "", nil},
		{"/accounts/acc/d1/databases", "", nil},
		{"/accounts/acc/d2/database", "", nil},
		{"/accounts//d1/database", "", nil},
		{"/accounts/acc/d1/database/", "", nil},
		{"/accounts/acc/d1/database//query", "", nil},
		{"/accounts/acc/d1/database/db/backup", "", nil},
		{"/accounts/acc/d1/database/db/query/x", "", nil},
		{"/accounts/acc/d1/database/db/Query", "", nil},
		{"/zones/acc/d1/database/db/query", "", nil},
		{"/user/acc/d1/database/db/query", "", nil},
	} {
		rt, args := matchRoute(tc.path)
		name := ""
		if rt != nil {
			name = rt.name
		}
		if name != tc.route || !slices.Equal(args, tc.args) {
			t.Errorf("matchRoute(%q) = %q %q, want %q %q", tc.path, name, args, tc.route, tc.args)
		}
	}
}
