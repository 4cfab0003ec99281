package budget

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"net/http"
	"sync"
	"time"
)

// Class is how a call draws on the budget; its values index arrays.
type Class uint8

const (
	// Normal is new work (claims, lookups, reads).
	Normal Class = iota
	// Priority is work that finishes what was started (completions,
	// heartbeats, releases).
	Priority
)

const (
	// resetMargin is added to a reset before calls resume: t is whole seconds.
	resetMargin = time.Second
	// windowSlack is how far two reset times of one window may differ.
	windowSlack = 1500 * time.Millisecond
	// ringMargin widens the local window by Per/ringMargin: calls sent Per
	// apart can arrive closer than that, and Cloudflare counts arrivals.
	ringMargin = 300
	// othersHalfLife smooths the estimate of the calls others spend.
	othersHalfLife = 15 * time.Second
	// minShare is the least share of the account's even pace a client takes.
	minShare = 1.0 / 64
)

// Account is the API budget of one Cloudflare account as this process sees
// it from the Ratelimit headers of every answer, so that replicas, wrangler
// and the dashboard share one budget with no coordination. The remaining
// calls are spent evenly until the reset, less what others are seen to
// spend, after a burst of Budget.Burst; the local Budget's pace is an upper
// bound. Priority calls follow the pace while their deadline allows, and
// otherwise go while this process's share of the account has a call left.
// Normal calls go at most at (1 - Budget.Reserve) of the pace and never
// take a window's last Budget.Kept calls, so completions always find one.
// After a 971 block (Block), nothing is sent until it ends. An Account is
// safe for concurrent use.
type Account struct {
	budget Budget // validated

	mu        sync.Mutex
	ring      []time.Time // send times of the last Calls calls (zero: none), oldest at head
	head      int
	localPace pace          // the local Budget's even pace
	localStep time.Duration // its interval; 0: none
	acctPace  pace          // the account's, from the headers
	paceEnd   time.Time     // the end of the window acctPace was kept in; zero: none

	view    accountView
	sample  accountView   // the last header, for the estimate of others' spending
	others  float64       // calls per second others spend, smoothed
	ours    float64       // and this process
	replies int64         // answers received
	sentAt  []time.Time   // send times of the calls taken and not yet answered, oldest first
	rtt     time.Duration // smoothed time from a call's send to its answer; see RoundTrip

	blockedUntil time.Time
	changed      chan struct{} // closed, and replaced, when the view changes

	lanes []*Lane    // the lanes with debts
	needs []laneNeed // fits's scratch
}

// accountView is the account's budget as the last Ratelimit headers gave it.
type accountView struct {
	seen      time.Time // when the headers arrived; zero when never
	remaining int       // the headers' r, less this process's calls since
	header    int       // the headers' own r
	reset     time.Time
	quota     int           // Ratelimit-Policy's q; 0 when unknown
	window    time.Duration // and w
	replies   int64         // the answers received by then (in sample)
}

// NewAccount returns an Account that paces calls within b, or Validate's
// error. Share it among everything of this process using one account.
func NewAccount(b Budget) (*Account, error) {
	if err := b.Validate(); err != nil {
		return nil, fmt.Errorf("budget: %w", err)
	}
	return newAccount(b), nil
}

func newAccount(b Budget) *Account {
	a := &Account{budget: b, changed: make(chan struct{})}
	if !b.IsUnlimited() {
		a.ring = make([]time.Time, b.Calls())
		a.localStep = b.Per() / time.Duration(b.Calls())
	}
	return a
}

// Budget returns the Budget the Account was made with.
func (a *Account) Budget() Budget { return a.budget }

// String describes the Account by its Budget.
func (a *Account) String() string { return "budget.Account{" + a.budget.String() + "}" }

// State is what an Account knows of its budget at one moment.
type State struct {
	Seen         time.Time     // when the last Ratelimit headers arrived; zero: never
	Remaining    int           // the calls left to the account, as they said
	Reset        time.Time     // when its window resets, as they said
	Quota        int           // Ratelimit-Policy's q; zero when it was absent
	Window       time.Duration // and its w
	Estimate     int           // the calls this process believes are left now; -1 without current headers
	Pace         time.Duration // the time between calls at the current even pace; zero: no limit
	InFlight     int           // the calls sent and not yet answered
	BlockedUntil time.Time     // the end of a 971 block, if one is on
	Owed         int           // debts admitted and not yet paid (see Debt)
}

