package d1client

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// kind classifies a failed D1 call: one kind per documented D1 failure
// shape, each with its sentinel error.
type kind int

const (
	kindSQL         kind = iota + 1 // HTTP 400, code 7500: SQLite refused the statement
	kindAuth                        // the token or the account is wrong
	kindNoDatabase                  // HTTP 404, code 7404: no such database
	kindRateLimited                 // HTTP 429, code 971: Cloudflare's global API limit
	kindOverloaded                  // any other 429: D1 is overloaded
	kindTransient                   // HTTP 5xx with a JSON body
	kindNonJSON                     // a body that is not JSON (an edge's HTML page)
	kindEnvelope                    // 2xx with success:false, or a malformed result
	kindResultCount                 // as many results as statements were not returned
	kindTransport                   // no HTTP response
	kindInvalid                     // refused before anything was sent
	kindRejected                    // any other 4xx
	kindBudget                      // the request budget is spent
)

// Sentinel errors, one per kind of failure. Every error of this package is
// an [*Error] that matches exactly one of them with [errors.Is], except that
// a constraint violation matches both ErrSQL and ErrConstraint.
var (
	// ErrSQL: SQLite refused the statement (HTTP 400, code 7500), for a
	// syntax error, a missing table, a constraint or an authorizer denial.
	// Nothing of the call was committed.
	ErrSQL = errors.New("d1: SQL error")
	// ErrConstraint: a constraint violation (UNIQUE, PRIMARY KEY, NOT NULL,
	// CHECK, FOREIGN KEY). Such an error is also an ErrSQL.
	ErrConstraint = errors.New("d1: constraint violation")
	// ErrAuth: the token, its permissions or the account are wrong (codes
	// 10000, 10001, 7403, 7003, 6003, 6111, 6103, 9106, 9107, 9109, or any
	// other HTTP 401 or 403).
	ErrAuth = errors.New("d1: authentication or configuration error")
	// ErrNoDatabase: the account has no database with the configured ID
	// (code 7404, with HTTP 404).
	ErrNoDatabase = errors.New("d1: no such database")
	// ErrRateLimited: Cloudflare's global API rate limit (HTTP 429, code
	// 971) blocks every API call of the account until Error.RetryAfter has
	// passed; the client sends nothing before then.
	ErrRateLimited = errors.New("d1: Cloudflare API rate limit reached (code 971)")
	// ErrOverloaded: D1 is overloaded (any other HTTP 429).
	ErrOverloaded = errors.New("d1: database overloaded")
	// ErrTransient: a server error with a JSON body (HTTP 5xx). A write may
	// have committed.
	ErrTransient = errors.New("d1: transient server error")
	// ErrNonJSON: a response that is not JSON, typically a 502, 503 or 504
	// page from Cloudflare's edge. A write may have committed.
	ErrNonJSON = errors.New("d1: non-JSON response")
	// ErrEnvelope: a 2xx response whose envelope says success:false or does
	// not decode. A write may have committed.
	ErrEnvelope = errors.New("d1: unsuccessful or malformed response envelope")
	// ErrResultCount: D1 returned a different number of results than
	// statements were sent. A write may have committed.
	ErrResultCount = errors.New("d1: result count does not match statement count")
	// ErrTransport: no HTTP response arrived (connection refused or lost, a
	// timeout), or the call was not sent because its context was done or
	// had less than a round trip left (the error then matches the context's
	// error). Error.Ambiguous says whether the request may have reached D1.
	ErrTransport = errors.New("d1: transport error")
	// ErrInvalid: refused before anything was sent: a bad Config, too many
	// parameters, SQL too long or holding several statements, an
	// unsupported parameter type.
	ErrInvalid = errors.New("d1: invalid request")
	// ErrRejected: any other HTTP 4xx (a malformed request).
	ErrRejected = errors.New("d1: request rejected")
	// ErrBudget: the API budget (see Account) had no call for the
	// statements early enough to come back (a round trip) before the
	// context's deadline. Nothing was sent; Error.RetryAfter says when a
	// call could go.
	ErrBudget = errors.New("d1: request budget exhausted")
)

var kindSentinels = map[kind]error{
	kindSQL: ErrSQL, kindAuth: ErrAuth, kindNoDatabase: ErrNoDatabase, kindRateLimited: ErrRateLimited,
	kindOverloaded: ErrOverloaded, kindTransient: ErrTransient, kindNonJSON: ErrNonJSON,
	kindEnvelope: ErrEnvelope, kindResultCount: ErrResultCount, kindTransport: ErrTransport,
	kindInvalid: ErrInvalid, kindRejected: ErrRejected, kindBudget: ErrBudget,
}

func (k kind) String() string {
	if s, ok := kindSentinels[k]; ok {
		return strings.TrimPrefix(s.Error(), "d1: ")
	}
	return "unknown d1 error"
}

