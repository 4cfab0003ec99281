// Package idem implements an Idempotency-Key ledger on D1 and the
// administrative API the d1idem CLI is built on; docs/contract.md states the
// contract it keeps, and a Worker running the spec can share its table.
// Package idemhttp puts it in front of a net/http handler.
//
// A request runs in two D1 round trips: Ledger.Begin claims the key (or takes
// over a stale reservation with the same fingerprint) and reads the row;
// the mutation runs under Ledger.Hold, whose context is cancelled if the
// lease is lost; Ledger.Complete (or CompleteTx, with the caller's own
// statements) stores the response, fenced by the reservation's generation.
//
// Every key is scoped to a principal, which the server must derive from
// authentication, never from anything the client controls. NewSharded
// spans several databases (docs/sharding.md). Until the first tagged release
// the exported API may change; the stored row format changes only with the
// spec.
package idem
