package bridge_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/internal/d1test"
)

// TestLedgerThroughBridgeURL: a client configured by D1IDEM_BRIDGE_URL
// alone (an API token beside it is not what it sends) runs the ledger
// through the bridge, and group commit still shares D1 calls between
// concurrent requests: 32 requests started together take fewer than their
// 64 round trips.
func TestLedgerThroughBridgeURL(t *testing.T) {
	b := d1test.Workerd(t)
	db := b.NewDatabase(t)
	d1test.ApplySchema(t, db.Client(t))
	t.Setenv(d1client.BaseURLEnv, "")
	t.Setenv(d1client.APIBaseURLEnv, "")
	t.Setenv(d1client.BridgeURLEnv, b.BridgeURL())
	c, err := d1client.New(d1client.Config{APIToken: "a-cloudflare-api-token", AccountID: d1test.AccountID, DatabaseID: db.ID, HTTPClient: b.HTTPClient})
	if err != nil || !c.Bridge() {
		t.Fatalf("d1client.New: %v (bridge %v)", err, err == nil && c.Bridge())
	}
	ledger, err := idem.New(c, idem.Config{Heartbeat: -1})
	if err != nil {
		t.Fatal(err)
	}
	const n = 32
	start := make(chan struct{})
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			d, err := ledger.Begin(t.Context(), "acct_1", fmt.Sprintf("key-%d", i), "fp")
			if err == nil && d.Outcome != idem.Execute {
				err = fmt.Errorf("key-%d: %v, want Execute", i, d.Outcome)
			}
			if err == nil {
				_, err = ledger.Complete(t.Context(), d.Reservation, idem.Response{Status: 201, Body: []byte("ok")})
			}
			errs <- err
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if got := count(t, db.Client(t), "SELECT count(*) FROM idempotency_keys WHERE status = 'completed'"); got != n {
		t.Fatalf("%d completed rows, want %d", got, n)
	}
	if calls := c.Stats().Calls; calls >= 2*n {
		t.Errorf("%d D1 calls for %d requests: group commit shared none", calls, n)
	} else {
		t.Logf("%d D1 calls for %d requests", calls, n)
	}
}
