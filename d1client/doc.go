// Package d1client is a Cloudflare D1 REST client that is exact about what D1
// accepts, what it returns, and which failures are safe to retry.
//
// Every call is one POST to D1's /raw endpoint, which keeps column order and
// duplicate column names. Exec takes Statements, each one SQL statement with
// its parameters; several run as one batch, one transaction. Results decode
// exactly, integers never through float64: see Value, Row.Scan and Meta.
//
// # Parameters
//
//	nil, nil pointer        -> null
//	bool                    -> 0 / 1
//	integer, |v| <= 2^53    -> JSON number
//	integer, |v| >  2^53    -> decimal string (INTEGER affinity restores it)
//	float (finite)          -> JSON number
//	string (valid UTF-8)    -> JSON string
//	json.Number             -> as written
//	[]byte                  -> refused: bind hex text, write unhex(?)
//	time.Time               -> refused: bind t.UnixMilli() or an RFC 3339 string
//
// SQL holding several statements, or over MaxParams or MaxSQLBytes, is
// refused before anything is sent.
//
// # Errors
//
// Every failure is an *Error matching one sentinel error (ErrSQL, ErrAuth,
// ErrRateLimited, ...: each says which answers it stands for) with errors.Is.
// No error, log line, printed Config or Client, or panic shows the API token
// or a parameter value; a token echoed back by a server becomes "[REDACTED]".
//
// # Retries
//
// Reads (proven from SQL's tokens) and calls marked Idempotent are retried
// on transient failures (overload, 5xx, non-JSON, transport) with capped,
// jittered exponential backoff, honouring Retry-After up to a cap; a write
// that may have reached D1 is never sent again. Nothing is sent during a 971
// block, nor with less than a round trip left before the context's deadline:
// that fails with ErrTransport, matching context.DeadlineExceeded, or with
// the earlier attempt's error when that one may have committed.
//
// # The API budget, group commit and the bridge
//
// Every call takes its slot from a budget.Account (Config.Account); Priority
// calls go first when calls are scarce, and a call whose slot comes too late
// fails at once with ErrBudget. Calls made with Coalesce() share D1 batch
// calls (see CoalesceConfig). Config.BridgeURL, or D1IDEM_BRIDGE_URL, sends
// every call to a d1idem bridge instead (docs/guide.md, docs/bridge.md).
//
// # API stability
//
// Exported names and their documented behaviour are kept compatible within a
// major version; error message texts, String and Format output, and
// CoalesceConfig's defaults are not.
package d1client
