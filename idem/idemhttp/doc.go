// Package idemhttp is the net/http middleware that puts an Idempotency-Key
// ledger (package idem) in front of a handler. It is built on idem's
// exported API alone, as a transport for any other protocol would be.
//
// For a guarded request the middleware derives the principal, validates the
// key, reads the body once (capped by Options.MaxBodyBytes) and
// fingerprints the request. Round trip 1 (idem.Ledger.Begin) then decides:
// a replay, a reuse, a key in progress and a ledger failure are answered
// without running the handler; it fails closed, with 503 and Retry-After,
// when the ledger cannot be reached. Otherwise the handler runs under
// idem.Ledger.Hold, its response captured, not sent; round trip 2
// (idem.Ledger.Complete, or CompleteTx with the statements of its Tx)
// stores it, and it is sent as stored: one the ledger cannot store goes
// out as the spec's sentinel, status 500 with no body, as every replay of
// it will. A handler that streams, hijacks or panics has no response to
// store: the reservation is released so that a retry runs it again.
//
// The middleware's own answers are JSON objects whose "error" field is one
// of the Code constants; a replay carries Idempotent-Replayed: true. Logs go
// to the ledger's Config.Logger (else slog.Default()) and never carry the
// principal; each guarded request is a d1idem.request span and a
// d1idem.request.duration measurement by outcome, from the ledger's
// providers (docs/observability.md).
package idemhttp
