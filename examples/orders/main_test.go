package main

import (
	"context"
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

// GET /metrics serves, for Prometheus, the metrics under the names
// docs/observability.md and docs/operators.md's alerts use.
func TestMetricsForPrometheus(t *testing.T) {
	mp, metrics, err := newMetrics()
	if err != nil {
		t.Fatal(err)
	}
	defer mp.Shutdown(context.Background())
	db, stop, err := startLocal(t.TempDir(), mp)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	ctx := context.Background()
	if err := ordersapi.EnsureSchema(ctx, db); err != nil {
		t.Fatal(err)
	}
	ledger, err := idem.New(db, idem.Config{MeterProvider: mp})
	if err != nil {
		t.Fatal(err)
	}
	api, err := ordersapi.New(ordersapi.Config{Ledger: ledger, DB: db})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 { // an execution, then a replay
		req := httptest.NewRequest(http.MethodPost, "/v1/orders", strings.NewReader(`{"sku":"tea","qty":2}`))
		req.Header.Set("Authorization", "Bearer tok_metrics_secret")
		req.Header.Set("Idempotency-Key", "key-metrics-secret")
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		api.ServeHTTP(rec, req)
		if rec.Code != http.StatusCreated {
			t.Fatalf("status %d: %s", rec.Code, rec.Body)
		}
	}
	if _, err := ledger.Admin().Stats(ctx); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(metrics)
	defer srv.Close()
	res, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	body := string(b)
	for _, want := range []string{
		`d1idem_request_duration_seconds_count{d1idem_outcome="execute"`,
		`d1idem_request_duration_seconds_count{d1idem_outcome="replay"`,
		`d1idem_completions_total{d1idem_completion_result="stored"`,
		`d1idem_d1_call_duration_seconds_bucket{d1idem_d1_call_kind="`,
		`d1idem_d1_call_statements_bucket{`,
		`d1idem_d1_operation_duration_seconds_count{d1idem_d1_operation="claim",d1idem_d1_result="ok"`,
		`d1idem_keys{d1idem_key_status="completed"`,
		`d1idem_keys_stuck{`,
		`d1idem_sweep_backlog{`,
		"go_goroutines ",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	for _, secret := range []string{"tok_metrics_secret", "key-metrics-secret"} {
		if strings.Contains(body, secret) {
			t.Errorf("/metrics shows %q", secret)
		}
	}
	if t.Failed() {
		t.Logf("/metrics:\n%s", body)
	}
}

// The API budget's gauges, which docs/operators.md's budget alert divides,
// are served under the names it uses, for the account.
func TestMetricsBudgetGauges(t *testing.T) {
	mp, metrics, err := newMetrics()
	if err != nil {
		t.Fatal(err)
	}
	defer mp.Shutdown(context.Background())
	// A d1local that plays Cloudflare's API limit, so that its answers
	// carry the Ratelimit headers Cloudflare's do.
	d1, err := d1local.New(d1local.Config{RateLimit: d1local.CloudflareRateLimit()})
	if err != nil {
		t.Fatal(err)
	}
	defer d1.Close()
	srv := httptest.NewServer(d1)
	defer srv.Close()
	db, err := d1client.New(d1client.Config{BaseURL: srv.URL, AccountID: d1local.DefaultAccountID,
		DatabaseID: d1local.LocalDatabaseID, MeterProvider: mp})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(context.Background(), []d1client.Statement{{SQL: "SELECT 1"}}); err != nil {
		t.Fatal(err)
	}
	body := scrape(t, metrics)
	acct := `{cloud_account_id="` + d1local.DefaultAccountID + `",`
	for _, want := range []string{
		"d1idem_d1_budget_remaining" + acct, "d1idem_d1_budget_limit" + acct, "d1idem_d1_budget_reset_seconds" + acct,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if !strings.Contains(body, "d1idem_d1_budget_limit"+acct+`otel_scope_name="`+d1client.ScopeName+`"`) {
		t.Errorf("the budget's limit is not labelled as docs/observability.md says")
	}
	if t.Failed() {
		t.Logf("/metrics:\n%s", body)
	}
}

// scrape returns what the metrics handler serves.
func scrape(t *testing.T, metrics http.Handler) string {
	t.Helper()
	rec := httptest.NewRecorder()
	metrics.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("GET /metrics: %d", rec.Code)
	}
	return rec.Body.String()
}
