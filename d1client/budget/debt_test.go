package budget

import (
	"testing"
	"testing/synctest"
	"time"
)

// completionTerms are the terms of a claim whose completion can wait 2 s.
var completionTerms = Terms{Wait: 2 * time.Second}

// claim tries a Normal call on l that admits a new debt on terms, and
// returns the debt if the call was taken and admitted it.
func claim(a *Account, l *Lane, terms Terms) (*Debt, bool) {
	d := NewDebt(terms)
	n, ok, _, _, _ := a.TryCall(&Call{Class: Normal, Lane: l, Drained: true, Owes: []*Debt{d}})
	return d, ok && n == 1 && d.Admitted()
}

// pay tries a Priority call on l that pays ds, with deadline dl.
func pay(a *Account, l *Lane, dl time.Time, ds ...*Debt) (ok bool, at time.Time) {
	_, ok, at, _, _ = a.TryCall(&Call{Class: Priority, Deadline: dl, Lane: l, Drained: true, Pays: ds})
	return ok, at
}

// A Normal call admits a debt only while the window keeps, besides the
// calls of Kept but one, a call for every debt unpaid, their own included;
// past that, claims are refused, and the completions each find their
// call. Of 10 calls an hour (Kept 3): 4 claims and their 4 completions,
// and 2 calls left for other Priority work.
func TestDebtsKeepTheirCallsInTheWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newTestAccount(t, New(10, time.Hour))
		l := a.NewLane()
		var debts []*Debt
		for {
			d, ok := claim(a, l, completionTerms)
			if !ok {
				break
			}
			debts = append(debts, d)
			time.Sleep(100 * time.Millisecond)
		}
		if len(debts) != 4 || a.State().Owed != 4 {
			t.Fatalf("%d claims admitted (%d owed); want 4", len(debts), a.State().Owed)
		}
		// A read leaves the debts' calls too.
		if ok, _, _, _ := a.TryTake(Normal, time.Time{}); ok {
			t.Fatal("a Normal call took a call the debts need")
		}
		for i, d := range debts { // completions 50 ms apart
			if ok, at := pay(a, l, time.Now().Add(2*time.Second), d); !ok {
				t.Fatalf("completion %d found no call; one may go in %v", i, time.Until(at))
			}
			time.Sleep(50 * time.Millisecond)
		}
		if st := a.State(); st.Owed != 0 {
			t.Fatalf("%d debts owed after their completions", st.Owed)
		}
		if _, ok := claim(a, l, completionTerms); ok {
			t.Fatal("a claim was admitted with only the window's spare calls left")
		}
		if ok, _, _, _ := a.TryTake(Priority, time.Now().Add(time.Second)); !ok {
			t.Fatal("no call left for other Priority work")
		}
	})
}

// The account's remaining calls, from its Ratelimit headers, are kept for
// the debts as the local window's are: with 8 calls left before the reset
// (Kept 3), 3 claims are admitted, their completions find their calls, and
// claims are admitted again once the window has reset.
func TestDebtsKeepTheirCallsOfTheAccount(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newTestAccount(t, Unlimited())
		l := a.NewLane()
		a.take(time.Now(), Normal)
		a.Answered(rateHeaders(8, 60, 1200, 300))
		var debts []*Debt
		for {
			d, ok := claim(a, l, completionTerms)
			if !ok {
				break
			}
			a.Answered(nil)
			debts = append(debts, d)
		}
		if len(debts) != 3 {
			t.Fatalf("%d claims admitted with 8 calls left; want 3", len(debts))
		}
		for i, d := range debts {
			if ok, at := pay(a, l, time.Now().Add(2*time.Second), d); !ok {
				t.Fatalf("completion %d found no call; one may go in %v", i, time.Until(at))
			}
			a.Answered(nil)
		}
		time.Sleep(62 * time.Second) // past the reset
		if _, ok := claim(a, l, completionTerms); !ok {
			t.Fatal("no claim admitted after the reset")
		}
	})
}

// Lanes sharing an Account share its calls: the debts of one keep calls
// from the claims of the other.
func TestLanesShareTheDebts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newTestAccount(t, New(10, time.Hour))
		l1, l2 := a.NewLane(), a.NewLane()
		n := 0
		for i := 0; ; i++ {
			if _, ok := claim(a, []*Lane{l1, l2}[i%2], completionTerms); !ok {
				break
			}
			n++
		}
		if n != 4 {
			t.Fatalf("%d claims admitted on two lanes; one lane alone admits 4", n)
		}
	})
}

