package budget

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"sort"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// The Account's tests run in fake time (testing/synctest): time moves only
// when every goroutine of the test's bubble is blocked, so that nothing
// passes between the calls a test makes, and a time.Sleep moves the clock
// by exactly its duration.

// newTestAccount returns an Account of b; make it inside the test's bubble.
func newTestAccount(t testing.TB, b Budget) *Account {
	t.Helper()
	if err := b.Validate(); err != nil {
		t.Fatal(err)
	}
	return newAccount(b)
}

// takeAt takes a call of Class c at its slot, sleeping until then, and
// returns the slot's offset from start.
func takeAt(t testing.TB, a *Account, c Class, start time.Time) time.Duration {
	t.Helper()
	at, why := a.NextSlot(c, time.Time{})
	if why == WaitBlock {
		t.Fatal("blocked")
	}
	time.Sleep(time.Until(at))
	if ok, _, _, _ := a.TryTake(c, time.Time{}); !ok {
		t.Fatalf("no call at the slot %v", at.Sub(start))
	}
	return at.Sub(start)
}

// wait is Acquire without the time waited, its error as the *Refusal it
// always is.
func (a *Account) wait(ctx context.Context, c Class) *Refusal {
	_, err := a.Acquire(ctx, c)
	if err == nil {
		return nil
	}
	var r *Refusal
	if !errors.As(err, &r) {
		panic(fmt.Sprintf("Acquire's error %v (%T) is not a *Refusal", err, err))
	}
	return r
}

func TestBudgetWaitsOrFailsByDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newTestAccount(t, New(3, time.Second))
		start := time.Now()
		ctx := context.Background()
		for i := 0; i < 3; i++ {
			if e := a.wait(ctx, Priority); e != nil {
				t.Fatalf("call %d: %v", i, e)
			}
		}
		// A caller whose deadline comes before a call frees is refused at
		// once, with the wait it would need: the oldest call leaves the window
		// after 1 s, and a 300th of it (the ring's margin for calls that
		// arrive later than they left).
		window := time.Second + time.Second/ringMargin
		dctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		defer cancel()
		e := a.wait(dctx, Priority)
		if e == nil || e.Cause != CauseBudget || e.Wait != window || e.Err != nil || time.Since(start) != 0 {
			t.Fatalf("err = %v after %v", e, time.Since(start))
		}
		// A caller without a deadline waits for it.
		type result struct {
			e  *Refusal
			at time.Time
		}
		done := make(chan result, 1)
		go func() { e := a.wait(ctx, Priority); done <- result{e, time.Now()} }()
		synctest.Wait()
		select {
		case r := <-done:
			t.Fatalf("the caller did not wait: %v", r.e)
		default:
		}
		r := <-done
		if r.e != nil {
			t.Fatal(r.e)
		}
		if waited := r.at.Sub(start); waited != window {
			t.Fatalf("waited %v, want %v", waited, window)
		}
	})
	if got := Unlimited().String(); got != "unlimited" {
		t.Errorf("Unlimited() = %q", got)
	}
}

// Without rate-limit headers, calls without Priority follow the local
// budget's even pace: a burst, then one call per Per/Calls/(1 - Reserve).
func TestPacingSpreadsCallsEvenly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// One call a second, half of it kept for Priority work: other work
		// bursts 2 calls (half of the burst's 4 further calls, and the
		// first), then one per 2 s.
		a := newTestAccount(t, New(100, 100*time.Second).WithBurst(5).WithReserve(0.5))
		start := time.Now()
		var got []time.Duration
		for range 12 {
			got = append(got, takeAt(t, a, Normal, start))
		}
		want := []time.Duration{0, 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20}
		for i := range want {
			if got[i] != want[i]*time.Second {
				t.Fatalf("calls at %v, want %v s", got, want)
			}
		}
		// After a quiet spell the burst is back, and no more.
		time.Sleep(time.Minute)
		start = time.Now()
		got = got[:0]
		for range 4 {
			got = append(got, takeAt(t, a, Normal, start))
		}
		if got[1] != 0 || got[2] != 2*time.Second || got[3] != 4*time.Second {
			t.Fatalf("after a quiet minute: calls at %v", got)
		}
	})
}