// ErrorDetail is one entry of the envelope's errors array.
type ErrorDetail struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// Error is a failed D1 call. Match it against the sentinel errors with
// [errors.Is]; use [errors.As] for its details. It never holds the API
// token, and every parameter value of the call is left out.
type Error struct {
	StatusCode int           // HTTP status; 0 when no response arrived
	Codes      []int         // Cloudflare error codes, in order
	Message    string        // the first error message, or a snippet of a non-JSON body
	Details    []ErrorDetail // every entry of the envelope's errors array

	// SQLiteCode is the SQLite result code at the end of an SQL error's
	// message (such as "SQLITE_CONSTRAINT"), and ExtendedCode the extended
	// code where D1 gives one.
	SQLiteCode   string
	ExtendedCode string

	// RetryAfter is the server's Retry-After or, for ErrBudget, the wait
	// until the budget frees a call. BlockedUntil is the end of a 971
	// block, before which the client sends nothing.
	RetryAfter   time.Duration
	BlockedUntil time.Time

	// Ambiguous is true when the request may have reached D1 and committed
	// although no successful answer came back.
	Ambiguous bool

	// Statements is the SQL of the call, each with the number of its
	// parameters (their values are left out).
	Statements []string
	// Attempts is the number of HTTP attempts made.
	Attempts int

	// Err is the underlying cause, if any.
	Err error

	kind         kind
	violation    bool // a constraint violation, read from the message before redaction
	notSent      bool // raised before the call was sent (budget, 971, deadline): never retried
	siblingAbort bool // an SQL error of a shared call: each caller is sent again alone
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("d1: ")
	b.WriteString(e.kind.String())
	if st := e.Status(); st != "" {
		b.WriteString(" (" + st + ")")
	}
	switch {
	case e.Message != "":
		b.WriteString(": " + e.Message)
	case e.Err != nil:
		b.WriteString(": " + e.Err.Error())
	}
	if e.RetryAfter > 0 {
		fmt.Fprintf(&b, "; retry after %s", e.RetryAfter.Round(time.Millisecond))
	}
	if e.Ambiguous {
		b.WriteString("; the request may have been committed")
	}
	if len(e.Statements) > 0 {
		b.WriteString(" [sql: ")
		b.WriteString(strings.Join(e.Statements, "; "))
		b.WriteString("]")
	}
	return b.String()
}

// Status describes the HTTP status and the Cloudflare codes, such as
// "HTTP 403, code 10000"; "" when there are neither.
func (e *Error) Status() string {
	var parts []string
	if e.StatusCode != 0 {
		parts = append(parts, fmt.Sprintf("HTTP %d", e.StatusCode))
	}
	for _, c := range e.Codes {
		parts = append(parts, fmt.Sprintf("code %d", c))
	}
	return strings.Join(parts, ", ")
}

// Unwrap returns the underlying cause.
func (e *Error) Unwrap() error { return e.Err }

// Is reports whether target is the sentinel error of e's kind, or
// ErrConstraint for a constraint violation.
func (e *Error) Is(target error) bool {
	if target == ErrConstraint {
		return e.constraint()
	}
	return target == kindSentinels[e.kind]
}

// constraint reports whether SQLite refused the statement with a
// constraint violation.
func (e *Error) constraint() bool { return e.kind == kindSQL && e.violation }

// isViolation reports whether an SQL error's code, or its message as D1
// sent it, names a constraint violation.
func isViolation(code, msg string) bool {
	if code != "" {
		return code == "SQLITE_CONSTRAINT"
	}
	// Older D1 messages carry no suffix ("FOREIGN KEY constraint failed").
	return strings.Contains(msg, "constraint failed")
}

var sqliteSuffix = regexp.MustCompile(`:\s*(SQLITE_[A-Z_]+)(?:\s*\(extended:\s*(SQLITE_[A-Z_]+)\))?\s*$`)

// parseSQLiteCode splits "<message>: SQLITE_<CODE>" (optionally followed by
// " (extended: SQLITE_<EXT>)", as local workerd answers) into its parts.
func parseSQLiteCode(msg string) (code, extended string) {
	m := sqliteSuffix.FindStringSubmatch(msg)
	if m == nil {
		return "", ""
	}
	return m[1], m[2]
}

// maxRetryAfter bounds a server's Retry-After: Cloudflare's longest block
// is 5 minutes, and 1e12 seconds would overflow a time.Duration.
const maxRetryAfter = time.Hour

// parseRetryAfter reads Retry-After as seconds or an HTTP date, at most
// maxRetryAfter.
func parseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if secs, err := strconv.ParseFloat(v, 64); (err == nil || errors.Is(err, strconv.ErrRange)) && secs >= 0 {
		// Bounded before the multiplication, so that it cannot overflow.
		return time.Duration(min(secs, maxRetryAfter.Seconds()) * float64(time.Second)), true
	}
	if t, err := time.Parse(time.RFC1123, v); err == nil {
		return min(max(t.Sub(now), 0), maxRetryAfter), true
	}
	return 0, false
}

// notSent is the error of a call its context ended before it was sent:
// not ambiguous, and matching the context's error.
func notSent(err error, where string) *Error {
	return &Error{kind: kindTransport, Err: err, Message: "not sent: " + err.Error() + where, notSent: true}
}
