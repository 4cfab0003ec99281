package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/d1idem/d1idem/d1client"
)

// TestAPIErrors replays recorded D1 failures through httpmock: every one
// ends in exit 1 and one line on stderr that says what happened and what
// to do, and nothing on stdout.
func TestAPIErrors(t *testing.T) {
	for _, tc := range []struct {
		fixture string
		args    []string
		want    string
		calls   int
	}{
		{"auth_10000", []string{"keys", "get", "--principal", "p", "--key", "k"},
			"d1idem: keys get: D1 refused the credentials (HTTP 403, code 10000): Authentication error; check the API token (it needs D1 edit permission), the account ID and the database ID\n", 1},
		{"auth_10000", []string{"schema", "apply"},
			"d1idem: schema: reading the database: D1 refused the credentials (HTTP 403, code 10000): Authentication error;", 1},
		{"account_7403", []string{"stats"}, "d1idem: stats: D1 refused the credentials (HTTP 403, code 7403)", 1},
		// A missing database is named, with the account's databases: the
		// query, then the list's one page (a short page is the last).
		{"database_7404", []string{"stats"}, "d1idem: stats: no database \"6b4c8e3e-0000-4000-8000-000000000000\" (have: orders-db (0c7d1f52-93b8-4e6a-a1d4-5b2e8f9c3a71))\n", 2},
		{"rate_limit_971", []string{"sweep", "--all"},
			"d1idem: sweep: Cloudflare's API rate limit is reached (HTTP 429, code 971): every API call of the account, the application's included, is blocked for up to 5 minutes; try again in 4m47s; use a lower --max-calls\n", 1},
		// Only the sweep has --max-calls to lower.
		{"rate_limit_971", []string{"keys", "stuck"},
			"d1idem: keys stuck: Cloudflare's API rate limit is reached (HTTP 429, code 971): every API call of the account, the application's included, is blocked for up to 5 minutes; try again in 4m47s\n", 1},
		// A read is retried (4 attempts), then reported.
		{"html_502", []string{"stats"},
			"d1idem: stats: D1 answered with a page that is not JSON (HTTP 502), an error of Cloudflare's edge or gateway; it is usually transient: try again (after 4 attempts)\n", 4},
		{"html_502", []string{"schema", "verify"}, "(HTTP 502), an error of Cloudflare's edge or gateway", 4},
		// A write is not retried once it may have reached D1, and says so.
		{"html_502", []string{"keys", "release", "--principal", "p", "--key", "k", "--generation", "1"},
			"d1idem: keys release: D1 answered with a page that is not JSON (HTTP 502), an error of Cloudflare's edge or gateway; it is usually transient: try again; the change may have been committed: look before repeating it\n", 1},
		{"sql_error_no_such_table", []string{"keys", "list"}, "d1idem: keys list: D1 SQL error (HTTP 400, code 7500): no such table: raw_mails: SQLITE_ERROR\n", 1},
	} {
		t.Run(tc.fixture+"/"+strings.Join(tc.args[:min(2, len(tc.args))], "_"), func(t *testing.T) {
			o, tr := mocked(t, tc.fixture)
			r := runCLI(t, o, append(tc.args, mockFlags()...)...)
			if r.code != exitError || r.stdout != "" || strings.Count(r.stderr, "\n") != 1 || !strings.HasPrefix(r.stderr, strings.TrimSuffix(tc.want, "\n")) && !strings.Contains(r.stderr, tc.want) {
				t.Errorf("want exit 1 and %q; %s", tc.want, r)
			}
			if strings.HasSuffix(tc.want, "\n") && r.stderr != tc.want {
				t.Errorf("stderr:\n%q\nwant\n%q", r.stderr, tc.want)
			}
			if n := tr.GetTotalCallCount(); n != tc.calls {
				t.Errorf("%d HTTP calls, want %d", n, tc.calls)
			}
			if strings.Contains(r.stderr, "SELECT") || strings.Contains(r.stderr, "DELETE") {
				t.Errorf("the SQL leaked into the error line: %s", r.stderr)
			}
		})
	}
}

func TestTransportError(t *testing.T) {
	r := runCLI(t, fixedClock(), "keys", "stuck", "--base-url", "http://127.0.0.1:1", "--account-id", "a", "--api-token", "tok_transport", "--database-id", "d")
	if r.code != exitError || !strings.HasPrefix(r.stderr, "d1idem: keys stuck: cannot reach D1: ") || strings.Count(r.stderr, "\n") != 1 {
		t.Errorf("%s", r)
	}
}