// Pace returns the time between calls at the current even pace (the
// local Budget's, or the account's from its headers, the longer); zero when
// nothing sets one.
func (a *Account) Pace() time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	return max(a.localStep, a.accountInterval(time.Now()))
}

// State returns the Account's view of the budget.
func (a *Account) State() State {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := time.Now()
	st := State{
		Seen: a.view.seen, Remaining: a.view.header, Reset: a.view.reset,
		Quota: a.view.quota, Window: a.view.window, Estimate: -1, InFlight: len(a.sentAt),
	}
	a.forgive(now)
	st.Owed = a.owed()
	if a.fresh(now) {
		st.Estimate = a.estimate(now)
	}
	if now.Before(a.blockedUntil) {
		st.BlockedUntil = a.blockedUntil
	}
	st.Pace = max(a.localStep, a.accountInterval(now))
	return st
}

// Reason says what a call waits for.
type Reason uint8

const (
	NotWaiting Reason = iota // a call may go now
	WaitBudget               // the budget has no call for it until then
	WaitBlock                // a 971 block is on until then
)

// slot returns when a call of class c, of use until deadline (zero: none),
// may be sent, and what it waits for: the hard limits, then the paces,
// which hold Priority work only while the slot and a round trip allow.
func (a *Account) slot(now time.Time, c Class, deadline time.Time) (time.Time, Reason) {
	if now.Before(a.blockedUntil) {
		return a.blockedUntil, WaitBlock
	}
	burst, cost := a.class(c)
	at := latest(now, a.localLimit(now, c), a.accountLimit(now, c))
	paced := latest(at, a.localPace.slot(now, a.localStep, float64(burst-1)*cost), a.accountPaceSlot(now, c, burst, cost))
	if c == Normal || deadline.IsZero() || !paced.Add(a.rtt).After(deadline) {
		at = paced
	}
	if at.After(now) {
		return at, WaitBudget
	}
	return now, NotWaiting
}

// latest returns the latest of t and ts.
func latest(t time.Time, ts ...time.Time) time.Time {
	for _, u := range ts {
		if u.After(t) {
			t = u
		}
	}
	return t
}

// class returns the burst of class c and what its call adds to a pace's
// debt: Normal work bursts less and counts 1/(1 - Reserve), so that it gets
// at most (1 - Reserve) of the pace, and Priority work finds a call.
func (a *Account) class(c Class) (burst int, cost float64) {
	burst, reserve := a.budget.Burst(), a.budget.Reserve()
	if c == Normal {
		return normalBurst(burst, reserve), 1 / (1 - reserve)
	}
	return burst, 1
}

// pace is an even pace with a burst: a debt in calls, draining at one per
// interval (0: no pace); a call may go while the debt is at most its
// tolerance, and adds its cost. In calls, a burst survives interval changes.
type pace struct {
	debt float64
	at   time.Time
}

func (p *pace) level(now time.Time, interval time.Duration) float64 {
	return max(0, p.debt-float64(now.Sub(p.at))/float64(interval))
}

// slot returns when the debt drains to tolerance.
func (p *pace) slot(now time.Time, interval time.Duration, tolerance float64) time.Time {
	if interval <= 0 {
		return now
	}
	over := p.level(now, interval) - tolerance
	return now.Add(time.Duration(math.Ceil(max(over, 0) * float64(interval))))
}

func (p *pace) take(now time.Time, interval time.Duration, cost float64) {
	if interval <= 0 {
		return
	}
	p.debt, p.at = p.level(now, interval)+cost, now
}

// localLimit is when the local ring lets a call of class c go: never more
// than Calls in a window of Per, and for Normal work never the last Kept.
func (a *Account) localLimit(now time.Time, c Class) time.Time {
	if a.ring == nil {
		return now
	}
	// Once the keep-th oldest call of the ring has left the window.
	keep := 0
	if c == Normal {
		keep = min(a.budget.Kept(), len(a.ring)-1)
	}
	per := a.budget.Per()
	return latest(now, a.ring[(a.head+keep)%len(a.ring)].Add(per+per/ringMargin))
}

// fresh reports whether the headers' view describes the current window.
func (a *Account) fresh(now time.Time) bool {
	return !a.view.seen.IsZero() && now.Before(a.view.end())
}

func (v *accountView) end() time.Time { return v.reset.Add(resetMargin) }

