package idem_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/d1idem/d1idem"
	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1client/budget"
	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/idem"
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

// Use the ledger directly, from any transport: Begin decides, Complete
// stores.
func ExampleLedger() {
	db, cleanup := exampleDB()
	defer cleanup()
	ledger, _ := idem.New(db, idem.Config{})
	ctx := context.Background()

	fp, _ := idem.Fingerprint("POST", "/v1/charges", http.Header{}, idem.DefaultFingerprintHeaders, strings.NewReader(`{"amount":500}`))
	d, _ := ledger.Begin(ctx, "acct_42", "charge-1", fp)
	fmt.Println(d.Outcome, d.Reservation.Generation)

	// ... run the mutation, then store its response:
	c, _ := ledger.Complete(ctx, d.Reservation, idem.Response{Status: 201, Body: []byte(`{"charge":"ch_1"}`)})
	fmt.Println("stored:", c.Stored)

	d, _ = ledger.Begin(ctx, "acct_42", "charge-1", fp)
	fmt.Println(d.Outcome, d.Response.Status, string(d.Response.Body))
	// Output:
	// execute 1
	// stored: true
	// replay 201 {"charge":"ch_1"}
}

// Inspect and release keys with the administrative API, which the d1idem
// CLI is built on.
func ExampleAdmin() {
	db, cleanup := exampleDB()
	defer cleanup()
	now := time.UnixMilli(1_767_225_600_000)
	ledger, _ := idem.New(db, idem.Config{Clock: func() time.Time { return now }})
	ctx := context.Background()

	// An owner claims a key and dies.
	ledger.Begin(ctx, "acct_42", "order-7", "fp")
	now = now.Add(time.Minute)

	// The pending keys with no update for longer than the TTL.
	admin := ledger.Admin()
	stuck, _ := admin.List(ctx, idem.ListOptions{Status: idem.StatusPending, OlderThan: idem.DefaultTTL})
	k := stuck.Keys[0]
	fmt.Println(len(stuck.Keys), k.Key, k.Generation, k.SinceUpdate())

	// Release it at the generation just read: the client's retry takes it
	// over at once.
	res, _ := admin.Release(ctx, k.Principal, k.Key, k.Generation, idem.ReleaseOptions{})
	fmt.Println(res.Released, res.Before.Generation, "->", res.Generation)
	// Output:
	// 1 order-7 1 1m0s
	// true 1 -> 2
}

// Say why a key is stuck and what to do, as the d1idem CLI does.
func ExampleAdmin_Explain() {
	db, cleanup := exampleDB()
	defer cleanup()
	now := time.UnixMilli(1_767_225_600_000)
	ledger, _ := idem.New(db, idem.Config{Clock: func() time.Time { return now }})
	ctx := context.Background()

	// An owner claims a key, and stops renewing it.
	ledger.Begin(ctx, "acct_42", "order-7", "fp")
	now = now.Add(25 * time.Second)

	admin := ledger.Admin()
	k, _ := admin.Get(ctx, "acct_42", "order-7")
	e := admin.Explain(&k)
	fmt.Println(e.State, "-", e.Reason)
	fmt.Println(e.Next)
	fmt.Printf("release at generation %d, force %v; the retry takes it over at generation %d\n", e.Release.Generation, e.Release.Force, e.TakeoverGeneration)
	// Output:
	// owner_quiet - no update for 25s (a live owner renews every 10s), inside the 30s TTL
	// Retries get 409 idempotency_key_in_progress until the TTL has passed, in 5s.
	// release at generation 1, force true; the retry takes it over at generation 3
}

// A cron job that clears the sweep backlog of every database of the
// ledger, batch by batch, within the D1 client's API budget.
func ExampleAdmin_SweepAll() {
	db, cleanup := exampleDB()
	defer cleanup()
	now := time.UnixMilli(1_767_225_600_000)
	ledger, _ := idem.New(db, idem.Config{Clock: func() time.Time { return now }, SweepBatch: 2})
	ctx := context.Background()
	for _, key := range []string{"k1", "k2", "k3"} {
		d, _ := ledger.Begin(ctx, "acct_42", key, "fp")
		ledger.Complete(ctx, d.Reservation, idem.Response{Status: 204})
	}
	now = now.Add(25 * time.Hour) // past the retention

	res, err := ledger.Admin().SweepAll(ctx, idem.SweepOptions{
		Progress: func(p idem.SweepProgress) {
			if p.Wait > 0 {
				log.Printf("sweep: waiting %v for the API budget", p.Wait)
			}
		},
	})
	fmt.Println(res.Deleted, res.Batches, res.Complete, err)
	// Output:
	// 3 2 true <nil>
}

// exampleDBs returns clients on fresh local D1 databases with these IDs,
// each holding the ledger schema.
func exampleDBs(ids ...string) ([]*d1client.Client, func()) {
	local, _ := d1local.New(d1local.Config{})
	srv := httptest.NewServer(local)
	var schema []d1client.Statement
	for _, s := range d1idem.SchemaStatements() {
		schema = append(schema, d1client.Statement{SQL: s})
	}
	var dbs []*d1client.Client
	for _, id := range ids {
		db, _ := d1client.New(d1client.Config{BaseURL: srv.URL, AccountID: "acct", DatabaseID: id, Budget: budget.Unlimited()})
		if _, err := db.Exec(context.Background(), schema); err != nil {
			panic(err)
		}
		dbs = append(dbs, db)
	}
	return dbs, func() { srv.Close(); local.Close() }
}

// Spread the ledger over several databases, then add one. Each principal's
// keys live in the database the ring routes it to; while the ring is
// Moving, a moved principal's keys at its old home are still answered from
// there, and its new keys go to its new home.
func ExampleNewSharded() {
	dbs, cleanup := exampleDBs("db-a", "db-b", "db-c")
	defer cleanup()
	ctx := context.Background()
	homes := []idem.Home{{DB: dbs[0]}, {DB: dbs[1]}} // IDs: the database IDs

	// The operator records the first ring, once.
	ledger, _ := idem.NewSharded(homes, idem.Config{})
	st, _ := ledger.Admin().InitRing(ctx)
	fmt.Println(st.Ring)

	d, _ := ledger.Begin(ctx, "acct_7", "order-1", "fp")
	ledger.Complete(ctx, d.Reservation, idem.Response{Status: 201, Body: []byte(`{"order":1}`)})

	// Every replica is given the new database, then the operator grows.
	ledger, _ = idem.NewSharded(append(homes, idem.Home{DB: dbs[2]}), idem.Config{})
	st, _ = ledger.Admin().Grow(ctx, "db-c")
	fmt.Println(st.Ring)
	fmt.Println("acct_7:", st.Ring.PreviousHome("acct_7"), "->", st.Ring.Home("acct_7"))

	d, _ = ledger.Begin(ctx, "acct_7", "order-1", "fp") // at its old home
	fmt.Println(d.Outcome, string(d.Response.Body))
	d, _ = ledger.Begin(ctx, "acct_7", "order-2", "fp") // at its new home
	fmt.Println(d.Outcome, d.Reservation.Generation)
	// Output:
	// v1 stable [db-a db-b]
	// v2 moving [db-a db-b db-c] from [db-a db-b]
	// acct_7: db-b -> db-c
	// replay {"order":1}
	// execute 1
}
