package d1client

import (
	"context"
	"math"
	"sync"
	"time"
)

// CoalesceConfig configures group commit: statements of concurrent Exec
// calls made with Coalesce() travel together in one D1 batch call.
//
// How it behaves:
//
//   - When no coalesced call is in flight, a caller's statements are sent at
//     once: the batcher never waits when idle. A caller that also arrives
//     alone (nobody else for 2 ms) makes that call on its own goroutine, and
//     its context governs the request, as for a call made without Coalesce;
//     if nobody queued meanwhile, the batcher is idle again when it returns.
//   - While a call is in flight, arriving statements queue. When it returns,
//     the next call waits while the callers it answered keep coming back
//     with their next statements (a claim's completion, say), so that they
//     ride in it too: until they are all back, the call is full, none has
//     come back for longer than waiting is worth (the missing callers would
//     each lose a round trip, the queued ones lose the wait; while calls
//     are plentiful, 2 ms), or Window has passed.
//   - A further call starts in parallel (up to MaxInFlight) as soon as
//     waiting would cost more than a round trip: the queue holds more than
//     the next call carries, the calls in flight are overdue by two round
//     trips, or, while calls are plentiful, the queued callers' waits for
//     the first call in flight to return add up to more than a round trip,
//     each more than a quarter of one. Such a call first gathers the
//     statements still arriving, while they come less than 2 ms apart and
//     for a quarter of a round trip at most.
//   - Calls are plentiful when the budget has a call now and its even pace
//     allows MaxInFlight calls in a round trip: with UnlimitedBudget, or a
//     budget far above the traffic. Cloudflare's default budget (4 calls a
//     second) never is: there, group commit spends calls sparingly.
//   - Callers whose calls left within a quarter of a round trip of each
//     other ride on together, as long as those calls' statements fit one
//     call: the runner of the call that returns first hands its callers to
//     the other's. While calls are plentiful, only as long as their waits
//     for the other call to return add up to a round trip at most: a call
//     is worth more than that (as for a parallel call, above).
//   - When calls are scarce, the next call waits for the request budget's
//     next slot while more statements join it, so each call carries more.
//     Priority statements leave first; the others ride along where there is
//     room. A caller whose deadline comes before the slot its statements
//     would get is told at once (ErrBudget, with Retry-After).
//   - Every call is bounded by MaxStatements and MaxBytes (the statements'
//     exact encoded size), and each caller gets exactly the results of its
//     own statements. D1 runs a call's statements one after another, and
//     each caller waits for all of them: while calls are plentiful, a call
//     carries no more statements than D1 runs in 2 ms (and in an eighth of
//     a round trip), as measured from the calls made so far.
//
// A batch is one transaction, so when a shared call fails, no caller may be
// handed a wrong answer:
//
//   - An SQL error (HTTP 400/7500) aborts the whole batch and commits
//     nothing. The error cannot say whose statement failed, so every caller
//     of a shared call is sent again, alone; each then gets its own true
//     outcome. (Coalesced statements are chosen so that this does not happen
//     by design.)
//   - Any other failure reaches every caller with its cause, marked
//     Ambiguous where the batch may have committed. Each caller's own retry
//     policy then applies: Idempotent and read-only calls are retried, other
//     writes return the error.
type CoalesceConfig struct {
	// Window is the longest a call waits, after the previous one returned,
	// for the callers that one answered: up to 1 s. Default (0): the time a
	// call takes; negative: never wait.
	Window time.Duration
	// MaxStatements bounds the statements in one call: 1 to 10,000.
	// Default 512.
	MaxStatements int
	// MaxBytes bounds the encoded statements of one call: 1 KiB to 50 MiB.
	// Default 512 KiB.
	MaxBytes int
	// MaxInFlight bounds the coalesced calls in flight at once: 1 to 64.
	// Default 4.
	MaxInFlight int
}

