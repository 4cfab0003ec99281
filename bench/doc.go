// Package bench holds the throughput benchmarks of d1idem. They are ordinary
// Go benchmarks (go test -bench . ./bench/); `make bench` runs them with the
// ledger and conformance benchmarks and prints one table with the machine
// noted (internal/benchtable).
//
// What they measure, against d1local over real HTTP on loopback:
//
//   - BenchmarkCallsPerRequest: D1 calls per request at concurrency 1, 8, 64
//     and 256, for first executions and for replays, with 20 ms injected per
//     D1 call (a REST round trip), through group commit.
//   - BenchmarkSustainedThroughput: idempotent requests per second (first
//     executions) under the default budget's rate, 1200 calls per 300 s,
//     with its window scaled down to 5 s (20 calls) so that the run measures
//     the sustained regime rather than the initial burst.
//   - BenchmarkAddedLatency: p50 and p99 of the time the ledger adds to a
//     request (round trips 1 and 2; a replay is round trip 1 alone), with
//     50 ms injected per D1 call, for our request path and for the spec's
//     literal statement sequence (claim; lookup; takeover; completion).
//   - BenchmarkMiddlewareOverhead: CPU and allocations of a bare handler and
//     of the same handler behind the middleware, for a 1 KB body, with
//     d1local reached in process (no sockets); the middleware figures
//     include the D1 work of d1local's SQLite.
//   - BenchmarkFingerprint: idem.Fingerprint against raw crypto/sha256 over
//     1 MiB.
//   - BenchmarkSweepBatch: one sweep batch (20 rows) on a table of 10k rows
//     and of 1M rows, wall time and D1's own duration.
package bench
