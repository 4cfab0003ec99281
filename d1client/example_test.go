package d1client_test

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"strings"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1client/budget"
	"github.com/d1idem/d1idem/d1local"
)

// Run a batch (one transaction) and read its results exactly. Against
// Cloudflare, leave BaseURL empty and set APIToken, AccountID and
// DatabaseID; here a local D1 (d1local) stands in.
func ExampleClient_Exec() {
	local, _ := d1local.New(d1local.Config{})
	defer local.Close()
	srv := httptest.NewServer(local)
	defer srv.Close()

	db, err := d1client.New(d1client.Config{BaseURL: srv.URL, AccountID: "acct", DatabaseID: "example", Budget: budget.Unlimited()})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	res, err := db.Exec(ctx, []d1client.Statement{
		d1client.Statement{SQL: "CREATE TABLE accounts (id INTEGER PRIMARY KEY, email TEXT UNIQUE, balance INTEGER)"},
		d1client.Statement{SQL: "INSERT INTO accounts (email, balance) VALUES (?, ?) RETURNING id", Params: []any{"a@example.com", int64(9007199254740993)}},
		d1client.Statement{SQL: "SELECT email, CAST(balance AS TEXT) AS exact FROM accounts"},
	})
	if err != nil {
		panic(err)
	}
	var id int64
	_ = res[1].Rows[0].Scan(&id)
	var email, exact string
	_ = res[2].Rows[0].Scan(&email, &exact)
	fmt.Println(id, email, exact, res[1].Meta.Changes)

	// A constraint violation is an SQL error, matchable with errors.Is.
	_, err = db.Query(ctx, "INSERT INTO accounts (email) VALUES (?)", "a@example.com")
	var e *d1client.Error
	fmt.Println(errors.Is(err, d1client.ErrConstraint), errors.As(err, &e) && e.SQLiteCode == "SQLITE_CONSTRAINT")
	// Output:
	// 1 a@example.com 9007199254740993 1
	// true true
}

// Clients of several databases on one Cloudflare account share its API
// budget through one Account: they pace their calls together, from the
// account's own Ratelimit headers, which d1local sends when it plays the
// account's budget.
func ExampleConfig_account() {
	local, _ := d1local.New(d1local.Config{RateLimit: d1local.CloudflareRateLimit()})
	defer local.Close()
	srv := httptest.NewServer(local)
	defer srv.Close()

	account, err := budget.NewAccount(budget.Budget{}) // Cloudflare's limit, default burst and reserve
	if err != nil {
		panic(err)
	}
	orders, _ := d1client.New(d1client.Config{BaseURL: srv.URL, AccountID: "acct", DatabaseID: "orders", Account: account})
	users, _ := d1client.New(d1client.Config{BaseURL: srv.URL, AccountID: "acct", DatabaseID: "users", Account: account})
	ctx := context.Background()
	if _, err := orders.Query(ctx, "SELECT 1"); err != nil {
		panic(err)
	}
	if _, err := users.Query(ctx, "SELECT 1"); err != nil {
		panic(err)
	}
	st := users.Account().State()
	fmt.Println(st.Quota, st.Window, st.Remaining)
	// Output:
	// 1200 5m0s 1198
}

// Reach D1 through a d1idem bridge: its URL carries its secret, which is
// sent as the bearer token, and the client applies no API budget. In
// production, leave the Config without BaseURL and BridgeURL and set
// D1IDEM_BRIDGE_URL=https://:SECRET@d1idem-bridge.<subdomain>.workers.dev;
// here a local D1 requiring that token stands in for the bridge.
func ExampleConfig_bridgeURL() {
	const secret = "5f0c3b1e9a7d2468ace13579bdf02468"
	local, _ := d1local.New(d1local.Config{Token: secret})
	defer local.Close()
	srv := httptest.NewServer(local)
	defer srv.Close()

	db, err := d1client.New(d1client.Config{
		BridgeURL:  "http://:" + secret + "@" + srv.Listener.Addr().String(),
		AccountID:  "acct",
		DatabaseID: "example",
	})
	if err != nil {
		panic(err)
	}
	res, err := db.Query(context.Background(), "SELECT 1 AS one")
	if err != nil {
		panic(err)
	}
	fmt.Println(db.Bridge(), db.BudgetWait(), res.Rows[0][0])
	fmt.Println(strings.Contains(fmt.Sprintf("%v %#v", db, db), secret)) // the secret is never shown
	// Output:
	// true 0s 1
	// false
}
