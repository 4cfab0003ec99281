package d1client

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Kind classifies a failed D1 call. Every error this package returns is an
// [*Error] whose Kind says which documented D1 failure it is; the matching
// sentinel (ErrSQL, ErrAuth, ...) makes it testable with [errors.Is].
type Kind int

// The kinds of failure. The package documentation maps every D1 response
// shape to one of them.
const (
	// KindSQL: HTTP 400 with code 7500. SQLite refused the statement (syntax,
	// missing table, constraint, authorizer denial). Deterministic: never
	// retried. Nothing in the request was committed.
	KindSQL Kind = iota + 1
	// KindAuth: the token, account or database is wrong (10000, 7403, 7404,
	// 7003, 6003/6111). Deterministic: never retried.
	KindAuth
	// KindRateLimited: HTTP 429 with code 971, Cloudflare's global API limit
	// (1200 calls per 5 minutes). Every API call of the account is blocked
	// until RetryAfter has passed; the client refuses to send until then.
	KindRateLimited
	// KindOverloaded: HTTP 429 from D1 itself (its queue is full). Short
	// backoff; retried for reads and idempotent calls.
	KindOverloaded
	// KindTransient: HTTP 5xx with a JSON body, including 500/7500
	// "internal error". Retried for reads and idempotent calls only, because
	// a write may have committed.
	KindTransient
	// KindNonJSON: a response that is not JSON, typically a 502/503/504 HTML
	// page from the edge. Treated like KindTransient.
	KindNonJSON
	// KindEnvelope: HTTP 2xx whose envelope says success:false, or whose
	// body does not decode. The outcome of a write is unknown.
	KindEnvelope
	// KindResultCount: D1 answered with a different number of results than
	// statements were sent. The outcome of a write is unknown.
	KindResultCount
	// KindTransport: no HTTP response (connection refused, reset, timeout).
	// Ambiguous reports whether the request may have reached D1.
	KindTransport
	// KindInvalid: refused by this client before anything was sent (too many
	// parameters, SQL too long, an unsupported parameter type, bad config).
	KindInvalid
	// KindRejected: any other 4xx from the API (a malformed body, say).
	// Deterministic: never retried.
	KindRejected
	// KindBudget: the client-side request budget had no call left before the
	// context deadline. Nothing was sent; RetryAfter says when one frees up.
	KindBudget
)

// Sentinels for [errors.Is]. Each *Error matches the sentinel of its Kind;
// ErrConstraint additionally matches SQL errors whose SQLite code is
// SQLITE_CONSTRAINT, and ErrRetryable matches every error that is safe and
// useful to try again later.
var (
	ErrSQL         = errors.New("d1: SQL error")
	ErrConstraint  = errors.New("d1: constraint violation")
	ErrAuth        = errors.New("d1: authentication or configuration error")
	ErrRateLimited = errors.New("d1: Cloudflare API rate limit reached (code 971)")
	ErrOverloaded  = errors.New("d1: database overloaded")
	ErrTransient   = errors.New("d1: transient server error")
	ErrNonJSON     = errors.New("d1: non-JSON response")
	ErrEnvelope    = errors.New("d1: unsuccessful or malformed response envelope")
	ErrResultCount = errors.New("d1: result count does not match statement count")
	ErrTransport   = errors.New("d1: transport error")
	ErrInvalid     = errors.New("d1: invalid request")
	ErrRejected    = errors.New("d1: request rejected")
	ErrBudget      = errors.New("d1: request budget exhausted")
	ErrRetryable   = errors.New("d1: retryable")
)

var kindSentinels = map[Kind]error{
	KindSQL: ErrSQL, KindAuth: ErrAuth, KindRateLimited: ErrRateLimited,
	KindOverloaded: ErrOverloaded, KindTransient: ErrTransient, KindNonJSON: ErrNonJSON,
	KindEnvelope: ErrEnvelope, KindResultCount: ErrResultCount, KindTransport: ErrTransport,
	KindInvalid: ErrInvalid, KindRejected: ErrRejected, KindBudget: ErrBudget,
}

