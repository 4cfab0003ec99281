package bridge_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/d1idem/d1idem/internal/d1test"
)

// send makes one request to the backend with its token.
func send(t testing.TB, b *d1test.Backend, method, path, body string) *d1test.Response {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, b.BaseURL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+b.Token)
	res, err := b.HTTPClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	data, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return &d1test.Response{Status: res.StatusCode, Header: res.Header, Body: data}
}

// TestRoutes: the bridge serves POST .../query and .../raw, with or without
// the /client/v4 prefix and a trailing slash, and answers anything else as
// Cloudflare's API does: 404 with code 7000 for a route it does not have
// (with or without a token), 405 with code 10405 and Allow: POST for
// another method, 400 with code 7400 for a body that is not a query.
func TestRoutes(t *testing.T) {
	b := d1test.Workerd(t)
	db := b.NewDatabase(t)
	acc := "/accounts/" + b.AccountID + "/d1/database/" + db.ID

	for _, path := range []string{acc + "/raw", acc + "/query", "/client/v4" + acc + "/raw", acc + "/query/"} {
		wantOK(t, send(t, b, http.MethodPost, path, `{"sql":"SELECT 1 AS one"}`), 1)
	}
	for _, path := range []string{"/", "/healthz", acc, acc + "/execute", acc + "/raw/x", "/client/v4/accounts/x/d1/database", "/accounts//d1/database/db-0/raw", "/v4" + acc + "/raw"} {
		wantError(t, send(t, b, http.MethodPost, path, `{"sql":"SELECT 1"}`), http.StatusNotFound, 7000, "No route for that URI")
	}
	res := b.Database(db.ID).PostHeader(t, "nope", http.Header{}, `{}`)
	wantError(t, res, http.StatusNotFound, 7000)
	for _, method := range []string{http.MethodGet, http.MethodPut, http.MethodDelete, http.MethodPatch} {
		res := send(t, b, method, acc+"/raw", `{"sql":"SELECT 1"}`)
		wantError(t, res, http.StatusMethodNotAllowed, 10405, "Method "+method+" not allowed")
		if got := res.Header.Get("Allow"); got != "POST" {
			t.Errorf("%s: Allow = %q, want POST", method, got)
		}
	}
	for _, body := range []string{``, `{`, `[]`, `"SELECT 1"`, `{"sql":1}`, `{"sql":"SELECT ?","params":{"a":1}}`, `{"batch":[]}`, `{"batch":{}}`, `{"batch":[{"sql":"SELECT 1"},"SELECT 2"]}`} {
		res := db.Post(t, "raw", body)
		wantError(t, res, http.StatusBadRequest, 7400)
	}
	res = db.Post(t, "raw", bytes.Repeat([]byte("x"), 10))
	wantError(t, res, http.StatusBadRequest, 7400, "not valid JSON")
	// A database segment that does not decode is a bad identifier.
	res = send(t, b, http.MethodPost, "/accounts/x/d1/database/%E0%A4/raw", `{"sql":"SELECT 1"}`)
	wantError(t, res, http.StatusBadRequest, 7003, "perhaps your object identifier is invalid?")
}

// TestDatabaseMapping: BRIDGE_DATABASES decides which database IDs reach
// which binding: a database's UUID and its name may both name one binding,
// and nothing else is served (404, code 7404), the binding names included.
// Without BRIDGE_DATABASES each binding is addressed by its name. A map
// that names a binding the Worker does not have is a misconfiguration.
func TestDatabaseMapping(t *testing.T) {
	t.Run("map", func(t *testing.T) {
		const uuid = "6b4c8e3e-0000-4000-8000-000000000001"
		b := d1test.Bridge(t, d1test.BridgeConfig{Pool: 3, Databases: `{"orders-db":"DB_0","` + uuid + `":"DB_0","db-1":"DB_1"}`})
		wantOK(t, b.Database("orders-db").Post(t, "raw", `{"sql":"CREATE TABLE orders (id INTEGER)"}`), 1)
		wantOK(t, b.Database("orders-db").Post(t, "raw", `{"sql":"INSERT INTO orders VALUES (7)"}`), 1)
		got := wantOK(t, b.Database(uuid).Post(t, "raw", `{"sql":"SELECT id FROM orders"}`), 1)
		if !strings.Contains(string(got[0]), `"rows":[[7]]`) {
			t.Errorf("by UUID: %s, want the row written by name", got[0])
		}
		res := b.Database("db-1").Post(t, "raw", `{"sql":"SELECT id FROM orders"}`)
		wantError(t, res, http.StatusBadRequest, 7500, "no such table: orders")
		for _, id := range []string{"db-0", "db-2", "DB_0", "DB_2", "orders", "ORDERS-DB"} {
			res := b.Database(id).Post(t, "raw", `{"sql":"SELECT 1"}`)
			wantError(t, res, http.StatusNotFound, 7404, "The database "+id+" could not be found")
		}
	})
	t.Run("binding names", func(t *testing.T) {
		b := d1test.Bridge(t, d1test.BridgeConfig{Pool: 2, Databases: "none"})
		wantOK(t, b.Database("DB_0").Post(t, "raw", `{"sql":"SELECT 1"}`), 1)
		wantOK(t, b.Database("DB_1").Post(t, "raw", `{"sql":"SELECT 1"}`), 1)
		res := b.Database("db-0").Post(t, "raw", `{"sql":"SELECT 1"}`)
		wantError(t, res, http.StatusNotFound, 7404)
	})
}

// TestMisconfiguration: a setting the Worker cannot read, as workerd hands
// it over (a JSON string here), makes it refuse every request with
// 500/10001 and a message naming the setting, rather than run with a guess;
// the message goes only to requests that carry the secret (others get 401,
// and learn nothing of the settings). TestWorkerUnderNode covers every
// other unreadable setting.
func TestMisconfiguration(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  d1test.BridgeConfig
		want string
	}{
		{"allowed not JSON", d1test.BridgeConfig{Mode: "ledger-only", Env: []string{"BRIDGE_ALLOWED_STATEMENTS=SELECT 1"}}, "BRIDGE_ALLOWED_STATEMENTS is not valid JSON"},
		{"unknown binding", d1test.BridgeConfig{Databases: `{"orders-db":"DB"}`}, `BRIDGE_DATABASES maps "orders-db" to "DB", which is not a D1 binding of this Worker`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Pool = 1
			b := d1test.Bridge(t, tc.cfg)
			res := b.Database("db-0").Post(t, "raw", `{"sql":"SELECT 1"}`)
			wantError(t, res, http.StatusInternalServerError, 10001, "bridge misconfigured: "+tc.want)
			res = b.Database("db-0").PostHeader(t, "raw", bearer("not-the-secret-not-the-secret"), `{"sql":"SELECT 1"}`)
			wantError(t, res, http.StatusUnauthorized, 10000)
		})
	}
}