// withDefaults validates c and fills its zero fields with the defaults.
func (c CoalesceConfig) withDefaults() (CoalesceConfig, error) {
	if c.Window > time.Second {
		return c, invalidf("Config.Coalesce.Window is %s; accepted: negative (never wait), 0 (the default: a round trip) or up to 1s", c.Window)
	}
	sizes := []struct {
		field     string
		v, lo, hi int
		def       string
	}{
		{"MaxStatements", c.MaxStatements, 1, 10_000, "512"},
		{"MaxBytes", c.MaxBytes, 1 << 10, 50 << 20, "524288"},
		{"MaxInFlight", c.MaxInFlight, 1, 64, "4"},
	}
	for _, s := range sizes {
		if s.v != 0 && (s.v < s.lo || s.v > s.hi) {
			return c, invalidf("Config.Coalesce.%s is %d; accepted: 0 (the default, %s) or %d to %d", s.field, s.v, s.def, s.lo, s.hi)
		}
	}
	if c.Window < 0 {
		c.Window = -1
	}
	if c.MaxStatements == 0 {
		c.MaxStatements = 512
	}
	if c.MaxBytes == 0 {
		c.MaxBytes = 512 << 10
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = 4
	}
	return c, nil
}

// batcher is group commit: it queues the statements of coalesced calls and
// sends them together, one call per departure.
//
// A runner is a goroutine that holds one of the MaxInFlight call slots. It
// departs (drains the queue into a call and sends it) when the budget has a
// call for the queue's first class, and, after a call of its own returned,
// once the callers it answered had a chance to join (see lingering). A
// runner with nothing to carry gives up its slot. A lone caller that finds
// the batcher idle, and the budget with a call for it, is the runner of
// that call itself, sparing two goroutine switches a round trip (see lead).
type batcher struct {
	c   *Client
	cfg CoalesceConfig
	clk clock

	mu          sync.Mutex
	queue       [2][]*pendingGroup // by class: normal, priority
	stmts       int                // statements queued
	size        int                // their share of a body, in bytes
	runners     int                // runners, at most MaxInFlight
	departing   int                // runners not in flight: they carry the queue next
	flights     []*flight          // calls in flight
	arrivals    uint64             // groups ever queued
	lastArrival time.Time          // when the last group was queued
	kick        chan struct{}      // closed, and replaced, when the queue changes
	rtt         time.Duration      // smoothed duration of a call; 0 until one returned
	returns     float64            // smoothed share of answered callers that come back
	cost        costModel          // a call's duration by its statements
}

// flight is a shared call in flight.
type flight struct {
	start time.Time
	// Calls that left just before or after this one and returned first
	// hand their callers over: this call's runner gathers them with its
	// own. handoff is how many groups they answered, since the arrivals
	// when the first of them returned, and first the start of the earliest.
	handoff int
	since   uint64
	first   time.Time
	// stmts is how many statements this call and the calls handed over
	// carried.
	stmts int
}

// pendingGroup is one caller's statements waiting for, or riding in, a call.
type pendingGroup struct {
	wire     []wireStatement
	class    class
	deadline time.Time // the caller's context's; zero: none
	size     int
	taken    bool // drained into a call; the caller can no longer withdraw it
	done     chan struct{}
	results  []Result
	err      *Error
	shared   int // statements of the call that carried it
}

func newBatcher(c *Client, cfg CoalesceConfig, clk clock) *batcher {
	return &batcher{c: c, cfg: cfg, clk: clk, kick: make(chan struct{}), returns: 1}
}

// groupSize is the statements' exact share of a batch body: their encoding
// and a comma each.
func groupSize(wire []wireStatement) int {
	n := 0
	for _, w := range wire {
		n += len(w) + 1
	}
	return n
}

// batchOverhead is what {"batch":[...]} adds to its statements' shares.
const batchOverhead = len(`{"batch":[]}`) - 1

