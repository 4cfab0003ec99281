package idemhttp

import (
	"crypto/sha256"
	"encoding/hex"
	"time"
)

// Event is what the middleware did with one guarded request, for
// Options.OnDecision. It carries digests of the principal and the key,
// never the values (the principal may be a bearer token).
type Event struct {
	// Outcome is the request's d1idem.outcome (docs/observability.md):
	// execute, replay, in_progress, reused, retry, key_missing, ...,
	// unprotected; "" when the handler panicked before an outcome.
	Outcome string
	// Status is the status sent; 0 when the middleware does not know it (an
	// unprotected request, a panic, a hijacked connection).
	Status int
	// Completion, for an executed request, is what became of its response:
	// stored, fenced_out, released, failed or expired
	// (d1idem.completion.result).
	Completion string
	// PrincipalSHA256 and KeySHA256 are the first 12 hex digits of the
	// SHA-256 of the principal and the key, as the logs carry them; "" when
	// there was none.
	PrincipalSHA256, KeySHA256 string
	// Generation and Takeover are the reservation's, for an executed request.
	Generation int64
	Takeover   bool
	// Duration is the time from the request's arrival at the middleware to
	// its answer.
	Duration time.Duration
}

// event is the Event of the request rt traced.
func (rt *requestTrace) event() Event {
	e := Event{Outcome: answers[rt.outcome].name, Status: rt.status, Completion: rt.completion, Duration: time.Since(rt.start)}
	if rt.principal != "" {
		e.PrincipalSHA256 = shortHash(rt.principal)
	}
	if rt.key != "" {
		e.KeySHA256 = shortHash(rt.key)
	}
	if r := rt.res; r != nil {
		e.Generation, e.Takeover = r.Generation, r.Takeover
	}
	return e
}

// shortHash is the first 12 hex digits of s's SHA-256, as idem's logs show
// a principal or a key.
func shortHash(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])[:12]
}
