package d1client

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jarcoal/httpmock"
)

type userID int64
type label string

func TestEncodeParam(t *testing.T) {
	s := "ptr"
	var nilPtr *int64
	tests := []struct {
		name    string
		in      any
		want    string // JSON; empty when an error is expected
		wantErr string
	}{
		{"nil", nil, "null", ""},
		{"nil pointer", nilPtr, "null", ""},
		{"true", true, "1", ""},
		{"false", false, "0", ""},
		{"int", 42, "42", ""},
		{"negative", int64(-7), "-7", ""},
		{"2^53 stays a number", int64(1 << 53), "9007199254740992", ""},
		{"-2^53 stays a number", int64(-(1 << 53)), "-9007199254740992", ""},
		{"2^53+1 travels as a string", int64(1<<53 + 1), `"9007199254740993"`, ""},
		{"-2^53-1 travels as a string", int64(-(1 << 53) - 1), `"-9007199254740993"`, ""},
		{"max int64", int64(math.MaxInt64), `"9223372036854775807"`, ""},
		{"min int64", int64(math.MinInt64), `"-9223372036854775808"`, ""},
		{"uint8", uint8(200), "200", ""},
		{"uint64 in range", uint64(1 << 60), `"1152921504606846976"`, ""},
		{"uint64 too big", uint64(math.MaxUint64), "", "exceeds SQLite's int64 range"},
		{"named int", userID(12), "12", ""},
		{"float", 1.5, "1.5", ""},
		{"float32", float32(0.25), "0.25", ""},
		{"whole float", 2.0, "2", ""},
		{"NaN", math.NaN(), "", "no JSON encoding"},
		{"Inf", math.Inf(1), "", "no JSON encoding"},
		{"string", "héllo \"x\"", `"héllo \"x\""`, ""},
		{"named string", label("a"), `"a"`, ""},
		{"pointer", &s, `"ptr"`, ""},
		{"invalid UTF-8", "a\xffb", "", "not valid UTF-8"},
		{"json.Number", json.Number("12.5e3"), "12.5e3", ""},
		{"bad json.Number", json.Number("12x"), "", "not a number"},
		{"sql.NullString valid", sql.NullString{String: "v", Valid: true}, `"v"`, ""},
		{"sql.NullInt64 null", sql.NullInt64{}, "null", ""},
		{"bytes", []byte{1, 2}, "", "unhex(?)"},
		{"json.RawMessage", json.RawMessage(`{}`), "", "unhex(?)"},
		{"time", time.Unix(0, 0), "", "t.UnixMilli()"},
		{"struct", struct{}{}, "", "unsupported parameter type"},
		{"map", map[string]int{}, "", "unsupported parameter type"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := encodeParam(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tc.want {
				t.Errorf("got %s, want %s", got, tc.want)
			}
		})
	}
}

// The encoded parameters reach the wire exactly, in the single and batch
// forms.
func TestRequestBodyOnTheWire(t *testing.T) {
	var bodies []string
	responder := func(req *http.Request) (*http.Response, error) {
		b, _ := io.ReadAll(req.Body)
		bodies = append(bodies, string(b))
		if req.Header.Get("Authorization") != "Bearer "+testToken || !strings.HasPrefix(req.Header.Get("Content-Type"), "application/json") {
			return httpmock.NewStringResponse(400, "bad headers"), nil
		}
		n := strings.Count(string(b), `"sql"`)
		return httpmock.NewStringResponse(200, okResults(n)), nil
	}
	c, _ := mockClient(t, responder)
	ctx := context.Background()
	if _, err := c.Query(ctx, "SELECT ?, ?, ?, ?", int64(1<<53+1), nil, true, "x"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, []Statement{{SQL: "SELECT 1"}, {SQL: "SELECT ?", Params: []any{2.5}}}); err != nil {
		t.Fatal(err)
	}
	want := []string{
		`{"sql":"SELECT ?, ?, ?, ?","params":["9007199254740993",null,1,"x"]}`,
		`{"batch":[{"sql":"SELECT 1"},{"sql":"SELECT ?","params":[2.5]}]}`,
	}
	for i := range want {
		if bodies[i] != want[i] {
			t.Errorf("body %d = %s\nwant %s", i, bodies[i], want[i])
		}
	}
}

func okResults(n int) string {
	parts := make([]string, n)
	for i := range parts {
		parts[i] = `{"results":{"columns":[],"rows":[]},"success":true,"meta":{}}`
	}
	return `{"result":[` + strings.Join(parts, ",") + `],"success":true,"errors":[],"messages":[]}`
}

