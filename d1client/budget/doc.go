// Package budget decides when a call to Cloudflare's API may go. Cloudflare
// allows 1200 API calls per 5 minutes per user, across every token, tool
// and the dashboard; going over blocks the account for 5 minutes (HTTP 429,
// code 971). An Account, shared by everything of one process that calls
// the API on one account, paces the calls by the account's own Ratelimit
// headers and a local limit (a Budget), keeping a reserve for Priority work
// (completions). Work a call admits (a claim) owes the budget the call that
// finishes it (its completion): a Debt, for which the Account keeps the
// calls it may need, refusing the work it cannot keep them for, so that a
// completion always finds a call. It sends nothing itself: a client such as
// d1client takes a call (Acquire, TryTake or TryCall) before sending it and
// hands the answer's headers back (Answered). Account.State shows the
// budget as last seen.
package budget
