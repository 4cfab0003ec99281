package d1localtest_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/d1local/d1localtest"
)

func count(t *testing.T, c *d1client.Client, sql string) int64 {
	t.Helper()
	res, err := c.Query(t.Context(), sql)
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	n, ok := res.Rows[0][0].Int64()
	if !ok {
		t.Fatalf("%s: %v is not an integer", sql, res.Rows[0][0])
	}
	return n
}

func TestNew(t *testing.T) {
	var srv *d1localtest.Server
	t.Run("a test", func(t *testing.T) {
		srv = d1localtest.New(t, d1localtest.WithSchema())
		if srv.DatabaseID != d1localtest.DatabaseID || srv.AccountID != d1local.DefaultAccountID || srv.Token != "" {
			t.Errorf("server = %+v", srv)
		}
		if n := count(t, srv.Client, "SELECT count(*) FROM sqlite_master WHERE name IN ('idempotency_keys', 'idx_idempotency_keys_updated_at')"); n != 2 {
			t.Errorf("%d schema objects, want 2", n)
		}
		// Another database of the same server starts empty.
		other, err := srv.NewClient("other")
		if err != nil {
			t.Fatal(err)
		}
		if n := count(t, other, "SELECT count(*) FROM sqlite_master"); n != 0 {
			t.Errorf("another database holds %d objects", n)
		}
		if srv.D1.Calls() == 0 {
			t.Error("D1.Calls() = 0")
		}
	})
	// The test's cleanup stopped the server.
	if _, err := http.Get(srv.URL + "/client/v4/memberships"); err == nil {
		t.Error("the server still answers after its test ended")
	}
	if _, err := srv.D1.Databases(); err == nil {
		t.Error("d1local still open after its test ended")
	}
	if err := srv.Close(); err != nil {
		t.Errorf("a second Close: %v", err)
	}
}

func TestWithoutSchema(t *testing.T) {
	srv := d1localtest.New(t)
	if n := count(t, srv.Client, "SELECT count(*) FROM sqlite_master"); n != 0 {
		t.Errorf("a new database holds %d objects", n)
	}
}

func TestWithConfig(t *testing.T) {
	srv := d1localtest.New(t,
		d1localtest.WithConfig(d1local.Config{Token: "s3cret", NoAutoCreate: true, Dir: t.TempDir()}),
		d1localtest.WithDatabaseID("orders"), d1localtest.WithSchema())
	if srv.DatabaseID != "orders" || srv.Token != "s3cret" {
		t.Errorf("server = %+v", srv)
	}
	if n := count(t, srv.Client, "SELECT count(*) FROM idempotency_keys"); n != 0 {
		t.Errorf("%d keys", n)
	}
	if ids, err := srv.D1.Databases(); err != nil || len(ids) != 1 || ids[0] != "orders" {
		t.Errorf("Databases() = %q, %v", ids, err)
	}
	// The token is required, and with NoAutoCreate other databases are
	// missing.
	resp, err := http.Post(srv.URL+"/client/v4/accounts/x/d1/database/orders/query", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("without the token: %d, want 403", resp.StatusCode)
	}
	req, _ := http.NewRequest("POST", srv.URL+"/client/v4/accounts/x/d1/database/missing/query", strings.NewReader(`{"sql":"SELECT 1"}`))
	req.Header.Set("Authorization", "Bearer s3cret")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("a missing database: %d, want 404", resp.StatusCode)
	}
}

func TestFaults(t *testing.T) {
	srv := d1localtest.New(t)
	// A rate limit (429, code 971) is never retried by d1client.
	srv.D1.Inject(d1local.Fault{RateLimit: true, RetryAfter: time.Second})
	if _, err := srv.Client.Query(t.Context(), "SELECT 1"); err == nil {
		t.Error("an injected rate limit did not reach the client")
	}
}

func TestStartFails(t *testing.T) {
	if _, err := d1localtest.Start(d1localtest.WithConfig(d1local.Config{Dir: t.TempDir() + "/missing", NoAutoCreate: true})); err == nil {
		t.Error("Start with a missing directory succeeded")
	}
}
