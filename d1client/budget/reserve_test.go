package budget

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// A Budget without a reserve is refused, by Validate and NewAccount, with
// the accepted range: without one, work without Priority could take every
// call, and a completion meeting the empty budget would fail.
func TestReserveZeroRefused(t *testing.T) {
	for _, b := range []Budget{Budget{}.WithReserve(0), New(10, time.Second).WithBurst(1).WithReserve(0), Unlimited().WithReserve(0)} {
		if err := b.Validate(); err == nil || !strings.Contains(err.Error(), "reserve is 0; accepted: 0.01 to 0.9") {
			t.Errorf("Validate of %v with no reserve: %v", b, err)
		}
		if _, err := NewAccount(b); err == nil || !strings.Contains(err.Error(), "accepted: 0.01 to 0.9") {
			t.Errorf("NewAccount with %v and no reserve: %v", b, err)
		}
	}
	if _, err := NewAccount(New(10, time.Second).WithReserve(MinReserve)); err != nil {
		t.Errorf("the least reserve: %v", err)
	}
}

// Priority work (a completion) whose deadline cannot wait for the even
// pace is not held to it: it goes at once while the account has a call
// left, even right after other work spent the pace. It is held to the
// calls really left: the local window's Calls, the headers' remaining
// calls, a 971 block.
func TestCompletionBypassesPace(t *testing.T) {
	t.Run("local pace", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			a := newTestAccount(t, New(5, 100*time.Second).WithBurst(1))
			takeAt(t, a, Normal, time.Now())
			if at, _ := a.NextSlot(Normal, time.Time{}); !at.After(time.Now()) {
				t.Fatal("the pace lets new work go at once after a call")
			}
			for i := range 4 { // the rest of the window's 5 calls
				if at, why := a.NextSlot(Priority, soon()); !at.Equal(time.Now()) {
					t.Fatalf("Priority call %d waits %v (%v)", i+2, time.Until(at), why)
				}
				a.take(time.Now(), Priority)
			}
			// The window is spent: the next waits for its first call to leave it.
			if at, why := a.NextSlot(Priority, soon()); why != WaitBudget || !at.Equal(time.Now().Add(100*time.Second+100*time.Second/ringMargin)) {
				t.Fatalf("with the window spent, Priority may go in %v (%v)", time.Until(at), why)
			}
		})
	})
	t.Run("account pace", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			a := newTestAccount(t, Unlimited().WithBurst(1))
			a.take(time.Now(), Normal)
			a.Answered(rateHeaders(3, 60, 1200, 300)) // 3 calls left, one every 20 s
			takeAt(t, a, Normal, time.Now())
			if at, _ := a.NextSlot(Normal, time.Time{}); !at.After(time.Now()) {
				t.Fatal("the pace lets new work go at once after a call")
			}
			for i := range 2 {
				if at, why := a.NextSlot(Priority, soon()); !at.Equal(time.Now()) {
					t.Fatalf("Priority call %d waits %v (%v)", i+1, time.Until(at), why)
				}
				a.take(time.Now(), Priority)
			}
			// None is left: the next waits for the reset.
			st := a.State()
			if at, why := a.NextSlot(Priority, soon()); why != WaitBudget || !at.Equal(st.Reset.Add(resetMargin)) {
				t.Fatalf("with no call left, Priority may go in %v (%v)", time.Until(at), why)
			}
		})
	})
	t.Run("971", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			a := newTestAccount(t, Unlimited())
			a.Block(time.Now().Add(time.Minute))
			if _, why := a.NextSlot(Priority, soon()); why != WaitBlock {
				t.Fatalf("Priority work during a 971 block: %v", why)
			}
		})
	})
}

// Priority work whose deadline allows it follows the even pace, so that
// completions arriving together wait for one call rather than each taking
// its own: without a deadline, or with one after its paced slot and a
// round trip, it waits for the slot; it goes beyond the pace only when it
// could not wait.
func TestPriorityFollowsThePaceWhileItsDeadlineAllows(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newTestAccount(t, New(100, 100*time.Second).WithBurst(1))
		takeAt(t, a, Priority, time.Now())
		a.Answered(nil)
		paced, why := a.NextSlot(Priority, time.Time{})
		if why != WaitBudget || !paced.Equal(time.Now().Add(time.Second)) {
			t.Fatalf("Priority work without a deadline may go in %v (%v); want 1s, the pace", time.Until(paced), why)
		}
		if at, _ := a.NextSlot(Priority, paced.Add(time.Second)); !at.Equal(paced) {
			t.Errorf("with a deadline after the slot, Priority work may go in %v; want 1s", time.Until(at))
		}
		if at, _ := a.NextSlot(Priority, paced.Add(-time.Millisecond)); !at.Equal(time.Now()) {
			t.Errorf("with a deadline before the slot, Priority work waits %v; want none", time.Until(at))
		}
		// Acquire follows the pace for a context whose deadline allows it,
		// and goes at once for one whose deadline does not.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if waited, err := a.Acquire(ctx, Priority); err != nil || waited != time.Second {
			t.Fatalf("Acquire with 10s left: waited %v, %v; want 1s", waited, err)
		}
		a.Answered(nil)
		ctx, cancel = context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		if waited, err := a.Acquire(ctx, Priority); err != nil || waited != 0 {
			t.Fatalf("Acquire with 500ms left: waited %v, %v; want 0", waited, err)
		}
	})
}

