package d1client

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"

	"github.com/jarcoal/httpmock"

	"github.com/d1idem/d1idem/d1client/budget"
	"github.com/d1idem/d1idem/internal/redact"
)

// sqlError answers with D1's SQL error (HTTP 400, code 7500) of message msg.
func sqlError(msg string) httpmock.Responder {
	body := fmt.Sprintf(`{"result":[],"success":false,"errors":[{"code":7500,"message":%q}],"messages":[]}`, msg)
	return httpmock.NewStringResponder(http.StatusBadRequest, body)
}

// A short token is redacted only where it stands as a whole word: D1's
// messages keep their words ("constraint", "localhost"), and an echo of
// the token is still hidden.
func TestRedactWholeTokenOnly(t *testing.T) {
	for _, tc := range []struct {
		token, msg, want string
	}{
		{"t", "NOT NULL constraint failed: orders.total: SQLITE_CONSTRAINT",
			"NOT NULL constraint failed: orders.total: SQLITE_CONSTRAINT"},
		{"t", "bad token t: SQLITE_ERROR", "bad token [REDACTED]: SQLITE_ERROR"},
		{"local", "no such table: localhost_cache: SQLITE_ERROR", "no such table: localhost_cache: SQLITE_ERROR"},
		{"local", "Bearer local was refused: SQLITE_AUTH", "Bearer [REDACTED] was refused: SQLITE_AUTH"},
		{"local", "(local,local) local.x: SQLITE_ERROR", "([REDACTED],[REDACTED]) [REDACTED].x: SQLITE_ERROR"},
		{"aa", "aaa aa: SQLITE_ERROR", "aaa [REDACTED]: SQLITE_ERROR"},
		// A long token is opaque: hidden even glued to other characters.
		{testToken, "Authorization=Bearer%20" + testToken + "x: SQLITE_AUTH", "Authorization=Bearer%20[REDACTED]x: SQLITE_AUTH"},
	} {
		c, _ := mockClient(t, sqlError(tc.msg), func(cfg *Config) { cfg.APIToken = tc.token })
		_, err := c.Exec(t.Context(), readStmt)
		var e *Error
		if !errors.As(err, &e) || !errors.Is(err, ErrSQL) {
			t.Fatalf("token %q: err = %v", tc.token, err)
		}
		if e.Message != tc.want || e.Details[0].Message != tc.want {
			t.Errorf("token %q: message %q, details %q; want %q", tc.token, e.Message, e.Details[0].Message, tc.want)
		}
	}
	for _, tc := range []struct{ s, tok, want string }{
		{"", "t", ""},
		{"t", "t", "[REDACTED]"},
		{"tt t", "t", "tt [REDACTED]"},
		{"é-local", "local", "é-local"},
		{"x!ab!y", "!ab!", "x[REDACTED]y"}, // a token with no word character at its ends
	} {
		if got := redactText(tc.s, tc.tok); got != tc.want {
			t.Errorf("redactText(%q, %q) = %q, want %q", tc.s, tc.tok, got, tc.want)
		}
	}
}

// A constraint violation is classified from D1's message before the token
// is redacted from it: a token that is a word of the message (here the old
// message form, with no SQLITE_ suffix) does not turn ErrConstraint into a
// plain ErrSQL.
func TestConstraintClassifiedBeforeRedaction(t *testing.T) {
	c, _ := mockClient(t, replay(t, "sql_error_fk_old_format"), func(cfg *Config) { cfg.APIToken = "constraint" })
	_, err := c.Exec(t.Context(), readStmt)
	var e *Error
	if !errors.As(err, &e) || !errors.Is(err, ErrConstraint) || !errors.Is(err, ErrSQL) {
		t.Fatalf("err = %v, want ErrConstraint", err)
	}
	if strings.Contains(e.Message, "constraint") {
		t.Errorf("the token is shown: %q", e.Message)
	}
}

// Redaction keeps the error's cause for errors.Is: a short token inside a
// host name leaves the cause as it was, and a cause whose text names the
// token is hidden behind its redacted text without leaving the chain.
func TestRedactKeepsErrorChain(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close() // nothing listens there now: a dial is refused
	c, err := New(Config{
		BaseURL: fmt.Sprintf("http://localhost:%d/", port), APIToken: "local",
		AccountID: testAccount, DatabaseID: testDatabase, Budget: budget.Unlimited(), Retry: NoRetry(),
	})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Exec(t.Context(), readStmt)
	if !errors.Is(err, ErrTransport) || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("err = %v; want ErrTransport and ECONNREFUSED", err)
	}
	if strings.Contains(err.Error(), redact.Redacted) || !strings.Contains(err.Error(), "localhost") {
		t.Errorf("the host name was mangled: %v", err)
	}

	// A cause that names the token.
	refused := func(req *http.Request) (*http.Response, error) {
		return nil, fmt.Errorf("proxy refused %s: %w", req.Header.Get("Authorization"), syscall.ECONNREFUSED)
	}
	c2, _ := mockClient(t, refused, func(cfg *Config) { cfg.Retry = NoRetry() })
	_, err = c2.Exec(t.Context(), readStmt)
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("err = %v; the cause is lost", err)
	}
	for e := error(err); e != nil; e = errors.Unwrap(e) {
		if strings.Contains(e.Error(), testToken) {
			t.Fatalf("the token is reachable through Unwrap: %v", e)
		}
	}
	if !strings.Contains(err.Error(), "proxy refused Bearer [REDACTED]") {
		t.Errorf("err = %v", err)
	}
}
