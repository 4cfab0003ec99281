// Package d1client is a Cloudflare D1 REST client that is exact about three
// things: what D1 accepts, what D1 returns, and which failures are safe to
// retry.
//
// It is built on github.com/cloudflare/cloudflare-go/v7 (its d1 and option
// packages only), with cloudflare-go's own retries turned off: cloudflare-go
// retries POSTs, and so writes, by default, and honours Retry-After with no
// cap. Every call goes to the /raw endpoint, whose ordered columns keep
// duplicate names and column order (see Client).
//
// # Statements and batches
//
// Exec takes one or more Statements. One travels as {"sql","params"}; several
// travel as {"batch":[...]}, which D1 runs as one transaction. The number of
// results is checked against the number of statements. Results decode from
// the raw JSON bytes, never through float64 for integers: see Value for the
// exact rules, Row.Scan for scanning, and Meta for the per-statement meta
// (changes, rows_read, rows_written, duration, size_after, served_by_*).
//
// # Parameters
//
// Parameters are encoded deliberately (see encodeParam for the reasoning):
//
//	nil, nil pointer        -> null
//	bool                    -> 0 / 1
//	integer, |v| <= 2^53    -> JSON number
//	integer, |v| >  2^53    -> decimal string (JSON numbers are JavaScript
//	                           doubles in D1; INTEGER affinity restores the
//	                           exact value from the string)
//	float (finite)          -> JSON number
//	string (valid UTF-8)    -> JSON string
//	json.Number             -> as written
//	[]byte                  -> refused: bind hex text, write unhex(?)
//	time.Time               -> refused: bind t.UnixMilli() or an RFC 3339 string
//
// Before anything is sent, a statement with more than 100 parameters or more
// than 100,000 bytes of SQL is refused with a KindInvalid error.
//
// # Errors
//
// Every failure is an *Error. Its Kind maps the D1 response shape, and the
// matching sentinel works with errors.Is:
//
//	HTTP 400, code 7500 "<msg>: SQLITE_<CODE>"   KindSQL         ErrSQL (and ErrConstraint for SQLITE_CONSTRAINT)
//	403 10000, 403 7403, 404 7404, 400/404 7003,
//	400 6003/6111/6103, any other 401/403         KindAuth        ErrAuth
//	429 code 971 (global API limit), Retry-After  KindRateLimited ErrRateLimited
//	429 otherwise (D1 overloaded)                 KindOverloaded  ErrOverloaded
//	5xx with a JSON body (500/7500 internal)      KindTransient   ErrTransient
//	a body that is not JSON (502/503/504 HTML)    KindNonJSON     ErrNonJSON
//	2xx with success:false, or a bad result       KindEnvelope    ErrEnvelope
//	result count differs from statement count     KindResultCount ErrResultCount
//	no HTTP response at all                       KindTransport   ErrTransport
//	other 4xx (a malformed request)               KindRejected    ErrRejected
//	refused before sending                        KindInvalid     ErrInvalid
//	the request budget is spent                   KindBudget      ErrBudget
//
// Every error carries the status, the codes, the message and the SQL of the
// call with its parameter values redacted. The API token never appears in an
// error, a log line or a panic. Ambiguous marks failures after which a write
// may nevertheless have committed.
//
// # Retries
//
// The RetryPolicy retries reads, and calls marked Idempotent, on transient
// failures (overload, 5xx, non-JSON, transport) with capped exponential
// backoff and jitter, honouring Retry-After up to a cap. A write that may
// already have reached D1 is never retried automatically. A 971 block is
// never retried before it ends: the client refuses to send until then. The
// context's deadline always wins: no retry starts that could not finish
// before it.
//
// # Request budget and group commit
//
// A Budget keeps the client within Cloudflare's API limit (1200 calls per
// 5 minutes by default). Calls made with Coalesce() share D1 batch calls
// with concurrent callers; see CoalesceConfig.
package d1client