// submit queues the statements for the next shared call and waits for their
// results, and the number of statements of the call that carried them (0
// when none did).
func (b *batcher) submit(ctx context.Context, wire []wireStatement, cl class) ([]Result, int, *Error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, &Error{kind: kindTransport, Err: err, Message: "not sent: " + err.Error(), notSent: true}
	}
	if e := b.c.account.blocked(); e != nil {
		return nil, 0, e
	}
	g := &pendingGroup{wire: wire, class: cl, size: groupSize(wire), done: make(chan struct{})}
	if dl, ok := ctx.Deadline(); ok {
		g.deadline = dl
		// Less than a round trip is left: the call could not come back in
		// time.
		if left, rtt := time.Until(dl), b.c.account.roundTrip(); left < rtt {
			return nil, 0, tooLate(left, rtt)
		}
	}
	b.mu.Lock()
	if !g.deadline.IsZero() {
		// The call that would carry these statements cannot leave, and come
		// back, before the deadline: say so now, with when it could leave.
		if at, why := b.departure(g); why != notWaiting {
			if wait := at.Sub(b.clk.Now()); time.Until(g.deadline) < wait+b.c.account.roundTrip() {
				b.mu.Unlock()
				if why == waitBlock {
					return nil, 0, blockedError(at, wait)
				}
				return nil, 0, b.c.account.exhausted(wait)
			}
		}
	}
	b.queue[cl] = append(b.queue[cl], g)
	b.stmts += len(wire)
	b.size += g.size
	b.arrivals++
	now := b.clk.Now()
	lone := now.Sub(b.lastArrival) >= lingerGap // nobody else arrived lately
	b.lastArrival = now
	b.changed()
	if b.runners == 0 && lone {
		// The batcher is idle, so nothing else is queued (a runner stops
		// only with the queue empty), and nobody else arrived for
		// lingerGap: the call is this caller's alone, and it makes it on
		// its own goroutine. (Under concurrency a runner goroutine starts
		// instead: the callers arriving while it gets going join its call.)
		if ok, _, _, _ := b.c.account.tryTake(cl); ok {
			b.runners++
			return b.lead(ctx, g)
		}
	}
	if start, gather := b.shouldStart(); start {
		b.runners++
		b.departing++
		go b.run(gather)
	}
	b.mu.Unlock()

	select {
	case <-g.done:
		return g.results, g.shared, g.err
	case <-ctx.Done():
	}
	b.mu.Lock()
	select {
	case <-g.done: // the answer arrived together with the cancellation
		b.mu.Unlock()
		return g.results, g.shared, g.err
	default:
	}
	taken := g.taken
	if !taken {
		b.withdraw(g)
	}
	b.mu.Unlock()
	if taken {
		return nil, 0, &Error{kind: kindTransport, Err: ctx.Err(), Ambiguous: true, Message: ctx.Err().Error() + " while the call was in flight"}
	}
	if at, why := b.c.account.nextSlot(cl); why == waitBudget {
		e := b.c.account.exhausted(at.Sub(b.clk.Now()))
		e.Err = ctx.Err()
		return nil, 0, e
	}
	return nil, 0, &Error{kind: kindTransport, Err: ctx.Err(), Message: "not sent: " + ctx.Err().Error() + " while queued for group commit", notSent: true}
}

// departure estimates when the call carrying g would leave, were it queued
// now: the budget's slot for the n-th call from now, n the calls it takes
// to carry the statements ahead of g (all of a higher class first).
func (b *batcher) departure(g *pendingGroup) (time.Time, waitReason) {
	ahead := len(g.wire)
	for c := g.class; c <= priority; c++ {
		for _, q := range b.queue[c] {
			ahead += len(q.wire)
		}
	}
	n := (ahead + b.cfg.MaxStatements - 1) / b.cfg.MaxStatements
	cl := g.class
	if len(b.queue[priority]) > 0 {
		cl = priority // it rides along with the priority work
	}
	return b.c.account.plan(cl, n)
}

// withdraw takes a group that was never sent out of the queue.
func (b *batcher) withdraw(g *pendingGroup) {
	q := b.queue[g.class]
	for i := range q {
		if q[i] == g {
			b.queue[g.class] = append(q[:i:i], q[i+1:]...)
			b.stmts -= len(g.wire)
			b.size -= g.size
			b.changed()
			return
		}
	}
}

// changed wakes the runners waiting to depart.
func (b *batcher) changed() {
	close(b.kick)
	b.kick = make(chan struct{})
}

// headClass is the class of the queue's next call: priority when any
// priority work waits.
func (b *batcher) headClass() class {
	if len(b.queue[priority]) > 0 {
		return priority
	}
	return normal
}

