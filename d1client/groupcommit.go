package d1client

import (
	"cmp"
	"context"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/d1idem/d1idem/d1client/budget"
)

// CoalesceConfig configures group commit: concurrent Exec calls made with
// Coalesce() share D1 batch calls. A caller finding no call in flight is
// sent at once; others queue for the next call, priority work first. A
// statement failing in a shared call is found by its callers' checks (see
// Check), or else by sending them again in halves until it is alone; any
// other failure reaches each caller.
type CoalesceConfig struct {
	// Window bounds how long a call waits, after the previous one returned,
	// for the callers that one answered to come back: up to 1 s; 0 (the
	// default) a round trip; negative: never.
	Window        time.Duration
	MaxStatements int // statements in one call: 1 to 10,000; default 1024
	MaxBytes      int // encoded statements of one call: 1 KiB to 50 MiB; default 2 MiB
	MaxInFlight   int // coalesced calls in flight at once: 1 to 64; default 4
	// MaxQueueWait is the longest a caller without Priority may expect to
	// wait, beyond the next call's slot, for the calls that carry the work
	// queued ahead of it; one that would wait longer is refused at once,
	// unsent, with ErrShed. Up to 1 minute; 0 (the default) 500 ms;
	// negative: never refused for the queue.
	MaxQueueWait time.Duration
}

// withDefaults validates c and fills its zero fields with the defaults.
func (c CoalesceConfig) withDefaults() (CoalesceConfig, error) {
	if c.Window > time.Second {
		return c, invalidf("Config.Coalesce.Window is %s; accepted: negative (never wait), 0 (the default: a round trip) or up to 1s", c.Window)
	}
	c.Window = max(c.Window, -1)
	if c.MaxQueueWait > time.Minute {
		return c, invalidf("Config.Coalesce.MaxQueueWait is %s; accepted: negative (never refuse), 0 (the default: 500ms) or up to 1m", c.MaxQueueWait)
	}
	c.MaxQueueWait = cmp.Or(max(c.MaxQueueWait, -1), defaultMaxQueueWait)
	err := cmp.Or(
		setting("Coalesce.MaxStatements", &c.MaxStatements, 1, 10_000, 1024),
		setting("Coalesce.MaxBytes", &c.MaxBytes, 1<<10, 50<<20, 2<<20),
		setting("Coalesce.MaxInFlight", &c.MaxInFlight, 1, 64, 4),
	)
	return c, err
}

// defaultMaxQueueWait is CoalesceConfig.MaxQueueWait's default.
const defaultMaxQueueWait = 500 * time.Millisecond

// batcher is group commit's mechanism; gcpolicy.go decides. A runner is a
// goroutine holding one of maxInFlight call slots: it waits, takes a budget
// call, drains the queue into it, sends it, answers its callers and waits
// for them to come back, until it has nothing to carry or hands its callers
// over to the runner of a call in flight.
type batcher struct {
	pol  groupPolicy
	c    *Client
	lane *budget.Lane // its calls' line: each carries all waiting priority work it can

	mu          sync.Mutex
	queue       [2][]*pendingGroup // by class: budget.Normal, budget.Priority
	stmts, size int                // statements queued, and their share of a body
	owing       int                // queued groups whose call would admit a debt
	runners     int
	departing   int // runners not in flight
	flights     []*flight
	arrivals    uint64
	lastArrival time.Time
	kick        chan struct{} // closed, and replaced, when the queue changes
	returns     float64       // smoothed share of answered callers that come back
	cost        costModel
}

// pendingGroup is one caller's statements waiting for, or riding in, a call.
type pendingGroup struct {
	ctx       context.Context // the caller's attempt's
	wire      []wireStatement
	class     budget.Class
	callTerms           // the debt its call admits, the one it pays, its check
	deadline  time.Time // the caller's context's; zero: none
	size      int
	taken     bool // drained into a call: the caller can no longer withdraw it
	owing     bool // its call would admit a debt, when queued
	done      chan struct{}
	results   []Result
	err       *Error
	shared    int       // statements of the call that carried it
	sent      time.Time // when a call first carried it out
}

// batchOverhead is what {"batch":[...]} adds to its statements' shares.
const batchOverhead = len(`{"batch":[]}`) - 1

