package ordersapi_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/examples/orders/ordersapi"
	"github.com/d1idem/d1idem/idem"
)

func TestOrdersAPI(t *testing.T) {
	ctx := context.Background()
	db := newDB(t)
	if err := ordersapi.EnsureSchema(ctx, db); err != nil {
		t.Fatal(err)
	}
	ledger, err := idem.New(db, idem.Config{})
	if err != nil {
		t.Fatal(err)
	}
	h, err := ordersapi.New(ordersapi.Config{Ledger: ledger, DB: db})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	c := ordersClient{url: srv.URL, db: db}

	res, body := c.do(t, "POST", "/v1/orders", "", "k1", `{"sku":"tea","qty":2}`)
	if res.StatusCode != 401 {
		t.Fatalf("no token: %d %s", res.StatusCode, body)
	}
	badTokensRefused(t, c)
	createReplayGet(t, c)
	// Invalid orders are answered, stored and replayed like any response;
	// nothing is created.
	for i := 0; i < 2; i++ {
		if res, body = c.do(t, "POST", "/v1/orders", "tok_a", "k2", `{"sku":"","qty":0}`); res.StatusCode != 422 {
			t.Fatalf("invalid: %d %s", res.StatusCode, body)
		}
	}
	if res, body = c.do(t, "POST", "/v1/orders", "tok_a", "k3", `{"sku":"x","qty":1,"extra":true}`); res.StatusCode != 400 {
		t.Fatalf("unknown field: %d %s", res.StatusCode, body)
	}
	if n := c.count(t, "1"); n != 1 {
		t.Fatalf("%d orders after invalid requests", n)
	}
}

// ordersClient is a client of the orders API served at url, and the
// database behind it.
type ordersClient struct {
	url string
	db  *d1client.Client
}

// do sends a request with a JSON body, the bearer token and the
// Idempotency-Key (each only when given), and returns the response and
// its body.
func (c ordersClient) do(t *testing.T, method, path, token, key, body string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(method, c.url+path, strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res, string(b)
}

// count counts the orders rows where the condition holds.
func (c ordersClient) count(t *testing.T, where string, args ...any) int64 {
	t.Helper()
	res, err := c.db.Query(context.Background(), "SELECT count(*) FROM orders WHERE "+where, args...)
	if err != nil {
		t.Fatal(err)
	}
	n, _ := res.Rows[0][0].Int64()
	return n
}

// badTokensRefused checks that a token that is not a b64token (a byte
// that is not UTF-8, a space) or is too long is refused by the API itself,
// 401, before the ledger: never reported as the ledger being unavailable.
// A token of the longest length is accepted.
func badTokensRefused(t *testing.T, c ordersClient) {
	t.Helper()
	for _, bad := range []string{"tok\xff", "tok en", "tok\u00e9", strings.Repeat("t", ordersapi.MaxTokenLength+1), "==="} {
		for _, path := range []string{"/v1/orders", "/v1/orders/ord_1"} {
			method := "POST"
			if path != "/v1/orders" {
				method = "GET"
			}
			res, body := c.do(t, method, path, bad, "k1", `{"sku":"tea","qty":2}`)
			if res.StatusCode != 401 || !strings.Contains(body, `"unauthenticated"`) || res.Header.Get("Retry-After") != "" {
				t.Errorf("%s %s with token %q: %d %s", method, path, bad, res.StatusCode, body)
			}
		}
	}
	if n := c.count(t, "1"); n != 0 {
		t.Fatalf("%d orders after refused tokens", n)
	}
	if _, err := ordersapi.BearerPrincipal(&http.Request{Header: http.Header{"Authorization": {"Bearer " + strings.Repeat("t", ordersapi.MaxTokenLength)}}}); err != nil {
		t.Errorf("a token of %d characters: %v", ordersapi.MaxTokenLength, err)
	}
}

// createReplayGet creates an order with key k1, and checks its one row,
// its replay (no second row), and that only its principal reads it.
func createReplayGet(t *testing.T, c ordersClient) {
	t.Helper()
	res, body := c.do(t, "POST", "/v1/orders", "tok_a", "k1", `{"sku":"tea","qty":2}`)
	var o ordersapi.Order
	if res.StatusCode != 201 || json.Unmarshal([]byte(body), &o) != nil || res.Header.Get("Location") != "/v1/orders/"+o.ID || o.SKU != "tea" || o.Qty != 2 {
		t.Fatalf("create: %d %v %s", res.StatusCode, res.Header, body)
	}
	// The INSERT was committed with the completion: one row, the response's ID.
	if n := c.count(t, "id = ? AND principal = ? AND idempotency_key = ?", o.ID, "tok_a", "k1"); n != 1 {
		t.Fatalf("%d order rows", n)
	}
	res2, body2 := c.do(t, "POST", "/v1/orders", "tok_a", "k1", `{"sku":"tea","qty":2}`)
	if res2.StatusCode != 201 || body2 != body || res2.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay: %d %s", res2.StatusCode, body2)
	}
	if n := c.count(t, "1"); n != 1 {
		t.Fatalf("%d orders after a replay", n)
	}
	res, body = c.do(t, "GET", "/v1/orders/"+o.ID, "tok_a", "", "")
	if res.StatusCode != 200 || !strings.Contains(body, o.ID) {
		t.Fatalf("get: %d %s", res.StatusCode, body)
	}
	if res, _ = c.do(t, "GET", "/v1/orders/"+o.ID, "tok_b", "", ""); res.StatusCode != 404 {
		t.Fatalf("another principal reads the order: %d", res.StatusCode)
	}
}