// Whatever the concurrency, no window of length Per ever holds more than
// Calls calls.
func TestBudgetIsNeverExceeded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := New(7, 300*time.Millisecond).WithBurst(7)
		a := newTestAccount(t, b)
		var mu sync.Mutex
		var stamps []time.Time
		var wg sync.WaitGroup
		for g := 0; g < 32; g++ {
			wg.Go(func() {
				c := Class(g % 2)
				for i := 0; i < 20; i++ {
					if e := a.wait(context.Background(), c); e != nil {
						t.Error(e)
						return
					}
					// The call was taken now: fake time has not moved
					// since, as this goroutine has not blocked.
					at := time.Now()
					mu.Lock()
					stamps = append(stamps, at)
					mu.Unlock()
					a.Answered(nil)
				}
			})
		}
		wg.Wait()
		if len(stamps) != 640 {
			t.Fatalf("%d calls", len(stamps))
		}
		sort.Slice(stamps, func(i, j int) bool { return stamps[i].Before(stamps[j]) })
		for i := b.Calls(); i < len(stamps); i++ {
			if d := stamps[i].Sub(stamps[i-b.Calls()]); d < b.Per() {
				t.Fatalf("calls %d and %d are %v apart: %d calls within %v", i-b.Calls(), i, d, b.Calls()+1, b.Per())
			}
		}
	})
}

// Work without Priority goes at most at (1 - Reserve) of the pace and
// never takes the window's last calls; Priority work may take all of it.
func TestReserveKeepsCallsForPriority(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newTestAccount(t, New(20, 20*time.Second).WithBurst(10).WithReserve(0.5))
		start := time.Now()
		// Normal work gets half the burst (4 of 9 intervals of tolerance at
		// twice the interval): 4 go at once, then one per 2 s (1 s / (1 - 0.5)).
		var normals []time.Duration
		for range 6 {
			normals = append(normals, takeAt(t, a, Normal, start))
		}
		if normals[3] != 0 || normals[4] != 2*time.Second || normals[5] != 4*time.Second {
			t.Fatalf("Normal calls at %v", normals)
		}
		// Priority work finds a call at once: the reserve.
		if at, _ := a.NextSlot(Priority, time.Time{}); at.After(time.Now()) {
			t.Fatalf("Priority waits %v", time.Until(at))
		}
		// Normal work waits while Priority work goes.
		for range 3 {
			takeAt(t, a, Priority, start)
		}
		pAt, _ := a.NextSlot(Priority, time.Time{})
		nAt, _ := a.NextSlot(Normal, time.Time{})
		if !nAt.After(pAt) {
			t.Fatalf("Normal slot %v not after Priority slot %v", nAt.Sub(start), pAt.Sub(start))
		}
	})
	if got := New(20, time.Second).WithBurst(50).Burst(); got != 20 {
		t.Errorf("a burst above Calls is %d", got)
	}
}

func rateHeaders(r, t, q, w int) http.Header {
	h := http.Header{}
	h.Set("Ratelimit", fmt.Sprintf(`"default";r=%d;t=%d`, r, t))
	if q > 0 {
		h.Set("Ratelimit-Policy", fmt.Sprintf(`"burst";q=%d;w=%d`, q, w))
	}
	return h
}

// The account's remaining calls and reset time, from Cloudflare's headers,
// set the pace, whatever the local budget allows.
func TestRateLimitHeadersSetThePace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newTestAccount(t, Unlimited().WithBurst(1).WithReserve(MinReserve))
		start := time.Now()
		if at, _ := a.NextSlot(Normal, time.Time{}); !at.Equal(start) {
			t.Fatal("no headers, no limit: a call should go at once")
		}
		a.take(start, Normal)
		a.Answered(rateHeaders(60, 60, 1200, 300))
		st := a.State()
		if st.Remaining != 60 || !st.Reset.Equal(start.Add(time.Minute)) || st.Quota != 1200 || st.Window != 300*time.Second ||
			!st.Seen.Equal(start) || st.Estimate != 60 || st.Pace != time.Second {
			t.Fatalf("state %+v", st)
		}
		// 60 calls over 60 s: about one a second (the remaining calls over
		// the time left, after each call).
		var got []time.Duration
		for i := range 4 {
			got = append(got, takeAt(t, a, Normal, start))
			if lo, hi := time.Duration(i)*time.Second, time.Duration(i)*1050*time.Millisecond; got[i] < lo || got[i] > hi {
				t.Fatalf("calls at %v", got)
			}
		}
		if st := a.State(); st.Estimate != 56 || st.InFlight != 4 {
			t.Fatalf("after 4 calls: %+v", st)
		}
		// Nothing left: wait for the reset (plus a margin for the rounding of t).
		for range 4 {
			a.Answered(nil)
		}
		time.Sleep(time.Second)
		a.take(time.Now(), Priority)
		a.Answered(rateHeaders(0, 30, 1200, 300))
		reset := time.Now().Add(30 * time.Second)
		at, why := a.NextSlot(Priority, time.Time{})
		if why != WaitBudget || !at.Equal(reset.Add(resetMargin)) {
			t.Fatalf("slot %v (%v), want the reset + margin", at.Sub(start), why)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if e := a.wait(ctx, Priority); e == nil || e.Cause != CauseBudget || e.Wait != 31*time.Second {
			t.Fatalf("err = %v", e)
		}
		// After the reset, until new headers come, the policy's even pace:
		// 1200 calls per 300 s, of which work without Priority takes 99 %.
		time.Sleep(time.Until(reset.Add(resetMargin)))
		p0 := takeAt(t, a, Normal, time.Now())
		p1 := takeAt(t, a, Normal, time.Now())
		_, cost := a.class(Normal)
		if want := time.Duration(math.Ceil(cost * float64(250*time.Millisecond))); p0 != 0 || p1 != want {
			t.Fatalf("after the reset: %v, %v; want 0, %v", p0, p1, want)
		}
		// Priority work follows the pace while its deadline allows; one
		// whose deadline cannot wait for it goes at once.
		paced, _ := a.NextSlot(Priority, time.Time{})
		if !paced.After(time.Now()) {
			t.Fatalf("Priority work without a deadline is not held to the pace")
		}
		if at, _ := a.NextSlot(Priority, paced.Add(time.Second)); !at.Equal(paced) {
			t.Fatalf("Priority work whose deadline allows the pace waits %v; want %v", time.Until(at), time.Until(paced))
		}
		if at, _ := a.NextSlot(Priority, paced.Add(-time.Millisecond)); !at.Equal(time.Now()) {
			t.Fatalf("Priority work whose deadline cannot wait for the pace waits %v", time.Until(at))
		}
	})
}

