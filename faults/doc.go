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
//     fenced out; with idemhttp.Tx (the suite's handler, and the orders API) the
//     business write happens once, with a direct write twice (the spec's
//     admitted hole); with heartbeats on, a slow live owner is never taken
//     over (on an injected clock the test steps past four TTLs):
//     TestSlowOwnerTakenOverAndFencedOut,
//     TestOrdersAPITakeoverCreatesOneOrder, TestHeartbeatKeepsSlowLiveOwner.
//   - The owning process killed with SIGKILL mid-handler and during round
//     trip 2 (the test binary re-executed as TestHelperProcess, pointed at
//     the parent's d1local): TestOwnerKilledWithSIGKILL.
//   - Skewed local clocks injected through Config.Clock take over early (or
//     late); with D1's clock (the default) takeover follows D1's time only:
//     TestSkewedLocalClocksHazard, TestD1ClockDecidesTakeover.
//   - A seeded randomized run of N clients x M keys through the middleware,
//     with random faults on every D1 call, slow handlers, panics, duplicates
//     and abandoned requests, and the paths where the guarantees are
//     easiest to break: handlers that flush or hijack with Tx statements queued or call
//     Tx.Add after a flush, Location bytes that are not UTF-8, requests with
//     two Idempotency-Key fields, an operator releasing keys through the
//     admin API (with and without Force, pending, stuck and completed ones)
//     and sweeping under the shortest retention validation accepts, an
//     instance whose tiny D1 budget and 971 blocks starve completions
//     between the two round trips, and side callers sending echo reads,
//     writes and multi-statement SQL into the ledger's shared batches:
//     TestRandomizedFaults. TestCheckerCatchesEachViolation shows each check
//     firing on a history that breaks it; TestRandomizedCatchesReintroducedBugs
//     puts back in each bug mutants_test.go lists, from the test side
//     (the list says how), and the checker must report it, while
//     the same run without it passes; TestRandomizedCatchesNonTransactionalVariant
//     does the same for a handler writing outside idemhttp.Tx.
//     TestRandomizedFaultsBridge runs it (12 clients x 16 keys) against the
//     bridge in real workerd D1, the same faults injected by a proxy in
//     front of it (bridge_test.go).
//   - Regression tests of the bugs this suite found in other packages:
//     TestRegression*.
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
//   - One stored completion per (principal, key, generation), and per key
//     until the operator forgets it (Admin.Release with Force) or the sweep
//     deletes it past the retention: counted from the audited
//     pending-to-completed transitions in D1's order.
//   - No 2xx for a business write that did not commit: every non-replayed
//     201 names an execution whose completion is stored and whose business
//     row exists (under idemhttp.Tx an answer from a superseded owner, whose
//     write was aborted with its batch, is a violation).
//   - Byte-identical answers: the owner's own answer and every replay carry
//     the status, Content-Type, Location and body stored for it; a replay
//     is compared with the completion that stood while it was made.
//   - One business write per stored 201, by the execution the stored
//     response names; none for a 422 or for an execution whose 201 is not
//     stored. A trigger also flags a second business row the moment it is
//     written.
//   - A generation is never granted twice for a key within MaxLease + TTL +
//     RetentionMargin (while its owner may still write), and no completion
//     is stored by an execution that began before the claim it completed.
//   - No completed row is lost or changed: only the operator's forget
//     changes one, and no row is deleted less than the retention after its
//     last update; rows planted past the retention must be swept. A monitor
//     polls for violations during the run.
//   - Innocent co-batched callers: an echo read gets its own value, and a
//     side caller's call fails only when the call itself was faulted or
//     never sent (a 971 block, the budget); multi-statement SQL is refused
//     before it is sent and never reaches D1; a side write runs at most once
//     (none when its error says nothing was committed).
//   - Every answer is one the middleware documents (400 for two key
//     fields, which never execute), and every operation a client did not
//     abandon settles.
//
// # Running
//
// The default suite (go test ./..., or go test -race ./faults/) runs a short
// seeded randomized run (16 clients x 12 keys, several hundred requests,
// about 10 s). Every run logs its seed; rerun one with
//
//	go test ./faults -run TestRandomizedFaults -v -faults.seed=SEED
//
// (or FAULTS_SEED=SEED). The long runs (rounds of fresh keys for 10
// minutes: 48 clients x 25 keys per round on d1local, 12 x 16 on the
// bridge) run only with -faults.long; make faults-long and make
// faults-long-bridge run them:
//
//	go test ./faults -run '^TestRandomizedFaults$/^long$' -v -timeout 40m -faults.long
//	go test ./faults -run '^TestRandomizedFaultsBridge$/^long$' -v -timeout 40m -faults.long
//
// and -faults.clients, -faults.keys and -faults.duration resize them. Each
// run ends its report with one SUMMARY line (backend, seed, requests,
// takeovers, faults injected by kind, violations). The seed
// fixes the workload (keys, bodies, each execution's delay and panic,
// duplicates, abandons) and the fault of every D1 call by its number; the
// goroutine interleaving is not fixed, so a rerun replays the same plan, not
// the same schedule. On a violation the test prints the seed and each
// failing key's history: its requests and answers, handler executions, audit
// events, operator actions, ledger log lines and final row.
//
// # Timing
//
// No test asserts how fast the machine is. Where a scenario needs time to
// pass, the test either steps an injected clock, or brackets what it sees
// with reads of D1's clock (a retry that ended inside the TTL must have
// found the key in progress; one that began past it must take it over),
// or leaves seconds of room for what must happen first. Every test passes
// go test -race -count=20 ./faults/ while two other processes keep both
// cores busy.
package faults
