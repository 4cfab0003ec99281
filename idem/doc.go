// Package idem implements an Idempotency-Key ledger on D1, keeping
// docs/contract.md (a Worker running the spec can share its table), and the
// administrative API the d1idem CLI is built on. See idemhttp for net/http.
//
// A request takes two D1 round trips: Ledger.Begin claims the key; the
// mutation runs under Ledger.Hold, whose context is cancelled if the lease is
// lost; Ledger.Complete (or CompleteTx) stores the response, fenced by the
// reservation's generation.
//
// Every key is scoped to a principal, which the server must derive from
// authentication, never from the client. NewSharded spans several databases
// (docs/sharding.md). Until the first tagged release the exported API may
// change; the stored row format changes only with the spec.
package idem
