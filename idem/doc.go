// Package idem implements an Idempotency-Key ledger on D1, and the
// administrative API that the d1idem CLI is built on. docs/contract.md
// states the contract it keeps: claim before mutate, precise fingerprinting,
// fenced takeover of stale reservations, bounded sweep. A transport puts the
// ledger in front of a handler through the exported API alone: package
// idemhttp is the net/http middleware.
//
// A Go backend and a Cloudflare Worker running the spec's TypeScript can
// share one ledger table: the fingerprint bytes, the row encoding and the
// time unit are the contract's.
//
// # The request path
//
//  1. The transport validates the key (ValidKey) and the principal
//     (ValidPrincipal), and fingerprints the request (Fingerprint).
//  2. Round trip 1 (Ledger.Begin): one D1 batch claims the key, or takes
//     over a stale pending reservation with the same fingerprint, and reads
//     the row. Replay, reuse and in-progress answer here.
//  3. The mutation runs under a context that heartbeats keep alive and that
//     is cancelled if the lease is lost (Ledger.Hold).
//  4. Round trip 2 (Ledger.Complete): the fenced completion, optionally with
//     the caller's own statements behind a fence guard (Ledger.CompleteTx),
//     optionally with a bounded sweep.
//  5. The transport sends Completion.Response: the response as stored.
//
// # Principals
//
// Every key is scoped to a principal, which must be derived by the server
// from authentication (an account ID, an API key's owner) and never taken
// from anything the client controls: it is what keeps one account from
// replaying or blocking another's keys.
//
// # Guarantees
//
// Timestamps come from D1's clock unless Config.Clock injects one
// (docs/contract.md#8-time). A takeover or a release moves a key's
// generation on, and every write of an owner is fenced by its generation, so
// a superseded owner's writes match nothing (docs/contract.md#5-fencing).
// Rows are deleted only by the sweep, and the retention outlasts every
// owner's writes (see ErrReservationExpired), so a generation is never
// reused while its owner may still write.
//
// NewSharded spans several D1 databases, each principal's keys in the one
// the recorded ring routes it to; docs/sharding.md gives the routing, the
// procedure to grow and the proof that the ledger stays exactly-once.
//
// Logs go through log/slog and identify a reservation by its LogValue,
// never by a full principal.
//
// # API stability
//
// Until d1idem's first tagged release the exported API may change; after
// it, the exported names of this package follow semantic versioning. The
// stored row format (docs/contract.md#1-schema) is a contract with other
// ledger users and changes only with the spec.
package idem
