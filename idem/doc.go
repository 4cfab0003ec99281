// Package idem implements the spec's Idempotency-Key ledger on D1
// ("Idempotency-Key Ledger on D1": claim before mutate, precise
// fingerprinting, fenced takeover of stale reservations, bounded sweep) and
// the net/http middleware that puts it in front of a handler.
//
// A Go backend and a Cloudflare Worker running the spec's TypeScript can
// share one ledger table: the fingerprint bytes (Fingerprint, PathAndQuery),
// the row encoding (status strings, generation, the response_headers JSON
// object) and the time unit (milliseconds since the epoch) are the spec's.
//
// # The request path
//
//  1. The middleware validates the key, reads the body once (capped), and
//     fingerprints the request as a streaming SHA-256.
//  2. Round trip 1 (Begin): one D1 batch claims the key, or takes over a
//     stale pending reservation with the same fingerprint, and reads the
//     row. Replay, reuse and in-progress answer here.
//  3. The handler runs under a context that heartbeats keep alive and that
//     is cancelled if the lease is lost (see Config.Heartbeat).
//  4. Round trip 2 (Complete): the fenced completion, optionally with the
//     handler's own statements behind a fence guard (Tx), optionally with a
//     bounded sweep.
//  5. The response is sent.
//
// A first execution costs 2 D1 calls and a replay 1; concurrent requests
// share calls through d1client's group commit.
//
// # Principals
//
// Every key is scoped to a principal, which must be derived by the server
// from authentication (an account ID, an API key's owner) and never taken
// from anything the client controls: it is what keeps one account from
// replaying or blocking another's keys. An empty principal is an error.
//
// # Time
//
// By default every timestamp comes from D1's clock,
// CAST(unixepoch('subsec') * 1000 AS INTEGER), evaluated inside the
// statement that writes it, so all instances share one clock and a fast
// local clock can never take a reservation over early. Config.Clock injects
// a clock instead (tests, or a fleet that shares the table with Workers whose
// Date.now() is local anyway); its milliseconds are bound as parameters, as
// the spec does. The lease deadline a completion retries until, and the
// heartbeat period, use the local monotonic clock, which only measures
// durations.
//
// # Logs
//
// Fenced-out completions, lost leases and released reservations are logged
// through log/slog with the principal's SHA-256 digest (the example API's
// principal is a bearer token), the first characters of the key and its
// digest, and the generation; never a full principal.
package idem