// Limits and bad parameters are refused before anything is sent.
func TestClientSideLimits(t *testing.T) {
	params := func(n int) []any {
		p := make([]any, n)
		for i := range p {
			p[i] = i
		}
		return p
	}
	tests := []struct {
		name    string
		stmts   []Statement
		wantErr string
	}{
		{"no statements", nil, "no statements"},
		{"empty SQL", []Statement{{SQL: "  "}}, "empty SQL"},
		{"101 parameters", []Statement{{SQL: "SELECT 1", Params: params(101)}}, "101 parameters; D1 allows at most 100"},
		{"SQL over 100,000 bytes", []Statement{{SQL: "SELECT '" + strings.Repeat("x", MaxSQLBytes) + "'"}}, "D1 allows at most 100000 per statement"},
		{"second statement bad", []Statement{{SQL: "SELECT 1"}, {SQL: "SELECT ?", Params: []any{[]byte("x")}}}, "statement 2, parameter 1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, tr := mockClient(t, httpmock.NewStringResponder(200, okResults(1)))
			_, err := c.Exec(context.Background(), tc.stmts)
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err = %v, want ErrInvalid containing %q", err, tc.wantErr)
			}
			if n := tr.GetTotalCallCount(); n != 0 {
				t.Errorf("%d calls sent, want 0", n)
			}
		})
	}
	// Exactly at the limits is fine.
	c, tr := mockClient(t, httpmock.NewStringResponder(200, okResults(1)))
	if _, err := c.Exec(context.Background(), []Statement{{SQL: "SELECT 1", Params: params(100)}}); err != nil {
		t.Fatal(err)
	}
	if tr.GetTotalCallCount() != 1 {
		t.Fatal("100 parameters were not sent")
	}
}

func TestNewValidatesConfig(t *testing.T) {
	base := Config{AccountID: testAccount, DatabaseID: testDatabase, BaseURL: testBaseURL}
	tests := []struct {
		name string
		mod  func(*Config)
		want string
	}{
		{"missing account", func(c *Config) { c.AccountID = "" }, "account ID is required"},
		{"bad account", func(c *Config) { c.AccountID = "a/../b" }, "not a Cloudflare identifier"},
		{"missing database", func(c *Config) { c.DatabaseID = "" }, "database ID is required"},
		{"bad database", func(c *Config) { c.DatabaseID = "x?y" }, "not a D1 database UUID"},
		{"bad base URL", func(c *Config) { c.BaseURL = "ftp://x" }, "must start with http"},
		{"negative budget", func(c *Config) { c.Budget = &Budget{Calls: -1} }, "must not be negative"},
		{"budget without window", func(c *Config) { c.Budget = &Budget{Calls: 5} }, "positive window"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := base
			tc.mod(&cfg)
			_, err := New(cfg)
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrInvalid containing %q", err, tc.want)
			}
		})
	}
}

func TestBaseURLFromEnvironment(t *testing.T) {
	t.Setenv(BaseURLEnv, "http://127.0.0.1:1")
	c, err := New(Config{AccountID: testAccount, DatabaseID: testDatabase})
	if err != nil {
		t.Fatal(err)
	}
	if c.cfg.BaseURL != "http://127.0.0.1:1/" {
		t.Errorf("base URL = %q", c.cfg.BaseURL)
	}
	t.Setenv(BaseURLEnv, "")
	c, _ = New(Config{AccountID: testAccount, DatabaseID: testDatabase})
	if c.cfg.BaseURL != DefaultBaseURL {
		t.Errorf("default base URL = %q", c.cfg.BaseURL)
	}
}

func TestReadOnlyDetection(t *testing.T) {
	tests := map[string]bool{
		"SELECT 1":                                    true,
		"  -- comment\n select * from t":              true,
		"/* c */ VALUES (1)":                          true,
		"EXPLAIN QUERY PLAN DELETE FROM t":            true,
		"PRAGMA table_info(t)":                        true,
		"PRAGMA foreign_keys = ON":                    false,
		"WITH x AS (SELECT 1) SELECT * FROM x":        true,
		"WITH x AS (SELECT 1) DELETE FROM t":          false,
		"INSERT INTO t VALUES (1)":                    false,
		"UPDATE t SET a = 1 RETURNING a":              false,
		"DELETE FROM t":                               false,
		"CREATE TABLE t(a)":                           false,
		"with x as (select 1) insert into t select 1": false,
	}
	for sql, want := range tests {
		if got := (Statement{SQL: sql}).readOnly(); got != want {
			t.Errorf("readOnly(%q) = %v, want %v", sql, got, want)
		}
	}
}