// shouldStart reports whether a newly queued group is worth a new runner,
// and whether that runner gathers the groups still arriving before it
// departs. An idle batcher starts one at once. Otherwise the queue waits
// for the runners about to depart, or for the calls in flight to return,
// unless that would cost it more than a round trip:
//
//   - the queue holds more than those calls will carry (part of it would
//     wait a round trip more);
//   - calls are plentiful, and the queued groups' waits for the first call
//     in flight to return add up to more than a round trip, each waiting
//     more than a nearby while (see nearby); the new runner gathers the
//     groups arriving with them;
//   - the calls in flight are overdue by a round trip.
//
// A further call starts only when the budget has a call for it now.
func (b *batcher) shouldStart() (start, gather bool) {
	switch {
	case b.runners >= b.cfg.MaxInFlight:
		return false, false
	case b.runners == 0:
		return true, false
	}
	carriers := b.runners // each carries one call next
	overflow := b.stmts > carriers*b.callCap() || b.size+batchOverhead > carriers*b.cfg.MaxBytes
	if !overflow {
		switch {
		case b.departing > 0:
			return false, false
		case b.waitingCostsMore():
			return true, true
		case b.rtt == 0 || !b.overdue():
			return false, false
		}
	}
	return b.c.account.spare(b.headClass()), false
}

// waitingCostsMore reports whether calls are plentiful and the queued
// groups would each wait more than a nearby while for the first call in
// flight to return, more than a round trip in all. Until a call returned,
// each is taken to wait a round trip.
func (b *batcher) waitingCostsMore() bool {
	if !b.c.account.plentiful(b.headClass(), b.cfg.MaxInFlight, b.rtt) {
		return false
	}
	groups := len(b.queue[normal]) + len(b.queue[priority])
	if b.rtt == 0 {
		return groups > 1
	}
	now := b.clk.Now()
	due := b.rtt
	for _, f := range b.flights {
		due = min(due, b.due(f, now))
	}
	return due > b.nearby() && time.Duration(groups)*due > b.rtt
}

// due is how long until call f is expected back: a round trip after it
// left, and 0 once it is overdue.
func (b *batcher) due(f *flight, now time.Time) time.Duration {
	return max(f.start.Add(b.rtt).Sub(now), 0)
}

// nearby is the while within which calls count as leaving together: a
// quarter of a round trip. A runner gathers arriving groups for at most
// that long, and the callers of calls that left within it ride on together.
func (b *batcher) nearby() time.Duration { return b.rtt / 4 }

// overdue reports whether every call in flight has been out for more than
// two round trips: waiting for one to return may cost the queue more than
// a round trip.
func (b *batcher) overdue() bool {
	now := b.clk.Now()
	for _, f := range b.flights {
		if now.Sub(f.start) <= 2*b.rtt {
			return false
		}
	}
	return len(b.flights) > 0
}

// callCap is the most statements one call carries: MaxStatements, or,
// while the budget has calls to spare and a call slot is free, as many as
// D1 processes in the time of a round trip without them (while calls are
// plentiful, in an eighth of it, and in plentifulSerial at most). A
// database runs the statements of its calls one at a time, so each
// statement of a call waits for those before it: past that size, a
// parallel call costs its statements less than waiting does.
func (b *batcher) callCap() int {
	base, per, ok := b.cost.estimate()
	if !ok || b.runners >= b.cfg.MaxInFlight {
		return b.cfg.MaxStatements
	}
	var n int
	switch {
	case b.c.account.plentiful(normal, b.cfg.MaxInFlight, b.rtt):
		n = int(min(base/plentifulShare, plentifulSerial) / per)
	case b.c.account.spare(normal):
		n = int(base / per)
	default:
		return b.cfg.MaxStatements // calls are scarce: each carries all it can
	}
	return min(max(n, 1), b.cfg.MaxStatements)
}

// plentifulShare: while calls are plentiful, a call carries no more
// statements than D1 processes in this share of a round trip.
const plentifulShare = 8

// plentifulSerial: while calls are plentiful, a call carries no more
// statements than D1 processes in this time, however long the round trip:
// every caller of a call waits for all its statements, and a few calls of
// this size, sent together, return one after another, their callers going
// on while D1 runs the next. BenchmarkVsSpec at 256 concurrent callers
// measures what it buys, and the calls it costs.
const plentifulSerial = 2 * time.Millisecond

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
// and they show a positive cost per statement.
func (m *costModel) estimate() (base, per time.Duration, ok bool) {
	den := m.w*m.nn - m.n*m.n
	if m.w < 4 || den <= m.w*m.w { // sizes spread by less than a statement
		return 0, 0, false
	}
	slope := (m.w*m.nd - m.n*m.d) / den
	icept := (m.d - slope*m.n) / m.w
	if slope <= 0 || icept <= 0 {
		return 0, 0, false
	}
	return time.Duration(math.Round(icept)), time.Duration(max(math.Round(slope), 1)), true
}