// view is the policy's snapshot of the batcher, with b.mu held.
func (b *batcher) view() groupView {
	v := groupView{
		now: time.Now(), groups: len(b.queue[budget.Normal]) + len(b.queue[budget.Priority]), stmts: b.stmts, size: b.size,
		arrivals: b.arrivals, lastArrival: b.lastArrival, runners: b.runners, departing: b.departing,
		rtt: b.c.account.RoundTrip(), owing: b.owing,
	}
	v.flights = make([]flight, len(b.flights))
	for i, f := range b.flights {
		v.flights[i] = *f
	}
	cl, _ := b.head()
	v.spare = b.c.account.Spare(cl)
	v.plentiful = v.spare && b.c.account.Plentiful(cl, b.pol.maxInFlight, v.rtt)
	v.base, v.per = b.cost.estimate()
	return v
}

// head is the class of the queue's next call and its groups' earliest deadline.
func (b *batcher) head() (cl budget.Class, dl time.Time) {
	if len(b.queue[budget.Priority]) > 0 {
		cl = budget.Priority
	}
	for _, g := range b.queue[cl] {
		if !g.deadline.IsZero() && (dl.IsZero() || g.deadline.Before(dl)) {
			dl = g.deadline
		}
	}
	return cl, dl
}

// submit queues the statements for a shared call and returns their results,
// the statements of the call that carried them (0: none did) and when it
// was sent (zero: never).
func (b *batcher) submit(ctx context.Context, wire []wireStatement, cl budget.Class, d callTerms) ([]Result, int, time.Time, *Error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, time.Time{}, notSent(err, "")
	}
	if until, on := b.c.account.Blocked(); on {
		return nil, 0, time.Time{}, blockedError(until, time.Until(until))
	}
	g := &pendingGroup{ctx: ctx, wire: wire, class: cl, callTerms: d, owing: d.owe != nil && !d.owe.Admitted(), done: make(chan struct{})}
	for _, w := range wire {
		g.size += len(w) + 1 // its encoding and a comma: its exact share of a batch body
	}
	if dl, ok := ctx.Deadline(); ok {
		g.deadline = dl
		rtt := b.c.account.RoundTrip()
		if left := time.Until(dl); left < rtt {
			return nil, 0, time.Time{}, tooLate(left, rtt)
		}
		if at, why := b.c.account.NextSlot(cl, dl); why != budget.NotWaiting && time.Until(dl) < time.Until(at)+rtt {
			if why == budget.WaitBlock {
				return nil, 0, time.Time{}, blockedError(at, time.Until(at))
			}
			return nil, 0, time.Time{}, exhausted(b.c.account, time.Until(at), nil)
		}
	}
	b.mu.Lock()
	if cl == budget.Normal {
		if shed, wait := b.pol.shed(b.shedView(), len(wire), time.Until(g.deadline)); shed {
			b.mu.Unlock()
			return nil, 0, time.Time{}, shedError(wait)
		}
	}
	b.queue[cl] = append(b.queue[cl], g)
	b.count(g, 1)
	b.arrivals++
	b.lastArrival = time.Now()
	b.changed()
	if start, gather := b.pol.spawn(b.view()); start {
		b.start(gather)
	}
	b.mu.Unlock()

	select {
	case <-g.done:
		return g.results, g.shared, g.sent, g.err
	case <-ctx.Done():
	}
	b.mu.Lock()
	taken := g.taken // if not, it was never answered: it is withdrawn
	if !taken {
		b.withdraw(g)
	}
	b.mu.Unlock()
	select {
	case <-g.done: // answered together with the cancellation
		return g.results, g.shared, g.sent, g.err
	default:
	}
	if taken {
		return nil, 0, time.Time{}, &Error{kind: kindTransport, Err: ctx.Err(), Ambiguous: true, Message: ctx.Err().Error() + " while the call was in flight"}
	}
	if e := b.heldBy(g, ctx.Err()); e != nil {
		return nil, 0, time.Time{}, e
	}
	return nil, 0, time.Time{}, notSent(ctx.Err(), " while queued for group commit")
}

// start starts a runner, with b.mu held.
func (b *batcher) start(gather bool) {
	b.runners++
	b.departing++
	var w wait
	if gather {
		w = b.pol.gathering(b.view())
	}
	go b.run(w)
}

