package budget

import (
	"math"
	"sync/atomic"
	"time"
)

// Terms are what a Debt owes: the Priority call that pays it back (a
// completion), and, while it is unpaid, the calls of a heartbeat.
type Terms struct {
	// Wait is the least time the paying call can wait for a call once it
	// is ready: the paying calls of one Lane ready within it of each other
	// share a call. Zero: it cannot wait, and takes a call of its own.
	Wait time.Duration
	// Every, if positive, is the period of further Priority calls made
	// from Every after the debt was admitted until it is paid (the
	// heartbeats of a lease), each of which can wait EveryWait for a call.
	Every, EveryWait time.Duration
	// Life bounds how long the debt can stay unpaid; past it, it is
	// forgiven. Zero: an hour.
	Life time.Duration
}

// defaultLife is the Life of Terms that give none.
const defaultLife = time.Hour

// A Debt is what work admitted by one call owes the budget: the Priority
// call that finishes it later, on its Terms. A client admits it when it
// takes the call that creates it (a claim), keeping for it, from then on,
// the calls its Terms may need, and pays it when it takes the call that
// finishes it (a completion, or a release); Pay pays it otherwise (the work
// was not admitted after all, or gave up). A Debt is admitted once; it is
// safe for concurrent use.
type Debt struct {
	terms Terms
	lane  atomic.Pointer[Lane] // set when admitted
	paid  atomic.Bool

	// Guarded by the lane's Account's mutex.
	since time.Time // when admitted
	index int       // in lane.debts; -1 when not there
}

// NewDebt returns an unpaid Debt on terms t, for a client to admit.
func NewDebt(t Terms) *Debt {
	if t.Life <= 0 {
		t.Life = defaultLife
	}
	return &Debt{terms: t, index: -1}
}

// Admitted reports whether a call admitted d. A nil Debt is never admitted.
func (d *Debt) Admitted() bool { return d != nil && d.lane.Load() != nil }

// Pay pays d back: the budget keeps nothing for it any longer. It may be
// called any number of times, on a nil Debt too; a Debt paid before it was
// admitted is never admitted.
func (d *Debt) Pay() {
	if d == nil || d.paid.Swap(true) {
		return
	}
	if l := d.lane.Load(); l != nil {
		l.a.mu.Lock()
		if l.remove(d) {
			l.a.notify()
		}
		l.a.mu.Unlock()
	}
}

// A Lane is a line of calls that carries, one call at a time, all the
// Priority work waiting in it (a client's group commit): the paying calls
// of its debts, ready within their Wait of each other, share a call. Make
// one per line with Account.NewLane; debts are admitted to the lane of the
// call that admits them.
type Lane struct {
	a *Account

	// Guarded by a.mu.
	debts  []*Debt
	last   time.Time // its last call that carried all its waiting Priority work
	share  float64   // of a call, the most one paying call of late took (see Call.PayShare)
	active bool      // in a.lanes
}

// shareDecay is how much a lane's share shrinks at each call paying debts
// that took less.
const shareDecay = 0.99

// paid records, with a.mu held, that a call paying debts, the largest of
// which took share of it, was taken on l.
func (l *Lane) paid(share float64) {
	l.share = max(min(share, 1), l.share*shareDecay)
}

// NewLane returns a new Lane on a.
func (a *Account) NewLane() *Lane { return &Lane{a: a} }

// Owed returns the debts admitted to l and not yet paid.
func (l *Lane) Owed() int {
	l.a.mu.Lock()
	defer l.a.mu.Unlock()
	return len(l.debts)
}

// admit records d as owed on l from now, unless it was paid or admitted
// already; with a.mu held.
func (l *Lane) admit(d *Debt, now time.Time) {
	if d.paid.Load() || !d.lane.CompareAndSwap(nil, l) {
		return
	}
	if d.paid.Load() { // paid meanwhile: Pay found no lane, or will find it absent
		return
	}
	d.since, d.index = now, len(l.debts)
	l.debts = append(l.debts, d)
	if !l.active {
		l.active = true
		l.a.lanes = append(l.a.lanes, l)
	}
}