// Answers arriving out of order never raise the estimate within a window;
// a new window replaces it; calls in flight count as spent.
func TestHeaderViewMerging(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newTestAccount(t, Unlimited())
		for range 3 {
			a.take(time.Now(), Normal)
		}
		a.Answered(rateHeaders(100, 60, 0, 0)) // two more in flight
		if st := a.State(); st.Estimate != 98 || st.Remaining != 100 {
			t.Fatalf("state %+v", st)
		}
		a.Answered(rateHeaders(90, 60, 0, 0)) // one in flight
		if st := a.State(); st.Estimate != 89 {
			t.Fatalf("after r=90: %+v", st)
		}
		a.Answered(rateHeaders(95, 60, 0, 0)) // an older answer, late
		if st := a.State(); st.Estimate != 89 || st.Remaining != 95 {
			t.Fatalf("after a late r=95: %+v", st)
		}
		time.Sleep(61 * time.Second)
		a.take(time.Now(), Normal)
		a.Answered(rateHeaders(1199, 300, 0, 0))
		if st := a.State(); st.Estimate != 1199 || !st.Reset.Equal(time.Now().Add(300*time.Second)) {
			t.Fatalf("new window: %+v", st)
		}
	})
}

// Several replicas on one account, each wanting every call it can get,
// share the account's budget through the headers alone: no window ever
// holds more than the quota (no 971), the calls are spread over each
// window rather than spent at its start, and each replica gets a fair
// share.
func TestReplicasShareTheAccountEvenly(t *testing.T) {
	for _, tc := range []struct {
		replicas int
		rtt      time.Duration
	}{{1, 20 * time.Millisecond}, {4, 50 * time.Millisecond}, {8, 300 * time.Millisecond}, {3, 2 * time.Second}, {16, time.Second}, {12, 20 * time.Millisecond}} {
		t.Run(fmt.Sprintf("%d replicas, %v calls", tc.replicas, tc.rtt), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { simulateReplicas(t, tc.replicas, tc.rtt) })
		})
	}
}

// simulateReplicas plays replicas, in the bubble's fake time, against a
// simAccount whose answers take rtt.
func simulateReplicas(t *testing.T, replicas int, rtt time.Duration) {
	const (
		quota   = 1200
		window  = 300 * time.Second
		windows = 4
	)
	start := time.Now()
	srv := &simAccount{quota: quota, window: window}
	accts := make([]*Account, replicas)
	for i := range accts {
		accts[i] = newAccount(Budget{})
	}
	type answer struct {
		at   time.Time
		acct int
		h    http.Header
	}
	var pending []answer
	perReplica := make([]int, replicas)
	var sent []time.Time
	end := start.Add(windows * window)
	for {
		// The next event: an answer, or the earliest replica's slot.
		next, who := end, -1
		for i, a := range accts {
			if at, why := a.NextSlot(Normal, time.Time{}); why != WaitBlock && at.Before(next) {
				next, who = at, i
			}
		}
		ans := -1
		for i, p := range pending {
			if !p.at.After(next) {
				next, ans, who = p.at, i, -1
			}
		}
		if !next.Before(end) {
			break
		}
		time.Sleep(time.Until(next))
		if ans >= 0 {
			p := pending[ans]
			pending = append(pending[:ans], pending[ans+1:]...)
			accts[p.acct].Answered(p.h)
			continue
		}
		if ok, _, _, _ := accts[who].TryTake(Normal, time.Time{}); !ok {
			continue // the pace moved on as time did: plan again
		}
		now := time.Now()
		h, refused := srv.call(now)
		if refused {
			t.Fatalf("replica %d got a 971 at %v", who, now.Sub(start))
		}
		perReplica[who]++
		sent = append(sent, now)
		pending = append(pending, answer{at: now.Add(rtt), acct: who, h: h})
	}
	// Per window (the server's), per quarter of it.
	quarters := make([]int, windows*4)
	for _, s := range sent {
		quarters[int(s.Sub(start)/(window/4))]++
	}
	total := len(sent)
	t.Logf("%d calls in %d windows of %d; per replica %v; per quarter window %v", total, windows, quota, perReplica, quarters)
	if total < windows*quota*7/10 {
		t.Errorf("only %d of %d calls used", total, windows*quota)
	}
	for i, q := range quarters {
		if i == 0 {
			// Replicas starting together each take a lone client's pace
			// until they have seen each other spend.
			continue
		}
		if q < quota/4*6/10 || q > quota/4*14/10 {
			t.Errorf("quarter %d holds %d calls; an even pace gives about %d", i, q, quota/4)
		}
	}
	for i, n := range perReplica {
		if n < total/replicas*7/10 {
			t.Errorf("replica %d made %d calls of %d", i, n, total)
		}
	}
}