// accountInterval is the account's pace: the calls left to this process
// (at least its share) over the time to the reset, or after it the
// policy's; 0 when nothing sets one, or no call is left before the reset.
func (a *Account) accountInterval(now time.Time) time.Duration {
	rem, span := a.view.quota, a.view.window // zero when unknown
	if a.fresh(now) {
		rem, span = a.estimate(now), max(a.view.reset.Sub(now), resetMargin)
	}
	if rem <= 0 || span <= 0 {
		return 0
	}
	even := float64(rem) / span.Seconds() // calls per second for the account
	return time.Duration(float64(time.Second) / max(even-a.others, even*a.share()))
}

// share is this process's share of what the account spends, at least
// minShare, so that an overestimate of others' spending never stops it.
func (a *Account) share() float64 {
	if a.ours+a.others <= 0 {
		return 1
	}
	return max(a.ours/(a.ours+a.others), minShare)
}

// accountFloor is the calls of the account's window Normal work leaves:
// Kept, or while others spend Kept / share, this process's share being Kept.
func (a *Account) accountFloor() int {
	k := a.budget.Kept()
	if a.others <= 0 {
		return k
	}
	return int(math.Ceil(float64(k) / a.share()))
}

// estimate is the calls the account has left now: r, less this process's
// calls since and others' expected spending until a call now is answered.
func (a *Account) estimate(now time.Time) int {
	rem := a.view.remaining
	if a.others > 0 {
		ahead := now.Sub(a.view.seen) + a.rtt
		rem -= int(math.Ceil(a.others*ahead.Seconds())) + 1
	}
	return rem
}

// accountLimit is when the account's calls left before its reset let a
// call of class c go: Normal work while more than accountFloor are left,
// Priority work while this process's share of them (all while nobody else
// spends) holds one, so that several processes do not overrun the account.
func (a *Account) accountLimit(now time.Time, c Class) time.Time {
	left := a.estimate(now) - a.accountFloor()
	if c == Priority {
		left = a.priorityLeft(now)
	}
	if a.fresh(now) && left <= 0 {
		return a.view.end() // nothing left to it before the reset
	}
	return now
}

// priorityLeft is this process's share of the calls the account has left
// before its reset (all of them while nobody else spends): calls in flight,
// unknown to others yet, count against its share.
func (a *Account) priorityLeft(now time.Time) int {
	n := len(a.sentAt)
	left := a.estimate(now) + n
	if a.others > 0 {
		left = int(float64(left) * a.share())
	}
	return left - n
}

// accountPaceSlot is when the account's pace lets a call of class c go: its
// burst is this process's share, at most the calls left to the class.
func (a *Account) accountPaceSlot(now time.Time, c Class, burst int, cost float64) time.Time {
	burst = max(1, int(math.Round(float64(burst)*a.share())))
	if a.fresh(now) {
		left := a.estimate(now)
		if c == Normal {
			left -= a.accountFloor()
		}
		burst = max(1, min(burst, left))
	}
	at := a.acctPace.slot(now, a.accountInterval(now), float64(burst-1)*cost)
	if a.fresh(now) && at.After(a.view.end()) {
		at = a.view.end() // a new window, and a new pace, begin sooner
	}
	return at
}

// take records a call of class c sent at now, which slot allowed.
func (a *Account) take(now time.Time, c Class) {
	_, cost := a.class(c)
	if !a.budget.IsUnlimited() {
		a.ring[a.head] = now
		a.head = (a.head + 1) % len(a.ring)
		a.localPace.take(now, a.localStep, cost)
	}
	if !a.fresh(now) && a.paceEnd.Before(now) && !a.paceEnd.IsZero() {
		a.acctPace = pace{} // the window has ended: so has its pace
	}
	a.acctPace.take(now, a.accountInterval(now), cost)
	a.paceEnd = time.Time{}
	if a.fresh(now) {
		a.view.remaining--
		a.paceEnd = a.view.end()
	}
	a.sentAt = append(a.sentAt, now)
}