// remove takes d out of l's debts, with l.a.mu held, and reports whether
// it was there.
func (l *Lane) remove(d *Debt) bool {
	i := d.index
	if i < 0 || i >= len(l.debts) || l.debts[i] != d {
		return false
	}
	last := len(l.debts) - 1
	l.debts[i] = l.debts[last]
	l.debts[i].index = i
	l.debts[last] = nil
	l.debts = l.debts[:last]
	d.index = -1
	return true
}

// forgive drops, with a.mu held, the debts past their Life, and the lanes
// left with none from a.lanes.
func (a *Account) forgive(now time.Time) {
	kept := a.lanes[:0]
	for _, l := range a.lanes {
		for i := len(l.debts) - 1; i >= 0; i-- {
			if d := l.debts[i]; !now.Before(d.since.Add(d.terms.Life)) {
				l.remove(d)
			}
		}
		if len(l.debts) > 0 {
			kept = append(kept, l)
		} else {
			l.active = false
		}
	}
	clear(a.lanes[len(kept):])
	a.lanes = kept
}

// owedMargin is added to two round trips in lead.
const owedMargin = 10 * time.Millisecond

// lead is how long before its deadline a paying call must be taken: a
// round trip to send it in, another of margin.
func (a *Account) lead() time.Duration { return 2*a.rtt + owedMargin }

// laneNeed is what one lane's debts may need, as calls by horizon: its
// paying calls, at most one per debt, go at least g apart when they must
// (see owedGate), the first after anchor, each carrying all the paying work
// waiting that fits (a share of a call each): in k such rounds, at most
// k + n×share calls; its heartbeats, from the beating debts, at most one
// call per hbg when gathered, and no more than one per heartbeat each
// every period, plus the first heartbeat of each debt not yet beating (all
// counted from the earliest).
type laneNeed struct {
	n       int
	share   float64
	g       time.Duration // <= 0: no spacing, each may need its own call now
	anchor  time.Duration
	beat    int
	period  time.Duration
	first   int           // debts whose first heartbeat is to come
	firstAt time.Duration // the earliest of them
	hbg     time.Duration // <= 0: heartbeats that can never be sent in time
	hbAt    time.Duration
}

// need returns l's need at now, after a call that pays pays and admits
// owes (of l), which carried all l's waiting Priority work if drained.
func (a *Account) need(l *Lane, now time.Time, pays, owes []*Debt, drained bool) laneNeed {
	lead := a.lead()
	last := l.last
	if drained {
		last = now
	}
	ln := laneNeed{share: l.share}
	wait, every, everyWait := time.Duration(-1), time.Duration(0), time.Duration(-1)
	count := func(d *Debt, since time.Time) {
		ln.n++
		t := d.terms
		if wait < 0 || t.Wait < wait {
			wait = t.Wait
		}
		if t.Every <= 0 {
			return
		}
		if every == 0 || t.Every < every {
			every = t.Every
		}
		if everyWait < 0 || t.EveryWait < everyWait {
			everyWait = t.EveryWait
		}
		if at := since.Add(t.Every).Sub(now); at <= 0 {
			ln.beat++
		} else if ln.first++; ln.first == 1 || at < ln.firstAt {
			ln.firstAt = at
		}
	}
	for _, d := range l.debts {
		count(d, d.since)
	}
	for _, d := range pays {
		if d.lane.Load() == l && d.index >= 0 {
			ln.n--
		}
	}
	for _, d := range owes {
		count(d, now)
	}
	ln.g = wait - lead
	ln.anchor = max(last.Add(ln.g).Sub(now), 0)
	ln.period, ln.hbg = every, everyWait-lead
	ln.hbAt = max(last.Add(ln.hbg).Sub(now), 0)
	return ln
}

// calls is the number of calls ln may need within horizon h; with
// heartbeats if hb.
func (ln *laneNeed) calls(h time.Duration, hb bool) int {
	c := 0
	switch {
	case ln.n <= 0:
	case ln.g <= 0:
		c = ln.n
	case h >= ln.anchor:
		c = min(ln.n, 1+int((h-ln.anchor)/ln.g)+int(float64(ln.n)*ln.share))
	}
	if hb && ln.hbg > 0 && h >= ln.hbAt {
		beats := ln.beat * (1 + int(h/ln.period))
		if h >= ln.firstAt {
			beats += ln.first
		}
		if beats > 0 {
			c += min(beats, 1+int((h-ln.hbAt)/ln.hbg))
		}
	}
	return c
}

