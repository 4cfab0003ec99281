package idemhttp_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/d1idem/d1idem"
	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1client/budget"
	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/idem/idemhttp"
)

// exampleDB returns a client on a fresh local D1 (d1local) holding the
// ledger schema. In production, point d1client at Cloudflare instead:
// d1client.Config{APIToken: ..., AccountID: ..., DatabaseID: ...}.
func exampleDB() (*d1client.Client, func()) {
	local, _ := d1local.New(d1local.Config{})
	srv := httptest.NewServer(local)
	db, _ := d1client.New(d1client.Config{BaseURL: srv.URL, AccountID: "acct", DatabaseID: "example", Budget: budget.Unlimited()})
	var schema []d1client.Statement
	for _, s := range d1idem.SchemaStatements() {
		schema = append(schema, d1client.Statement{SQL: s})
	}
	if _, err := db.Exec(context.Background(), schema); err != nil {
		panic(err)
	}
	return db, func() { srv.Close(); local.Close() }
}

// Wrap a mutating handler: the first request runs it, a retry with the same
// Idempotency-Key replays the stored response.
func ExampleNew() {
	db, cleanup := exampleDB()
	defer cleanup()
	ledger, _ := idem.New(db, idem.Config{})

	createOrder := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"order":"ord_1"}`)
	})
	protect, err := idemhttp.New(ledger, idemhttp.Options{
		// Derive the principal from authentication, never from the client.
		Principal: func(r *http.Request) (string, error) { return "acct_42", nil },
	})
	if err != nil {
		panic(err)
	}
	api := httptest.NewServer(protect(createOrder))
	defer api.Close()

	for i := 0; i < 2; i++ {
		req, _ := http.NewRequest("POST", api.URL+"/v1/orders", strings.NewReader(`{"sku":"tea"}`))
		req.Header.Set("Idempotency-Key", "8e03978e-40d5-43e8-bc93-6894a57f9324")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		fmt.Println(res.StatusCode, res.Header.Get("Idempotent-Replayed"), string(body))
	}
	// Output:
	// 201  {"order":"ord_1"}
	// 201 true {"order":"ord_1"}
}

// A handler's business write commits in the same D1 batch as the stored
// response: queue it on the request's Tx, and it lands exactly once per
// key, even when a takeover fences this request out.
func ExampleTxFromContext() {
	db, cleanup := exampleDB()
	defer cleanup()
	if _, err := db.Query(context.Background(), "CREATE TABLE orders (id TEXT PRIMARY KEY, sku TEXT NOT NULL)"); err != nil {
		panic(err)
	}
	ledger, _ := idem.New(db, idem.Config{})
	protect := idemhttp.Must(ledger, idemhttp.Options{
		Principal: func(r *http.Request) (string, error) { return "acct_42", nil },
	})
	createOrder := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, _ := idemhttp.TxFromContext(r.Context())
		id := "ord_" + r.Header.Get(idemhttp.HeaderKey)
		if err := tx.Add(d1client.Statement{SQL: "INSERT INTO orders (id, sku) VALUES (?, ?)", Params: []any{id, "tea"}}); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, id)
	})
	api := httptest.NewServer(protect(createOrder))
	defer api.Close()

	for i := 0; i < 2; i++ {
		req, _ := http.NewRequest("POST", api.URL+"/v1/orders", strings.NewReader(`{"sku":"tea"}`))
		req.Header.Set(idemhttp.HeaderKey, "k1")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		fmt.Println(res.StatusCode, res.Header.Get(idemhttp.HeaderReplayed), string(body))
	}
	rows, _ := db.Query(context.Background(), "SELECT count(*) FROM orders")
	n, _ := rows.Rows[0][0].Int64()
	fmt.Println("orders:", n)
	// Output:
	// 201  ord_k1
	// 201 true ord_k1
	// orders: 1
}
