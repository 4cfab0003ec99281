package d1client

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// kind classifies a failed D1 call: one per sentinel error below.
type kind int

const (
	kindSQL kind = iota + 1
	kindAuth
	kindNoDatabase
	kindRateLimited
	kindOverloaded
	kindTransient
	kindNonJSON
	kindEnvelope
	kindResultCount
	kindTransport
	kindInvalid
	kindRejected
	kindBudget
	kindShed
)

// Sentinel errors. Every error of this package is an [*Error] matching
// exactly one of them with [errors.Is] (a constraint violation: ErrSQL and
// ErrConstraint). "A write may have committed" marks the Ambiguous kinds.
var (
	// ErrSQL: SQLite refused the statement (HTTP 400, code 7500); nothing
	// of the call was committed.
	ErrSQL = errors.New("d1: SQL error")
	// ErrConstraint: a UNIQUE, PRIMARY KEY, NOT NULL, CHECK or FOREIGN KEY
	// violation; also an ErrSQL.
	ErrConstraint = errors.New("d1: constraint violation")
	// ErrAuth: the token, its permissions or the account are wrong (codes
	// 10000, 10001, 7403, 7003, 6003, 6111, 6103, 9106, 9107, 9109, or any
	// other HTTP 401 or 403).
	ErrAuth = errors.New("d1: authentication or configuration error")
	// ErrNoDatabase: no database with the configured ID (HTTP 404, code 7404).
	ErrNoDatabase = errors.New("d1: no such database")
	// ErrRateLimited: Cloudflare's global API rate limit (HTTP 429, code
	// 971); the client sends nothing until Error.RetryAfter has passed.
	ErrRateLimited = errors.New("d1: Cloudflare API rate limit reached (code 971)")
	// ErrOverloaded: D1 is overloaded (any other HTTP 429).
	ErrOverloaded = errors.New("d1: database overloaded")
	// ErrTransient: HTTP 5xx with a JSON body. A write may have committed.
	ErrTransient = errors.New("d1: transient server error")
	// ErrNonJSON: a body that is not JSON, typically an edge's 502, 503 or
	// 504 page. A write may have committed.
	ErrNonJSON = errors.New("d1: non-JSON response")
	// ErrEnvelope: a 2xx whose envelope says success:false or does not
	// decode. A write may have committed.
	ErrEnvelope = errors.New("d1: unsuccessful or malformed response envelope")
	// ErrResultCount: not one result per statement. A write may have
	// committed.
	ErrResultCount = errors.New("d1: result count does not match statement count")
	// ErrTransport: no HTTP response (connection refused or lost, a
	// timeout; Error.Ambiguous says whether the request may have reached
	// D1), or not sent as the context was done or had less than a round
	// trip left (the error then matches the context's error).
	ErrTransport = errors.New("d1: transport error")
	// ErrInvalid: refused before sending: a bad Config, statement or
	// parameter.
	ErrInvalid = errors.New("d1: invalid request")
	// ErrRejected: any other HTTP 4xx.
	ErrRejected = errors.New("d1: request rejected")
	// ErrBudget: the API budget (see Account) had no call free a round
	// trip before the context's deadline; Error.RetryAfter says when.
	ErrBudget = errors.New("d1: request budget exhausted")
	// ErrShed: group commit's queue held more work ahead of a call
	// without Priority than it could wait for (CoalesceConfig.MaxQueueWait,
	// or its deadline): refused at once, unsent; Error.RetryAfter says
	// when the queue should have room.
	ErrShed = errors.New("d1: request shed: the queue is longer than it can wait")
)

var kindSentinels = map[kind]error{
	kindSQL: ErrSQL, kindAuth: ErrAuth, kindNoDatabase: ErrNoDatabase, kindRateLimited: ErrRateLimited,
	kindOverloaded: ErrOverloaded, kindTransient: ErrTransient, kindNonJSON: ErrNonJSON,
	kindEnvelope: ErrEnvelope, kindResultCount: ErrResultCount, kindTransport: ErrTransport,
	kindInvalid: ErrInvalid, kindRejected: ErrRejected, kindBudget: ErrBudget, kindShed: ErrShed,
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

// Error is a failed D1 call, matched against the sentinel errors with
// [errors.Is]. It never holds the API token nor a parameter value.
type Error struct {
	StatusCode int           // HTTP status; 0 when no response arrived
	Codes      []int         // Cloudflare error codes, in order
	Message    string        // the first error message, or a snippet of a non-JSON body
	Details    []ErrorDetail // every entry of the envelope's errors array

	SQLiteCode   string // the SQLite result code ending an SQL error's message ("SQLITE_CONSTRAINT")
	ExtendedCode string // the extended result code, where given

	RetryAfter   time.Duration // the server's Retry-After; for ErrBudget, the wait until a call is free
	BlockedUntil time.Time     // the end of a 971 block

	Ambiguous  bool     // the request may have reached D1 and committed, no successful answer came back
	Statements []string // the call's SQL, each with its number of parameters
	Attempts   int      // HTTP attempts made
	Err        error    // the underlying cause, if any

	kind      kind
	violation bool // a constraint violation, read from the message before redaction
	notSent   bool // raised before the call was sent (budget, 971, deadline): never retried
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("d1: " + e.kind.String())
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
		b.WriteString(" [sql: " + strings.Join(e.Statements, "; ") + "]")
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
		return e.kind == kindSQL && e.violation
	}
	return target == kindSentinels[e.kind]
}

// isViolation reports whether an SQL error's code, or its message where it
// has none ("FOREIGN KEY constraint failed"), names a constraint violation.
func isViolation(code, msg string) bool {
	if code != "" {
		return code == "SQLITE_CONSTRAINT"
	}
	return strings.Contains(msg, "constraint failed")
}

var sqliteSuffix = regexp.MustCompile(`:\s*(SQLITE_[A-Z_]+)(?:\s*\(extended:\s*(SQLITE_[A-Z_]+)\))?\s*$`)

// parseSQLiteCode reads the codes ending "<message>: SQLITE_<CODE>",
// optionally followed by " (extended: SQLITE_<EXT>)" as local workerd says.
func parseSQLiteCode(msg string) (code, extended string) {
	if m := sqliteSuffix.FindStringSubmatch(msg); m != nil {
		return m[1], m[2]
	}
	return "", ""
}

// maxRetryAfter bounds a server's Retry-After: Cloudflare's longest block
// is 5 minutes, and 1e12 seconds would overflow a time.Duration.
const maxRetryAfter = time.Hour

// parseRetryAfter reads Retry-After as seconds or an HTTP date.
func parseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" { // the usual case, which must not allocate an error
		return 0, false
	}
	if secs, err := strconv.ParseFloat(v, 64); (err == nil || errors.Is(err, strconv.ErrRange)) && secs >= 0 {
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
