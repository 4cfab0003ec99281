// Package idemclient is the client half of the Idempotency-Key protocol: an
// http.RoundTripper that makes a key, keeps it across retries, and waits as
// the server says. It works with d1idem's middleware (package
// idem/idemhttp), with a Cloudflare Worker running the spec's code, and
// with other APIs of the same shape, such as Stripe's. It imports only the
// standard library.
//
//	client := &http.Client{Transport: &idemclient.Transport{}}
//	res, err := client.Post(url, "application/json", strings.NewReader(body))
//
// # Keys
//
// A request of a guarded method (POST, PUT, PATCH and DELETE unless
// Transport.Methods says otherwise) that has no Idempotency-Key gets one
// from NewKey: 128 random bits as 32 hex digits. A request that has one
// keeps it. Every retry of the request sends the same key, so the server
// runs it at most once and answers each retry with its first answer.
// Requests of other methods go to the base transport untouched: no key, no
// retry.
//
// # Retries
//
// The Transport classifies each answer (see Class) and asks its Policy:
//
//   - a network error, 429 and 503 (d1idem's unavailable ledger or spent
//     API budget, which ran nothing): retried, no sooner than Retry-After;
//   - 409 idempotency_key_in_progress (the first request still runs):
//     retried no sooner than the body's retry_after_ms (more precise than
//     Retry-After's whole seconds), with a backoff that grows while the
//     answer lasts, so that a short hint never makes a tight loop, and
//     long enough by default (Policy.MaxElapsed) for a retry to take over
//     the key of a first request whose server died;
//   - 409 idempotency_key_retry (the key's row vanished): retried, at once
//     when it answers the first attempt;
//   - other 5xx: retried only with Policy.RetryServerErrors, except d1idem's
//     500s that a retry cannot change (idempotency_mutation_not_committed,
//     idempotency_record_unreadable, idempotency_principal_invalid);
//   - 409 or 422 idempotency_key_reused: never retried; the request fails
//     with a *KeyReusedError;
//   - a replay (Idempotent-Replayed: true), a success, and every other
//     answer: returned as it is.
//
// Waits grow exponentially with jitter (Policy.Wait) and end with the
// request's context. A request whose body cannot be sent again (a Body but
// no GetBody; http.NewRequest sets GetBody for the usual readers) is sent
// once. The bodies of answers retried are drained and closed. (Below the
// Transport, net/http's own transport may send a request once more on a
// keep-alive connection the server had closed, as it does for any request
// with an Idempotency-Key: the same key, so that is safe too; Report does
// not count it.)
//
// # Giving up
//
// When no further attempt can be made (Policy.MaxAttempts or MaxElapsed
// reached, the context's deadline too close, the context cancelled, a body
// that cannot be replayed), the request fails with an
// *UnknownOutcomeError: the server may or may not have run it. It carries
// the key. Keep it, and send the request again later with that key in its
// Idempotency-Key header: the server runs it if it never did, or replays
// its first answer. A new key could run it twice.
//
// # What it tells
//
// The answer's Request is the last attempt, with its key in its header.
// WithReport puts a *Report in the request's context, which the Transport
// fills in: the key, the number of attempts, whether the answer was a
// replay, the time spent waiting.
//
// # Other transports
//
// Policy holds the rules without HTTP: another transport (a gRPC
// interceptor) classifies its own answers into an Outcome and asks
// Policy.Wait, and returns the same errors.
package idemclient
