package schema_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http/httptest"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/schema"
)

// A service applies the schema at start-up; the second run finds it
// recorded and does nothing.
func ExampleApply() {
	db, done := exampleDB()
	defer done()
	ctx := context.Background()
	for range 2 {
		res, err := schema.Apply(ctx, db, schema.Options{})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%s: %v in %s\n", res.Action, res.Migrations, res.MigrationsTable)
	}
	// Output:
	// create the ledger table and index, and record the migration: [0001_d1idem_idempotency_keys.sql] in d1_migrations
	// nothing: the migration is already recorded: [0001_d1idem_idempotency_keys.sql] in d1_migrations
}

// Verify returns a *DriftError that lists the differences.
func ExampleVerify() {
	db, done := exampleDB()
	defer done()
	ctx := context.Background()
	if _, err := db.Query(ctx, `CREATE TABLE idempotency_keys (principal TEXT NOT NULL, key TEXT NOT NULL,
		fingerprint TEXT NOT NULL, status TEXT NOT NULL DEFAULT 'pending', generation INTEGER NOT NULL DEFAULT 1,
		response_status INTEGER, response_body TEXT, response_headers TEXT, created_at INTEGER NOT NULL,
		updated_at INTEGER, PRIMARY KEY (principal, key))`); err != nil {
		log.Fatal(err)
	}
	var drift *schema.DriftError
	if err := schema.Verify(ctx, db); errors.As(err, &drift) {
		for _, line := range drift.Diff {
			fmt.Println(line)
		}
	}
	// Output:
	// - column updated_at INTEGER NOT NULL
	// + column updated_at INTEGER
	// - index idx_idempotency_keys_updated_at on (updated_at)
}

// exampleDB returns a client of an in-memory d1local database, standing in
// for D1.
func exampleDB() (*d1client.Client, func()) {
	srv, err := d1local.New(d1local.Config{})
	if err != nil {
		log.Fatal(err)
	}
	ts := httptest.NewServer(srv)
	db, err := d1client.New(d1client.Config{BaseURL: ts.URL, AccountID: "example", DatabaseID: "example"})
	if err != nil {
		log.Fatal(err)
	}
	return db, func() { ts.Close(); srv.Close() }
}
