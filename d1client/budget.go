package d1client

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Budget is a client-side limit on D1 calls: at most Calls calls in any
// window of length Per. Cloudflare allows 1200 API calls per 5 minutes per
// token, and going over blocks every API call of the account (the dashboard
// included) for 5 minutes, so a Client never exceeds its budget.
//
// It works as a token bucket whose tokens come back exactly Per after they
// were spent: a call may be sent when fewer than Calls calls were sent in the
// last Per. That bounds every sliding window, unlike a refill-rate bucket,
// which lets up to twice its capacity through in a window after an idle spell.
//
// The budget is per Client. Processes that share one token must share the
// budget between them: give each a Budget with its share of Calls.
type Budget struct {
	Calls int           // calls allowed per window; 0 means unlimited
	Per   time.Duration // the window
}

// DefaultBudget is Cloudflare's global API limit: 1200 calls per 300 s.
var DefaultBudget = Budget{Calls: 1200, Per: 300 * time.Second}

// Unlimited is a Budget with no limit, for d1local and tests.
var Unlimited = Budget{}

func (b Budget) validate() error {
	if b.Calls < 0 {
		return invalidf("budget calls %d must not be negative", b.Calls)
	}
	if b.Calls > 0 && b.Per <= 0 {
		return invalidf("budget of %d calls needs a positive window", b.Calls)
	}
	return nil
}

func (b Budget) String() string {
	if b.Calls == 0 {
		return "unlimited"
	}
	return fmt.Sprintf("%d calls per %s", b.Calls, b.Per)
}

// budgetLimiter enforces a Budget with a ring of the send times of the last
// Calls calls.
type budgetLimiter struct {
	b     Budget
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
// gives up, with a KindBudget error that says when a call frees up, as soon
// as it is clear the context's deadline comes first.
func (l *budgetLimiter) wait(ctx context.Context) *Error {
	if l.b.Calls == 0 {
		return nil
	}
	for {
		l.mu.Lock()
		now := l.now()
		if len(l.sent) < l.b.Calls {
			l.sent = append(l.sent, now)
			l.reserved(now)
			l.mu.Unlock()
			return nil
		}
		free := l.sent[l.head].Add(l.b.Per)
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
	return &Error{Kind: KindBudget, RetryAfter: wait,
		Message: fmt.Sprintf("not sent: the request budget (%s) is spent; a call frees up in %s", l.b, wait.Round(time.Millisecond))}
}

// nextFree returns when the next call may be sent: now, or when the oldest
// call of a full window leaves it.
func (l *budgetLimiter) nextFree() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	if l.b.Calls == 0 || len(l.sent) < l.b.Calls {
		return now
	}
	if free := l.sent[l.head].Add(l.b.Per); free.After(now) {
		return free
	}
	return now
}

// BudgetWait returns how long the next call would wait for the request
// budget: zero when one may be sent now. It lets a caller say that it is
// about to wait (the CLI's sweep does) before Exec waits.
func (c *Client) BudgetWait() time.Duration {
	return max(0, time.Until(c.budget.nextFree()))
}