// A Call is a call about to be taken, as TryCall and AcquireCall see it.
type Call struct {
	Class    Class
	Deadline time.Time // when its answer is of no more use; zero: none
	// Lane is the line of calls it is taken on; nil: none.
	Lane *Lane
	// Drained says that it carries all the Priority work waiting in Lane.
	Drained bool
	// Pays are the debts it pays back when it is taken, and PayShare the
	// largest share of the call (0 to 1) the work paying one of them takes:
	// Lane learns from it how many paying calls its debts may need.
	Pays     []*Debt
	PayShare float64
	// Owes are the debts it would admit to Lane, in order: it admits the
	// first of them the budget can keep the calls for, from none to all.
	Owes []*Debt
	// Others says that it carries work besides Owes: it is taken even if
	// none of them is admitted. A call with no Owes always carries others.
	Others bool
}

// TryTake takes a call of class c, of use until deadline (zero: none), if
// one may go now. Otherwise it returns when one may, what it waits for, and
// a channel closed when the Account's view, and so that time, may change.
func (a *Account) TryTake(c Class, deadline time.Time) (ok bool, at time.Time, why Reason, changed <-chan struct{}) {
	_, ok, at, why, changed = a.TryCall(&Call{Class: c, Deadline: deadline})
	return ok, at, why, changed
}

// TryCall takes call c if it may go now, and returns how many of c.Owes it
// admitted; otherwise it returns as TryTake does. Besides TryTake's limits,
// a call must leave the calls the unpaid debts may need (see fits): free
// now, or freed by the local window and the account's reset in time.
// Priority work that pays a debt and does not fit goes as soon as its
// lane's spacing allows (see owedGate); other Priority work that does not
// fit waits for calls to be freed or debts paid. A call admits the first of
// c.Owes that fit with the calls of Budget.Kept but one to spare, and Normal
// work must leave those too: it does not go unless it fits and carries
// others or admits one.
func (a *Account) TryCall(c *Call) (admitted int, ok bool, at time.Time, why Reason, changed <-chan struct{}) {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := time.Now()
	a.forgive(now)
	if at, why = a.slot(now, c.Class, c.Deadline); why != NotWaiting {
		return 0, false, at, why, a.changed
	}
	oc := owedCall{lane: c.Lane, pays: c.Pays, drained: c.Drained}
	if c.Class == Priority && !a.fits(now, oc, false, 0) {
		at = a.nextSupply(now)
		switch {
		case len(c.Pays) == 0: // it waits for calls no debt needs
		case c.Lane == nil:
			at = now
		default:
			if gate := a.owedGate(c.Lane, now); at.IsZero() || gate.Before(at) {
				at = gate
			}
		}
		if at.After(now) || at.IsZero() {
			return 0, false, cmp.Or(at, now.Add(time.Second)), WaitBudget, a.changed
		}
	}
	spare := a.budget.Kept() - 1
	owes := a.admissible(now, oc, c.Owes, spare)
	if c.Class == Normal && len(owes) == 0 && (!c.Others && len(c.Owes) > 0 || !a.fits(now, oc, true, spare)) {
		return 0, false, cmp.Or(a.nextSupply(now), now.Add(time.Second)), WaitBudget, a.changed
	}
	a.take(now, c.Class)
	a.settle(now, c, owes)
	return len(owes), true, now, NotWaiting, nil
}

