// Package idemhttp is the net/http middleware that puts an Idempotency-Key
// ledger (package idem) in front of a handler: New wraps the handlers of a
// ServeMux, chi or gorilla/mux. It is built on idem's exported API alone,
// as a transport for gRPC or any other protocol would be.
//
// # The request path
//
//  1. The middleware derives the principal (Options.Principal), validates
//     the key, reads the body once (capped by Options.MaxBodyBytes), and
//     fingerprints the request (idem.Fingerprint, idem.PathAndQuery).
//  2. Round trip 1 (idem.Ledger.Begin) decides: a replay, a reuse, a key in
//     progress and a ledger failure are answered here, and the handler never
//     runs. It fails closed: when the ledger cannot be reached the answer is
//     503 with Retry-After.
//  3. The handler runs under a context that heartbeats keep alive and that
//     is cancelled if the lease is lost (idem.Ledger.Hold). Its response is
//     captured, not sent.
//  4. Round trip 2 (idem.Ledger.Complete) stores the response, fenced by the
//     reservation's generation; with the statements the handler queued on
//     its Tx, in the same D1 batch behind a fence guard
//     (idem.Ledger.CompleteTx).
//  5. The response is sent, as it was stored: a response the ledger cannot
//     store (a body over idem.Config.MaxStoredBody, not UTF-8, or a status
//     outside 200-599) goes out as the spec's sentinel, status 500 with no
//     body, as every replay of it will.
//
// A handler that streams (flushes) or hijacks the connection, or panics,
// has no response to store: the reservation is released so that the
// client's retry runs it again, and a panic goes on up the stack.
//
// # Answers
//
// Every answer of the middleware's own is a JSON object whose "error"
// field is one of the Code constants; a replay carries
// Idempotent-Replayed: true (HeaderReplayed). The codes are a contract with
// clients and with other ledger users, and change only with the spec.
//
// # Logs and telemetry
//
// Released reservations, panics and ledger failures are logged through
// log/slog (Options.Logger, else the ledger's Config.Logger, else
// slog.Default()) with the reservation's idem.Reservation.LogValue: the
// principal's digest and a truncated key, never the principal. Each guarded
// request is a span, d1idem.request, and a d1idem.request.duration
// measurement by outcome, made from the ledger's Config.MeterProvider and
// TracerProvider in the ledger's instrumentation scope (idem.ScopeName);
// docs/observability.md lists their attributes.
package idemhttp