// A debt's paying call that does not fit (the account's calls shrank under
// it: others spent them) is not refused but held to its lane's spacing: it
// goes a Wait less two round trips after the lane's last call that carried
// all its waiting work, so that the completions ready meanwhile share it.
func TestOwedCallsWaitForTheirLaneToGather(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newTestAccount(t, Unlimited())
		l := a.NewLane()
		a.take(time.Now(), Normal)
		a.Answered(rateHeaders(100, 60, 1200, 300))
		var debts []*Debt
		for range 3 {
			d, ok := claim(a, l, completionTerms)
			if !ok {
				t.Fatal("claim refused")
			}
			a.Answered(nil)
			debts = append(debts, d)
		}
		last := time.Now() // the lane's last call
		// Others spend the account down to 2 calls before the reset.
		a.Answered(rateHeaders(2, 58, 1200, 300))
		spacing := completionTerms.Wait - a.lead()
		// The first completion, alone; then the second, joined at its gate
		// by the third.
		for i, ds := range [][]*Debt{debts[:1], debts[1:]} {
			time.Sleep(10 * time.Millisecond)
			ok, at := pay(a, l, time.Now().Add(2*time.Second), ds[0])
			if ok || !at.Equal(last.Add(spacing)) {
				t.Fatalf("completion call %d: taken %v, may go in %v; want it held %v after the lane's last call", i, ok, time.Until(at), spacing)
			}
			time.Sleep(time.Until(at))
			if ok, at := pay(a, l, time.Now().Add(2*time.Second), ds...); !ok {
				t.Fatalf("at its lane's gate, completion call %d waits %v more", i, time.Until(at))
			}
			a.Answered(nil)
			last = time.Now()
		}
	})
}

// A debt past its Life is forgiven; one paid before it was admitted is
// never admitted, and a Normal call carrying nothing else is not taken.
func TestDebtForgivenOrPaidFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newTestAccount(t, New(10, time.Hour))
		l := a.NewLane()
		if _, ok := claim(a, l, Terms{Wait: 2 * time.Second, Life: time.Minute}); !ok {
			t.Fatal("claim refused")
		}
		if n := a.State().Owed; n != 1 {
			t.Fatalf("%d owed", n)
		}
		time.Sleep(time.Minute)
		if n := a.State().Owed; n != 0 {
			t.Fatalf("%d owed past the debt's Life", n)
		}
		d := NewDebt(completionTerms)
		d.Pay()
		n, ok, _, _, _ := a.TryCall(&Call{Class: Normal, Lane: l, Owes: []*Debt{d}})
		if ok || n != 0 || d.Admitted() {
			t.Fatalf("a paid debt: taken %v, admitted %d (%v)", ok, n, d.Admitted())
		}
		var nilDebt *Debt
		nilDebt.Pay() // no panic
	})
}

// A debt whose work renews a lease owes its heartbeats too: of 10 calls an
// hour, claims 100 ms apart whose handlers beat every second (each beat
// can wait 2 s) are admitted 2 at a time, where claims owing only their
// completion are admitted 4 (TestDebtsKeepTheirCallsInTheWindow).
func TestDebtsOweTheirHeartbeats(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for terms, want := range map[Terms]int{
			completionTerms: 4,
			{Wait: 2 * time.Second, Every: time.Second, EveryWait: 2 * time.Second, Life: 10 * time.Second}: 2,
		} {
			a := newTestAccount(t, New(10, time.Hour))
			l := a.NewLane()
			n := 0
			for ; ; n++ {
				if _, ok := claim(a, l, terms); !ok {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			if n != want {
				t.Errorf("terms %+v: %d claims admitted; want %d", terms, n, want)
			}
		}
	})
}

// The completions of a lane share calls only as far as they fit in one:
// after a paying call that a completion filled (PayShare 1), one claim's
// call owing 20 completions that can wait 20 s admits 7 of them (each may
// need a call of its own, within the 10 s window of 10 calls); after one
// that took none of it, all 20 (one call carries them all).
func TestDebtsNeedTheShareOfACallTheirCompletionsTook(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		long := Terms{Wait: 20 * time.Second}
		for share, want := range map[float64]int{0: 20, 1: 7} {
			a := newTestAccount(t, New(10, 10*time.Second))
			l := a.NewLane()
			d, _ := claim(a, l, long)
			if _, ok, _, _, _ := a.TryCall(&Call{Class: Priority, Deadline: time.Now().Add(20 * time.Second), Lane: l, Drained: true, Pays: []*Debt{d}, PayShare: share}); !ok {
				t.Fatal("the completion found no call")
			}
			var ds []*Debt
			for range 20 {
				ds = append(ds, NewDebt(long))
			}
			if n, _, _, _, _ := a.TryCall(&Call{Class: Normal, Lane: l, Drained: true, Owes: ds}); n != want {
				t.Errorf("after a completion's share %v: %d of 20 debts admitted; want %d", share, n, want)
			}
		}
	})
}
