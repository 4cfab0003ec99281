package d1client

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// Each recorded response shape of the D1 REST reference (sections 2 and 3)
// decodes to an exact value or maps to a documented error type.

func TestFixtureSuccessShapes(t *testing.T) {
	select1 := []Statement{{SQL: "SELECT 1"}}
	select2 := []Statement{{SQL: "INSERT INTO t(k) VALUES (?) RETURNING key", Params: []any{"k9"}}, {SQL: "SELECT count(*) AS n FROM t"}}
	tests := []struct {
		fixture string
		stmts   []Statement
		check   func(t *testing.T, res []Result)
	}{
		{"raw_real_slingdata", select1, checkRawRealSlingdata},
		{"raw_insert_returning", select1, checkRawInsertReturning},
		{"query_real_storecraft", select1, checkQueryRealStorecraft},
		{"query_insert_returning", select1, func(t *testing.T, res []Result) {
			wantCols(t, res[0], "id", "email")
			wantRow(t, res[0].Rows[0], IntValue(42), TextValue("a@example.com"))
		}},
		{"query_update_zero_rows", select1, func(t *testing.T, res []Result) {
			if len(res[0].Rows) != 0 || res[0].Meta.Changes != 0 || res[0].Meta.LastRowID != 42 || res[0].Meta.ChangedDB {
				t.Errorf("got %+v", res[0])
			}
		}},
		{"raw_empty_columns", select1, func(t *testing.T, res []Result) {
			if len(res[0].Columns) != 0 || len(res[0].Rows) != 0 || res[0].Meta.Changes != 1 {
				t.Errorf("got %+v", res[0])
			}
		}},
		{"raw_results_null", select2, func(t *testing.T, res []Result) {
			for i, r := range res {
				if len(r.Rows) != 0 || len(r.Columns) != 0 {
					t.Errorf("result %d = %+v", i, r)
				}
			}
		}},
		{"raw_on_conflict_no_row", select1, func(t *testing.T, res []Result) {
			wantCols(t, res[0], "key", "generation")
			if len(res[0].Rows) != 0 || res[0].Meta != (Meta{}) {
				t.Errorf("got %+v", res[0])
			}
		}},
		{"query_on_conflict_no_row_workerd", select1, func(t *testing.T, res []Result) {
			if len(res[0].Rows) != 0 || res[0].Meta.ServedBy != "miniflare.db" || res[0].Meta.Duration != 1 {
				t.Errorf("got %+v", res[0])
			}
		}},
		{"raw_batch_two_results", select2, func(t *testing.T, res []Result) {
			wantRow(t, res[0].Rows[0], TextValue("k9"))
			wantRow(t, res[1].Rows[0], IntValue(3))
			if res[0].Meta.Changes != 1 || res[1].Meta.RowsRead != 3 {
				t.Errorf("meta = %+v / %+v", res[0].Meta, res[1].Meta)
			}
		}},
		{"raw_large_integers_workerd", select1, func(t *testing.T, res []Result) {
			// 2^53+1 arrives rounded by D1; int64 extremes arrive as JS
			// doubles that do not fit int64 and decode as Real; the TEXT
			// cast is exact.
			wantRow(t, res[0].Rows[0],
				IntValue(9007199254740992), TextValue("integer"),
				RealValue(9223372036854775807), RealValue(-9223372036854775808),
				TextValue("9007199254740993"), RealValue(0.30000000000000004), IntValue(0), Value{})
		}},
		{"raw_types_blob_duplicates", select1, checkRawTypesBlobDuplicates},
	}
	for _, tc := range tests {
		t.Run(tc.fixture, func(t *testing.T) {
			c, _ := mockClient(t, replay(t, tc.fixture))
			res, err := c.Exec(context.Background(), tc.stmts)
			if err != nil {
				t.Fatalf("Exec: %v", err)
			}
			if len(res) != len(tc.stmts) {
				t.Fatalf("%d results for %d statements", len(res), len(tc.stmts))
			}
			tc.check(t, res)
		})
	}
}

