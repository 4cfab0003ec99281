package d1localtest_test

import (
	"context"
	"fmt"
	"log"
	"testing"

	"github.com/d1idem/d1idem/d1local/d1localtest"
)

// A test of a service that keeps its data in D1 starts a local D1 of its
// own: New starts d1local on 127.0.0.1, WithSchema applies the idempotency
// ledger's schema, and srv.Client is a ready d1client.Client. Everything is
// stopped when the test ends.
func ExampleNew() {
	testLedger := func(t *testing.T) {
		srv := d1localtest.New(t, d1localtest.WithSchema())
		res, err := srv.Client.Query(t.Context(), "SELECT count(*) FROM idempotency_keys")
		if err != nil {
			t.Fatal(err)
		}
		if n, _ := res.Rows[0][0].Int64(); n != 0 {
			t.Errorf("a new ledger holds %d keys", n)
		}
	}
	_ = testLedger // in a _test.go file: func TestLedger(t *testing.T) { ... }
}

// Start is New outside a test function, for a TestMain or a program; the
// caller closes the server.
func ExampleStart() {
	srv, err := d1localtest.Start(d1localtest.WithSchema())
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()

	ctx := context.Background()
	if _, err := srv.Client.Query(ctx, "INSERT INTO idempotency_keys (principal, key, fingerprint, created_at, updated_at) VALUES (?, ?, ?, ?, ?)",
		"alice", "k1", "fp", 1, 1); err != nil {
		log.Fatal(err)
	}
	res, err := srv.Client.Query(ctx, "SELECT principal, key, status, generation FROM idempotency_keys")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Columns)
	for _, row := range res.Rows {
		fmt.Println(row)
	}
	// Output:
	// [principal key status generation]
	// [alice k1 pending 1]
}