// withdraw takes a group that was never sent out of the queue.
func (b *batcher) withdraw(g *pendingGroup) {
	if i := slices.Index(b.queue[g.class], g); i >= 0 {
		b.queue[g.class] = slices.Delete(b.queue[g.class], i, i+1)
		b.count(g, -1)
		b.changed()
	}
}

// count adds queued group g to the queue's counts (sign 1), or takes it
// out of them (-1), with b.mu held.
func (b *batcher) count(g *pendingGroup, sign int) {
	b.stmts += sign * len(g.wire)
	b.size += sign * g.size
	if g.owing {
		b.owing += sign
	}
}

// shedView is the view of the shed decision, with b.mu held: view's, with
// the priority work to come and the budget's pace.
func (b *batcher) shedView() groupView {
	v := b.view()
	v.owed, v.pace = b.lane.Owed(), b.c.account.Pace()
	return v
}

// changed wakes the runners waiting to depart.
func (b *batcher) changed() {
	close(b.kick)
	b.kick = make(chan struct{})
}

// run is a runner's life, from a wait w.
func (b *batcher) run(w wait) {
	b.mu.Lock()
	for {
		groups, stmts, ok := b.await(w)
		if !w.gathering && w.answered > 0 {
			back := min(float64(b.arrivals-w.arrivals)/float64(w.answered), 1)
			b.returns += (back - b.returns) / 8
		}
		b.departing--
		if !ok {
			b.runners--
			b.mu.Unlock()
			return
		}
		var on bool
		if w, on = b.fly(groups, stmts); !on {
			return
		}
	}
}

// await waits, with b.mu held, until the runner may depart, takes the call
// from the budget and the groups it carries from the queue. It returns
// false when there is nothing to carry.
func (b *batcher) await(w wait) ([]*pendingGroup, int, bool) {
	var budgetSince time.Time // when the budget first had no call for it
	for {
		b.dropLate()
		v := b.view()
		depart, wake := b.pol.depart(v, w, b.returns)
		if b.stmts == 0 && depart {
			return nil, 0, false
		}
		var changed <-chan struct{}
		if depart {
			groups, call := b.pick(b.pol.capacity(v), b.pol.maxBytes)
			_, ok, at, why, ch := b.c.account.TryCall(&call)
			switch {
			case ok:
				if !budgetSince.IsZero() {
					b.c.tel.waited(call.Class, time.Since(budgetSince))
				}
				groups, stmts := b.take(groups, false)
				return groups, stmts, true
			case why == budget.WaitBlock:
				// A 971 arrived while these waited: nothing is sent.
				groups, _ := b.pick(math.MaxInt, math.MaxInt)
				groups, _ = b.take(groups, true)
				e := blockedError(at, time.Until(at))
				b.mu.Unlock()
				deliver(groups, 0, nil, e)
				b.mu.Lock()
				continue
			case budgetSince.IsZero():
				budgetSince = v.now
			}
			wake, changed = at, ch
		}
		kick := b.kick
		b.mu.Unlock()
		select {
		case <-time.After(time.Until(wake)):
		case <-kick:
		case <-changed:
		}
		b.mu.Lock()
	}
}

// fly sends a call drained from the queue, with b.mu held and the budget's
// call taken. It returns the runner's next wait, with b.mu held, or false,
// b.mu released, when the runner handed its callers over.
func (b *batcher) fly(groups []*pendingGroup, stmts int) (wait, bool) {
	if start, gather := b.pol.leftover(b.view()); start {
		b.start(gather)
	}
	f := &flight{start: time.Now(), stmts: stmts}
	f.first = f.start
	b.flights = append(b.flights, f)
	b.mu.Unlock()

	b.call(groups, stmts)

	b.mu.Lock()
	b.flights = slices.DeleteFunc(b.flights, func(x *flight) bool { return x == f })
	b.cost.add(stmts, time.Since(f.start))
	since, answered := b.arrivals, len(groups)
	if f.handed > 0 {
		since, answered = f.since, answered+f.handed
	}
	i := b.pol.handoff(b.view(), f, answered)
	if i >= 0 { // its runner takes these callers over
		g := b.flights[i]
		g.stmts += f.stmts
		if g.handed == 0 || since < g.since {
			g.since = since
		}
		g.handed += answered
		if f.first.Before(g.first) {
			g.first = f.first
		}
		b.runners--
	} else {
		b.departing++ // before the callers wake: whoever comes back rides with this runner
	}
	b.mu.Unlock()
	for _, g := range groups {
		close(g.done)
	}
	if i >= 0 {
		return wait{}, false
	}
	b.mu.Lock()
	return b.pol.afterReturn(b.view(), since, answered), true
}