// simAccount is Cloudflare's side of the budget as d1local plays it: a
// window opens with the first call, holds quota calls, and a call beyond
// them is refused.
type simAccount struct {
	quota  int
	window time.Duration
	start  time.Time
	count  int
}

func (s *simAccount) call(now time.Time) (http.Header, bool) {
	if s.start.IsZero() || !now.Before(s.start.Add(s.window)) {
		s.start, s.count = now, 0
	}
	if s.count >= s.quota {
		return nil, true
	}
	s.count++
	reset := s.start.Add(s.window).Sub(now)
	return rateHeaders(s.quota-s.count, int((reset+time.Second-1)/time.Second), s.quota, int(s.window/time.Second)), false
}

// Calls are plentiful when one may go now and the even pace allows n of
// them in a round trip: never under Cloudflare's default budget, always
// without a limit, and not while the account's headers say calls are
// scarce or a 971 block is on.
func TestPlentiful(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const rtt = 20 * time.Millisecond
		for _, tc := range []struct {
			name string
			b    Budget
			want bool
		}{
			{"unlimited", Unlimited(), true},
			{"the default budget", Budget{}, false},
			{"a pace of 1 ms", New(300_000, 300*time.Second), true},
			{"a pace of 10 ms", New(30_000, 300*time.Second), false},
		} {
			a := newTestAccount(t, tc.b)
			if got := a.Plentiful(Normal, 4, rtt); got != tc.want {
				t.Errorf("%s: plentiful = %v, want %v", tc.name, got, tc.want)
			}
		}
		// Unlimited here, but the account's headers set a pace: 60 calls
		// left in 60 s.
		a := newTestAccount(t, Unlimited())
		a.take(time.Now(), Normal)
		a.Answered(rateHeaders(60, 60, 1200, 300))
		if a.Plentiful(Normal, 4, rtt) {
			t.Error("plentiful at one call a second")
		}
		// A budget with no call now is not plentiful, whatever its pace.
		a = newTestAccount(t, New(300_000, 300*time.Second).WithBurst(1))
		a.take(time.Now(), Priority)
		if a.Plentiful(Normal, 4, rtt) {
			t.Error("plentiful with no call to spare now")
		}
		time.Sleep(time.Millisecond)
		if !a.Plentiful(Normal, 4, rtt) {
			t.Error("not plentiful once the pace has a call again")
		}
		// During a 971 block nothing is.
		a = newTestAccount(t, Unlimited())
		a.take(time.Now(), Normal)
		a.Block(time.Now().Add(time.Minute))
		if a.Plentiful(Normal, 4, rtt) {
			t.Error("plentiful during a 971 block")
		}
	})
}

// This process's calls answered out of order are not others' spending:
// two calls in flight, D1 counts both, and the later one's answer comes
// first; the fall of r is this process's, and its share stays whole.
func TestOwnCallsAnsweredOutOfOrderAreNotOthers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newTestAccount(t, Unlimited())
		a.take(time.Now(), Normal)
		time.Sleep(100 * time.Millisecond)
		a.Answered(rateHeaders(10, 60, 1200, 300)) // a round trip of 100 ms
		a.take(time.Now(), Normal)
		a.take(time.Now(), Normal)
		time.Sleep(100 * time.Millisecond)
		a.Answered(rateHeaders(8, 60, 1200, 300)) // the second call's answer
		a.Answered(rateHeaders(9, 60, 1200, 300)) // the first's, late
		if a.others != 0 || a.share() != 1 {
			t.Fatalf("others spend %g calls/s, this process's share %g; want none and all", a.others, a.share())
		}
	})
}
