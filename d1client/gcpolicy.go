package d1client

import (
	"math"
	"time"
)

// groupPolicy is what group commit (groupcommit.go) decides: when a call
// departs, what it carries, and whether another starts beside it. It is a
// pure function of a groupView, a snapshot of the batcher, so that every
// rule and constant is here, and table tests need no goroutines or clocks.
type groupPolicy struct {
	maxInFlight   int // calls in flight at once (CoalesceConfig.MaxInFlight)
	maxStatements int // statements one call carries (CoalesceConfig.MaxStatements)
	maxBytes      int // their encoded size (CoalesceConfig.MaxBytes)
	// window bounds how long a returned call's runner waits for the
	// callers it answered: 0 means a round trip, negative never
	// (CoalesceConfig.Window).
	window time.Duration
	// gap: a waiting runner departs once no caller arrived for this long.
	gap time.Duration
	// gather: a call started beside others gathers the callers arriving
	// with it for at most this share of a round trip; and calls that left
	// within it of each other count as leaving together (see handoff).
	gather float64
	// serial: while calls are plentiful, a call carries no more statements
	// than D1 runs, one after another, in this time, nor in serialShare of
	// a round trip: each caller waits for all of them.
	serial      time.Duration
	serialShare float64
}

// newGroupPolicy returns the policy for cfg, whose defaults are filled in.
func newGroupPolicy(cfg CoalesceConfig) groupPolicy {
	return groupPolicy{
		maxInFlight: cfg.MaxInFlight, maxStatements: cfg.MaxStatements, maxBytes: cfg.MaxBytes, window: cfg.Window,
		gap: 2 * time.Millisecond, gather: 0.25, serial: 2 * time.Millisecond, serialShare: 0.125,
	}
}

// groupView is what the policy sees of the batcher at one moment.
type groupView struct {
	now         time.Time
	groups      int       // callers queued
	stmts, size int       // their statements, and their share of a body in bytes
	arrivals    uint64    // callers ever queued
	lastArrival time.Time // when the last one was
	runners     int       // runners: each departs, or has a call in flight
	departing   int       // runners not in flight
	flights     []flight  // the calls in flight
	rtt         time.Duration
	// spare: the budget has a call now; plentiful: and its pace allows
	// maxInFlight of them in a round trip (an unlimited budget, or one far
	// above the traffic; never Cloudflare's own).
	spare, plentiful bool
	// base and per: a call's duration as base + per × statements, from
	// the calls so far; zero until known.
	base, per time.Duration
}

// flight is a call in flight.
type flight struct {
	start time.Time
	stmts int // statements of this call and of the calls handed over to its runner
	// handed is how many callers the runners of calls that returned first
	// handed over to this call's runner (see handoff), since arrival
	// number since; first is the start of the earliest of those calls.
	handed int
	since  uint64
	first  time.Time
}

// due is how long until call f is expected back: a round trip after it
// left, and 0 once it is overdue.
func (v *groupView) due(f *flight) time.Duration {
	return max(f.start.Add(v.rtt).Sub(v.now), 0)
}

// capacity is how many statements the next call carries: maxStatements,
// or, while calls are plentiful and a slot is free, as many as D1 runs in
// the serial bound, since a parallel call then costs its callers less.
func (p groupPolicy) capacity(v groupView) int {
	if v.per <= 0 || v.runners >= p.maxInFlight || !v.plentiful {
		return p.maxStatements
	}
	bound := min(time.Duration(float64(v.base)*p.serialShare), p.serial)
	return min(max(int(bound/v.per), 1), p.maxStatements)
}

// full reports whether the queue fills a call.
func (p groupPolicy) full(v groupView) bool {
	return v.stmts >= p.capacity(v) || v.size+batchOverhead >= p.maxBytes
}

// spawn says whether a caller just queued gets a new runner, and whether
// that runner gathers the callers still arriving before it departs. An idle
// batcher starts one at once. Otherwise the queue waits for the runners
// about to depart, or for a return, unless that would cost more than a
// round trip: the queue holds more than those runners carry, or calls are
// plentiful and the queued callers would each wait more than the gather
// time, a round trip in all. A further runner needs a call of the budget.
func (p groupPolicy) spawn(v groupView) (start, gather bool) {
	switch {
	case v.runners >= p.maxInFlight:
		return false, false
	case v.runners == 0:
		return true, false
	case !v.spare:
		return false, false
	case v.stmts > v.runners*p.capacity(v) || v.size+batchOverhead > v.runners*p.maxBytes:
		return true, false
	case v.departing > 0 || !v.plentiful:
		return false, false
	}
	due := v.rtt
	if v.rtt == 0 {
		return v.groups > 1, true // no round trip known: each waits one
	}
	for i := range v.flights {
		due = min(due, v.due(&v.flights[i]))
	}
	return due > p.gatherTime(v) && time.Duration(v.groups)*due > v.rtt, true
}

