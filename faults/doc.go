// Package faults is d1idem's fault-injection suite. It has no API: its
// tests drive the ledger (idem), the middleware, the example orders API and
// d1client against d1local with injected D1 failures, real subprocesses
// killed with SIGKILL, skewed clocks and a seeded randomized workload, and
// check the ledger's guarantees on what clients saw and what D1 holds.
//
// # Scenarios
//
//   - Lost responses after the commit (d1local Fault{LoseResponse}), aimed
//     by a Config.Faults hook at the claim (round trip 1) or the completion
//     (round trip 2): TestLostResponseOnClaim, TestLostResponseOnCompletion.
//   - D1's 500/7500, 429/971, 429/7500 (overloaded) and HTML 502 on both
//     round trips, before and after the commit: TestD1ErrorsOnBothRoundTrips.
//   - A handler that outlives the TTL with heartbeats off is taken over and
//     fenced out; with idem.Tx (the suite's handler, and the orders API) the
//     business write happens once, with a direct write twice (the spec's
//     admitted hole); with heartbeats on, a slow live owner is never taken
//     over: TestSlowOwnerTakenOverAndFencedOut,
//     TestOrdersAPITakeoverCreatesOneOrder, TestHeartbeatKeepsSlowLiveOwner.
//   - The owning process killed with SIGKILL mid-handler and during round
//     trip 2 (the test binary re-executed as TestHelperProcess, pointed at
//     the parent's d1local): TestOwnerKilledWithSIGKILL.
//   - Skewed local clocks injected through Config.Clock take over early (or
//     late); with D1's clock (the default) takeover follows D1's time only:
//     TestSkewedLocalClocksHazard, TestD1ClockDecidesTakeover.
//   - A seeded randomized run of N clients x M keys through the middleware,
//     with random faults on every D1 call, slow handlers, panics, duplicates
//     and abandoned requests: TestRandomizedFaults. TestCheckerCatchesEachViolation
//     and TestRandomizedCatchesNonTransactionalVariant show that its checks
//     are not vacuous. TestRandomizedFaultsBridge runs it (12 clients x 16
//     keys) against the bridge in real workerd D1, the same faults injected
//     by a proxy in front of it (bridge_test.go).
//   - Regression tests for the bugs this suite found in other packages, now
//     fixed: TestRegression*.
//
// # How the suite observes
//
// Next to the ledger's table, each test database holds a business table
// (deliberately without a unique key, so a double write shows) and audit
// triggers that record, inside the transaction that makes them, every
// claim, takeover, pending-to-completed transition (with the stored
// response), deletion and business write, stamped with D1's clock. The
// triggers only add rows to audit tables; the ledger's statements see and
// return what they would without them. The suite's own reads carry a SQL
// comment marker that the fault hook never faults.
//
// # Invariants of the randomized run
//
//   - At most one stored completion per (principal, key, generation), and
//     per key: counted from the audited pending-to-completed transitions.
//   - Every replay (Idempotent-Replayed: true) is byte-identical in status,
//     Content-Type, Location and body to the stored response and to the
//     first non-replayed response of the key. Non-replayed answers sent by
//     a superseded owner (whose execution is not the stored one) are counted
//     apart: the spec admits them for a plain completion, but under idem.Tx
//     a superseded 201 describes a write that was aborted, and is a
//     violation. So is a completion stored by an execution that began before
//     the claim it completed (a superseded owner whose generation came round
//     again).
//   - Under transactional completion the business write happens exactly
//     once: a key completed with 201 has exactly one business row, written
//     by the execution its stored response names; a key completed with 422
//     or never completed has none. A trigger also flags a second business
//     row the moment it is written, and a monitor polls for it during the
//     run.
//   - No row inside retention (24 h; sweeps run every 500 ms) is lost: every
//     audited completion is still the key's row at the end, response intact,
//     and no completed row was ever updated or deleted.
//   - Every answer is one the middleware documents, and every operation a
//     client did not abandon settles.
//
// # Running
//
// The default suite (go test ./..., or go test -race ./faults/) runs a short
// seeded randomized run (16 clients x 12 keys, a few hundred requests,
// well under 30 s). Every run logs its seed; rerun one with
//
//	go test ./faults -run TestRandomizedFaults -v -faults.seed=SEED
//
// (or FAULTS_SEED=SEED). The long run (48 clients x 25 keys per round,
// rounds of fresh keys for 2 minutes) runs only with -faults.long:
//
//	go test ./faults -run TestRandomizedFaults/long -v -timeout 30m -faults.long
//
// and -faults.clients, -faults.keys and -faults.duration resize it. The seed
// fixes the workload (keys, bodies, each execution's delay and panic,
// duplicates, abandons) and the fault of every D1 call by its number; the
// goroutine interleaving is not fixed, so a rerun replays the same plan, not
// the same schedule. On a violation the test prints the seed and each
// failing key's history: its requests and answers, handler executions, audit
// events, ledger log lines and final row.
package faults