// saturates returns the horizon past which ln needs no more calls, or -1
// when it never stops needing more (heartbeats).
func (ln *laneNeed) saturates(hb bool) time.Duration {
	if hb && ln.beat+ln.first > 0 && ln.hbg > 0 {
		return -1
	}
	if ln.n <= 0 || ln.g <= 0 {
		return 0
	}
	return ln.anchor + time.Duration(max(ln.n-1-int(float64(ln.n)*ln.share), 0))*ln.g
}

// maxSteps bounds the horizons fits looks at.
const maxSteps = 512

// owedCall describes a call for fits: the lane it is taken on, the debts it
// pays and admits, whether it carries all the lane's waiting Priority work.
type owedCall struct {
	lane    *Lane
	pays    []*Debt
	owes    []*Debt
	drained bool
}

// fits reports, with a.mu held, whether a call taken now as c leaves,
// for every horizon, the calls every lane's debts may need (with their
// heartbeats if hb), plus spare calls whenever they need any: the calls
// free now and those the window and the account's reset free by then.
func (a *Account) fits(now time.Time, c owedCall, hb bool, spare int) bool {
	horizon := a.supplyHorizon(now)
	if horizon < 0 || len(a.lanes) == 0 && len(c.owes) == 0 {
		return true // nothing limits the calls, or nothing is owed
	}
	needs := a.needs[:0]
	step, sat := time.Duration(0), time.Duration(0)
	for _, l := range a.lanes {
		if l == c.lane {
			continue
		}
		needs = append(needs, a.need(l, now, nil, nil, false))
	}
	if c.lane != nil {
		needs = append(needs, a.need(c.lane, now, c.pays, c.owes, c.drained))
	}
	a.needs = needs
	for i := range needs {
		ln := &needs[i]
		for _, g := range []time.Duration{ln.g, ln.hbg} {
			if g > 0 && (step == 0 || g < step) {
				step = g
			}
		}
		if s := ln.saturates(hb); s < 0 || sat < 0 {
			sat = -1
		} else {
			sat = max(sat, s)
		}
	}
	if sat >= 0 {
		horizon = min(horizon, sat)
	}
	if step == 0 || horizon/step > maxSteps {
		step = max(horizon/maxSteps, 1)
	}
	needAt := func(h time.Duration) int {
		n := 0
		for i := range needs {
			n += needs[i].calls(h, hb)
		}
		return n
	}
	// Enough: the calls free now cover all the need within the horizon.
	ring := a.ringScan(now)
	if need := needAt(horizon + step); need == 0 || min(ring.supply(0), a.accountSupply(now, 0))-1 >= need+spare {
		return true
	}
	for h := time.Duration(0); ; h += step {
		// The need at the end of the step, against the supply at its start.
		if need := needAt(h + step - 1); need > 0 && min(ring.supply(h), a.accountSupply(now, h))-1 < need+spare {
			return false
		}
		if h >= horizon {
			return true
		}
	}
}

// ringScan reads the local window's supply at growing horizons from now,
// going forward in the ring; with a.mu held.
type ringScan struct {
	a    *Account
	now  time.Time
	sent int // calls sent at or before the last threshold asked
}

func (a *Account) ringScan(now time.Time) *ringScan { return &ringScan{a: a, now: now} }

// supply is the local window's calls free by now+h, h no less than before:
// those sent at or before now+h-window leave it by then.
func (r *ringScan) supply(h time.Duration) int {
	a := r.a
	if a.ring == nil {
		return unlimitedSupply
	}
	if r.sent == 0 {
		r.sent = a.sentBy(r.now.Add(h - a.window()))
		return r.sent
	}
	gone := r.now.Add(h - a.window())
	for r.sent < len(a.ring) && !a.ring[(a.head+r.sent)%len(a.ring)].After(gone) {
		r.sent++
	}
	return r.sent
}

