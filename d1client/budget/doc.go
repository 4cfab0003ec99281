// Package budget decides when a call to Cloudflare's API may go: from a
// local limit (a Budget) and the account's own Ratelimit headers, kept by
// an Account that everything of one process calling the API on one
// account shares. It sends nothing itself: a client takes a call from the
// Account before sending it (Acquire, or TryTake) and hands the answer's
// headers back (Answered). d1client is such a client.
//
// Cloudflare allows 1200 API calls per 5 minutes per user, across every
// token, tool and the dashboard; going over blocks every call of the
// account for 5 minutes (HTTP 429, code 971). Every response says what is
// left to the whole account (Ratelimit: "default";r=<remaining>;t=<seconds
// to reset>, and Ratelimit-Policy: "burst";q=<quota>;w=<window>). An
// Account reads them and paces the calls of everything that shares it.
// Values past sense are bounded before any arithmetic: a reset is at most
// the policy's window (24 h without one).
//
//   - The remaining calls are spread evenly over the time to the reset,
//     less what other clients of the account (replicas, wrangler, the
//     dashboard) are seen to spend, after a burst of Budget.Burst calls.
//     Replicas share the budget this way with no coordination of their own.
//   - The local Budget (Calls per Per) is an upper bound, and the pace when
//     the headers are absent (d1local without a budget sends none).
//   - Calls of class Priority (completions, heartbeats, releases) may use
//     the whole pace, and follow it while their deadline allows, so that
//     completions arriving together share calls. One whose deadline could
//     not wait for the pace is not held to it: it goes while the account
//     has a call left, by the headers' remaining calls (this process's
//     share of them while other clients spend, so that several replicas'
//     completions do not overrun the account), the local Budget's Calls
//     per Per and a 971 block. Normal calls go at most at (1 - Budget.Reserve) of the pace,
//     so new work is turned away first, and never take the last
//     Budget.Kept() calls of a window (at least one): a completion always
//     finds a call, whatever the Budget. There is always a reserve:
//     WithReserve accepts 0.01 to 0.9, and New at least 2 calls.
//   - Acquire waits for a call's slot as long as its context allows; when
//     the deadline comes first, or less than a round trip after the slot,
//     it gives up at once with a Refusal saying when a call could go. It
//     sends no call with less than a round trip left before the deadline,
//     and none during a 971 block.
//
// Account.State shows the budget as last seen.
package budget
