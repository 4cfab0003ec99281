package d1client

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/jarcoal/httpmock"

	"github.com/d1idem/d1idem/d1client/budget"
)

// measureRoundTrip makes the account measure one round trip of d: a call
// taken, answered d later (in a synctest bubble, d of fake time).
func measureRoundTrip(t *testing.T, a *budget.Account, d time.Duration) {
	t.Helper()
	spend(t, a)
	time.Sleep(d)
	a.Answered(http.Header{})
}

// spend takes a call of the account now, as another client of it would,
// and leaves it in flight.
func spend(t *testing.T, a *budget.Account) {
	t.Helper()
	if ok, _, _, _ := a.TryTake(budget.Priority, time.Time{}); !ok {
		t.Fatal("the account has no call to spend")
	}
}

// notSentForDeadline checks that err is the error of a call not sent for
// want of a round trip before its deadline.
func notSentForDeadline(t *testing.T, what string, err error) {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) || !errors.Is(err, ErrTransport) || !errors.Is(err, context.DeadlineExceeded) ||
		e.Ambiguous || !strings.Contains(e.Message, "not sent") || !strings.Contains(e.Message, "less than a round trip (2s)") {
		t.Fatalf("%s: err = %v; want ErrTransport, not sent for want of a round trip", what, err)
	}
	if e.Attempts != 1 {
		t.Errorf("%s: %d attempts", what, e.Attempts)
	}
}

// A call is not sent when less than the account's expected round trip is
// left before its context's deadline, alone or through group commit, and
// whatever its retry options: the call could not come back in time, and a
// write's outcome would be unknown. The error says so and is not
// ambiguous. With the round trip's time left, the call goes.
func TestNoSendWithoutRoundTripLeft(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		acct := newTestAccount(t, budget.Unlimited())
		measureRoundTrip(t, acct, 2*time.Second)
		if st := acct.State(); st.InFlight != 0 {
			t.Fatalf("state %+v", st)
		}
		c, tr := mockClient(t, ok1(t), func(cfg *Config) { cfg.Budget, cfg.Account = budget.Budget{}, acct })
		for name, opts := range map[string][]ExecOption{
			"alone":                   nil,
			"coalesced":               {Coalesce()},
			"a completion":            {Coalesce(), Priority(), Idempotent(), RetryUntilDeadline()},
			"a completion, alone":     {Priority(), Idempotent(), RetryUntilDeadline()},
			"a write, retried":        {Idempotent(), RetryUntilDeadline()},
			"a read, coalesced, soon": {Coalesce(), Operation("read")},
		} {
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			_, err := c.Exec(ctx, readStmt, opts...)
			cancel()
			notSentForDeadline(t, name, err)
		}
		if n := tr.GetTotalCallCount(); n != 0 {
			t.Fatalf("%d calls sent", n)
		}
		// A minute is enough.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for _, opts := range [][]ExecOption{nil, {Coalesce()}} {
			if _, err := c.Exec(ctx, readStmt, opts...); err != nil {
				t.Fatal(err)
			}
		}
		if n := tr.GetTotalCallCount(); n != 2 {
			t.Fatalf("%d calls sent, want 2", n)
		}
		// Group commit's runner waits for its caller to come back, for a
		// round trip: let it end before the bubble's time stops.
		time.Sleep(time.Minute)
	})
}

// A call whose budget slot comes before its deadline, but less than a
// round trip before it, is refused at once (ErrBudget, with when a call
// could go) instead of waiting for the slot and going with no time left.
func TestNoWaitForASlotTooCloseToTheDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		acct := newTestAccount(t, budget.New(2, 10*time.Second))
		measureRoundTrip(t, acct, 2*time.Second)
		spend(t, acct)                                // the window's two calls are spent
		window := 10*time.Second + 10*time.Second/300 // the ring's window, with its margin of a 300th
		slot := window - 2*time.Second                // the first call leaves the window then
		c, tr := mockClient(t, ok1(t), func(cfg *Config) { cfg.Budget, cfg.Account = budget.Budget{}, acct })
		for name, opts := range map[string][]ExecOption{"alone": {Priority()}, "coalesced": {Priority(), Coalesce()}} {
			// The slot comes before the deadline, 1 s before it: less than
			// the round trip.
			ctx, cancel := context.WithTimeout(context.Background(), slot+time.Second)
			done := make(chan error, 1)
			go func() { _, err := c.Exec(ctx, readStmt, opts...); done <- err }()
			synctest.Wait()
			var err error
			select {
			case err = <-done:
			default:
				cancel()
				err = <-done
				t.Fatalf("%s: the call waited for a slot it could not use (then %v)", name, err)
			}
			cancel()
			var e *Error
			if !errors.As(err, &e) || !errors.Is(err, ErrBudget) || e.Ambiguous || e.RetryAfter != slot {
				t.Fatalf("%s: err = %v; want ErrBudget, retry after %v", name, err, slot)
			}
		}
		if n := tr.GetTotalCallCount(); n != 0 {
			t.Fatalf("%d calls sent", n)
		}
	})
}

