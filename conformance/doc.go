// Package conformance holds d1idem's D1 conformance suite: one set of tests,
// run through d1client against two backends, that pins down the D1
// behaviour the idempotency ledger relies on.
//
// The backends (see internal/d1test) are:
//
//   - d1local, this module's D1-compatible REST server on SQLite, in process;
//   - workerd, Cloudflare's real local D1: workerd's own D1 binding and
//     Miniflare's D1 database object on workerd's SQLite, behind the bridge
//     (../bridge/worker.js, the product's Worker that serves the D1 REST
//     API's shapes on D1 bindings), with its secret checked on every call,
//     started from Node by server.mjs with the npm packages pinned in
//     package.json. harness.js runs beside it: the spec's
//     Worker code, copied verbatim into spec.mjs.
//
// Every test runs the same assertions on both, so d1local is held to what
// the real thing does. Where the two legitimately differ, the test asserts
// the difference explicitly and says why.
//
// What is covered: the spec's five ledger statements, verbatim (claim,
// lookup, fenced takeover, fenced completion, the bounded rowid-subquery
// sweep); batch atomicity, DDL included; the error shapes (syntax errors,
// constraint violations, BEGIN); parameter typing (JSON numbers bind as
// REAL, the TEXT-affinity "42.0" gotcha, integers beyond 2^53); the schema as
// PRAGMA table_info and index_list report it; the /raw and /query shapes
// (zero-row column names, duplicate column names, envelopes, several
// statements in one "sql"); the meta fields a client acts on (and the
// billing counters, which differ); and, on workerd only, the spec's
// computeFingerprint served by the harness Worker, and the spec's own
// handleIdempotentMutation sharing one ledger with a Go backend on the
// bridge (TestSpecWorkerSharesLedgerThroughBridge). BenchmarkClaimLookup
// measures a claim+lookup batch on both backends, sequential and 16-way
// concurrent; BenchmarkBridgeOverhead the bridge's statements per second
// against raw D1 binding calls from a Worker.
//
// TestWrangler runs the wrangler pinned in package.json against a d1local
// server, as a user points it at one with CLOUDFLARE_API_BASE_URL: d1
// execute --remote (--command, and --file through the import flow), d1
// info, d1 list, d1 export --remote, d1 create, d1 delete, d1 migrations
// apply --remote, a wrong token and no account ID.
//
// Running it: `make test`, or `npm ci` in this directory once and then
// `go test ./conformance/`. Without Node or node_modules the workerd leg and
// the wrangler tests are skipped, except in CI (CI set), where they fail.
package conformance