// Every accepted Budget, WithBurst(1) and the least reserve included,
// keeps at least one call of each window that work without Priority never
// takes: new work taking every call it can, a completion still finds one
// at once.
func TestEveryBudgetKeepsACallForPriority(t *testing.T) {
	for _, b := range []Budget{
		New(5, 100*time.Second).WithBurst(1).WithReserve(MinReserve),
		New(5, 100*time.Second).WithBurst(1),
		New(2, time.Minute),
		New(2, time.Minute).WithBurst(1000).WithReserve(MinReserve),
		New(20, 20*time.Second).WithBurst(20).WithReserve(MinReserve),
		New(20, 20*time.Second).WithBurst(1).WithReserve(MaxReserve),
		Budget{},
		Budget{}.WithBurst(1).WithReserve(MinReserve),
	} {
		t.Run(fmt.Sprintf("%v, burst %d, reserve %v", b, b.Burst(), b.Reserve()), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				a := newTestAccount(t, b)
				start := time.Now()
				n := 0
				for {
					at, _ := a.NextSlot(Normal, time.Time{})
					if !at.Before(start.Add(b.Per())) {
						break
					}
					takeAt(t, a, Normal, start)
					n++
				}
				if n > b.Calls()-b.Kept() || b.Kept() < 1 {
					t.Errorf("new work took %d of the window's %d calls, %d of them kept", n, b.Calls(), b.Kept())
				}
				if at, why := a.NextSlot(Priority, soon()); !at.Equal(time.Now()) {
					t.Errorf("after %d calls of new work, a completion waits %v (%v)", n, time.Until(at), why)
				}
			})
		})
	}
	// The account's headers: new work leaves the last of the calls they
	// say are left.
	for _, b := range []Budget{Unlimited().WithBurst(1).WithReserve(MinReserve), Unlimited().WithBurst(1), Unlimited()} {
		t.Run(fmt.Sprintf("headers, burst %d, reserve %v", b.Burst(), b.Reserve()), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				a := newTestAccount(t, b)
				a.take(time.Now(), Normal)
				a.Answered(rateHeaders(5, 60, 1200, 300))
				reset := a.State().Reset
				n := 0
				for {
					at, _ := a.NextSlot(Normal, time.Time{})
					if !at.Before(reset) {
						break
					}
					takeAt(t, a, Normal, time.Now())
					n++
				}
				if n > 5-b.Kept() {
					t.Errorf("new work took %d of the 5 calls left, %d of them kept", n, b.Kept())
				}
				if at, why := a.NextSlot(Priority, soon()); !at.Equal(time.Now()) {
					t.Errorf("after %d calls of new work, a completion waits %v (%v)", n, time.Until(at), why)
				}
			})
		})
	}
}

// While other processes spend the account's calls, Priority work takes
// only this process's share of the calls left (its calls in flight,
// which the others cannot know of yet, counted against it), so that
// several processes' completions seeing the same headers do not overrun
// the account; work without Priority leaves Kept calls for each.
func TestPriorityTakesItsShareOfTheLastCalls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newTestAccount(t, Unlimited())
		a.take(time.Now(), Normal)
		a.Answered(rateHeaders(10, 60, 1200, 300))
		a.mu.Lock()
		a.ours, a.others = 1, 2 // this process spends a third of the account's calls
		a.mu.Unlock()
		// 10 left, less one that others may have in flight: a third of 9.
		n := 0
		for ; n < 10; n++ {
			if at, _ := a.NextSlot(Priority, soon()); !at.Equal(time.Now()) {
				break
			}
			a.take(time.Now(), Priority)
		}
		if n != 3 {
			t.Errorf("Priority work took %d calls; want 3, a third of the 9 left", n)
		}
		if at, _ := a.NextSlot(Normal, time.Time{}); !at.Equal(a.State().Reset.Add(resetMargin)) {
			t.Errorf("new work may go in %v; want the reset", time.Until(at))
		}
		// Answered, the calls are the headers' again: a third of what is left.
		for range 3 {
			a.Answered(nil)
		}
		if at, _ := a.NextSlot(Priority, soon()); !at.Equal(time.Now()) {
			t.Errorf("with its calls answered, Priority work waits %v", time.Until(at))
		}
	})
}

// soon is the deadline of a Priority call that cannot wait for the even
// pace: a millisecond away.
func soon() time.Time { return time.Now().Add(time.Millisecond) }

// TestBackground: a Background budget gives work without Priority exactly
// its calls per window: the calls kept for Priority work come on top.
func TestBackground(t *testing.T) {
	for _, n := range []int{1, 2, 3, 9, 10, 11, 200, 1199} {
		b := Background(n, 5*time.Minute)
		if got := b.Calls() - b.Kept(); got != n || b.Per() != 5*time.Minute {
			t.Errorf("calls %d: %v keeping %d gives the sweep %d", n, b, b.Kept(), got)
		}
		if _, err := NewAccount(b); err != nil {
			t.Errorf("calls %d: %v", n, err)
		}
	}
}
