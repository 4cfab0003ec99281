package bridge_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/internal/d1test"
)

// apiError is the first entry of an error envelope, with the envelope's
// result as raw JSON.
type apiError struct {
	Code       int               `json:"code"`
	Message    string            `json:"message"`
	ErrorChain []json.RawMessage `json:"error_chain"`
	Result     string            `json:"-"`
}

// wantError asserts an error envelope with this status and code whose
// message contains each of the fragments, and returns its first error.
func wantError(t testing.TB, res *d1test.Response, status, code int, fragments ...string) apiError {
	t.Helper()
	var env struct {
		Result   json.RawMessage `json:"result"`
		Success  *bool           `json:"success"`
		Errors   []apiError      `json:"errors"`
		Messages []any           `json:"messages"`
	}
	if err := json.Unmarshal(res.Body, &env); err != nil || env.Success == nil {
		t.Fatalf("HTTP %d: not an envelope: %s", res.Status, res.Body)
	}
	if res.Status != status || *env.Success || len(env.Errors) == 0 || env.Errors[0].Code != code || env.Messages == nil {
		t.Fatalf("got HTTP %d %s, want HTTP %d with code %d", res.Status, res.Body, status, code)
	}
	e := env.Errors[0]
	e.Result = string(env.Result)
	wantResult := "null"
	if code == 7500 {
		wantResult = "[]"
	}
	if e.Result != wantResult {
		t.Errorf(`"result" = %s, want %s`, e.Result, wantResult)
	}
	for _, f := range fragments {
		if !strings.Contains(e.Message, f) {
			t.Errorf("message %q does not contain %q", e.Message, f)
		}
	}
	return e
}

// wantOK asserts a successful envelope with n results.
func wantOK(t testing.TB, res *d1test.Response, n int) []json.RawMessage {
	t.Helper()
	var env struct {
		Result  []json.RawMessage `json:"result"`
		Success bool              `json:"success"`
	}
	if err := json.Unmarshal(res.Body, &env); err != nil || res.Status != http.StatusOK || !env.Success || len(env.Result) != n {
		t.Fatalf("got HTTP %d %s, want 200 with %d results", res.Status, res.Body, n)
	}
	return env.Result
}

// bearer is an Authorization header.
func bearer(token string) http.Header {
	return http.Header{"Authorization": {"Bearer " + token}}
}

// clientError asserts that err is a *d1client.Error matching the sentinel
// kind (d1client.ErrAuth, ErrSQL, ...) with this HTTP status.
func clientError(t testing.TB, err error, kind error, status int) *d1client.Error {
	t.Helper()
	var e *d1client.Error
	if !errors.As(err, &e) || !errors.Is(err, kind) || e.StatusCode != status {
		t.Fatalf("err = %v, want %v with HTTP %d", err, kind, status)
	}
	return e
}

// count runs a count(*) query on c.
func count(t testing.TB, c *d1client.Client, sql string, params ...any) int64 {
	t.Helper()
	res, err := c.Query(t.Context(), sql, params...)
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	n, ok := res.Rows[0][0].Int64()
	if !ok {
		t.Fatalf("%s: %v is not an integer", sql, res.Rows[0][0])
	}
	return n
}
