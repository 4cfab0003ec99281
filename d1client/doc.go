// Package d1client is a Cloudflare D1 REST client that is exact about three
// things: what D1 accepts, what D1 returns, and which failures are safe to
// retry.
//
// Every call is one POST to D1's /raw endpoint, which keeps column order and
// duplicate column names. Exec takes one or more Statements, each one SQL
// statement with its parameters; several run as one batch, one transaction.
// SQL holding several statements is refused before anything is sent, and the
// number of results is checked. Results decode exactly, integers never
// through float64: see Value, Row.Scan and Meta.
//
// # Parameters
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
// A statement with more than 100 parameters or more than 100,000 bytes of
// SQL is refused before anything is sent.
//
// # Errors
//
// Every failure is an *Error that matches one sentinel error with
// errors.Is; errors.As gives its details (status, codes, message, SQLite
// code, Retry-After, whether a write may have committed):
//
//	HTTP 400, code 7500 "<msg>: SQLITE_<CODE>"    ErrSQL (and ErrConstraint for SQLITE_CONSTRAINT)
//	HTTP 404, code 7404                           ErrNoDatabase
//	403 10000, 403 7403, 400/404 7003,
//	400 6003/6111/6103, any other 401/403          ErrAuth
//	429 code 971 (global API limit), Retry-After   ErrRateLimited
//	429 otherwise (D1 overloaded)                  ErrOverloaded
//	5xx with a JSON body (500/7500 internal)       ErrTransient
//	a body that is not JSON (502/503/504 HTML)     ErrNonJSON
//	2xx with success:false, or a bad result        ErrEnvelope
//	result count differs from statement count      ErrResultCount
//	no HTTP response at all                        ErrTransport
//	other 4xx (a malformed request)                ErrRejected
//	refused before sending                         ErrInvalid
//	the request budget is spent                    ErrBudget
//
// No error, log line, printed Config or Client, or panic of this package
// shows the API token or a parameter value; a token echoed back by a server
// is replaced by "[REDACTED]".
//
// # Retries
//
// Reads, and calls marked Idempotent, are retried on transient failures
// (overload, 5xx, non-JSON, transport) with capped exponential backoff and
// jitter, honouring Retry-After up to a cap; see RetryPolicy. A statement is
// a read only when the client proves it from SQL's tokens; a write that may
// already have reached D1 is never sent again unless marked Idempotent.
// Nothing is sent during a 971 block, no retry starts that could not finish
// before the context's deadline, and no call is sent with less than a round
// trip left before it: it fails with ErrTransport, matching
// context.DeadlineExceeded, or with the earlier attempt's error when that
// one may have committed.
//
// # The API budget, group commit and the bridge
//
// Every call takes its slot from a budget.Account, shared by the clients of
// one Cloudflare account (Config.Account); calls made with Priority go first
// when calls are scarce, and a call whose slot comes too late fails at once
// with ErrBudget. Calls made with Coalesce() share D1 batch calls with
// concurrent callers (see CoalesceConfig). Config.BridgeURL, or
// D1IDEM_BRIDGE_URL, sends every call to a d1idem bridge instead, past the
// API budget. docs/guide.md and docs/bridge.md say more.
//
// # API stability
//
// The exported API (every exported name and its documented behaviour:
// encodings, error classification, retry rules) is kept compatible within
// a major version. Not covered: the text of error messages (match errors
// with errors.Is, never by text), the output of String and Format, and the
// defaults of CoalesceConfig, which may be tuned.
package d1client
