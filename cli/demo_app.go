package cli

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/idem/idemhttp"
)

// The demo plays against an orders API of its own, shaped like the example
// API (examples/orders: POST /v1/orders with a bearer token, an
// Idempotency-Key and {"sku", "qty"}), with its business rows in their own
// table, so that both can share one database.

// demoTable is the demo API's business table.
const demoTable = `CREATE TABLE IF NOT EXISTS demo_orders (id TEXT PRIMARY KEY, principal TEXT NOT NULL,
  idempotency_key TEXT NOT NULL, sku TEXT NOT NULL, qty INTEGER NOT NULL)`

// demoStallHeader makes the demo API take as long as its value ("3s")
// before it creates the order: a slow request. The example API has the same
// header when started with --demo-headers.
const demoStallHeader = "X-Demo-Stall"

// demoOrder is what the demo API answers.
type demoOrder struct {
	ID  string `json:"id"`
	SKU string `json:"sku"`
	Qty int64  `json:"qty"`
}

// demoAPI is the demo's orders API: POST /v1/orders, guarded by the idem
// middleware, its INSERT committed with the ledger's completion (idemhttp.Tx).
func demoAPI(ledger *idem.Ledger) (http.Handler, error) {
	mw, err := idemhttp.New(ledger, idemhttp.Options{Principal: bearerToken})
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("POST /v1/orders", mw(http.HandlerFunc(createDemoOrder)))
	return mux, nil
}

// bearerToken is the demo's stand-in for authentication: the principal is
// the bearer token.
func bearerToken(r *http.Request) (string, error) {
	if token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok && token != "" {
		return token, nil
	}
	return "", errors.New("no bearer token")
}

func createDemoOrder(w http.ResponseWriter, r *http.Request) {
	var o demoOrder
	if err := json.NewDecoder(r.Body).Decode(&o); err != nil || o.SKU == "" || o.Qty < 1 {
		http.Error(w, `{"error":"invalid_order"}`, http.StatusUnprocessableEntity)
		return
	}
	if d, err := time.ParseDuration(r.Header.Get(demoStallHeader)); err == nil {
		select {
		case <-time.After(d):
		case <-r.Context().Done():
			panic(http.ErrAbortHandler) // the lease was lost: nothing to store
		}
	}
	var id [6]byte
	_, _ = rand.Read(id[:])
	o.ID = "ord_" + hex.EncodeToString(id[:])
	principal, _ := bearerToken(r)
	tx, ok := idemhttp.TxFromContext(r.Context())
	if !ok || tx.Add(d1client.Statement{SQL: "INSERT INTO demo_orders VALUES (?, ?, ?, ?, ?)",
		Params: []any{o.ID, principal, r.Header.Get(idemhttp.HeaderKey), o.SKU, o.Qty}}) != nil {
		http.Error(w, `{"error":"internal"}`, http.StatusInternalServerError)
		return
	}
	body, _ := json.Marshal(o)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/v1/orders/"+o.ID)
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write(body)
}
