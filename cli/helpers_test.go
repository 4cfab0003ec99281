package cli

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jarcoal/httpmock"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/internal/d1test"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// testNow is the injected clock of the deterministic tests.
var testNow = time.Date(2026, 3, 1, 3, 0, 0, 0, time.UTC)

func fixedClock() *options {
	return &options{now: func() time.Time { return testNow }}
}

type result struct {
	stdout, stderr string
	code           int
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\n--- stdout:\n%s--- stderr:\n%s", r.code, r.stdout, r.stderr)
}

// runCLI runs the command line with the options o (nil: production).
func runCLI(t testing.TB, o *options, args ...string) result {
	t.Helper()
	return runCLIContext(t, context.Background(), o, args...)
}

func runCLIContext(t testing.TB, ctx context.Context, o *options, args ...string) result {
	t.Helper()
	if o == nil {
		o = &options{}
	}
	var out, errb bytes.Buffer
	code := run(ctx, newApp(&out, &errb, o), append([]string{"d1idem"}, args...), &errb)
	return result{stdout: out.String(), stderr: errb.String(), code: code}
}

// mustRun runs the command line and fails t unless it exits 0.
func mustRun(t testing.TB, o *options, args ...string) result {
	t.Helper()
	r := runCLI(t, o, args...)
	if r.code != 0 {
		t.Fatalf("d1idem %s: %s", strings.Join(args, " "), r)
	}
	return r
}

// ledgerDB is a d1local database for one test, reachable by the CLI through
// --base-url like a Cloudflare database.
type ledgerDB struct {
	b      *d1test.Backend
	id     string
	client *d1client.Client
}

// newLedgerDB returns a fresh database with the given ID (each test has its
// own d1local server, so fixed IDs keep outputs deterministic).
func newLedgerDB(t testing.TB, id string) *ledgerDB {
	t.Helper()
	b := d1test.Local(t)
	return &ledgerDB{b: b, id: id, client: b.Database(id).Client(t)}
}

// newSchemaDB is newLedgerDB with the ledger schema applied.
func newSchemaDB(t testing.TB, id string) *ledgerDB {
	t.Helper()
	l := newLedgerDB(t, id)
	d1test.ApplySchema(t, l.client)
	return l
}

// flags are the connection flags that reach this database.
func (l *ledgerDB) flags() []string {
	return []string{"--base-url", l.b.BaseURL, "--account-id", d1test.AccountID, "--api-token", "tok_test", "--database-id", l.id}
}

// args appends the connection flags to a command line.
func (l *ledgerDB) args(args ...string) []string {
	return append(args, l.flags()...)
}

// hint is how a suggested command repeats the connection flags: the token
// as a placeholder for the shell to fill in.
func (l *ledgerDB) hint() string {
	return " --base-url " + l.b.BaseURL + " --account-id " + d1test.AccountID + ` --api-token "$CLOUDFLARE_API_TOKEN" --database-id ` + l.id
}

func (l *ledgerDB) exec(t testing.TB, sql string, params ...any) *d1client.Result {
	t.Helper()
	res, err := l.client.Query(context.Background(), sql, params...)
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return res
}

// row is a ledger row to insert.
type row struct {
	principal, key, status string
	generation             int64
	created, updated       time.Duration // before testNow
	respStatus             any
	headers, body          any
	fingerprint            string
}

func (l *ledgerDB) insert(t testing.TB, now time.Time, rows ...row) {
	t.Helper()
	for _, r := range rows {
		fp := r.fingerprint
		if fp == "" {
			fp = fmt.Sprintf("%064x", len(r.key)*7919+len(r.principal))
		}
		l.exec(t, `INSERT INTO idempotency_keys (principal, key, fingerprint, status, generation, response_status, response_body, response_headers, created_at, updated_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`, r.principal, r.key, fp, r.status, r.generation, r.respStatus, r.body, r.headers,
			now.Add(-r.created).UnixMilli(), now.Add(-r.updated).UnixMilli())
	}
}

// count returns the rows matching where.
func (l *ledgerDB) count(t testing.TB, where string, params ...any) int64 {
	t.Helper()
	res := l.exec(t, "SELECT count(*) FROM idempotency_keys WHERE "+where, params...)
	n, _ := res.Rows[0][0].Int64()
	return n
}