// call sends the groups' statements as one call, whose budget was taken,
// and records each group's outcome. A statement failing in a shared call
// aborts the whole batch, and the error does not say whose it was: the
// groups' checks (see Check) are run, and those whose check fails are
// answered the error; failing that, the groups are sent again in two
// halves, on calls of their own, until the failing one is alone, so that a
// failure costs about two calls per halving rather than one per caller.
func (b *batcher) call(groups []*pendingGroup, stmts int) {
	wire := make([]wireStatement, 0, stmts)
	for _, g := range groups {
		wire = append(wire, g.wire...)
	}
	// A shared call outlives its callers' contexts; a lone one keeps its trace.
	ctx := context.Background()
	if len(groups) == 1 {
		ctx = context.WithoutCancel(groups[0].ctx)
	}
	body, sent := encodeBody(wire), time.Now()
	for _, g := range groups {
		if g.sent.IsZero() {
			g.sent = sent
		}
	}
	results, err := b.c.send(ctx, body, len(wire), true)
	if err == nil || err.kind != kindSQL || len(groups) == 1 {
		record(groups, stmts, results, err)
		return
	}
	parts := [][]*pendingGroup{groups[:len(groups)/2], groups[len(groups)/2:]}
	if kept, ok := b.sift(groups, stmts, err); ok {
		parts = [][]*pendingGroup{kept}
	}
	for _, part := range parts {
		n := 0
		for _, g := range part {
			n += len(g.wire)
		}
		if n == 0 {
			continue
		}
		if e := b.acquireFor(part); e != nil {
			record(part, 0, nil, e)
			continue
		}
		b.call(part, n)
	}
}

// sift runs, on a call of their own, the checks of the groups that have
// one, after a shared call of stmts statements carrying groups failed with
// err: it answers err to those whose check fails, whose statements would
// fail again, and returns the others. It returns false if no check failed
// (none ran, or all passed: the failure is another statement's). A check
// runs once: one that passed is dropped.
func (b *batcher) sift(groups []*pendingGroup, stmts int, err *Error) ([]*pendingGroup, bool) {
	var checked []*pendingGroup
	var wire []wireStatement
	for _, g := range groups {
		if g.check != nil {
			checked = append(checked, g)
			wire = append(wire, g.check.wire)
		}
	}
	if len(checked) == 0 || b.acquireFor(checked) != nil {
		return nil, false
	}
	results, cerr := b.c.send(context.Background(), encodeBody(wire), len(wire), true)
	if cerr != nil || len(results) != len(wire) {
		return nil, false
	}
	failing := map[*pendingGroup]bool{}
	for i, g := range checked {
		if !g.check.ok(results[i]) {
			failing[g] = true
		} else {
			g.check = nil // passed: not run again at the halvings to come
		}
	}
	if len(failing) == 0 {
		return nil, false
	}
	var kept, failed []*pendingGroup
	for _, g := range groups {
		if failing[g] {
			failed = append(failed, g)
		} else {
			kept = append(kept, g)
		}
	}
	record(failed, stmts, nil, err)
	return kept, true
}

// acquireFor takes a budget call for groups, sent again after a shared
// call failed: of their first class, until their earliest deadline.
func (b *batcher) acquireFor(groups []*pendingGroup) *Error {
	call := budget.Call{Class: budget.Normal, Lane: b.lane}
	var dl time.Time
	for _, g := range groups {
		call.Class = max(call.Class, g.class)
		if !g.deadline.IsZero() && (dl.IsZero() || g.deadline.Before(dl)) {
			dl = g.deadline
		}
	}
	ctx, cancel := context.Background(), context.CancelFunc(func() {})
	if !dl.IsZero() {
		ctx, cancel = context.WithDeadline(ctx, dl)
	}
	defer cancel()
	return b.c.acquire(ctx, &call)
}

// record gives each group its results, or its own copy of the error, and
// the statements of the call that carried it (shared).
func record(groups []*pendingGroup, shared int, results []Result, err *Error) {
	off := 0
	for _, g := range groups {
		g.shared = shared
		if err != nil {
			cp := *err
			g.err = &cp
		} else {
			g.results = results[off : off+len(g.wire) : off+len(g.wire)]
			off += len(g.wire)
		}
	}
}

