package d1client

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/d1idem/d1idem/d1client/budget"
)

// staticTransport answers every request with the same 200 body, reading
// and discarding the request, as a server would.
type staticTransport struct {
	body   []byte
	header http.Header
}

func (s staticTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body != nil {
		_, _ = io.Copy(io.Discard, req.Body)
		_ = req.Body.Close()
	}
	return &http.Response{
		StatusCode:    200,
		Header:        s.header.Clone(),
		Body:          io.NopCloser(bytes.NewReader(s.body)),
		ContentLength: int64(len(s.body)),
		Request:       req,
	}, nil
}

const claimLikeResponse = `{"result":[{"results":{"columns":["generation"],"rows":[[1]]},"success":true,"meta":{"changes":1,"duration":0.2,"last_row_id":1,"rows_read":1,"rows_written":1,"size_after":8192,"changed_db":true}},{"results":{"columns":["status","fingerprint","generation","response_status","response_body","response_headers","updated_at"],"rows":[["pending","abc",1,null,null,null,1700000000000]]},"success":true,"meta":{"changes":0,"duration":0.1,"rows_read":1,"rows_written":0}}],"errors":[],"messages":[],"success":true}`

// cloudflareHeader is the header of a Cloudflare API response, its budget
// headers included.
var cloudflareHeader = http.Header{
	"Content-Type":     {"application/json"},
	"Ratelimit":        {`"default";r=999999;t=1`}, // a budget that never paces the loop
	"Ratelimit-Policy": {`"burst";q=1200;w=300`},
}

// benchStatements are shaped like round trip 1: a claim and a lookup.
var benchStatements = []Statement{
	{SQL: "INSERT INTO idempotency_keys (principal, key, fingerprint, status, generation, created_at, updated_at) VALUES (?, ?, ?, 'pending', 1, ?, ?) ON CONFLICT (principal, key) DO UPDATE SET generation = generation + 1 WHERE status = 'pending' RETURNING generation",
		Params: []any{"principal-1", "key-123", "fingerprint-abcdef", 1700000000000, 1700000000000}},
	{SQL: "SELECT status, fingerprint, generation, response_status, response_body, response_headers, updated_at FROM idempotency_keys WHERE principal = ? AND key = ?",
		Params: []any{"principal-1", "key-123"}},
}

// BenchmarkExecAllocs measures the client-side cost of one D1 call: a
// two-statement batch shaped like round trip 1, against a transport that
// answers at once as Cloudflare does, budget headers included. (The
// transport's own copy of the header is counted too.)
func BenchmarkExecAllocs(b *testing.B) {
	c, err := New(Config{BaseURL: "http://d1.test/client/v4", APIToken: "t", AccountID: "acct", DatabaseID: "db",
		HTTPClient: &http.Client{Transport: staticTransport{[]byte(claimLikeResponse), cloudflareHeader}}, Budget: budget.Unlimited()})
	if err != nil {
		b.Fatal(err)
	}
	benchExec(b, c)
}

// BenchmarkExecAllocsLoopback is BenchmarkExecAllocs over a real HTTP
// connection to a server in the same process that answers at once; its
// allocations include net/http's on both sides.
func BenchmarkExecAllocsLoopback(b *testing.B) {
	body := []byte(claimLikeResponse)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	}))
	defer srv.Close()
	c, err := New(Config{BaseURL: srv.URL + "/client/v4", APIToken: "t", AccountID: "acct", DatabaseID: "db",
		HTTPClient: srv.Client(), Budget: budget.Unlimited()})
	if err != nil {
		b.Fatal(err)
	}
	benchExec(b, c)
}

// benchExec runs benchStatements through c once per iteration, counting
// allocations.
func benchExec(b *testing.B, c *Client) {
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Exec(ctx, benchStatements, Idempotent()); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecodeBatch decodes the answer to a coalesced call of 120
// statements: 60 claims and 60 lookups, their meta as d1local and D1
// write it.
func BenchmarkDecodeBatch(b *testing.B) {
	claim := `{"results":{"columns":["generation"],"rows":[[1]]},"success":true,"meta":{"served_by":"d1local","served_by_region":"LOCAL","served_by_primary":true,"timings":{"sql_duration_ms":0.0512},"duration":0.0512,"changes":1,"last_row_id":12,"changed_db":true,"size_after":20480,"rows_read":1,"rows_written":2}}`
	lookup := `{"results":{"columns":["fingerprint","status","generation","response_status","response_body","response_headers","updated_at"],"rows":[["fp","completed",1,201,"{\"id\":\"ord_1\"}","{\"content-type\":\"application/json\"}",1700000000000]]},"success":true,"meta":{"served_by":"d1local","served_by_region":"LOCAL","served_by_primary":true,"timings":{"sql_duration_ms":0.0231},"duration":0.0231,"changes":0,"last_row_id":12,"changed_db":false,"size_after":20480,"rows_read":1,"rows_written":0}}`
	parts := make([]string, 0, 120)
	for range 60 {
		parts = append(parts, claim, lookup)
	}
	body := []byte(`{"success":true,"errors":[],"messages":[],"result":[` + strings.Join(parts, ",") + `]}`)
	c, err := New(Config{AccountID: "acct", DatabaseID: "db", BaseURL: "http://d1.test/", Budget: budget.Unlimited()})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if _, e := c.classify(200, http.Header{}, body, len(parts)); e != nil {
			b.Fatal(e)
		}
	}
}