func (k Kind) String() string {
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

// Error is a failed D1 call. It carries what an operator needs and never the
// API token: the HTTP status, the Cloudflare codes and messages, the SQLite
// result code for SQL errors, Retry-After for rate limits, and the SQL of the
// call with every parameter value redacted.
type Error struct {
	Kind       Kind
	StatusCode int           // HTTP status; 0 when no response arrived
	Codes      []int         // Cloudflare error codes, in order
	Message    string        // first error message (or a snippet of a non-JSON body)
	Details    []ErrorDetail // every entry of the envelope's errors array

	// SQLiteCode is the primary SQLite code parsed from the ": SQLITE_<CODE>"
	// suffix of a 7500 message (for example "SQLITE_CONSTRAINT"), and
	// ExtendedCode the "(extended: SQLITE_...)" part where D1 gives it.
	SQLiteCode   string
	ExtendedCode string

	// RetryAfter is the server's Retry-After (429, 503) or, for KindBudget,
	// the wait until the budget frees a call. BlockedUntil is set for a 971
	// block: the time before which this client will not send.
	RetryAfter   time.Duration
	BlockedUntil time.Time

	// Ambiguous is true when the request may have reached D1 and been
	// committed even though no successful answer came back.
	Ambiguous bool

	// Statements is the SQL of the call, each with a count of its redacted
	// parameters, for diagnostics.
	Statements []string
	// Attempts is the number of HTTP attempts made.
	Attempts int

	// Err is the underlying cause, if any (a transport error, say).
	Err error

	// siblingAbort marks an SQL error of a shared (coalesced) call, whose
	// statements must each be sent again alone.
	siblingAbort bool
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("d1: ")
	b.WriteString(e.Kind.String())
	if st := e.Status(); st != "" {
		b.WriteString(" (" + st + ")")
	}
	if e.Message != "" {
		b.WriteString(": ")
		b.WriteString(e.Message)
	}
	if e.Err != nil && e.Message == "" {
		b.WriteString(": ")
		b.WriteString(e.Err.Error())
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

// Is matches the sentinel of the error's Kind, ErrConstraint for constraint
// violations, and ErrRetryable for errors worth retrying later.
func (e *Error) Is(target error) bool {
	switch target {
	case kindSentinels[e.Kind]:
		return true
	case ErrConstraint:
		return e.IsConstraint()
	case ErrRetryable:
		return e.Retryable()
	}
	return false
}

// IsConstraint reports whether SQLite refused the statement with a
// constraint violation (UNIQUE, PRIMARY KEY, NOT NULL, CHECK, FOREIGN KEY).
func (e *Error) IsConstraint() bool {
	if e.Kind != KindSQL {
		return false
	}
	if e.SQLiteCode != "" {
		return e.SQLiteCode == "SQLITE_CONSTRAINT"
	}
	// Older D1 messages carry no suffix ("FOREIGN KEY constraint failed").
	return strings.Contains(e.Message, "constraint failed")
}

// Retryable reports whether trying the same call again later can succeed:
// transient server and transport failures, overload, rate limits and an
// exhausted budget. It says nothing about whether a retry is safe for a
// write; see Ambiguous.
func (e *Error) Retryable() bool {
	switch e.Kind {
	case KindRateLimited, KindOverloaded, KindTransient, KindNonJSON, KindTransport, KindBudget:
		return true
	}
	return false
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

// parseRetryAfter reads Retry-After as seconds or an HTTP date.
func parseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if secs, err := strconv.ParseFloat(v, 64); err == nil && secs >= 0 {
		return time.Duration(secs * float64(time.Second)), true
	}
	if t, err := time.Parse(time.RFC1123, v); err == nil {
		if d := t.Sub(now); d > 0 {
			return d, true
		}
		return 0, true
	}
	return 0, false
}
