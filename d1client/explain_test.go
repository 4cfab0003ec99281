package d1client

import (
	"strings"
	"testing"
	"time"
)

// TestExplain: each kind of failure reads as what happened and what to do,
// without the SQL; a call that may have committed a write says so, and a
// read never does.
func TestExplain(t *testing.T) {
	insert, sel := []string{"INSERT INTO t VALUES (?)"}, []string{"select 1"}
	for _, tc := range []struct {
		e    *Error
		want string
	}{
		{&Error{kind: kindAuth, StatusCode: 403, Codes: []int{10000}, Message: "Authentication error"},
			"D1 refused the credentials (HTTP 403, code 10000): Authentication error; check the API token (it needs D1 edit permission), the account ID and the database ID"},
		{&Error{kind: kindRateLimited, StatusCode: 429, Codes: []int{971}, RetryAfter: 90 * time.Second},
			"Cloudflare's API rate limit is reached (HTTP 429, code 971): every API call of the account, the application's included, is blocked for up to 5 minutes; try again in 1m30s"},
		{&Error{kind: kindSQL, StatusCode: 400, Message: "no such table: t", Statements: insert},
			"D1 SQL error (HTTP 400): no such table: t"},
		{&Error{kind: kindTransient, StatusCode: 503, Message: "try later", Ambiguous: true, Attempts: 3, Statements: insert},
			"D1 transient server error (HTTP 503): try later (after 3 attempts); the change may have been committed: look before repeating it"},
		{&Error{kind: kindTransient, StatusCode: 503, Message: "try later", Ambiguous: true, Statements: sel},
			"D1 transient server error (HTTP 503): try later"},
	} {
		if got := tc.e.Explain(); got != tc.want {
			t.Errorf("Explain() = %q\nwant        %q", got, tc.want)
		}
		if strings.Contains(tc.e.Explain(), "INSERT") {
			t.Errorf("Explain() shows the SQL: %q", tc.e.Explain())
		}
	}
}
