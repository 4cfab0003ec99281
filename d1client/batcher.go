package d1client

import (
	"context"
	"sync"
	"time"
)

// CoalesceConfig configures group commit: statements of concurrent Exec
// calls made with Coalesce() travel together in one D1 batch call.
//
// How it behaves:
//
//   - When no coalesced call is in flight, a caller's statements are sent at
//     once: the batcher never waits when idle.
//   - While a call is in flight, arriving statements queue, and leave
//     together as soon as it returns. A further call starts in parallel (up
//     to MaxInFlight) only once half a batch (MaxStatements/2) has piled up;
//     such a call first waits at most Window for more company. Every call is
//     bounded by MaxStatements and MaxBytes.
//   - Waiting for the request budget happens before the queue is drained,
//     so under budget pressure each call carries more.
//   - Each caller gets exactly the results of its own statements.
//
// So a statement waits for at most one call in flight (one D1 round trip)
// plus Window before it is sent, budget permitting, and under concurrency the
// calls per request fall towards 1/(requests per batch).
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
	// Window is the longest an additional parallel call waits for more
	// statements before it is sent: up to 1 s. Default 2 ms; negative means
	// never wait.
	Window time.Duration
	// MaxStatements bounds the statements in one call: 1 to 10,000.
	// Default 256.
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
		return c, invalidf("Config.Coalesce.Window is %s; accepted: negative (never wait), 0 (the default, 2ms) or up to 1s", c.Window)
	}
	sizes := []struct {
		field     string
		v, lo, hi int
		def       string
	}{
		{"MaxStatements", c.MaxStatements, 1, 10_000, "256"},
		{"MaxBytes", c.MaxBytes, 1 << 10, 50 << 20, "524288"},
		{"MaxInFlight", c.MaxInFlight, 1, 64, "4"},
	}
	for _, s := range sizes {
		if s.v != 0 && (s.v < s.lo || s.v > s.hi) {
			return c, invalidf("Config.Coalesce.%s is %d; accepted: 0 (the default, %s) or %d to %d", s.field, s.v, s.def, s.lo, s.hi)
		}
	}
	if c.Window == 0 {
		c.Window = 2 * time.Millisecond
	}
	if c.Window < 0 {
		c.Window = 0
	}
	if c.MaxStatements == 0 {
		c.MaxStatements = 256
	}
	if c.MaxBytes == 0 {
		c.MaxBytes = 512 << 10
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = 4
	}
	return c, nil
}

type batcher struct {
	c   *Client
	cfg CoalesceConfig

	mu       sync.Mutex
	queue    []*pendingGroup
	queued   int // statements in queue
	inflight int
}

// pendingGroup is one caller's statements waiting for, or riding in, a call.
type pendingGroup struct {
	wire    []wireStatement
	size    int
	taken   bool // drained into a call; the caller can no longer withdraw it
	done    chan struct{}
	results []Result
	err     *Error
}

func newBatcher(c *Client, cfg CoalesceConfig) *batcher {
	return &batcher{c: c, cfg: cfg}
}

// groupSize is the statements' exact share of a batch body.
func groupSize(wire []wireStatement) int {
	n := 0
	for _, w := range wire {
		n += len(w) + 1
	}
	return n
}

// submit queues the statements for the next shared call and waits for their
// results.
func (b *batcher) submit(ctx context.Context, wire []wireStatement) ([]Result, *Error) {
	if err := ctx.Err(); err != nil {
		return nil, &Error{kind: kindTransport, Err: err, Message: "not sent: " + err.Error()}
	}
	if e := b.c.checkBlocked(); e != nil {
		return nil, e
	}
	if dl, ok := ctx.Deadline(); ok {
		if free := b.c.budget.nextFree(); dl.Before(free) {
			return nil, b.c.budget.exhausted(time.Until(free))
		}
	}
	g := &pendingGroup{wire: wire, size: groupSize(wire), done: make(chan struct{})}
	b.mu.Lock()
	b.queue = append(b.queue, g)
	b.queued += len(wire)
	// Idle: send at once. Busy: the statements wait for the call in flight
	// to return and then leave together, unless enough have piled up to
	// fill half a batch, which is worth another call in parallel.
	if b.inflight == 0 || b.inflight < b.cfg.MaxInFlight && b.queued >= b.cfg.MaxStatements/2 {
		idle := b.inflight == 0
		b.inflight++
		go b.run(idle)
	}
	b.mu.Unlock()

	select {
	case <-g.done:
		return g.results, g.err
	case <-ctx.Done():
	}
	b.mu.Lock()
	select {
	case <-g.done: // the answer arrived together with the cancellation
		b.mu.Unlock()
		return g.results, g.err
	default:
	}
	taken := g.taken
	if !taken {
		for i, q := range b.queue {
			if q == g {
				b.queue = append(b.queue[:i], b.queue[i+1:]...)
				b.queued -= len(g.wire)
				break
			}
		}
	}
	b.mu.Unlock()
	if !taken {
		if free := b.c.budget.nextFree(); time.Until(free) > 0 {
			e := b.c.budget.exhausted(time.Until(free))
			e.Err = ctx.Err()
			return nil, e
		}
		return nil, &Error{kind: kindTransport, Err: ctx.Err(), Message: "not sent: " + ctx.Err().Error() + " while queued for group commit"}
	}
	return nil, &Error{kind: kindTransport, Err: ctx.Err(), Ambiguous: true, Message: ctx.Err().Error() + " while the call was in flight"}
}

// run sends shared calls until the queue is empty, then gives up its
// in-flight slot. The slot is given up before the callers are woken, so a
// caller that comes straight back finds the batcher idle and is sent at once.
func (b *batcher) run(idle bool) {
	if !idle && b.cfg.Window > 0 {
		time.Sleep(b.cfg.Window)
	}
	for {
		// Wait for the budget before draining, so the queue keeps filling.
		budgetErr := b.c.budget.wait(context.Background())
		blocked := b.c.checkBlocked()
		groups, stmts := b.drain()
		var deliver func()
		switch {
		case len(groups) == 0:
			deliver = func() {}
		case blocked != nil:
			deliver = func() { b.fail(groups, blocked) }
		case budgetErr != nil:
			deliver = func() { b.fail(groups, budgetErr) }
		default:
			deliver = b.send(groups, stmts)
		}
		b.mu.Lock()
		more := len(b.queue) > 0
		if !more {
			b.inflight--
		}
		b.mu.Unlock()
		deliver()
		if !more {
			return
		}
	}
}

// drain takes the queued groups for one call, bounded by MaxStatements and
// MaxBytes (a single larger group travels alone).
func (b *batcher) drain() ([]*pendingGroup, int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var groups []*pendingGroup
	stmts, size := 0, 0
	for len(b.queue) > 0 {
		g := b.queue[0]
		if len(groups) > 0 && (stmts+len(g.wire) > b.cfg.MaxStatements || size+g.size > b.cfg.MaxBytes) {
			break
		}
		g.taken = true
		groups = append(groups, g)
		stmts += len(g.wire)
		size += g.size
		b.queue = b.queue[1:]
		b.queued -= len(g.wire)
	}
	return groups, stmts
}

// send makes one shared call and returns the function that hands each
// caller its results or its error.
func (b *batcher) send(groups []*pendingGroup, stmts int) (deliver func()) {
	wire := make([]wireStatement, 0, stmts)
	for _, g := range groups {
		wire = append(wire, g.wire...)
	}
	results, e := b.c.send(context.Background(), encodeBody(wire), len(wire))
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
