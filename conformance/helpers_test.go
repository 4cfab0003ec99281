package conformance

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"
	"testing"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/internal/specseq"
)

// The spec's five ledger statements, verbatim (internal/specseq holds them).
const (
	sqlClaim    = specseq.Claim
	sqlLookup   = specseq.Lookup
	sqlTakeover = specseq.Takeover
	sqlComplete = specseq.Complete
	sqlSweep    = specseq.Sweep
)

// pendingTTL is the spec's PENDING_TTL_MS.
const pendingTTL = 30_000

func claim(principal, key, fp string, now int64) d1client.Statement {
	return d1client.Statement{SQL: sqlClaim, Params: []any{principal, key, fp, now, now}}
}

func lookup(principal, key string) d1client.Statement {
	return d1client.Statement{SQL: sqlLookup, Params: []any{principal, key}}
}

func takeover(principal, key string, now int64) d1client.Statement {
	return d1client.Statement{SQL: sqlTakeover, Params: []any{now, principal, key, now - pendingTTL}}
}

func complete(principal, key string, generation int64, status int, body, headers string, now int64) d1client.Statement {
	return d1client.Statement{SQL: sqlComplete, Params: []any{status, body, headers, now, principal, key, generation}}
}

// exec runs statements as one call and fails the test on error.
func exec(t testing.TB, c *d1client.Client, stmts ...d1client.Statement) []d1client.Result {
	t.Helper()
	res, err := c.Exec(t.Context(), stmts)
	if err != nil {
		t.Fatalf("Exec: %v", err)
	}
	return res
}

// query runs one statement and fails the test on error.
func query(t testing.TB, c *d1client.Client, sql string, params ...any) *d1client.Result {
	t.Helper()
	res, err := c.Query(t.Context(), sql, params...)
	if err != nil {
		t.Fatalf("Query(%q): %v", sql, err)
	}
	return res
}

// wantTable compares a result's columns and rows with JSON spellings of
// them, e.g. wantTable(t, res, `["key","generation"]`, `[["k1",1]]`). Values
// compare as D1's JSON would spell them (see d1client.Value.MarshalJSON), so
// Integer 42 and Real 42 are equal here; tests that care check Type().
func wantTable(t testing.TB, res *d1client.Result, columns, rows string) {
	t.Helper()
	cols := res.Columns
	if cols == nil {
		cols = []string{}
	}
	r := res.Rows
	if r == nil {
		r = []d1client.Row{}
	}
	gotCols, _ := json.Marshal(cols)
	gotRows, err := json.Marshal(r)
	if err != nil {
		t.Fatalf("encoding rows: %v", err)
	}
	if !jsonEqual(t, gotCols, []byte(columns)) {
		t.Errorf("columns = %s, want %s", gotCols, columns)
	}
	if !jsonEqual(t, gotRows, []byte(rows)) {
		t.Errorf("rows = %s, want %s", gotRows, rows)
	}
}

// jsonEqual reports whether two JSON texts hold the same value. Numbers
// compare exactly as int64 when their literal is an integer that fits, and
// as float64 otherwise, so 9223372036854776000 (JavaScript's spelling) equals
// 9.223372036854776e+18 (Go's) and 1.5e-7 equals 1.5e-07.
func jsonEqual(t testing.TB, a, b []byte) bool {
	t.Helper()
	return jsonNorm(t, a) == jsonNorm(t, b)
}

func jsonNorm(t testing.TB, data []byte) string {
	t.Helper()
	v, err := decodeJSON(data)
	if err != nil {
		t.Fatalf("invalid JSON %s: %v", data, err)
	}
	out, _ := json.Marshal(canonNumbers(v))
	return string(out)
}

// canonNumbers rewrites every json.Number into one spelling per value.
func canonNumbers(v any) any {
	switch x := v.(type) {
	case json.Number:
		if i, err := strconv.ParseInt(string(x), 10, 64); err == nil {
			return json.Number(strconv.FormatInt(i, 10))
		}
		if f, err := strconv.ParseFloat(string(x), 64); err == nil {
			return json.Number(strconv.FormatFloat(f, 'g', -1, 64))
		}
		return x
	case []any:
		for i := range x {
			x[i] = canonNumbers(x[i])
		}
	case map[string]any:
		for k := range x {
			x[k] = canonNumbers(x[k])
		}
	}
	return v
}

// decodeJSON decodes with json.Number, so numbers keep their exact text.
func decodeJSON(data []byte) (any, error) {
	var v any
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	err := dec.Decode(&v)
	return v, err
}

// sqlError asserts err is a *d1client.Error matching ErrSQL from an HTTP 400
// with code 7500, and returns it.
func sqlError(t testing.TB, err error) *d1client.Error {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want a D1 SQL error")
	}
	var e *d1client.Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v (%T) is not a *d1client.Error", err, err)
	}
	if !errors.Is(err, d1client.ErrSQL) {
		t.Errorf("err = %v, want ErrSQL", err)
	}
	if e.StatusCode != 400 {
		t.Errorf("StatusCode = %d, want 400", e.StatusCode)
	}
	if len(e.Codes) != 1 || e.Codes[0] != 7500 {
		t.Errorf("Codes = %v, want [7500]", e.Codes)
	}
	if e.Ambiguous {
		t.Errorf("Ambiguous = true for a deterministic SQL error")
	}
	return e
}

// count returns the single integer of a one-row, one-column result.
func count(t testing.TB, c *d1client.Client, sql string, params ...any) int64 {
	t.Helper()
	res := query(t, c, sql, params...)
	if len(res.Rows) != 1 || len(res.Rows[0]) != 1 {
		t.Fatalf("%q: want one row of one column, got %d rows", sql, len(res.Rows))
	}
	n, ok := res.Rows[0][0].Int64()
	if !ok {
		t.Fatalf("%q: %s is not an integer", sql, res.Rows[0][0])
	}
	return n
}
