package budget

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// measureRoundTrip makes the account measure one round trip of d: a call
// taken, answered d later (in a synctest bubble, d of fake time).
func measureRoundTrip(t *testing.T, a *Account, d time.Duration) {
	t.Helper()
	if ok, _, _, _ := a.TryTake(Priority, time.Time{}); !ok {
		t.Fatal("no call to measure a round trip with")
	}
	time.Sleep(d)
	a.Answered(http.Header{})
}

// Acquire takes no call when less than the account's expected round trip
// is left before the context's deadline: the call could not come back in
// time. Its refusal says both durations and matches
// context.DeadlineExceeded. With the round trip's time left, it takes one.
func TestAcquireRefusesWithoutRoundTripLeft(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newTestAccount(t, Unlimited())
		if rtt := a.RoundTrip(); rtt != 0 {
			t.Fatalf("RoundTrip before any answer = %v", rtt)
		}
		measureRoundTrip(t, a, 2*time.Second)
		if rtt := a.RoundTrip(); rtt != 2*time.Second {
			t.Fatalf("RoundTrip = %v, want 2s", rtt)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		_, err := a.Acquire(ctx, Priority)
		var r *Refusal
		if !errors.As(err, &r) || r.Cause != CauseDeadline || r.Left != 500*time.Millisecond || r.RoundTrip != 2*time.Second ||
			!errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "less than a round trip (2s)") {
			t.Fatalf("err = %v (%+v); want CauseDeadline, 500ms left of a 2s round trip", err, r)
		}
		if st := a.State(); st.InFlight != 0 {
			t.Fatalf("a call was taken: %+v", st)
		}
		ctx, cancel = context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if waited, err := a.Acquire(ctx, Normal); err != nil || waited != 0 {
			t.Fatalf("with a minute left: waited %v, %v", waited, err)
		}
	})
}

// During a 971 block Acquire gives up at once, with the block's end; once
// it has ended, calls go again. A call refused by TryTake learns of the
// block through its channel.
func TestAcquireRefusesDuringABlock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newTestAccount(t, New(2, time.Hour))
		a.TryTake(Priority, time.Time{})
		a.TryTake(Priority, time.Time{}) // the hour's two calls
		ok, _, why, changed := a.TryTake(Priority, time.Time{})
		if ok || why != WaitBudget {
			t.Fatalf("a third call of the hour: %v, %v", ok, why)
		}
		if _, on := a.Blocked(); on {
			t.Fatal("Blocked before any block")
		}
		until := time.Now().Add(time.Minute)
		a.Block(until)
		select {
		case <-changed:
		default:
			t.Fatal("the block did not close the channel of a refused TryTake")
		}
		if got, on := a.Blocked(); !on || !got.Equal(until) {
			t.Fatalf("Blocked = %v, %v", got, on)
		}
		start := time.Now()
		_, err := a.Acquire(context.Background(), Priority)
		var r *Refusal
		if !errors.As(err, &r) || r.Cause != CauseBlock || !r.Until.Equal(until) || r.Wait != time.Minute || r.Err != nil ||
			time.Since(start) != 0 || !strings.Contains(err.Error(), "971") {
			t.Fatalf("err = %v (%+v); want CauseBlock until the block's end, at once", err, r)
		}
		if st := a.State(); !st.BlockedUntil.Equal(until) {
			t.Fatalf("state %+v", st)
		}
		// A shorter block does not shorten it.
		a.Block(until.Add(-30 * time.Second))
		if got, _ := a.Blocked(); !got.Equal(until) {
			t.Fatalf("a shorter block moved the end to %v", got.Sub(start))
		}
		time.Sleep(time.Minute)
		if _, on := a.Blocked(); on {
			t.Fatal("Blocked after the block's end")
		}
		if st := a.State(); !st.BlockedUntil.IsZero() {
			t.Fatalf("state after the block %+v", st)
		}
	})
}

// A caller waiting for the budget whose context ends is refused with what
// is left of the wait and the context's error; the call it waited for is
// not taken.
func TestAcquireRefusesWhenTheContextEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newTestAccount(t, New(2, 10*time.Second))
		a.TryTake(Priority, time.Time{})
		a.TryTake(Priority, time.Time{}) // the window's two calls
		slot, _ := a.NextSlot(Priority, time.Time{})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { _, err := a.Acquire(ctx, Priority); done <- err }()
		time.Sleep(3 * time.Second)
		cancel()
		err := <-done
		var r *Refusal
		if !errors.As(err, &r) || r.Cause != CauseBudget || r.Wait != time.Until(slot) || !errors.Is(err, context.Canceled) ||
			!strings.Contains(err.Error(), "context canceled") {
			t.Fatalf("err = %v (%+v); want CauseBudget, %v left of the wait, context.Canceled", err, r, time.Until(slot))
		}
		if st := a.State(); st.InFlight != 2 {
			t.Fatalf("state %+v: the refused call was taken", st)
		}
	})
}