// deliver records the groups' outcome (see record) and answers them.
func deliver(groups []*pendingGroup, shared int, results []Result, err *Error) {
	record(groups, shared, results, err)
	for _, g := range groups {
		close(g.done)
	}
}

// dropLate fails, with b.mu held, queued groups with less than a round trip left.
func (b *batcher) dropLate() {
	rtt := b.c.account.RoundTrip()
	if rtt == 0 {
		return
	}
	now, dropped := time.Now(), false // one reading of the clock: the queue may be long
	for c, q := range b.queue {
		b.queue[c] = slices.DeleteFunc(q, func(g *pendingGroup) bool {
			left := g.deadline.Sub(now)
			if g.deadline.IsZero() || left >= rtt {
				return false
			}
			b.count(g, -1)
			g.taken = true
			g.err = b.late(g, left, rtt)
			close(g.done)
			dropped = true
			return true
		})
	}
	if dropped {
		b.changed()
	}
}

// pick returns the queued groups the next call carries, priority first,
// then first come first served, for one call of at most capacity statements
// and maxBytes (a larger group travels alone), and that call as the budget
// sees it: it carries all the lane's waiting priority work if all of it
// fits, pays the debts of those groups and would admit theirs.
func (b *batcher) pick(capacity, maxBytes int) ([]*pendingGroup, budget.Call) {
	cl, dl := b.head()
	call := budget.Call{Class: cl, Deadline: dl, Lane: b.lane, Drained: true}
	var groups []*pendingGroup
	stmts, size := 0, batchOverhead
	for c := budget.Priority; ; c-- {
		for _, g := range b.queue[c] {
			if len(groups) > 0 && (stmts+len(g.wire) > capacity || size+g.size > maxBytes) {
				call.Drained = call.Drained && c == budget.Normal
				return groups, call
			}
			groups = append(groups, g)
			stmts += len(g.wire)
			size += g.size
			if g.pay != nil {
				call.Pays = append(call.Pays, g.pay)
				call.PayShare = max(call.PayShare, b.share(g))
			}
			if g.owe != nil && !g.owe.Admitted() {
				call.Owes = append(call.Owes, g.owe)
			} else {
				call.Others = true
			}
		}
		if c == budget.Normal {
			return groups, call
		}
	}
}

// share is the share of a call of the most statements and bytes group
// commit puts in one that group g takes.
func (b *batcher) share(g *pendingGroup) float64 {
	return max(float64(len(g.wire))/float64(b.pol.maxStatements), float64(g.size)/float64(b.pol.maxBytes-batchOverhead))
}

// take takes the groups pick chose out of the queue, all of them or but
// those whose debt the budget did not admit, and returns them and their
// statements.
func (b *batcher) take(groups []*pendingGroup, all bool) ([]*pendingGroup, int) {
	kept, stmts := groups[:0], 0
	for _, g := range groups {
		if !all && g.owe != nil && !g.owe.Admitted() {
			continue
		}
		g.taken = true
		b.count(g, -1)
		kept = append(kept, g)
		stmts += len(g.wire)
	}
	for c := range b.queue {
		b.queue[c] = slices.DeleteFunc(b.queue[c], func(g *pendingGroup) bool { return g.taken })
	}
	return kept, stmts
}

// late is the error of group g, dropped with left, less than a round trip
// of rtt, before its deadline: heldBy's, else tooLate's.
func (b *batcher) late(g *pendingGroup, left, rtt time.Duration) *Error {
	if e := b.heldBy(g, nil); e != nil {
		return e
	}
	return tooLate(left, rtt)
}

// heldBy returns ErrBudget, with cause err, if the budget kept queued group
// g waiting: its slot, or the calls its debt would need, are to come; nil
// otherwise.
func (b *batcher) heldBy(g *pendingGroup, err error) *Error {
	if at, why := b.c.account.NextSlot(g.class, g.deadline); why == budget.WaitBudget {
		return exhausted(b.c.account, time.Until(at), err)
	}
	if g.owe != nil && !g.owe.Admitted() {
		if wait := b.c.account.Admission(b.lane, g.owe); wait > 0 {
			return exhausted(b.c.account, wait, err)
		}
	}
	return nil
}
