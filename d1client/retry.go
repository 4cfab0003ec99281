package d1client

import (
	"context"
	"math/rand/v2"
	"time"
)

// RateLimitBlock is how long Cloudflare blocks every API call of an account
// after its global rate limit (code 971) trips, when no Retry-After says
// otherwise.
const RateLimitBlock = 5 * time.Minute

// RetryPolicy decides how transient failures are retried. Only reads and
// calls marked Idempotent are retried after a failure that may have reached
// D1; any call is retried after a failure that proves nothing was sent (a
// refused connection). SQL, auth and envelope errors are never retried, and
// a 971 rate-limit block is never retried before it ends.
type RetryPolicy struct {
	// MaxAttempts is the number of attempts, the first included. 1 disables
	// retries. Default 4.
	MaxAttempts int
	// BaseDelay is the first backoff; each retry doubles it, up to MaxDelay,
	// with jitter (each delay is drawn from [d/2, d]). Defaults 100 ms, 2 s.
	BaseDelay time.Duration
	MaxDelay  time.Duration
	// MaxRetryAfter caps how long a server's Retry-After is honoured. A
	// longer Retry-After ends the retries and returns the error, carrying
	// RetryAfter, to the caller. Default 10 s.
	MaxRetryAfter time.Duration
}

// DefaultRetryPolicy is the policy a zero RetryPolicy stands for.
var DefaultRetryPolicy = RetryPolicy{MaxAttempts: 4, BaseDelay: 100 * time.Millisecond, MaxDelay: 2 * time.Second, MaxRetryAfter: 10 * time.Second}

func (p RetryPolicy) withDefaults() RetryPolicy {
	d := DefaultRetryPolicy
	if p.MaxAttempts > 0 {
		d.MaxAttempts = p.MaxAttempts
	}
	if p.BaseDelay > 0 {
		d.BaseDelay = p.BaseDelay
	}
	if p.MaxDelay > 0 {
		d.MaxDelay = p.MaxDelay
	}
	if p.MaxRetryAfter > 0 {
		d.MaxRetryAfter = p.MaxRetryAfter
	}
	if d.MaxDelay < d.BaseDelay {
		d.MaxDelay = d.BaseDelay
	}
	return d
}

// backoff returns the jittered delay before retry number attempt (1-based).
func (p RetryPolicy) backoff(attempt int) time.Duration {
	d := p.BaseDelay
	for i := 1; i < attempt && d < p.MaxDelay; i++ {
		d *= 2
	}
	d = min(d, p.MaxDelay)
	half := d / 2
	return half + rand.N(half+1)
}

// retryDelay decides whether the failed attempt is retried and after how
// long. safe says whether the call may be repeated even if it was delivered.
func (c *Client) retryDelay(ctx context.Context, e *Error, attempt int, safe, untilDeadline bool) (time.Duration, bool) {
	switch e.Kind {
	case KindOverloaded, KindTransient, KindNonJSON, KindTransport:
		if !safe && e.Ambiguous {
			return 0, false // a write that may have committed is never repeated blindly
		}
	default:
		return 0, false
	}
	if ctx.Err() != nil {
		return 0, false
	}
	deadline, hasDeadline := ctx.Deadline()
	if attempt >= c.retry.MaxAttempts && !(untilDeadline && hasDeadline) {
		return 0, false
	}
	delay := c.retry.backoff(attempt)
	if e.RetryAfter > 0 {
		if e.RetryAfter > c.retry.MaxRetryAfter {
			return 0, false
		}
		delay = max(delay, e.RetryAfter)
	}
	if hasDeadline && time.Until(deadline) <= delay {
		return 0, false // the deadline wins: no attempt could finish in time
	}
	return delay, true
}
