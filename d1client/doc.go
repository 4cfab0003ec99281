// Package d1client is a Cloudflare D1 REST client that is exact about what D1
// accepts, what it returns, and which failures are safe to retry.
//
// Every call is one POST to D1's /raw endpoint, which keeps column order and
// duplicate column names. Exec runs Statements, each one SQL statement with
// its parameters, as one batch, one transaction. Results decode exactly,
// integers never through float64: see Value, Row.Scan and Meta.
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
// # Errors and retries
//
// Every failure is an *Error matching one sentinel (ErrSQL, ErrAuth, ...)
// with errors.Is. No error, log line, printed Config or Client, or panic
// shows the API token or a parameter value.
//
// Reads (proven from the SQL) and Idempotent calls are retried on overload,
// 5xx, non-JSON and transport failures, with jittered exponential backoff
// and Retry-After; a write that may have reached D1 is never sent again.
// Nothing is sent during a 971 block, nor with less than a round trip left
// before the context's deadline (ErrTransport, matching
// context.DeadlineExceeded, or the earlier attempt's error if that one may
// have committed).
//
// # Budget, group commit and the bridge
//
// Every call takes its slot from a budget.Account; Priority calls go first,
// and a call whose slot comes too late fails at once with ErrBudget.
// Coalesce() calls share D1 batch calls (CoalesceConfig). Config.BridgeURL
// sends every call to a d1idem bridge (docs/bridge.md).
//
// Exported names and their documented behaviour are stable within a major
// version; error texts, String and Format output and CoalesceConfig's
// defaults are not.
package d1client