// admissible returns, with a.mu held, the first of the debts not yet
// admitted nor paid that a call oc can admit: as many as fit, with spare
// calls (fits is monotone in their number).
func (a *Account) admissible(now time.Time, oc owedCall, debts []*Debt, spare int) []*Debt {
	if oc.lane == nil {
		return nil
	}
	owes := make([]*Debt, 0, len(debts))
	for _, d := range debts {
		if !d.Admitted() && !d.paid.Load() {
			owes = append(owes, d)
		}
	}
	if len(owes) == 0 {
		return nil // nothing to admit: no fits to run (TryCall runs it for Normal work)
	}
	if oc.owes = owes; a.fits(now, oc, true, spare) {
		return owes // the usual case: all of them
	}
	lo, hi := 0, len(owes)-1
	for lo < hi {
		mid := (lo + hi + 1) / 2
		if oc.owes = owes[:mid]; a.fits(now, oc, true, spare) {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return owes[:lo]
}

// settle records, with a.mu held, what call c, just taken, did to the
// debts: it admitted owes, paid c.Pays, and on its lane, paid with the share
// it says and, if drained, left nothing waiting.
func (a *Account) settle(now time.Time, c *Call, owes []*Debt) {
	for _, d := range owes {
		c.Lane.admit(d, now)
	}
	paid := false
	for _, d := range c.Pays {
		d.paid.Store(true)
		if l := d.lane.Load(); l != nil && l.a == a && l.remove(d) {
			paid = true
		}
	}
	if c.Lane != nil && len(c.Pays) > 0 {
		c.Lane.paid(c.PayShare)
	}
	if c.Lane != nil && c.Drained {
		c.Lane.last = now
	}
	if paid {
		a.notify() // what the debts need shrank
	}
}

// Acquire takes a call of class c, waiting as long as the context allows,
// and returns how long it waited (zero when it took one at once or none).
// When it takes none, its error is a *Refusal; it gives up at once when
// the call could not go and come back before the deadline, or in a block.
func (a *Account) Acquire(ctx context.Context, c Class) (waited time.Duration, err error) {
	_, waited, err = a.AcquireCall(ctx, &Call{Class: c})
	return waited, err
}

// AcquireCall is Acquire for call c, whose Deadline is the context's, and
// returns how many of c.Owes it admitted too (see TryCall).
func (a *Account) AcquireCall(ctx context.Context, c *Call) (admitted int, waited time.Duration, err error) {
	var since time.Time // when it started waiting
	dl, hasDeadline := ctx.Deadline()
	call := *c
	call.Deadline = dl
	for {
		rtt := a.RoundTrip()
		if left := time.Until(dl); hasDeadline && left < rtt {
			return 0, 0, &Refusal{Cause: CauseDeadline, Left: max(left, 0), RoundTrip: rtt, Err: context.DeadlineExceeded}
		}
		n, ok, at, why, changed := a.TryCall(&call)
		if ok && since.IsZero() {
			return n, 0, nil
		} else if ok {
			return n, time.Since(since), nil
		}
		now := time.Now()
		wait := at.Sub(now)
		if why == WaitBlock {
			return 0, 0, &Refusal{Cause: CauseBlock, Wait: wait, Until: at}
		}
		if hasDeadline && time.Until(dl) < wait+rtt {
			return 0, 0, &Refusal{Cause: CauseBudget, Wait: wait}
		}
		since = cmp.Or(since, now)
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return 0, 0, &Refusal{Cause: CauseBudget, Wait: max(time.Until(at), 0), Err: ctx.Err()}
		case <-timer.C:
		case <-changed:
			timer.Stop()
		}
	}
}

// Cause is why Acquire took no call.
type Cause uint8

const (
	CauseBudget   Cause = iota + 1 // no call before the deadline (a round trip included), or the context ended
	CauseBlock                     // a 971 block is on
	CauseDeadline                  // less than a round trip left before the deadline: a write's outcome would be unknown
)

// Refusal is Acquire's error: it took no call, and nothing is to be sent,
// so nothing can have happened. Beside each field, the causes that set it.
type Refusal struct {
	Cause           Cause
	Wait            time.Duration // until a call may go (CauseBudget) or the block ends (CauseBlock)
	Until           time.Time     // the end of the block (CauseBlock)
	Left, RoundTrip time.Duration // time left before the deadline, less than the round trip (CauseDeadline)
	Err             error         // the context's error when it ended (CauseBudget); DeadlineExceeded (CauseDeadline)
}

func (r *Refusal) Error() string {
	switch {
	case r.Cause == CauseBlock:
		return "budget: Cloudflare's global API rate limit (971) blocks the account until " + r.Until.UTC().Format(time.RFC3339)
	case r.Cause == CauseDeadline:
		return fmt.Sprintf("budget: %s left before the context's deadline, less than a round trip (%s)",
			r.Left.Round(time.Millisecond), r.RoundTrip.Round(time.Millisecond))
	case r.Err != nil:
		return fmt.Sprintf("budget: no call before the context ended (%v); one may go in %s", r.Err, r.Wait.Round(time.Millisecond))
	}
	return fmt.Sprintf("budget: no call before the context's deadline; one may go in %s", r.Wait.Round(time.Millisecond))
}

// Unwrap returns Err.
func (r *Refusal) Unwrap() error { return r.Err }

// RoundTrip is the expected time from a call's send to its answer: the
// smoothed round trip of the answers so far; zero before the first.
func (a *Account) RoundTrip() time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.rtt
}

// NextSlot returns when a call of class c, whose answer is of use until
// deadline (zero: no deadline), could be sent, and what it would wait for.
func (a *Account) NextSlot(c Class, deadline time.Time) (time.Time, Reason) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.slot(time.Now(), c, deadline)
}