// checkRawRealSlingdata checks raw_real_slingdata (a real /raw capture):
// its columns, a row and its meta.
func checkRawRealSlingdata(t *testing.T, res []Result) {
	r := res[0]
	wantCols(t, r, "schema_name", "table_name", "is_view")
	wantRow(t, r.Rows[1], TextValue("main"), TextValue("table_name"), TextValue("false"))
	if r.Meta.ServedBy != "v3-prod" || r.Meta.Duration != 0.2294 || r.Meta.SizeAfter != 16384 || r.Meta.RowsRead != 4 {
		t.Errorf("meta = %+v", r.Meta)
	}
}

// checkRawInsertReturning checks raw_insert_returning: the returned row,
// every field of its meta, and the row scanned into Go values.
func checkRawInsertReturning(t *testing.T, res []Result) {
	r := res[0]
	wantCols(t, r, "id", "email")
	wantRow(t, r.Rows[0], IntValue(42), TextValue("a@example.com"))
	m := r.Meta
	if m.Changes != 1 || m.LastRowID != 42 || !m.ChangedDB || m.RowsRead != 1 || m.RowsWritten != 2 ||
		m.SizeAfter != 45056 || m.Duration != 0.41 || m.ServedByColo != "AMS" || m.ServedByRegion != "WEUR" || !m.ServedByPrimary {
		t.Errorf("meta = %+v", m)
	}
	var id int64
	var email string
	if err := r.Rows[0].Scan(&id, &email); err != nil || id != 42 || email != "a@example.com" {
		t.Errorf("Scan = %d %q %v", id, email, err)
	}
}

// checkQueryRealStorecraft checks query_real_storecraft (a real /query
// capture): a /query-shaped answer (objects) still decodes, in key order.
func checkQueryRealStorecraft(t *testing.T, res []Result) {
	r := res[0]
	wantCols(t, r, "name", "sql", "type")
	if v := r.Map(0)["name"]; v != TextValue("_cf_KV") {
		t.Errorf("name = %v", v)
	}
	if r.Meta.ServedByRegion != "APAC" || r.Meta.RowsRead != 2 || r.Meta.SizeAfter != 12288 {
		t.Errorf("meta = %+v", r.Meta)
	}
}

// checkRawTypesBlobDuplicates checks raw_types_blob_duplicates: duplicate
// column names, a blob and every type, decoded and scanned.
func checkRawTypesBlobDuplicates(t *testing.T, res []Result) {
	r := res[0]
	wantCols(t, r, "a", "a", "blob", "t", "r", "n", "exact")
	wantRow(t, r.Rows[0], IntValue(1), IntValue(2), BlobValue([]byte{1, 2, 255}), TextValue("42.0"),
		RealValue(1.5), Value{}, IntValue(9007199254740993))
	var a1, a2 int
	var blob []byte
	var text string
	var real float64
	var null *string
	var exact int64
	if err := r.Rows[0].Scan(&a1, &a2, &blob, &text, &real, &null, &exact); err != nil {
		t.Fatal(err)
	}
	if a1 != 1 || a2 != 2 || string(blob) != "\x01\x02\xff" || text != "42.0" || real != 1.5 || null != nil || exact != 9007199254740993 {
		t.Errorf("scanned %d %d %v %q %v %v %d", a1, a2, blob, text, real, null, exact)
	}
}

