// Package d1client is a Cloudflare D1 REST client that is exact about three
// things: what D1 accepts, what D1 returns, and which failures are safe to
// retry.
//
// Every call is one POST to D1's /raw endpoint, whose ordered columns keep
// duplicate names and column order, made with net/http (Config.HTTPClient).
// The package used to send it through cloudflare-go's d1 package; it no
// longer does, because that request path cost more than half of a call's
// allocations while this package captured the raw response and classified
// every shape itself anyway (and had cloudflare-go's retries, which repeat
// writes, turned off). Request bodies are JSON without HTML escaping, and a
// response is decoded in one pass, its rows straight into Values.
//
// # Statements and batches
//
// Exec takes one or more Statements, each one SQL statement with its
// parameters. One travels as {"sql","params"}; several travel as
// {"batch":[...]}, which D1 runs as one transaction. SQL holding several
// statements ("SELECT 1; SELECT 2") is refused before anything is sent. The
// number of results is checked against the number of statements. Results
// decode from the raw JSON bytes, never through float64 for integers: see
// Value, Row.Scan and Meta.
//
// # Parameters
//
// Parameters are encoded deliberately:
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
// No error, log line, formatted or JSON-encoded Config or Client, or panic
// of this package shows the API token; parameter values are left out of
// errors too. A token echoed back by a server or a proxy is replaced by
// "[REDACTED]" in errors: a token of 16 characters or more wherever it
// occurs, a shorter one only where it stands as a whole word (a token
// "local" leaves "localhost" alone). The error's cause stays reachable by
// errors.Is.
//
// # Retries
//
// Reads, and calls marked Idempotent, are retried on transient failures
// (overload, 5xx, non-JSON, transport) with capped exponential backoff and
// jitter, honouring Retry-After up to a cap; see RetryPolicy. A statement is
// a read only when the client proves it from SQL's tokens (a SELECT, a
// VALUES, a WITH whose main statement is a SELECT, an EXPLAIN, a PRAGMA
// that reads); anything else is a write, and a write that may already have
// reached D1 is never sent again unless marked Idempotent. Nothing is sent
// during a 971 block. No retry starts that could not finish before the
// context's deadline.
//
// No call is sent, alone or in a shared batch, with less than a round trip
// left before its context's deadline (the Account's smoothed time from a
// call's send to its answer): cut off on its way back, a write's outcome
// would be unknown. Such a call fails at once with ErrTransport, matching
// context.DeadlineExceeded, not Ambiguous, its message saying it was not
// sent. When an earlier attempt of the call may have committed, that
// attempt's error is returned instead.
//
// # The API budget
//
// Cloudflare allows 1200 API calls per 5 minutes per user, across every
// token, tool and the dashboard; going over blocks every call of the
// account for 5 minutes (HTTP 429, code 971). Every call takes its slot
// from a budget.Account (package github.com/d1idem/d1idem/d1client/budget),
// which reads the account's Ratelimit headers from every answer and paces
// the calls of every Client that shares it: new work at an even pace, and
// calls made with Priority (completions, heartbeats, releases) as long as
// the account has a call left. A call whose deadline comes before its
// slot, or less than a round trip after it, fails at once with ErrBudget,
// its RetryAfter saying when a call could go; nothing is sent during a 971
// block (ErrRateLimited), and a Retry-After is read as an hour at most.
// Config.Budget sets the local limit; clients of several databases on one
// account should share one Account (Config.Account), whose State shows the
// budget as last seen. Package budget says how the pace is kept.
//
// # Group commit
//
// Calls made with Coalesce() share D1 batch calls with concurrent callers:
// the statements of callers answered by one call ride in the next if they
// come straight back, a parallel call starts only when waiting would cost
// more than a round trip, and when calls are scarce each carries more,
// priority statements first. See CoalesceConfig.
//
// # The bridge
//
// A d1idem bridge (bridge/ in this module, docs/bridge.md) is a Worker that
// serves the same REST endpoints on the database's D1 binding, past the
// account's API budget. Config.BridgeURL, or the environment variable
// D1IDEM_BRIDGE_URL, names one with its secret, https://:SECRET@HOST: it
// stands for the base URL and the API token (which is then never sent),
// and the zero Budget then means no budget; group commit works as before.
// Client.Bridge reports it. Nothing else changes: a deployment moves from
// the API to the bridge by setting that one variable.
//
// # API stability
//
// The exported API (every exported name and its documented behaviour:
// encodings, error classification, retry rules) is kept compatible within
// a major version. Not covered: the text of error messages (match errors
// with errors.Is, never by text), the output of String and Format, and the
// defaults of CoalesceConfig, which may be tuned.
package d1client