// A caller queued for group commit whose deadline comes within a round
// trip by the time its call could leave (here the round trip grew while
// it waited for the budget: another call of the account came back slowly)
// is not sent: it gets the not-sent error, and nothing goes.
func TestQueuedCallerDroppedWithoutRoundTripLeft(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		acct := newTestAccount(t, budget.New(2, time.Hour))
		c, tr := mockClient(t, ok1(t), func(cfg *Config) {
			cfg.Budget, cfg.Account, cfg.Coalesce, cfg.Retry = budget.Budget{}, acct, CoalesceConfig{Window: -1}, NoRetry()
		})
		measureRoundTrip(t, acct, 2*time.Second)
		spend(t, acct) // the hour's two calls are spent; this one is still in flight
		slot, _ := acct.NextSlot(budget.Priority, time.Time{})
		// The deadline comes a minute after the slot: enough, at a round
		// trip of 2 s.
		ctx, cancel := context.WithDeadline(context.Background(), slot.Add(time.Minute))
		defer cancel()
		done := make(chan error, 1)
		go func() { _, err := c.Exec(ctx, readStmt, Coalesce(), Priority()); done <- err }()
		synctest.Wait()
		b := c.batch
		b.mu.Lock()
		queued, runners := len(b.queue[budget.Priority]), b.runners
		b.mu.Unlock()
		if queued != 1 || runners != 1 {
			t.Fatalf("%d callers queued, %d runners; want the caller queued for the budget's slot, and its runner", queued, runners)
		}
		select {
		case err := <-done:
			t.Fatalf("the caller did not queue: %v", err)
		default:
		}
		// The call in flight comes back an hour later: the expected round
		// trip grows past what is left before the deadline.
		time.Sleep(time.Until(slot.Add(-12 * time.Second)))
		acct.Answered(http.Header{})
		rtt := acct.RoundTrip()
		if left := time.Until(slot.Add(time.Minute)); rtt <= left {
			t.Fatalf("the round trip grew to %v only, with %v left", rtt, left)
		}
		err := <-done
		var e *Error
		if !errors.As(err, &e) || !errors.Is(err, context.DeadlineExceeded) || e.Ambiguous ||
			!strings.Contains(e.Message, fmt.Sprintf("less than a round trip (%s)", rtt.Round(time.Millisecond))) {
			t.Fatalf("err = %v; want not sent for want of a round trip (%v)", err, rtt)
		}
		if n := tr.GetTotalCallCount(); n != 0 {
			t.Fatalf("%d calls sent", n)
		}
		synctest.Wait()
		b.mu.Lock()
		runners = b.runners
		b.mu.Unlock()
		if runners != 0 {
			t.Errorf("%d runners left", runners)
		}
	})
}

// A retry that is not sent, for want of a round trip or of a budget slot
// before the deadline, leaves the attempt before it as the call's error:
// when that one may have committed, the caller learns so, not that nothing
// was sent.
func TestRetryNotSentReportsTheAmbiguousAttempt(t *testing.T) {
	for _, tc := range []struct {
		name   string
		budget budget.Budget
		answer time.Duration // how long each answer takes
	}{
		// 10 s are left of the 30 after the answer: less than its round trip.
		{"no round trip left", budget.Unlimited(), 20 * time.Second},
		{"no slot before the deadline", budget.New(2, time.Hour), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				acct := newTestAccount(t, tc.budget)
				if !tc.budget.IsUnlimited() {
					spend(t, acct) // one of the hour's two calls is spent
				}
				slow500 := func(req *http.Request) (*http.Response, error) {
					time.Sleep(tc.answer)
					return httpmock.NewStringResponse(http.StatusInternalServerError, `{"success":false,"errors":[{"code":7500,"message":"internal error"}]}`), nil
				}
				c, tr := mockClient(t, slow500, func(cfg *Config) { cfg.Budget, cfg.Account = budget.Budget{}, acct })
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				_, err := c.Exec(ctx, readStmt, Priority(), Idempotent(), RetryUntilDeadline())
				var e *Error
				if !errors.As(err, &e) || !errors.Is(err, ErrTransient) || !e.Ambiguous || e.Attempts != 1 {
					t.Fatalf("err = %v; want the first attempt's ambiguous ErrTransient", err)
				}
				if n := tr.GetTotalCallCount(); n != 1 {
					t.Fatalf("%d calls: a retry went", n)
				}
			})
		})
	}
}
