package d1client

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Budget is a client-side limit on D1 calls: at most Calls calls in any
// window of length Per. Cloudflare allows 1200 API calls per 5 minutes per
// user, and going over blocks every API call of the account (the dashboard
// included) for 5 minutes.
//
// The zero Budget is that limit, 1200 calls per 300 s. Make others with
// NewBudget and UnlimitedBudget. The budget is per Client: processes that
// share an account should each get a share of its calls.
type Budget struct {
	calls     int
	per       time.Duration
	unlimited bool
}

// Cloudflare's global API limit, the zero Budget.
const (
	defaultBudgetCalls = 1200
	defaultBudgetPer   = 300 * time.Second
)

// NewBudget returns a Budget of calls calls in any window of length per.
// New refuses it unless calls is from 1 to 1,000,000 and per from 1 ms to
// 24 h.
func NewBudget(calls int, per time.Duration) Budget {
	return Budget{calls: calls, per: per}
}

// UnlimitedBudget returns a Budget with no limit, for d1local and tests.
func UnlimitedBudget() Budget { return Budget{unlimited: true} }

// Calls returns the calls allowed per window; 0 for an unlimited budget.
func (b Budget) Calls() int {
	switch {
	case b.unlimited:
		return 0
	case b == Budget{}:
		return defaultBudgetCalls
	}
	return b.calls
}

// Per returns the window; 0 for an unlimited budget.
func (b Budget) Per() time.Duration {
	switch {
	case b.unlimited:
		return 0
	case b == Budget{}:
		return defaultBudgetPer
	}
	return b.per
}

// Unlimited reports whether the budget has no limit.
func (b Budget) Unlimited() bool { return b.unlimited }

// String describes the budget, such as "1200 calls per 5m0s".
func (b Budget) String() string {
	if b.unlimited {
		return "unlimited"
	}
	return fmt.Sprintf("%d calls per %s", b.Calls(), b.Per())
}

func (b Budget) validate() error {
	if b.unlimited || b == (Budget{}) {
		return nil
	}
	if b.calls < 1 || b.calls > 1_000_000 || b.per < time.Millisecond || b.per > 24*time.Hour {
		return invalidf("Config.Budget is %d calls per %s; accepted: the zero Budget (1200 calls per 300 s), UnlimitedBudget(), or NewBudget with 1 to 1000000 calls per 1ms to 24h", b.calls, b.per)
	}
	return nil
}

// budgetLimiter enforces a Budget with a ring of the send times of the last
// Calls calls.
type budgetLimiter struct {
	b     Budget // validated
	mu    sync.Mutex
	sent  []time.Time // ring of send times, oldest at head once full
	head  int
	now   func() time.Time
	sleep func(ctx context.Context, d time.Duration) error

	onReserve func(time.Time) // called under mu with each reservation; tests only
}

func newBudgetLimiter(b Budget) *budgetLimiter {
	return &budgetLimiter{b: b, now: time.Now, sleep: sleepCtx}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// wait reserves one call, waiting for the window to free one if needed. It
// gives up, with an ErrBudget error that says when a call frees up, as soon
// as it is clear the context's deadline comes first.
func (l *budgetLimiter) wait(ctx context.Context) *Error {
	if l.b.unlimited {
		return nil
	}
	calls, per := l.b.Calls(), l.b.Per()
	for {
		l.mu.Lock()
		now := l.now()
		if len(l.sent) < calls {
			l.sent = append(l.sent, now)
			l.reserved(now)
			l.mu.Unlock()
			return nil
		}
		free := l.sent[l.head].Add(per)
		if !free.After(now) {
			l.sent[l.head] = now
			l.head = (l.head + 1) % len(l.sent)
			l.reserved(now)
			l.mu.Unlock()
			return nil
		}
		l.mu.Unlock()
		wait := free.Sub(now)
		if dl, ok := ctx.Deadline(); ok && dl.Before(free) {
			return l.exhausted(wait)
		}
		if err := l.sleep(ctx, wait); err != nil {
			e := l.exhausted(wait)
			e.Err = err
			return e
		}
	}
}

func (l *budgetLimiter) reserved(t time.Time) {
	if l.onReserve != nil {
		l.onReserve(t)
	}
}

func (l *budgetLimiter) exhausted(wait time.Duration) *Error {
	return &Error{kind: kindBudget, RetryAfter: wait,
		Message: fmt.Sprintf("not sent: the request budget (%s) is spent; a call frees up in %s", l.b, wait.Round(time.Millisecond))}
}

// nextFree returns when the next call may be sent: now, or when the oldest
// call of a full window leaves it.
func (l *budgetLimiter) nextFree() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	if l.b.unlimited || len(l.sent) < l.b.Calls() {
		return now
	}
	if free := l.sent[l.head].Add(l.b.Per()); free.After(now) {
		return free
	}
	return now
}

// BudgetWait returns how long the next call would wait for the request
// budget; zero when one may be sent now.
func (c *Client) BudgetWait() time.Duration {
	return max(0, time.Until(c.budget.nextFree()))
}