// leftover says whether the statements a departing call could not carry
// get a runner of their own at once, and whether it gathers: they would
// wait a round trip for this call otherwise. It needs a free call slot, no
// other runner about to depart, and a call of the budget now.
func (p groupPolicy) leftover(v groupView) (start, gather bool) {
	if v.stmts == 0 || v.departing > 0 || v.runners >= p.maxInFlight || !v.spare {
		return false, false
	}
	return true, v.plentiful
}

// gatherTime is the gather share of a round trip.
func (p groupPolicy) gatherTime(v groupView) time.Duration {
	return time.Duration(float64(v.rtt) * p.gather)
}

// wait is how a runner waits before it departs: for the callers its call
// answered to come back with their next statements (a claim's completion),
// or, a runner started beside others, for the callers arriving with it.
type wait struct {
	gathering bool
	start     time.Time // when the call returned, or the runner started
	arrivals  uint64    // arrivals then
	answered  int       // callers it waits for
	until     time.Time // the longest it waits
}

// gathering is the wait of a runner just started beside others.
func (p groupPolicy) gathering(v groupView) wait {
	w := wait{gathering: true, start: v.now, until: v.now.Add(p.gatherTime(v))}
	if p.window > 0 && p.window < p.gatherTime(v) {
		w.until = v.now.Add(p.window)
	}
	if p.window < 0 {
		w.until = v.now
	}
	return w
}

// afterReturn is the wait of a runner whose call returned at v.now having
// answered callers since arrival number since: at most the window.
func (p groupPolicy) afterReturn(v groupView, since uint64, answered int) wait {
	window := p.window
	if window == 0 {
		window = v.rtt
	}
	return wait{start: v.now, arrivals: since, answered: answered, until: v.now.Add(max(window, 0))}
}

// depart says whether a runner waiting as w departs now; if not, it looks
// again at the time it returns, or when the queue changes. It waits while
// the call has room, w.until has not passed, and callers keep coming: a
// gathering runner while they arrive less than gap apart; a returned one
// while some it answered are missing and the last arrival was less than gap
// ago. While calls are scarce a missing caller is worth more waiting: it
// would wait a round trip for the next call, if it comes back at all
// (returns, the share that does), against the queued callers' wait.
func (p groupPolicy) depart(v groupView, w wait, returns float64) (bool, time.Time) {
	if p.full(v) || !v.now.Before(w.until) {
		return true, v.now
	}
	quiet := p.gap
	if !w.gathering {
		missing := w.answered - int(v.arrivals-w.arrivals)
		switch {
		case missing <= 0:
			return true, v.now
		case v.groups == 0:
			return false, w.until // nobody waits yet
		case !v.plentiful:
			quiet = max(quiet, time.Duration(returns*float64(missing)*float64(v.rtt)/float64(v.groups)))
		}
	}
	wake := w.start.Add(quiet)
	if v.lastArrival.After(w.start) {
		wake = v.lastArrival.Add(quiet)
	}
	if w.until.Before(wake) {
		wake = w.until
	}
	return !v.now.Before(wake), wake
}

// handoff returns the index of the call in flight whose runner takes over
// the callers that call f, just returned, answered: one that left within
// the gather time of f (or of the earliest call handed to f), whose
// statements fit one call with f's, and, while calls are plentiful, whose
// return they would wait for a round trip at most in all. -1 when none.
func (p groupPolicy) handoff(v groupView, f *flight, answered int) int {
	if v.rtt == 0 || p.window < 0 {
		return -1
	}
	near := p.gatherTime(v)
	for i := range v.flights {
		g := &v.flights[i]
		switch {
		case g.start.Sub(f.first).Abs() > near, g.stmts+f.stmts > p.capacity(v):
		case v.plentiful && time.Duration(answered)*v.due(g) > v.rtt:
		default:
			return i
		}
	}
	return -1
}

// costModel estimates the duration of a call of n statements as
// base + n*per, by least squares over the calls seen, the older ones
// weighing less.
type costModel struct {
	w, n, d, nn, nd float64
}

// costDecay is the weight a call's sample keeps at each later one.
const costDecay = 0.95

func (m *costModel) add(n int, d time.Duration) {
	x, y := float64(n), float64(d)
	m.w = m.w*costDecay + 1
	m.n = m.n*costDecay + x
	m.d = m.d*costDecay + y
	m.nn = m.nn*costDecay + x*x
	m.nd = m.nd*costDecay + x*y
}

// estimate returns base and per, once calls of different sizes were seen
// and they show a positive cost per statement; zeros otherwise.
func (m *costModel) estimate() (base, per time.Duration) {
	den := m.w*m.nn - m.n*m.n
	if m.w < 4 || den <= m.w*m.w { // sizes spread by less than a statement
		return 0, 0
	}
	slope := (m.w*m.nd - m.n*m.d) / den
	icept := (m.d - slope*m.n) / m.w
	if slope <= 0 || icept <= 0 {
		return 0, 0
	}
	return time.Duration(math.Round(icept)), time.Duration(max(math.Round(slope), 1))
}