// nearbyFlight returns a call in flight that left within a nearby while of
// f, or of the earliest call whose callers f's runner gathers, and whose
// statements, with f's, fit one call; or nil. Callers of calls too large to
// ride on together stay apart: merged, each would wait for all their
// statements. While calls are plentiful, the answered callers of f wait for
// the other call only while their waits for it add up to a round trip at
// most: past that, a call of their own costs less than the wait, as for a
// parallel call (see waitingCostsMore). A large group of callers, then, is
// not held back for a call that is still out.
func (b *batcher) nearbyFlight(f *flight, answered int, now time.Time) *flight {
	if b.rtt == 0 || b.cfg.Window < 0 {
		return nil
	}
	capacity := b.callCap()
	plentiful := b.c.account.plentiful(b.headClass(), b.cfg.MaxInFlight, b.rtt)
	for _, g := range b.flights {
		if g.start.Sub(f.first).Abs() > b.nearby() || g.stmts+f.stmts > capacity {
			continue
		}
		if plentiful && time.Duration(answered)*b.due(g, now) > b.rtt {
			continue
		}
		return g
	}
	return nil
}

// full reports whether the queue fills a call.
func (b *batcher) full() bool {
	return b.stmts >= b.callCap() || b.size+batchOverhead >= b.cfg.MaxBytes
}

// linger is how a runner whose call returned waits for the callers it
// answered to come back with their next statements.
type linger struct {
	on       bool
	gather   bool      // a new runner gathering the groups arriving
	start    time.Time // when the call returned, or the runner started
	arrivals uint64    // arrivals then
	answered int       // groups the call answered
	until    time.Time // the longest it waits
}

// lingering reports whether a runner lingering as lg still waits, and
// until when, unless another group arrives first. It waits while callers
// it answered are missing, the call has room, and they are still coming
// back: the last of them arrived less than a while ago. While calls are
// plentiful, the while is lingerGap: a caller coming back later gets a
// parallel call if waiting would cost it more (see shouldStart). Otherwise
// it is the longer of lingerGap and what waiting may cost the statements
// already queued before it costs more than leaving would cost the missing
// callers (each would wait about a round trip for this call to return, if
// it comes back at all: returns is the share that usually does). A
// gathering runner waits while groups keep arriving, lingerGap apart.
func (b *batcher) lingering(lg *linger, now time.Time) (bool, time.Time) {
	if !lg.on || b.full() || !now.Before(lg.until) {
		return false, now
	}
	if lg.gather {
		// A gathering runner waits while groups keep arriving.
		wake := maxTime(lg.start, b.lastArrival).Add(lingerGap)
		if lg.until.Before(wake) {
			wake = lg.until
		}
		return now.Before(wake), wake
	}
	back := int(b.arrivals - lg.arrivals)
	missing := lg.answered - back
	if missing <= 0 {
		return false, now
	}
	queued := len(b.queue[normal]) + len(b.queue[priority])
	if queued == 0 {
		return true, lg.until // nobody waits yet
	}
	worth := lingerGap
	if !b.c.account.plentiful(b.headClass(), b.cfg.MaxInFlight, b.rtt) {
		worth = max(worth, time.Duration(b.returns*float64(missing)*float64(b.rtt)/float64(queued)))
	}
	wake := maxTime(lg.start, b.lastArrival).Add(worth)
	if lg.until.Before(wake) {
		wake = lg.until
	}
	return now.Before(wake), wake
}

// lingerGap is the least a linger waits for the next caller to come back.
const lingerGap = 2 * time.Millisecond

// lingered records what share of the callers a call answered came back
// while its runner waited.
func (b *batcher) lingered(lg *linger) {
	if !lg.on || lg.answered == 0 {
		return
	}
	share := min(float64(b.arrivals-lg.arrivals)/float64(lg.answered), 1)
	b.returns += (share - b.returns) / 8
}

// run is a runner. A gathering runner waits, before its first call, while
// groups keep arriving, for a nearby while at most.
func (b *batcher) run(gather bool) {
	var lg linger
	b.mu.Lock()
	if gather && b.cfg.Window >= 0 {
		now := b.clk.Now()
		until := now.Add(b.nearby())
		if b.cfg.Window > 0 && b.cfg.Window < b.nearby() {
			until = now.Add(b.cfg.Window)
		}
		lg = linger{on: true, gather: true, start: now, until: until}
	}
	b.loop(lg)
}