// supplyHorizon is how far ahead fits looks: the local window, and the
// account's until the end of its next window (if its length is known, else
// of this one); -1 when neither limits the calls.
func (a *Account) supplyHorizon(now time.Time) time.Duration {
	h := time.Duration(-1)
	if a.ring != nil {
		h = a.window()
	}
	switch w := a.view.window; {
	case a.fresh(now):
		h = max(h, a.supplyEnd().Sub(now)+max(w, 0))
	case a.view.quota > 0 && w > 0:
		h = max(h, 2*a.accountWindow())
	}
	return h
}

// accountWindow is the longest a window of the account may seem to last,
// its length known: its reset is seen rounded up and a margin later.
func (a *Account) accountWindow() time.Duration { return a.view.window + resetMargin + windowSlack }

// supplyEnd is the latest the account's view of its window may end: later
// headers of the window, their reset rounded up to whole seconds, may move
// it by up to windowSlack (see Answered).
func (a *Account) supplyEnd() time.Time { return a.view.end().Add(windowSlack) }

// window is how long a call counts in the local window.
func (a *Account) window() time.Duration {
	per := a.budget.Per()
	return per + per/ringMargin
}

// accountSupply is this process's share of the calls the account has by
// now+h: those left before its reset, less what others spend meanwhile,
// and then its share of each window's quota; with no current headers, a
// window's quota from now. Unlimited when no header gave its policy.
func (a *Account) accountSupply(now time.Time, h time.Duration) int {
	q, w := int(float64(a.view.quota)*a.share()), a.view.window
	if !a.fresh(now) {
		if q <= 0 || w <= 0 {
			return unlimitedSupply
		}
		return q * (1 + int(h/a.accountWindow()))
	}
	left := a.priorityLeft(now) - int(math.Ceil(a.others*h.Seconds()*a.share()))
	switch after := now.Add(h).Sub(a.supplyEnd()); {
	case after < 0:
		return left
	case q <= 0 || w <= 0:
		return unlimitedSupply
	default:
		return max(left, 0) + q*(1+int(after/w))
	}
}

// unlimitedSupply stands for a supply nothing limits.
const unlimitedSupply = 1 << 30

// sentBy returns how many of the ring's calls (unused places included)
// were sent at or before t: its entries are in the order of their sending.
func (a *Account) sentBy(t time.Time) int {
	lo, hi := 0, len(a.ring)
	for lo < hi {
		mid := (lo + hi) / 2
		if a.ring[(a.head+mid)%len(a.ring)].After(t) {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return lo
}

// nextSupply is when the supply next grows: a call leaves the window, or
// the account's window resets; zero when nothing will.
func (a *Account) nextSupply(now time.Time) time.Time {
	var at time.Time
	if a.ring != nil {
		w := a.window()
		if i := a.sentBy(now.Add(-w)); i < len(a.ring) {
			at = a.ring[(a.head+i)%len(a.ring)].Add(w)
		}
	}
	if a.fresh(now) && (at.IsZero() || a.view.end().Before(at)) {
		at = a.view.end()
	}
	return at
}

// owedGate is when a call paying debts of lane l may go although it does
// not fit: a g after the lane's last call that carried all its waiting
// Priority work, so that the lane's paying calls that do not fit go at
// least g apart, and each debt's Wait still allows it.
func (a *Account) owedGate(l *Lane, now time.Time) time.Time {
	ln := a.need(l, now, nil, nil, false)
	if ln.g <= 0 {
		return now
	}
	return l.last.Add(ln.g)
}

// Admission returns how long a Normal call on lane l that admits d would
// wait for the calls the unpaid debts need (see TryCall): zero when it
// fits now, else until calls are next freed, at least a second; debts paid
// meanwhile may let it go sooner.
func (a *Account) Admission(l *Lane, d *Debt) time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := time.Now()
	a.forgive(now)
	if a.fits(now, owedCall{lane: l, owes: []*Debt{d}, drained: true}, true, a.budget.Kept()-1) {
		return 0
	}
	if at := a.nextSupply(now); !at.IsZero() {
		return max(at.Sub(now), time.Second)
	}
	return time.Second
}

// owed returns, with a.mu held, the debts admitted and not yet paid or forgiven.
func (a *Account) owed() int {
	n := 0
	for _, l := range a.lanes {
		n += len(l.debts)
	}
	return n
}
