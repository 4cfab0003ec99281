// Package idem implements an Idempotency-Key ledger on D1
// (docs/contract.md states the contract it keeps: claim before mutate, precise
// fingerprinting, fenced takeover of stale reservations, bounded sweep), and
// the administrative API that the d1idem CLI is built on. A transport puts
// the ledger in front of a handler through the exported API alone: package
// idemhttp is the net/http middleware.
//
// A Go backend and a Cloudflare Worker running the spec's TypeScript can
// share one ledger table: the fingerprint bytes (Fingerprint, PathAndQuery,
// HeaderValue), the row encoding (status strings, generation, the
// response_headers JSON object) and the time unit (milliseconds since the
// epoch) are the contract's, and header values are stored as a Worker stores
// them.
//
// # The request path
//
//  1. The transport validates the key (ValidKey) and the principal
//     (ValidPrincipal), and fingerprints the request as a streaming SHA-256
//     (Fingerprint).
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
// A first execution costs 2 D1 calls and a replay 1; concurrent requests
// share calls through d1client's group commit.
//
// # Principals
//
// Every key is scoped to a principal, which must be derived by the server
// from authentication (an account ID, an API key's owner) and never taken
// from anything the client controls: it is what keeps one account from
// replaying or blocking another's keys.
//
// # Time
//
// By default every timestamp comes from D1's clock, evaluated inside the
// statement that writes it, so all instances share one clock. Config.Clock
// injects a clock instead, bound as a parameter (docs/contract.md#8-time). Deadlines
// and heartbeat periods use the local monotonic clock, which only measures
// durations.
//
// # Fencing
//
// A takeover or a release moves a key's generation on, and every write of
// an owner is fenced by its generation, so a superseded owner's writes match
// nothing. Rows are never deleted except by the sweep (and on a sharded
// ledger by the move of a stale reservation to its principal's new
// database, after which the old database never holds the key again), and
// the retention (at least MaxLease + TTL + RetentionMargin) outlasts every
// owner's writes, which stop at Retention - TTL - RetentionMargin/2 after
// its claim (ErrReservationExpired): a generation is never reused while its
// owner may still write.
//
// # Many databases
//
// NewSharded makes a Ledger that spans several D1 databases (Home), past one
// database's 10 GB and single writer. Each principal's keys live in one of
// them, chosen by rendezvous hashing (Rendezvous) over the databases of the
// ring, a versioned list recorded in every one of them as a reserved row
// that no request can address (principal "", key "d1idem:ring"), beside
// the home ID the database joined the ring under (key "d1idem:home").
// Every claim carries a guard that aborts it unless the database is the
// home the ledger takes it for and has recorded no newer ring, nor another
// ring of the same epoch: a replica never claims by a ring a database has
// moved past (it reads the newer ring and routes the request again), and
// conflicting rings or mismatched homes are refused, never served. The Ledger, its
// transports and the administrative API work unchanged; a Reservation remembers its
// database, and Admin's reads merge the databases.
//
// Admin.Grow adds databases in two phases. While the ring is Moving, a
// moved principal's old home is read first: keys there are answered from
// there, new keys go to the new home, and the old home refuses claims for
// it from replicas that still route by the older ring. Two retention
// windows later, Admin.AdvanceRing makes the ring Stable and the old homes
// are no longer read. docs/sharding.md gives the procedure, the cost and
// the proof that the ledger stays exactly-once while replicas learn each
// version at different moments.
//
// # Logs
//
// Fenced-out completions, lost leases and expired reservations are logged
// through log/slog (slog.Default() unless a Logger is configured) with the
// reservation's LogValue: the principal's SHA-256 digest, the first
// characters of the key and its digest, and the generation; never a full
// principal. A transport logs what it does with a reservation (a release,
// a ledger failure) the same way, to the same Logger unless given its own.
//
// # API stability
//
// Until d1idem's first tagged release the exported API may change; after
// it, the exported names of this package follow semantic versioning. The
// stored row format (docs/contract.md#1-schema) is a contract with other
// ledger users and changes only with the spec.
package idem