// newDB returns a client of a fresh in-memory d1local database, served for
// the test's duration.
func newDB(t *testing.T) *d1client.Client {
	t.Helper()
	srv, err := d1local.New(d1local.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv)
	t.Cleanup(func() {
		ts.Close()
		_ = srv.Close()
	})
	db, err := d1client.New(d1client.Config{BaseURL: ts.URL, AccountID: "test", DatabaseID: "orders"})
	if err != nil {
		t.Fatal(err)
	}
	return db
}

// TestCrashHeader: a request with CrashHeader calls Crash once its key is
// claimed, before the order is created; a request without it does not.
func TestCrashHeader(t *testing.T) {
	ctx := context.Background()
	db := newDB(t)
	if err := ordersapi.EnsureSchema(ctx, db); err != nil {
		t.Fatal(err)
	}
	ledger, err := idem.New(db, idem.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ordersapi.New(ordersapi.Config{Ledger: ledger, DB: db, CrashHeader: "X-Demo-Crash"}); err == nil {
		t.Fatal("CrashHeader without Crash is accepted")
	}
	crashes := 0
	h, err := ordersapi.New(ordersapi.Config{Ledger: ledger, DB: db, CrashHeader: "X-Demo-Crash",
		Crash: func() { crashes++; panic(http.ErrAbortHandler) }})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	post := func(key string, crash bool) {
		req, _ := http.NewRequest("POST", srv.URL+"/v1/orders", strings.NewReader(`{"sku":"tea","qty":2}`))
		req.Header.Set("Authorization", "Bearer tok_a")
		req.Header.Set("Idempotency-Key", key)
		if crash {
			req.Header.Set("X-Demo-Crash", "1")
		}
		if res, err := http.DefaultClient.Do(req); err == nil {
			res.Body.Close()
		}
	}
	post("k1", false)
	post("k2", true)
	res, err := db.Query(ctx, "SELECT count(*) FROM orders")
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := res.Rows[0][0].Int64(); crashes != 1 || n != 1 {
		t.Errorf("crashes = %d, orders = %d; want 1 and 1", crashes, n)
	}
	// The crashed request's key was claimed.
	if _, err := ledger.Admin().Get(ctx, "tok_a", "k2"); err != nil {
		t.Errorf("the crashed request's key: %v", err)
	}
}
