// Package idemhttp is the net/http middleware that puts an Idempotency-Key
// ledger (package idem) in front of a handler, built on idem's exported API
// alone.
//
// Round trip 1 (idem.Ledger.Begin) answers a replay, a reuse, a key in
// progress or a ledger failure (failing closed) without running the handler.
// Otherwise the handler runs under idem.Ledger.Hold; its response is
// captured, stored by round trip 2 with the statements of its Tx, and sent
// as stored. A handler that streams, hijacks or panics stores nothing: the
// reservation is released so that a retry runs it again.
//
// The middleware's own answers are JSON objects whose "error" is one of the
// Code constants (docs/contract.md). Logs go to the ledger's Config.Logger
// and never carry the principal; metrics and spans are in
// docs/observability.md.
package idemhttp
