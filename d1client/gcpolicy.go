package d1client

import (
	"cmp"
	"math"
	"time"
)

// groupPolicy decides group commit (groupcommit.go): when a call departs,
// what it carries, and whether another starts beside it. Every rule is a
// pure function of a groupView, and every constant is here.
type groupPolicy struct {
	maxInFlight, maxStatements, maxBytes int           // from CoalesceConfig
	window                               time.Duration // CoalesceConfig.Window
	maxQueueWait                         time.Duration // CoalesceConfig.MaxQueueWait; negative: never shed
	// gap: a waiting runner departs once no caller arrived for this long.
	gap time.Duration
	// gather: a runner started beside others gathers arriving callers for
	// this share of a round trip at most; calls that left within it of each
	// other count as leaving together (handoff).
	gather float64
	// While calls are plentiful, a call carries no more statements than D1
	// runs in serial, nor in serialShare of a call: each caller waits for all.
	serial      time.Duration
	serialShare float64
}

func newGroupPolicy(cfg CoalesceConfig) groupPolicy {
	return groupPolicy{
		maxInFlight: cfg.MaxInFlight, maxStatements: cfg.MaxStatements, maxBytes: cfg.MaxBytes, window: cfg.Window,
		maxQueueWait: cfg.MaxQueueWait,
		gap:          2 * time.Millisecond, gather: 0.25, serial: 2 * time.Millisecond, serialShare: 0.125,
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
	spare       bool          // the budget has a call now
	plentiful   bool          // and its pace allows maxInFlight calls a round trip
	base, per   time.Duration // a call lasts base + per × statements; 0: unknown
	owing       int           // queued callers whose calls would admit a debt (see Owes)
	owed        int           // debts admitted and not yet paid: priority work to come
	pace        time.Duration // the budget's time between calls; 0: none
}

// flight is a call in flight. handed callers were handed over to its runner,
// since arrival number since, by calls the first of which left at first.
type flight struct {
	start  time.Time
	stmts  int // its statements and those of the calls handed over to it
	handed int
	since  uint64
	first  time.Time
}

// due is how long until call f is expected back; 0 once overdue.
func (v *groupView) due(f *flight) time.Duration {
	return max(f.start.Add(v.rtt).Sub(v.now), 0)
}

// capacity is how many statements the next call carries.
func (p groupPolicy) capacity(v groupView) int {
	if v.per <= 0 || v.runners >= p.maxInFlight || !v.plentiful {
		return p.maxStatements
	}
	bound := min(time.Duration(float64(v.base)*p.serialShare), p.serial)
	return min(max(int(bound/v.per), 1), p.maxStatements)
}

// spawn says whether a caller just queued gets a new runner, and whether it
// gathers. The queue waits for a departing runner or a return unless that
// costs more than a round trip in all; another runner needs a budget call.
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
	case v.rtt == 0:
		return v.groups > 1, true // no round trip known: each waits one
	}
	due := v.rtt
	for i := range v.flights {
		due = min(due, v.due(&v.flights[i]))
	}
	return due > p.gatherTime(v) && time.Duration(v.groups)*due > v.rtt, true
}

// leftover says whether what a departing call could not carry gets a runner
// at once (else it waits a round trip), and whether that one gathers.
func (p groupPolicy) leftover(v groupView) (start, gather bool) {
	start = v.stmts > 0 && v.departing == 0 && v.runners < p.maxInFlight && v.spare
	return start, start && v.plentiful
}

func (p groupPolicy) gatherTime(v groupView) time.Duration {
	return time.Duration(float64(v.rtt) * p.gather)
}

// wait is how a runner waits before it departs: for the callers its call
// answered to come back, or, gathering, for callers arriving with it.
type wait struct {
	gathering bool
	start     time.Time // when the call returned, or the runner started
	arrivals  uint64    // arrivals then
	answered  int       // callers it waits for
	until     time.Time // the longest it waits
}