// loop is a runner's life, entered with b.mu held: it departs whenever it
// may, lingering as lg first, until it has nothing to carry or hands its
// callers over. It holds b.mu except while waiting and sending.
func (b *batcher) loop(lg linger) {
	for {
		ok := b.awaitDeparture(&lg)
		b.lingered(&lg)
		b.departing--
		if !ok {
			b.runners--
			b.mu.Unlock()
			return
		}
		deliver, next, on := b.fly(context.Background())
		if !on {
			deliver()
			return
		}
		lg = next
		b.mu.Unlock()
		deliver()
		b.mu.Lock()
	}
}

// lead makes the call of a caller that found the batcher idle, on the
// caller's goroutine, and returns its results. It is entered with b.mu
// held, a runner counted and a call taken from the budget. The call
// carries only this caller's statements, so ctx governs it: cancelled, the
// request is abandoned at once, as the caller would abandon a shared one.
// If nobody else queued meanwhile, the runner ends with the call (the
// caller's next statements find the batcher idle again); otherwise a
// runner goroutine lingers for the callers, as after any call.
func (b *batcher) lead(ctx context.Context, g *pendingGroup) ([]Result, int, *Error) {
	deliver, lg, on := b.fly(ctx)
	if on {
		if lg.answered == 1 && b.stmts == 0 {
			b.departing--
			b.runners--
		} else {
			go func() {
				b.mu.Lock()
				b.loop(lg)
			}()
		}
		b.mu.Unlock()
	}
	deliver()
	return g.results, g.shared, g.err
}

// fly drains the queue into a call and sends it, entered with b.mu held.
// It returns the function that answers the call's callers, and whether the
// runner goes on: then b.mu is held, and next is how the runner lingers for
// the callers it answered. Otherwise the runner handed them over to a call
// that left with this one, and b.mu is released.
func (b *batcher) fly(ctx context.Context) (deliver func(), next linger, on bool) {
	groups, stmts := b.drain()
	if b.stmts > 0 && b.departing == 0 && b.runners < b.cfg.MaxInFlight {
		// What this call could not carry would wait a round trip for
		// it: a parallel call takes it now, if the budget has one.
		if b.c.account.spare(b.headClass()) {
			b.runners++
			b.departing++
			go b.run(b.c.account.plentiful(b.headClass(), b.cfg.MaxInFlight, b.rtt))
		}
	}
	f := &flight{start: b.clk.Now(), stmts: stmts}
	f.first = f.start
	b.flights = append(b.flights, f)
	b.mu.Unlock()

	deliver = b.send(ctx, groups, stmts)

	b.mu.Lock()
	now := b.clk.Now()
	for i, x := range b.flights {
		if x == f {
			b.flights = append(b.flights[:i:i], b.flights[i+1:]...)
			break
		}
	}
	if ctx.Err() == nil { // an abandoned call says nothing of D1's pace
		d := now.Sub(f.start)
		if b.rtt == 0 {
			b.rtt = d
		} else {
			b.rtt += (d - b.rtt) / 4
		}
		b.cost.add(stmts, d)
	}
	since, answered := b.arrivals, len(groups)
	if f.handoff > 0 {
		since, answered = f.since, answered+f.handoff
	}
	if g := b.nearbyFlight(f, answered, now); g != nil {
		// A call that left with this one is due back shortly: its
		// runner gathers these callers with its own, and they ride on
		// together.
		g.stmts += f.stmts
		if g.handoff == 0 || since < g.since {
			g.since = since
		}
		g.handoff += answered
		g.first = minTime(g.first, f.first)
		b.runners--
		b.mu.Unlock()
		return deliver, linger{}, false
	}
	wait := b.cfg.Window
	if wait == 0 {
		wait = b.rtt // the default: up to a round trip
	}
	next = linger{on: wait > 0, start: now, arrivals: since, answered: answered, until: now.Add(wait)}
	b.departing++ // before the callers wake: whoever comes back rides with this runner
	return deliver, next, true
}

