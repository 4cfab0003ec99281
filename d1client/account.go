package d1client

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/d1idem/d1idem/d1client/budget"
)

// acquire takes a call of class cl from the client's Account, recording any
// wait; when it took none, it returns the refusal: ErrBudget, ErrRateLimited,
// or ErrTransport for want of a round trip.
func (c *Client) acquire(ctx context.Context, cl budget.Class) *Error {
	waited, err := c.account.Acquire(ctx, cl)
	if waited > 0 {
		c.tel.waited(cl, waited)
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
	e := exhausted(c.account, r.Wait)
	e.Err = r.Err
	return e
}

// tooLate is the error of a call not sent because only left, less than a
// round trip of rtt, remained before its deadline: context.DeadlineExceeded.
func tooLate(left, rtt time.Duration) *Error {
	return &Error{kind: kindTransport, Err: context.DeadlineExceeded, notSent: true,
		Message: fmt.Sprintf("not sent: %s left before the context's deadline, less than a round trip (%s): the call could not finish in time",
			max(left, 0).Round(time.Millisecond), rtt.Round(time.Millisecond))}
}

// exhausted is the error of a call not sent because a's budget had no call
// for it in time; one may go after wait.
func exhausted(a *budget.Account, wait time.Duration) *Error {
	return &Error{kind: kindBudget, RetryAfter: wait, notSent: true,
		Message: fmt.Sprintf("not sent: the request budget (%s) has no call for it; one may go in %s", a.Budget(), wait.Round(time.Millisecond))}
}

// blockedError is the error of a call not sent during a 971 block, which
// ends at until, after wait.
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