// Spare reports whether a call of class c may go now, at the even pace.
func (a *Account) Spare(c Class) bool {
	at, why := a.NextSlot(c, time.Time{})
	return why == NotWaiting || !at.After(time.Now())
}

// Plentiful reports whether calls of class c are plentiful: one may go
// now, and the even pace allows at least n of them in a round trip of rtt.
func (a *Account) Plentiful(c Class, n int, rtt time.Duration) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := time.Now()
	if _, why := a.slot(now, c, time.Time{}); why != NotWaiting {
		return false
	}
	_, cost := a.class(c)
	step := time.Duration(float64(max(a.localStep, a.accountInterval(now))) * cost)
	return step == 0 || step*time.Duration(n) <= rtt
}

// Block stops every call until until: Cloudflare answered 429 with code
// 971, its global limit's block of the account.
func (a *Account) Block(until time.Time) {
	a.mu.Lock()
	a.blockedUntil = latest(a.blockedUntil, until)
	a.notify()
	a.mu.Unlock()
}

// Blocked returns the end of the 971 block, and whether one is on.
func (a *Account) Blocked() (until time.Time, on bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if time.Now().Before(a.blockedUntil) {
		return a.blockedUntil, true
	}
	return time.Time{}, false
}

func (a *Account) notify() {
	close(a.changed)
	a.changed = make(chan struct{})
}

// Answered records the answer to a call taken earlier, with its headers;
// h is nil when none arrived: the call counts, but measures no round trip.
func (a *Account) Answered(h http.Header) {
	lim, okLim := parseRateLimit(h.Values("Ratelimit")) // none from a nil h
	pol, okPol := parseRatePolicy(h.Values("Ratelimit-Policy"), lim.name)
	a.mu.Lock()
	defer a.mu.Unlock()
	now := time.Now()
	a.replies++
	if len(a.sentAt) > 0 {
		// Answers mostly come in the order of the calls: close enough.
		d := now.Sub(a.sentAt[0])
		a.sentAt = a.sentAt[1:]
		if h != nil { // only an answer measures a round trip
			a.rtt = cmp.Or(a.rtt, d) // the first one sets it
			a.rtt += (d - a.rtt) / 8
		}
	}
	if okPol {
		a.view.quota, a.view.window = pol.quota, pol.window
	}
	if !okLim {
		return
	}
	if w := a.view.window; w > 0 { // a window resets within its length
		lim.reset = min(lim.reset, w)
	}
	reset := now.Add(lim.reset)
	est := lim.remaining - len(a.sentAt) // calls in flight may be counted in r or not: count them
	if a.fresh(now) && reset.Sub(a.view.reset).Abs() <= windowSlack {
		a.view.remaining = min(a.view.remaining, est)
		a.view.reset = latest(a.view.reset, reset)
	} else {
		a.view.remaining, a.view.reset = est, reset
		a.acctPace, a.paceEnd = pace{}, time.Time{} // a new window: the old one's pace is over
	}
	a.view.seen, a.view.header = now, lim.remaining
	a.estimateOthers(now, lim.remaining, reset)
	a.notify()
}

// estimateOthers updates the rates at which others and this process spend:
// between two headers of a window, r fell by everyone's calls, this
// process's being those answered since and those still in flight that D1
// likely counted already, sent a round trip ago or more (answers come in
// any order).
func (a *Account) estimateOthers(now time.Time, r int, reset time.Time) {
	prev := a.sample
	same := !prev.seen.IsZero() && reset.Sub(prev.reset).Abs() <= windowSlack
	if same && r > prev.header {
		return // an older answer arriving late
	}
	a.sample = accountView{seen: now, header: r, reset: reset, replies: a.replies}
	dt := now.Sub(prev.seen)
	if !same || dt <= 0 {
		return // no sample across windows, nor over no time
	}
	ours := float64(a.replies - prev.replies)
	counted := 0
	for counted < len(a.sentAt) && !a.sentAt[counted].After(now.Add(-a.rtt)) {
		counted++
	}
	others := max(float64(prev.header-r)-ours-float64(counted), 0)
	alpha := 1 - math.Exp2(-dt.Seconds()/othersHalfLife.Seconds())
	a.others += alpha * (others/dt.Seconds() - a.others)
	a.ours += alpha * (ours/dt.Seconds() - a.ours)
}