// awaitDeparture waits, with b.mu held, until the runner may depart, and
// takes the call from the budget. It returns false when there is nothing
// to carry.
func (b *batcher) awaitDeparture(lg *linger) bool {
	var budgetSince time.Time // when the budget first had no call for it
	for {
		b.dropLate()
		now := b.clk.Now()
		lingering, wake := b.lingering(lg, now)
		if b.stmts == 0 && !lingering {
			return false
		}
		var changed <-chan struct{}
		if !lingering {
			cl := b.headClass()
			ok, at, why, ch := b.c.account.tryTake(cl)
			switch {
			case ok:
				if !budgetSince.IsZero() {
					b.c.tel.waited(cl, b.clk.Now().Sub(budgetSince))
				}
				return true
			case why == waitBudget && budgetSince.IsZero():
				budgetSince = now
			case why == waitBlock:
				// A 971 arrived while these waited: nothing is sent.
				groups := b.drainAll()
				e := blockedError(at, at.Sub(now))
				b.mu.Unlock()
				b.fail(groups, e)
				b.mu.Lock()
				continue
			}
			wake, changed = at, ch
		}
		kick := b.kick
		b.mu.Unlock()
		timer, stop := b.clk.After(wake.Sub(now))
		select {
		case <-timer:
		case <-kick:
			stop()
		case <-changed:
			stop()
		}
		b.mu.Lock()
	}
}

// dropLate fails, with b.mu held, the queued groups with less than a round
// trip left before their deadline: the call would be cut off on its way
// back, their outcome unknown. Nothing of them was sent.
func (b *batcher) dropLate() {
	rtt := b.c.account.roundTrip()
	if rtt == 0 {
		return
	}
	for c := range b.queue {
		for i := 0; i < len(b.queue[c]); {
			g := b.queue[c][i]
			left := time.Until(g.deadline)
			if g.deadline.IsZero() || left >= rtt {
				i++
				continue
			}
			b.withdraw(g) // the queue shrinks: i is the next group
			g.taken = true
			g.err = tooLate(left, rtt)
			close(g.done)
		}
	}
}

// drain takes the queued groups for one call, priority work first, bounded
// by MaxStatements and MaxBytes (a single larger group travels alone).
// Within a class the queue is first come, first served, and lower-class
// work joins only once all higher-class work is aboard.
func (b *batcher) drain() ([]*pendingGroup, int) {
	maxStmts := b.callCap()
	var groups []*pendingGroup
	stmts, size := 0, batchOverhead
	for c := priority; ; c-- {
		q := b.queue[c]
		i := 0
		for ; i < len(q); i++ {
			g := q[i]
			if len(groups) > 0 && (stmts+len(g.wire) > maxStmts || size+g.size > b.cfg.MaxBytes) {
				break
			}
			g.taken = true
			groups = append(groups, g)
			stmts += len(g.wire)
			size += g.size
		}
		b.queue[c] = q[i:]
		if i < len(q) || c == normal {
			break
		}
	}
	b.stmts -= stmts
	b.size -= size - batchOverhead
	return groups, stmts
}

// drainAll takes every queued group.
func (b *batcher) drainAll() []*pendingGroup {
	var groups []*pendingGroup
	for c := range b.queue {
		for _, g := range b.queue[c] {
			g.taken = true
			groups = append(groups, g)
		}
		b.queue[c] = nil
	}
	b.stmts, b.size = 0, 0
	return groups
}

// send makes one shared call and returns the function that hands each
// caller its results or its error.
func (b *batcher) send(ctx context.Context, groups []*pendingGroup, stmts int) (deliver func()) {
	wire := make([]wireStatement, 0, stmts)
	for _, g := range groups {
		wire = append(wire, g.wire...)
	}
	results, e := b.c.send(ctx, encodeBody(wire), len(wire), true)
	for _, g := range groups {
		g.shared = len(wire)
	}
	if e != nil {
		if e.kind == kindSQL && len(groups) > 1 {
			// Nothing committed, and the error does not say whose statement
			// failed: every caller is sent again alone.
			return func() { b.fail(groups, &Error{kind: kindSQL, siblingAbort: true, Message: e.Message}) }
		}
		return func() { b.fail(groups, e) }
	}
	return func() {
		off := 0
		for _, g := range groups {
			g.results = results[off : off+len(g.wire) : off+len(g.wire)]
			off += len(g.wire)
			close(g.done)
		}
	}
}

// fail hands every group its own copy of the error.
func (b *batcher) fail(groups []*pendingGroup, e *Error) {
	for _, g := range groups {
		cp := *e
		g.err = &cp
		close(g.done)
	}
}