func TestFixtureErrorShapes(t *testing.T) {
	tests := []struct {
		fixture    string
		kind       kind
		sentinel   error
		status     int
		codes      []int
		sqlite     string
		constraint bool
		ambiguous  bool
		retryAfter time.Duration
		msg        string
	}{
		{fixture: "sql_error_not_authorized_real", kind: kindSQL, sentinel: ErrSQL, status: 400, codes: []int{7500}, sqlite: "SQLITE_AUTH", msg: "not authorized"},
		{fixture: "sql_error_no_such_table", kind: kindSQL, sentinel: ErrSQL, status: 400, codes: []int{7500}, sqlite: "SQLITE_ERROR", msg: "no such table: raw_mails"},
		{fixture: "sql_error_syntax", kind: kindSQL, sentinel: ErrSQL, status: 400, codes: []int{7500}, sqlite: "SQLITE_ERROR", msg: `near "limit": syntax error`},
		{fixture: "sql_error_unique", kind: kindSQL, sentinel: ErrConstraint, status: 400, codes: []int{7500}, sqlite: "SQLITE_CONSTRAINT", constraint: true, msg: "UNIQUE constraint failed: users.email"},
		{fixture: "sql_error_unique_workerd", kind: kindSQL, sentinel: ErrConstraint, status: 400, codes: []int{7500}, sqlite: "SQLITE_CONSTRAINT", constraint: true, msg: "UNIQUE constraint failed: idempotency_keys.principal"},
		{fixture: "sql_error_fk_old_format", kind: kindSQL, sentinel: ErrConstraint, status: 400, codes: []int{7500}, constraint: true, msg: "FOREIGN KEY constraint failed"},
		{fixture: "sql_error_begin", kind: kindSQL, sentinel: ErrSQL, status: 400, codes: []int{7500}, sqlite: "SQLITE_ERROR", msg: "cannot start a transaction within a transaction"},
		{fixture: "sql_error_too_big", kind: kindSQL, sentinel: ErrSQL, status: 400, codes: []int{7500}, sqlite: "SQLITE_TOOBIG"},
		{fixture: "sql_error_free_tier", kind: kindSQL, sentinel: ErrSQL, status: 400, codes: []int{7500}, msg: "free tier daily row read limit"},
		{fixture: "sql_error_alpha", kind: kindSQL, sentinel: ErrSQL, status: 400, codes: []int{7500}, msg: "alpha database"},
		{fixture: "internal_500", kind: kindTransient, sentinel: ErrTransient, status: 500, codes: []int{7500}, ambiguous: true, msg: "internal error; reference ="},
		{fixture: "transient_500_reset", kind: kindTransient, sentinel: ErrTransient, status: 500, codes: []int{7500}, ambiguous: true, msg: "reset"},
		{fixture: "overloaded_429", kind: kindOverloaded, sentinel: ErrOverloaded, status: 429, codes: []int{7500}, ambiguous: true, msg: "overloaded"},
		{fixture: "rate_limit_971", kind: kindRateLimited, sentinel: ErrRateLimited, status: 429, codes: []int{971}, retryAfter: 287 * time.Second, msg: "throttling"},
		{fixture: "rate_limit_971_no_retry_after", kind: kindRateLimited, sentinel: ErrRateLimited, status: 429, codes: []int{971}, retryAfter: RateLimitBlock, msg: "1200 requests"},
		{fixture: "auth_10000", kind: kindAuth, sentinel: ErrAuth, status: 403, codes: []int{10000}, msg: "Authentication error"},
		{fixture: "auth_header_6003", kind: kindAuth, sentinel: ErrAuth, status: 400, codes: []int{6003}, msg: "Invalid request headers"},
		{fixture: "account_7403", kind: kindAuth, sentinel: ErrAuth, status: 403, codes: []int{7403}, msg: "not authorized to access this service"},
		{fixture: "route_7003", kind: kindAuth, sentinel: ErrAuth, status: 400, codes: []int{7003, 7000}, msg: "perhaps your object identifier is invalid"},
		{fixture: "database_7404", kind: kindNoDatabase, sentinel: ErrNoDatabase, status: 404, codes: []int{7404}, msg: "could not be found"},
		{fixture: "html_502", kind: kindNonJSON, sentinel: ErrNonJSON, status: 502, ambiguous: true, msg: "502 Bad Gateway"},
		{fixture: "html_503", kind: kindNonJSON, sentinel: ErrNonJSON, status: 503, ambiguous: true, msg: "503 Service Temporarily Unavailable"},
		{fixture: "html_504", kind: kindNonJSON, sentinel: ErrNonJSON, status: 504, ambiguous: true, msg: "504: Gateway time-out"},
		{fixture: "success_false_200", kind: kindEnvelope, sentinel: ErrEnvelope, status: 200, codes: []int{7500}, ambiguous: true, msg: "internal error"},
		{fixture: "result_count_mismatch", kind: kindResultCount, sentinel: ErrResultCount, status: 200, ambiguous: true, msg: "2 statements sent, 1 results returned"},
		{fixture: "statement_success_false", kind: kindEnvelope, sentinel: ErrEnvelope, status: 200, ambiguous: true, msg: "statement 2 reported success:false"},
	}
	stmts := []Statement{
		{SQL: "INSERT INTO t(k, v) VALUES (?, ?)", Params: []any{"secret-key", 7}},
		{SQL: "SELECT v FROM t WHERE k = ?", Params: []any{"secret-key"}},
	}
	for _, tc := range tests {
		t.Run(tc.fixture, func(t *testing.T) {
			c, tr := mockClient(t, replay(t, tc.fixture))
			_, err := c.Exec(context.Background(), stmts)
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("err = %v (%T), want *Error", err, err)
			}
			if e.kind != tc.kind || !errors.Is(err, tc.sentinel) {
				t.Errorf("kind = %v, want %v (errors.Is %v: %v)", e.kind, tc.kind, tc.sentinel, errors.Is(err, tc.sentinel))
			}
			if e.StatusCode != tc.status {
				t.Errorf("status = %d, want %d", e.StatusCode, tc.status)
			}
			if !equalInts(e.Codes, tc.codes) {
				t.Errorf("codes = %v, want %v", e.Codes, tc.codes)
			}
			if e.SQLiteCode != tc.sqlite {
				t.Errorf("SQLiteCode = %q, want %q", e.SQLiteCode, tc.sqlite)
			}
			if errors.Is(err, ErrConstraint) != tc.constraint {
				t.Errorf("errors.Is(err, ErrConstraint) = %v, want %v", !tc.constraint, tc.constraint)
			}
			if e.Ambiguous != tc.ambiguous {
				t.Errorf("Ambiguous = %v, want %v", e.Ambiguous, tc.ambiguous)
			}
			if tc.retryAfter != 0 && (e.RetryAfter != tc.retryAfter || e.BlockedUntil.IsZero()) {
				t.Errorf("RetryAfter = %v (blocked until %v), want %v", e.RetryAfter, e.BlockedUntil, tc.retryAfter)
			}
			if !strings.Contains(e.Error(), tc.msg) {
				t.Errorf("message %q does not contain %q", e.Error(), tc.msg)
			}
			// The SQL is carried, its parameter values are not.
			if len(e.Statements) != 2 || !strings.Contains(e.Error(), "SELECT v FROM t WHERE k = ? (1 params redacted)") {
				t.Errorf("statements = %q", e.Statements)
			}
			if strings.Contains(e.Error(), "secret-key") {
				t.Errorf("error leaks a parameter value: %s", e)
			}
			// A write is never retried after these failures.
			if n := tr.GetTotalCallCount(); n != 1 {
				t.Errorf("%d HTTP calls, want 1", n)
			}
		})
	}
}

func wantCols(t *testing.T, r Result, cols ...string) {
	t.Helper()
	if strings.Join(r.Columns, ",") != strings.Join(cols, ",") {
		t.Errorf("columns = %q, want %q", r.Columns, cols)
	}
}

func wantRow(t *testing.T, got Row, want ...Value) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("row has %d values, want %d: %v", len(got), len(want), got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("column %d = %v (%s), want %v (%s)", i, got[i], got[i].Type(), want[i], want[i].Type())
		}
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
