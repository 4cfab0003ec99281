// Package bench holds the throughput benchmarks of d1idem. They are ordinary
// Go benchmarks (go test -bench . ./bench/); `make bench` runs them with the
// ledger and conformance benchmarks and prints one table with the machine
// noted (tools/benchtable).
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
//   - BenchmarkMiddlewareTelemetry: the process's CPU time per request
//     through the middleware, as above, with the OpenTelemetry
//     instrumentation on (the SDK, an in-memory metric reader, every span
//     recorded) and off (no provider), the two taking turns; the overhead
//     is the median over rounds (target: under 10 %).
//   - BenchmarkFingerprint: idem.Fingerprint against raw crypto/sha256 over
//     1 MiB.
//   - BenchmarkSweepBatch: one sweep batch (20 rows) on a table of 10k rows
//     and of 1M rows, wall time and D1's own duration.
//
// And the measurements of the API budget:
//
//   - BenchmarkOpenLoop: the full middleware, served over loopback HTTP,
//     its ledger on a d1client with the default budget (1200 calls per
//     300 s, not scaled), under open-loop load: first executions with 1 KB
//     bodies started on a fixed schedule whatever the answers, 20 ms per D1
//     call. Answered, budget 503s, other errors, p50/p99, D1 calls per
//     second, and completions lost (handlers executed minus completions
//     stored, counted in D1). 150 req/s for 60 s; with -bench.long (make
//     bench-budget) 20, 150 and 400 req/s for 600 s each. Then overload:
//     twice the ceiling of calls of 512 statements (1,360 req/s) for 60 s,
//     goodput, the answered p50/p99 and the time to a refusal (503
//     idempotency_ledger_busy).
//   - BenchmarkReplicas (-bench.long only; TestReplicasSmoke runs it for two
//     seconds in go test): four replica processes of that service, the test
//     binary re-executed, against one d1local, with the 971 answers d1local
//     gave and the most calls it saw in any 300 s window.
//   - BenchmarkVsSpec: a first execution through the ledger side by side
//     with the spec's literal statement sequence (internal/specseq) at
//     concurrency 1, 8, 64 and 256, with 20 ms and 50 ms per D1 call, no
//     budget: p50, p99, their ratios with 95 % bootstrap intervals (an
//     interval that holds 1: the run cannot tell the two apart), D1 calls
//     per request, over rounds of each taken in turn (three at concurrency
//     1 and 8, twelve at 64 and 256, whose rounds are short).
//     TestSideBySideSmoke runs both sides briefly in go test.
//   - BenchmarkCallsVsLatency: BenchmarkVsSpec's concurrency-256, 50 ms
//     cell with group commit's calls bounded smaller (MaxStatements x
//     MaxInFlight: 128x8, 64x16, 32x64): the p50 ratio each buys and the D1
//     calls per request it spends, beside the default's.
//   - BenchmarkClientExec: allocations per D1 call of one d1client Exec,
//     d1local's answer replayed (the client's own) and with d1local in
//     process.
//
// And those of the bridge:
//
//   - BenchmarkBridgeVsREST: the full middleware under closed-loop load
//     (first executions, 1 KB bodies, 1, 64 and 256 clients), side by side
//     in one run, through the bridge on local workerd (its client configured
//     by its bridge URL alone: no budget) and through the REST shape
//     (d1local, 20 ms per call) at the default budget's rate with its
//     window scaled 60×: requests per second, p50/p99, D1 calls per
//     request, and at concurrency 1 the latency the middleware adds against
//     a bare bridge call. TestBridgeVsRESTSmoke runs it briefly in go test.
//     (BenchmarkBridgeOverhead, in conformance/, measures the bridge's own
//     cost against raw binding calls.)
//
// Flags: -bench.long runs the long forms, -bench.duration sets the length
// of each open-loop run (60 s, or 600 s with -bench.long), and -bench.rates
// runs BenchmarkOpenLoop at the rates given instead (no overload run).
// -bench.vsspec-inflight N runs BenchmarkVsSpec with d1idem's group commit
// never waiting and up to N calls in flight (Coalesce.Window -1,
// MaxInFlight N): what spending calls buys in latency.
//
// Every d1client these benchmarks build for the budget, replica and
// side-by-side runs comes from newClient, and d1local's configuration from
// localConfig: the places to change for a new budget API, and to have
// d1local play the account's budget in the replica runs.
package bench
