package d1client

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"time"

	"github.com/d1idem/d1idem/d1client/budget"
)

// RateLimitBlock is how long Cloudflare blocks every API call of an account
// after code 971, when no Retry-After says otherwise.
const RateLimitBlock = 5 * time.Minute

// RetryPolicy says how many attempts transient failures get, and the backoff
// between them; a zero field takes its default. What is retried at all is
// the package's rule (see the package doc).
type RetryPolicy struct {
	MaxAttempts int // attempts, the first included: 1 to 100; default 4
	// BaseDelay is the first backoff, 1 ms to 1 min; each retry doubles it,
	// up to MaxDelay (1 ms to 10 min), with jitter: each delay is drawn from
	// [d/2, d]. Defaults 100 ms and 2 s.
	BaseDelay time.Duration
	MaxDelay  time.Duration
	// MaxRetryAfter is the longest Retry-After waited for, 1 ms to 1 h;
	// default 10 s. A longer one ends the retries.
	MaxRetryAfter time.Duration
}

// DefaultRetryPolicy returns the policy the zero RetryPolicy stands for.
func DefaultRetryPolicy() RetryPolicy {
	return RetryPolicy{MaxAttempts: 4, BaseDelay: 100 * time.Millisecond, MaxDelay: 2 * time.Second, MaxRetryAfter: 10 * time.Second}
}

// NoRetry returns a policy of one attempt: no failure is retried.
func NoRetry() RetryPolicy { return RetryPolicy{MaxAttempts: 1} }

// withDefaults validates p and fills its zero fields with the defaults.
func (p RetryPolicy) withDefaults() (RetryPolicy, error) {
	base, most, d := p.BaseDelay, p.MaxDelay, DefaultRetryPolicy()
	if err := cmp.Or(
		setting("Retry.MaxAttempts", &p.MaxAttempts, 1, 100, d.MaxAttempts),
		setting("Retry.BaseDelay", &p.BaseDelay, time.Millisecond, time.Minute, d.BaseDelay),
		setting("Retry.MaxDelay", &p.MaxDelay, time.Millisecond, 10*time.Minute, d.MaxDelay),
		setting("Retry.MaxRetryAfter", &p.MaxRetryAfter, time.Millisecond, time.Hour, d.MaxRetryAfter),
	); err != nil {
		return p, err
	}
	if base != 0 && most != 0 && most < base {
		return p, invalidf("Config.Retry.MaxDelay (%s) is shorter than Config.Retry.BaseDelay (%s)", most, base)
	}
	p.MaxDelay = max(p.MaxDelay, p.BaseDelay)
	return p, nil
}

// backoff returns the jittered delay before retry number attempt (1-based).
func (p RetryPolicy) backoff(attempt int) time.Duration {
	// BaseDelay << 20 (>= 1 ms << 20) exceeds any MaxDelay, and cannot overflow.
	half := min(p.BaseDelay<<min(attempt-1, 20), p.MaxDelay) / 2
	return half + rand.N(half+1)
}

// retryDelay decides whether the failed attempt is retried and after how
// long. safe says whether the call may be repeated even if it was delivered.
func (c *Client) retryDelay(ctx context.Context, e *Error, attempt int, safe, untilDeadline bool) (time.Duration, bool) {
	retryable := e.kind == kindOverloaded || e.kind == kindTransient || e.kind == kindNonJSON || e.kind == kindTransport
	deadline, hasDeadline := ctx.Deadline()
	switch {
	case e.notSent, // what stopped it (the budget, the deadline) stands
		!retryable,
		!safe && e.Ambiguous, // a write that may have committed is never repeated blindly
		ctx.Err() != nil,
		attempt >= c.cfg.Retry.MaxAttempts && !(untilDeadline && hasDeadline),
		e.RetryAfter > c.cfg.Retry.MaxRetryAfter:
		return 0, false
	}
	delay := max(c.cfg.Retry.backoff(attempt), e.RetryAfter)
	if hasDeadline && time.Until(deadline) <= delay+c.account.RoundTrip() {
		return 0, false // the deadline wins: no attempt could finish in time
	}
	return delay, true
}

// acquire takes call from the Account, recording any wait, or
// returns the refusal: ErrBudget, ErrRateLimited, or ErrTransport (deadline).
func (c *Client) acquire(ctx context.Context, call *budget.Call) *Error {
	_, waited, err := c.account.AcquireCall(ctx, call)
	if waited > 0 {
		c.tel.waited(call.Class, waited)
	}
	if err == nil {
		return nil
	}
	var r *budget.Refusal
	switch {
	case !errors.As(err, &r):
		return notSent(err, "")
	case r.Cause == budget.CauseBlock:
		return blockedError(r.Until, r.Wait)
	case r.Cause == budget.CauseDeadline:
		return tooLate(r.Left, r.RoundTrip)
	}
	return exhausted(c.account, r.Wait, r.Err)
}

// tooLate is the error of a call not sent because only left, less than a
// round trip of rtt, remained before its deadline: context.DeadlineExceeded.
func tooLate(left, rtt time.Duration) *Error {
	return &Error{kind: kindTransport, Err: context.DeadlineExceeded, notSent: true,
		Message: fmt.Sprintf("not sent: %s left before the context's deadline, less than a round trip (%s): the call could not finish in time",
			max(left, 0).Round(time.Millisecond), rtt.Round(time.Millisecond))}
}

// exhausted is the error of a call not sent because a's budget had no call
// for it in time; one may go after wait. err is the cause, if any.
func exhausted(a *budget.Account, wait time.Duration, err error) *Error {
	return &Error{kind: kindBudget, RetryAfter: wait, notSent: true, Err: err,
		Message: fmt.Sprintf("not sent: the request budget (%s) has no call for it; one may go in %s", a.Budget(), wait.Round(time.Millisecond))}
}

// shedError is the error of a call not queued because group commit's
// queue was longer than it could wait; room may come after wait.
func shedError(wait time.Duration) *Error {
	return &Error{kind: kindShed, RetryAfter: wait, notSent: true,
		Message: fmt.Sprintf("not sent: group commit's queue holds more than the call could wait for; room may come in %s", wait.Round(time.Millisecond))}
}

// blockedError is the error of a call not sent during a 971 block, until until.
func blockedError(until time.Time, wait time.Duration) *Error {
	return &Error{kind: kindRateLimited, StatusCode: http.StatusTooManyRequests, Codes: []int{971},
		RetryAfter: wait, BlockedUntil: until, notSent: true,
		Message: "not sent: Cloudflare's global API rate limit blocks this account until " + until.UTC().Format(time.RFC3339)}
}

// BudgetWait returns how long the next call without Priority would wait for
// the budget; zero when one may be sent now.
func (c *Client) BudgetWait() time.Duration {
	at, _ := c.account.NextSlot(budget.Normal, time.Time{})
	return max(0, time.Until(at))
}