// TestMissingConnection: without credentials or --local the CLI says
// exactly what is missing, and never falls back to anything.
func TestMissingConnection(t *testing.T) {
	for _, env := range []string{"CLOUDFLARE_ACCOUNT_ID", "CLOUDFLARE_API_TOKEN", "D1_DATABASE_ID", "CLOUDFLARE_BASE_URL"} {
		t.Setenv(env, "")
	}
	t.Chdir(t.TempDir()) // no wrangler config around
	all := "the account ID (--account-id or CLOUDFLARE_ACCOUNT_ID), an API token (--api-token or CLOUDFLARE_API_TOKEN), the database (--database-id, D1_DATABASE_ID, or --database NAME with a wrangler config)"
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"stats"}, "d1idem: cannot reach D1: missing " + all + "; or pass --local DIR to use the embedded d1local\n"},
		{[]string{"keys", "stuck", "--api-token", "x"}, "d1idem: cannot reach D1: missing the account ID (--account-id or CLOUDFLARE_ACCOUNT_ID), the database (--database-id, D1_DATABASE_ID, or --database NAME with a wrangler config); or pass --local DIR to use the embedded d1local\n"},
		{[]string{"schema", "verify", "--account-id", "a", "--database-id", "d"}, "d1idem: cannot reach D1: missing an API token (--api-token or CLOUDFLARE_API_TOKEN); or pass --local DIR to use the embedded d1local\n"},
		{[]string{"sweep", "--database", "orders-db", "--api-token", "x"}, "d1idem: --database needs a wrangler config: there is no wrangler.json, wrangler.jsonc or wrangler.toml in this directory or above; pass --config FILE\n"},
	} {
		r := runCLI(t, nil, tc.args...)
		if r.code != exitUsage || r.stderr != tc.want || r.stdout != "" {
			t.Errorf("%v:\n%s\nwant stderr %q", tc.args, r, tc.want)
		}
	}
	// The environment wrangler users set is enough.
	l := newSchemaDB(t, "env")
	t.Setenv("CLOUDFLARE_ACCOUNT_ID", "0123456789abcdef0123456789abcdef")
	t.Setenv("CLOUDFLARE_API_TOKEN", "tok")
	t.Setenv("D1_DATABASE_ID", "env")
	t.Setenv("CLOUDFLARE_BASE_URL", l.b.BaseURL)
	r := mustRun(t, nil, "stats")
	if !strings.HasPrefix(r.stdout, "ledger on       database env\n") {
		t.Errorf("stats from the environment: %s", r)
	}
}

// TestSweepInterrupted: a deadline that comes before the budget frees a
// call, or Ctrl-C between batches, stops the sweep and says how far it got.
func TestSweepInterrupted(t *testing.T) {
	l := newSchemaDB(t, "ops")
	backlog(t, l, 30)
	o := fixedClock()
	o.budgetWindow = time.Hour // the second batch would wait an hour
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	r := runCLIContext(t, ctx, o, l.args("sweep", "--all", "--batch", "10", "--max-calls", "1")...)
	if r.code != exitError || !strings.Contains(r.stderr, "waiting 1h for the request budget (1 D1 call per 1h, --max-calls) after 10 rows") ||
		!strings.Contains(r.stderr, "d1idem: sweep stopped after deleting 10 rows in 1 batch: the request budget is spent") {
		t.Errorf("%s", r)
	}
	cctx, ccancel := context.WithCancel(context.Background())
	ccancel()
	r = runCLIContext(t, cctx, o, l.args("sweep", "--all", "--batch", "10")...)
	if r.code != exitError || !strings.Contains(r.stderr, "d1idem: sweep interrupted after deleting 0 rows in 0 batches") {
		t.Errorf("cancelled: %s", r)
	}
}

// TestErrorLineClipped: a huge message (a proxy's page passed on, say) is
// cut to the start of one line, at a character boundary, in text and JSON.
func TestErrorLineClipped(t *testing.T) {
	huge := strings.Repeat("é", 3<<20)
	// A plain error, and a D1 error whose message --json also repeats in
	// its "d1" object.
	for _, err := range []error{errors.New("stats: " + huge), fmt.Errorf("stats: %w", &d1client.Error{StatusCode: 500, Message: huge})} {
		for _, asJSON := range []bool{false, true} {
			var b bytes.Buffer
			report(&b, err, exitError, asJSON)
			line := b.String()
			if len(line) > 2*maxErrorLine+400 || strings.Count(line, "\n") != 1 || !utf8.ValidString(line) ||
				!strings.Contains(line, "é... (") || !strings.Contains(line, " more bytes)") {
				t.Errorf("%T, json %v: %d bytes: %.120q ... %q", err, asJSON, len(line), line, line[max(0, len(line)-60):])
			}
		}
	}
}
