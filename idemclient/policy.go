package idemclient

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"time"
)

// Class is what one attempt came to, as far as retrying goes. A transport
// classifies its answers (Transport does for HTTP) and Policy decides.
type Class uint8

const (
	// Final is an answer to hand to the caller: a success, a replay, or
	// an error that a retry of the same request would not change (most
	// 4xx, and the 500s d1idem says are final).
	Final Class = iota
	// Unavailable is no answer (a network error) or an answer saying the
	// server could not take the request now (429, 503): retried, no sooner
	// than the server's hint.
	Unavailable
	// ServerError is a 5xx other than 503: retried only when
	// Policy.RetryServerErrors is set.
	ServerError
	// InProgress is the answer that the key's first request is still
	// running (409 idempotency_key_in_progress): retried no sooner than the
	// server's hint, backing off while it lasts.
	InProgress
	// RetryNow is the server's request to retry at once (409
	// idempotency_key_retry: the key's row vanished under the request).
	RetryNow
	// Reused is the answer that the key was used for a different request
	// (idempotency_key_reused): never retried.
	Reused
)

var classNames = [...]string{Final: "final", Unavailable: "unavailable", ServerError: "server error",
	InProgress: "in progress", RetryNow: "retry now", Reused: "reused"}

// String returns the class's name, such as "in progress".
func (c Class) String() string {
	if int(c) < len(classNames) {
		return classNames[c]
	}
	return fmt.Sprintf("Class(%d)", uint8(c))
}

// Outcome is one attempt's result, classified.
type Outcome struct {
	Class Class
	// RetryAfter is the server's hint of when to retry, 0 if it gave none.
	// Over HTTP it is the body's retry_after_ms on an in-progress answer,
	// else the Retry-After header.
	RetryAfter time.Duration
}

// Defaults of Policy.
const (
	DefaultMaxElapsed     = time.Minute
	DefaultInitialBackoff = 250 * time.Millisecond
	DefaultMaxBackoff     = 10 * time.Second
)

// Errors Policy.Wait returns when no attempt should follow; an
// *UnknownOutcomeError wraps them.
var (
	ErrNotRetried  = errors.New("idemclient: this outcome is not retried")
	ErrMaxAttempts = errors.New("idemclient: Policy.MaxAttempts attempts made")
	ErrMaxElapsed  = errors.New("idemclient: the next attempt would start after Policy.MaxElapsed")
)

// Policy is when to retry a request that carries an idempotency key: the
// rules shared by every client transport of this module. With the key kept,
// a retry is always safe (the server runs the request once and replays its
// answer); the rules decide whether one can succeed, and when to try.
//
// The zero value of every field means its default.
type Policy struct {
	// MaxAttempts bounds the attempts of one request, the first included;
	// 0 means no bound but time's.
	MaxAttempts int
	// MaxElapsed bounds the time from the start of the first attempt to the
	// start of the last; default DefaultMaxElapsed (one minute, twice the
	// spec's pending TTL, so that a retry can outlast a dead first owner and
	// take its key over); negative: no bound but the context's deadline and
	// MaxAttempts. The request's context deadline bounds it too.
	MaxElapsed time.Duration
	// InitialBackoff is the backoff after the first attempt; it doubles
	// after each further attempt up to MaxBackoff. Defaults
	// DefaultInitialBackoff (250 ms) and DefaultMaxBackoff (10 s).
	InitialBackoff time.Duration
	MaxBackoff     time.Duration
	// RetryServerErrors retries ServerError outcomes: over HTTP, the 5xx
	// answers other than 503 (always retried), but for the 500s d1idem says
	// a retry cannot change (CodeMutationAbandoned, CodeRecordUnreadable,
	// CodePrincipalInvalid, CodeLedgerMisconfigured), which are Final. A 500 the server stored as the
	// request's answer comes back as a replay, which is Final too.
	RetryServerErrors bool
}

// Validate reports the first invalid field of p, by name.
func (p Policy) Validate() error {
	switch {
	case p.MaxAttempts < 0:
		return fmt.Errorf("idemclient: Policy.MaxAttempts %d is out of range: use 0 (no bound) or more", p.MaxAttempts)
	case p.InitialBackoff < 0:
		return fmt.Errorf("idemclient: Policy.InitialBackoff %v is out of range: use 0 (the default, %v) or more", p.InitialBackoff, DefaultInitialBackoff)
	case p.MaxBackoff < 0 || p.MaxBackoff > 0 && p.MaxBackoff < p.withDefaults().InitialBackoff:
		return fmt.Errorf("idemclient: Policy.MaxBackoff %v is out of range: use 0 (the default, %v) or at least InitialBackoff", p.MaxBackoff, DefaultMaxBackoff)
	}
	return nil
}

// withDefaults fills in the fields left zero.
func (p Policy) withDefaults() Policy {
	if p.MaxElapsed == 0 {
		p.MaxElapsed = DefaultMaxElapsed
	}
	if p.InitialBackoff == 0 {
		p.InitialBackoff = DefaultInitialBackoff
	}
	if p.MaxBackoff == 0 {
		p.MaxBackoff = max(DefaultMaxBackoff, p.InitialBackoff)
	}
	return p
}

// Retries reports whether p retries outcomes of class c at all.
func (p Policy) Retries(c Class) bool {
	switch c {
	case Unavailable, InProgress, RetryNow:
		return true
	case ServerError:
		return p.RetryServerErrors
	}
	return false
}

// Wait returns how long to wait before the attempt that follows attempt n
// (counted from 1), which came to o, elapsed after the first attempt
// began. It returns an error when no attempt should follow:
// ErrNotRetried, ErrMaxAttempts or ErrMaxElapsed.
//
// The wait is the server's hint (o.RetryAfter) or the backoff, whichever
// is longer. The backoff is InitialBackoff doubled after each attempt,
// capped at MaxBackoff, less a random part of up to half of it, so that
// clients that failed together do not retry together; it grows over the
// attempts whatever their classes, so a short hint repeated (a first
// request that runs long) is never a tight loop. A RetryNow answer to the
// first attempt is retried at once. The random part comes from
// math/rand/v2's generator, which the runtime seeds.
func (p Policy) Wait(n int, elapsed time.Duration, o Outcome) (time.Duration, error) {
	return p.wait(n, elapsed, o, rand.Float64())
}

// wait is Wait with u, in [0, 1), choosing the random part.
func (p Policy) wait(n int, elapsed time.Duration, o Outcome, u float64) (time.Duration, error) {
	p = p.withDefaults()
	switch {
	case !p.Retries(o.Class):
		return 0, ErrNotRetried
	case p.MaxAttempts > 0 && n >= p.MaxAttempts:
		return 0, ErrMaxAttempts
	}
	var d time.Duration
	if o.Class != RetryNow || n > 1 {
		b := p.backoff(n)
		d = b - time.Duration(u*float64(b/2))
	}
	d = max(d, o.RetryAfter)
	if p.MaxElapsed > 0 && elapsed+d > p.MaxElapsed {
		return 0, ErrMaxElapsed
	}
	return d, nil
}

// backoff is the backoff after attempt n: InitialBackoff doubled n-1 times,
// at most MaxBackoff.
func (p Policy) backoff(n int) time.Duration {
	b := p.InitialBackoff
	for i := 1; i < n && b < p.MaxBackoff; i++ {
		b *= 2
	}
	return min(b, p.MaxBackoff)
}