// scenario is the operator's night: two stuck keys, one in flight, one
// completed, and an old backlog.
var scenario = []row{
	{principal: "acct_42", key: "order-7", status: "pending", generation: 1, created: 12*time.Minute + 3*time.Second, updated: 12*time.Minute + 3*time.Second},
	{principal: "acct_42", key: "order-8", status: "pending", generation: 2, created: 40 * time.Minute, updated: 5 * time.Minute},
	{principal: "acct_7", key: "pay-1", status: "pending", generation: 1, created: 5 * time.Second, updated: 5 * time.Second},
	{principal: "acct_42", key: "order-1", status: "completed", generation: 1, created: 2 * time.Hour, updated: 2*time.Hour - 150*time.Millisecond,
		respStatus: 201, headers: `{"content-type":"application/json","location":"/v1/orders/17"}`,
		body: `{"id":17,"sku":"tea","qty":2,"status":"created","note":"` + strings.Repeat("x", 300) + `"}`},
	{principal: "acct_9", key: "old-1", status: "completed", generation: 1, created: 73 * time.Hour, updated: 73 * time.Hour,
		respStatus: 200, headers: `{}`, body: "ok"},
	{principal: "acct_9", key: "old-2", status: "pending", generation: 3, created: 31 * time.Hour, updated: 30 * time.Hour},
}

// packageDir is this package's directory, the tests' working directory
// before any of them changes it.
var packageDir, _ = os.Getwd()

// testURL matches the address of a test's own server, which changes from
// run to run.
var testURL = regexp.MustCompile(`http://127\.0\.0\.1:[0-9]+`)

// golden compares got, its test servers' addresses masked, with
// testdata/name.golden, or rewrites it with -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	got = testURL.ReplaceAllString(got, "http://127.0.0.1:PORT")
	path := filepath.Join(packageDir, "testdata", name+".golden")
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./cli -run %s -update to create it)", err, t.Name())
	}
	if string(want) != got {
		t.Errorf("%s differs from the golden file (run with -update to accept):\n--- got:\n%s--- want:\n%s", path, got, want)
	}
}

// ---- httpmock: recorded D1 responses ----

const (
	mockAccount  = "0123456789abcdef0123456789abcdef"
	mockDatabase = "6b4c8e3e-0000-4000-8000-000000000000"
	mockBaseURL  = "https://api.cloudflare.test/client/v4"
	mockListURL  = mockBaseURL + "/accounts/" + mockAccount + "/d1/database"
	mockRawURL   = mockListURL + "/" + mockDatabase + "/raw"
)

// listResponder answers Cloudflare's database list, in the documented
// envelope: one database on the first page, none after it.
func listResponder(req *http.Request) (*http.Response, error) {
	result := `[]`
	if p := req.URL.Query().Get("page"); p == "" || p == "1" {
		result = `[{"uuid":"0c7d1f52-93b8-4e6a-a1d4-5b2e8f9c3a71","name":"orders-db","created_at":"2026-01-05T10:00:00.000Z","version":"production"}]`
	}
	res := httpmock.NewStringResponse(http.StatusOK, `{"result":`+result+`,"result_info":{"page":1,"per_page":100,"count":1,"total_count":1},"success":true,"errors":[],"messages":[]}`)
	res.Header.Set("Content-Type", "application/json")
	return res, nil
}

// replay answers with the recorded response testdata/d1/<name>.http of
// the repository, parsed afresh for each request.
func replay(t testing.TB, name string) httpmock.Responder {
	raw, err := os.ReadFile(filepath.Join("..", "testdata", "d1", name+".http"))
	if err != nil {
		t.Fatalf("fixture %s: %v", name, err)
	}
	return func(req *http.Request) (*http.Response, error) {
		res, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(raw)), req)
		if err != nil {
			return nil, err
		}
		body, err := io.ReadAll(res.Body)
		if err != nil {
			return nil, err
		}
		res.Body = io.NopCloser(bytes.NewReader(body))
		res.ContentLength = int64(len(body))
		return res, nil
	}
}

// mocked returns options whose Cloudflare clients talk to an httpmock
// transport answering the raw endpoint with the fixture, and the transport.
func mocked(t testing.TB, fixture string) (*options, *httpmock.MockTransport) {
	tr := httpmock.NewMockTransport()
	tr.RegisterResponder(http.MethodPost, mockRawURL, replay(t, fixture))
	tr.RegisterResponder(http.MethodGet, mockListURL, listResponder)
	o := fixedClock()
	o.clientMods = []func(*d1client.Config){func(c *d1client.Config) {
		c.HTTPClient = &http.Client{Transport: tr}
		c.Retry = d1client.RetryPolicy{BaseDelay: time.Millisecond, MaxDelay: 4 * time.Millisecond}
	}}
	return o, tr
}

func mockFlags() []string {
	return []string{"--base-url", mockBaseURL, "--account-id", mockAccount, "--database-id", mockDatabase, "--api-token", "tok_mock"}
}

// firstLine is the first line of s, with its newline.
func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line + "\n"
}