// gathering is the wait of a runner just started beside others.
func (p groupPolicy) gathering(v groupView) wait {
	d := p.gatherTime(v)
	if p.window != 0 { // a negative window: none
		d = min(d, max(p.window, 0))
	}
	return wait{gathering: true, start: v.now, until: v.now.Add(d)}
}

// afterReturn is the wait of a runner whose call returned at v.now, having
// answered callers since arrival number since.
func (p groupPolicy) afterReturn(v groupView, since uint64, answered int) wait {
	window := max(cmp.Or(p.window, v.rtt), 0)
	return wait{start: v.now, arrivals: since, answered: answered, until: v.now.Add(window)}
}

// depart says whether a runner waiting as w departs now, or when to look
// again. It waits while the call has room, until has not passed, and callers
// keep coming less than gap apart (a returned runner: while some it answered
// are missing). While calls are scarce, a missing caller, who would wait a
// round trip for the next call, is worth waiting longer for, weighed by
// returns, the share of answered callers that come back.
func (p groupPolicy) depart(v groupView, w wait, returns float64) (bool, time.Time) {
	if v.stmts >= p.capacity(v) || v.size+batchOverhead >= p.maxBytes || !v.now.Before(w.until) {
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
// the callers of call f, just returned: one that left within the gather time
// of f.first, with room for f's statements, and, while calls are plentiful,
// not keeping them waiting a round trip in all. -1 when none.
func (p groupPolicy) handoff(v groupView, f *flight, answered int) int {
	if v.rtt == 0 || p.window < 0 {
		return -1
	}
	for i := range v.flights {
		g := &v.flights[i]
		switch {
		case g.start.Sub(f.first).Abs() > p.gatherTime(v), g.stmts+f.stmts > p.capacity(v):
		case v.plentiful && time.Duration(answered)*v.due(g) > v.rtt:
		default:
			return i
		}
	}
	return -1
}

// shed says whether a caller without priority, of n statements, arriving
// with left before its deadline (0: none), is refused at once rather than
// queued, and after how long it may come back. The calls needed to carry
// the work ahead of it, priority first (what is queued, and the priority
// work to come: the debts unpaid and those the queued callers would admit,
// a statement each), leave one after another, at the budget's pace or as
// fast as maxInFlight calls of D1's duration allow, whichever is slower:
// a caller that would wait for more than maxQueueWait of them, or not
// leave a round trip before its deadline, is shed. A standing queue adds
// the same wait to everyone and no throughput: turned away at once, the
// excess comes back later, and the callers admitted keep their latency.
func (p groupPolicy) shed(v groupView, n int, left time.Duration) (bool, time.Duration) {
	if p.maxQueueWait < 0 {
		return false, 0
	}
	capacity := p.capacity(v)
	work := v.stmts + v.owed + v.owing + n
	calls := (work + capacity - 1) / capacity
	interval := v.pace
	if v.per > 0 {
		interval = max(interval, (v.base+v.per*time.Duration(capacity))/time.Duration(p.maxInFlight))
	}
	wait := time.Duration(calls-1) * interval
	switch {
	case wait > p.maxQueueWait:
		return true, wait - p.maxQueueWait + interval
	case left > 0 && wait+v.rtt > left:
		return true, wait + interval
	}
	return false, 0
}

// costModel fits a call's duration to base + per × statements by least
// squares, each call's weight decaying by costDecay at each later one.
type costModel struct{ w, n, d, nn, nd float64 }

const costDecay = 0.95

func (m *costModel) add(n int, d time.Duration) {
	x, y := float64(n), float64(d)
	m.w = m.w*costDecay + 1
	m.n = m.n*costDecay + x
	m.d = m.d*costDecay + y
	m.nn = m.nn*costDecay + x*x
	m.nd = m.nd*costDecay + x*y
}

// estimate returns base and per once calls of different sizes show a cost
// per statement; zeros otherwise.
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
