package d1client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// gate is an HTTP transport whose calls wait until the test answers them,
// so that a test decides when each D1 call returns.
type gate struct {
	mu    sync.Mutex
	calls []*gateCall
	auto  func(c *gateCall) (http.Header, bool) // answers at once when it returns true
}

type gateCall struct {
	body   []byte
	sqls   []string // the statements' SQL, in order
	answer chan http.Header
}

func (g *gate) RoundTrip(req *http.Request) (*http.Response, error) {
	body, _ := io.ReadAll(req.Body)
	c := &gateCall{body: body, answer: make(chan http.Header, 1)}
	var one struct {
		SQL   string `json:"sql"`
		Batch []struct {
			SQL string `json:"sql"`
		} `json:"batch"`
	}
	if err := json.Unmarshal(body, &one); err != nil {
		return nil, err
	}
	if one.Batch == nil {
		c.sqls = []string{one.SQL}
	}
	for _, s := range one.Batch {
		c.sqls = append(c.sqls, s.SQL)
	}
	g.mu.Lock()
	g.calls = append(g.calls, c)
	auto := g.auto
	g.mu.Unlock()
	if auto != nil {
		if h, ok := auto(c); ok {
			c.answer <- h
		}
	}
	var h http.Header
	select {
	case h = <-c.answer:
	case <-req.Context().Done():
		return nil, req.Context().Err()
	}
	res := &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"application/json"}},
		Body: io.NopCloser(strings.NewReader(okResults(len(c.sqls)))), Request: req}
	for k, v := range h {
		res.Header[k] = v
	}
	return res, nil
}

// sent returns the calls made so far.
func (g *gate) sent() []*gateCall {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]*gateCall(nil), g.calls...)
}

// waitCalls waits for the n-th call to be made and returns it.
func (g *gate) waitCalls(t testing.TB, n int) *gateCall {
	t.Helper()
	eventually(t, fmt.Sprintf("call %d", n), func() bool { return len(g.sent()) >= n })
	return g.sent()[n-1]
}

// groupClient is a Client whose calls go through a gate, with a fake clock
// for its budget and group commit.
func groupClient(t testing.TB, b Budget, cc CoalesceConfig) (*Client, *gate, *fakeClock) {
	t.Helper()
	g := &gate{}
	clk := newFakeClock()
	if err := b.validate(); err != nil {
		t.Fatal(err)
	}
	acct := newAccount(b, clk)
	c, err := New(Config{BaseURL: testBaseURL, AccountID: testAccount, DatabaseID: testDatabase,
		HTTPClient: &http.Client{Transport: g}, Account: acct, Coalesce: cc, Retry: NoRetry()})
	if err != nil {
		t.Fatal(err)
	}
	return c, g, clk
}

// queued returns the groups waiting in the batcher's queue.
func (b *batcher) queued() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.queue[normal]) + len(b.queue[priority])
}

func (b *batcher) state() (runners, departing, flights int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.runners, b.departing, len(b.flights)
}

func stmt(sql string) []Statement { return []Statement{{SQL: sql}} }

// selects returns n statements: SELECT 0, SELECT 1, ...
func selects(n int) []Statement {
	out := make([]Statement, n)
	for i := range out {
		out[i] = Statement{SQL: fmt.Sprint("SELECT ", i)}
	}
	return out
}

// execAsync runs a coalesced call of sql and returns its error's channel.
func execAsync(c *Client, sql string) chan error {
	done := make(chan error, 1)
	go func() { _, err := c.Exec(context.Background(), stmt(sql), Coalesce()); done <- err }()
	return done
}

// waitOK waits for a call started by execAsync and fails on its error.
func waitOK(t testing.TB, d chan error) {
	t.Helper()
	if err := <-d; err != nil {
		t.Fatal(err)
	}
}

// The callers a call answers can join the next call before it leaves:
// each of them comes straight back with its next statement (a claim, then
// its completion), and the next call carries them all, not only those that
// queued while the first was in flight. No time passes while they come
// back: the runner departs as soon as all it answered are back.
//
// Caller 0 goes first, alone, and makes three calls; the five others queue
// behind it and make two: every call but the first carries all six.
func TestWokenCallersJoinTheNextCall(t *testing.T) {
	c, g, clk := groupClient(t, UnlimitedBudget(), CoalesceConfig{MaxInFlight: 1, Window: time.Second})
	start := clk.Now()
	const callers = 6
	var wg sync.WaitGroup
	first := make(chan struct{})
	for i := range callers {
		wg.Go(func() {
			if i > 0 {
				<-first
			}
			steps := 2
			if i == 0 {
				steps = 3
			}
			for step := range steps {
				if _, err := c.Exec(context.Background(), stmt(fmt.Sprintf("SELECT %d, %d", i, step)), Coalesce()); err != nil {
					t.Error(err)
				}
			}
		})
		if i == 0 {
			// The first caller's call is in flight before the others queue;
			// it takes 20 ms.
			call := g.waitCalls(t, 1)
			if len(call.sqls) != 1 {
				t.Fatalf("first call carries %v", call.sqls)
			}
			clk.Advance(20 * time.Millisecond)
			close(first)
		}
	}
	eventually(t, "the others to queue", func() bool { return c.batch.queued() == callers-1 })
	g.sent()[0].answer <- nil
	// Caller 0 comes back with its second statement and rides with the
	// five that waited.
	call := g.waitCalls(t, 2)
	if len(call.sqls) != callers {
		t.Fatalf("second call carries %d statements %v, want %d", len(call.sqls), call.sqls, callers)
	}
	call.answer <- nil
	// All six come back, and leave together.
	call = g.waitCalls(t, 3)
	if len(call.sqls) != callers {
		t.Fatalf("third call carries %v", call.sqls)
	}
	call.answer <- nil
	wg.Wait()
	// Nobody came back: the runner lingers until Window, then gives up its
	// slot.
	eventually(t, "the linger timer", func() bool { return clk.Timers() == 1 })
	if r, _, _ := c.batch.state(); r != 1 {
		t.Fatalf("%d runners while lingering", r)
	}
	clk.Advance(time.Second)
	eventually(t, "the runner to stop", func() bool { r, _, _ := c.batch.state(); return r == 0 })
	if n := len(g.sent()); n != 3 {
		t.Errorf("%d calls, want 3", n)
	}
	if d := clk.Now().Sub(start); d != time.Second+20*time.Millisecond {
		t.Errorf("%v passed: only the first call and the last linger take time", d)
	}
}

// A caller that finds the batcher idle, nobody else having arrived for
// lingerGap, makes its call itself: the call carries only its statements,
// so its context governs the request, and the runner ends with the call
// unless somebody queued meanwhile, whom a runner goroutine then carries,
// lingering for the lone caller first.
func TestLoneCallerMakesItsOwnCall(t *testing.T) {
	c, g, clk := groupClient(t, UnlimitedBudget(), CoalesceConfig{MaxInFlight: 4})

	// Cancelled in flight: the request is abandoned at once, nothing stays
	// out, and the abandoned call teaches no round trip.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { _, err := c.Exec(ctx, stmt("SELECT 'cancelled'"), Coalesce()); done <- err }()
	g.waitCalls(t, 1)
	clk.Advance(5 * time.Millisecond)
	cancel()
	var e *Error
	if err := <-done; !errors.As(err, &e) || !e.Ambiguous || !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled in flight: %v", err)
	}
	if r, _, f := c.batch.state(); r != 0 || f != 0 {
		t.Fatalf("%d runners, %d calls in flight after the lone caller gave up", r, f)
	}
	c.batch.mu.Lock()
	rtt := c.batch.rtt
	c.batch.mu.Unlock()
	if rtt != 0 {
		t.Fatalf("an abandoned call taught a round trip of %v", rtt)
	}

	// a's call leaves at once; b queues behind it. When a's call returns,
	// a runner goroutine takes b on, after waiting lingerGap for a.
	a := execAsync(c, "SELECT 'a'")
	call := g.waitCalls(t, 2)
	b := execAsync(c, "SELECT 'b'")
	eventually(t, "b to queue", func() bool { return c.batch.queued() == 1 })
	clk.Advance(20 * time.Millisecond)
	call.answer <- nil
	waitOK(t, a)
	if r, d, _ := c.batch.state(); r != 1 || d != 1 {
		t.Fatalf("%d runners, %d departing after a's call: want one, lingering", r, d)
	}
	eventually(t, "the linger timer", func() bool { return clk.Timers() == 1 })
	clk.Advance(lingerGap)
	if call := g.waitCalls(t, 3); !slices.Equal(call.sqls, []string{"SELECT 'b'"}) {
		t.Fatalf("the next call carries %v", call.sqls)
	}
	g.sent()[2].answer <- nil
	waitOK(t, b)
	eventually(t, "the linger timer", func() bool { return clk.Timers() == 1 })
	clk.Advance(time.Second)
	eventually(t, "the runner to stop", func() bool { r, _, _ := c.batch.state(); return r == 0 })

	// A caller that arrives right after another, the batcher idle, is not
	// alone: a runner goroutine makes its call, so that callers arriving
	// behind it could join, and lingers for it after.
	first := execAsync(c, "SELECT 'first'")
	g.waitCalls(t, 4).answer <- nil
	waitOK(t, first)
	if r, _, _ := c.batch.state(); r != 0 {
		t.Fatalf("%d runners after a lone caller's call", r)
	}
	next := execAsync(c, "SELECT 'next'")
	g.waitCalls(t, 5).answer <- nil
	waitOK(t, next)
	if r, _, _ := c.batch.state(); r != 1 {
		t.Fatalf("%d runners after a call of a caller that was not alone: want its runner, lingering", r)
	}
}

// A lone caller makes its own call only when the budget has one for it now:
// meeting a spent budget, it queues, nothing is sent before the budget's
// next slot, and a runner carries it then.
func TestLoneCallerWaitsForTheBudget(t *testing.T) {
	// A burst of one call, then one per 2 s (half of one a second).
	c, g, clk := groupClient(t, NewBudget(10, 10*time.Second).WithBurst(1).WithReserve(0.5), CoalesceConfig{})
	g.auto = func(*gateCall) (http.Header, bool) { return nil, true }
	start := clk.Now()
	if _, err := c.Exec(context.Background(), stmt("SELECT 'spends the burst'"), Coalesce()); err != nil {
		t.Fatal(err)
	}
	if r, _, _ := c.batch.state(); r != 0 {
		t.Fatalf("%d runners after a lone caller's call", r)
	}
	clk.Advance(lingerGap) // the next caller is alone too
	done := execAsync(c, "SELECT 'waits'")
	eventually(t, "the runner to wait for the next slot", func() bool {
		at, ok := clk.Next()
		return ok && at.Sub(start) == 2*time.Second && c.batch.queued() == 1
	})
	if n := len(g.sent()); n != 1 {
		t.Fatalf("%d calls before the budget's slot, want 1", n)
	}
	clk.Set(start.Add(2 * time.Second))
	waitOK(t, done)
	if call := g.sent()[1]; !slices.Equal(call.sqls, []string{"SELECT 'waits'"}) {
		t.Fatalf("the second call carries %v", call.sqls)
	}
}

// scarce is a budget that always has a call for these tests, but whose even
// pace (one call per 100 ms) is slower than their round trips: calls are
// not plentiful, so group commit spends them sparingly.
func scarce() Budget { return NewBudget(1000, 100*time.Second).WithBurst(1000) }

// While calls are scarce, a returned call waits for the callers it
// answered as long as that costs the statements already queued less than
// leaving would cost the missing callers (a round trip each), at most
// Window; any arrival counts towards them.
func TestLingerWeighsTheWait(t *testing.T) {
	c, g, clk := groupClient(t, scarce(), CoalesceConfig{MaxInFlight: 1, Window: time.Second})
	exec := func(sql string) chan error { return execAsync(c, sql) }
	wait := func(d chan error) { t.Helper(); waitOK(t, d) }
	// a's call takes 40 ms; b queues behind it.
	a := exec("SELECT 'a'")
	g.waitCalls(t, 1)
	b := exec("SELECT 'b'")
	eventually(t, "b to queue", func() bool { return c.batch.queued() == 1 })
	clk.Advance(40 * time.Millisecond)
	returned := clk.Now()
	g.sent()[0].answer <- nil
	wait(a)
	// a does not come back. One missing caller would lose a round trip
	// (40 ms); one queued statement loses what the linger takes: b waits
	// 40 ms for a.
	eventually(t, "the linger timer", func() bool {
		at, ok := clk.Next()
		return ok && at.Sub(returned) == 40*time.Millisecond
	})
	if len(g.sent()) != 1 {
		t.Fatal("b left before the linger ended")
	}
	clk.Advance(40 * time.Millisecond)
	call := g.waitCalls(t, 2)

	// Four queued behind b's call: each waits a quarter of a round trip
	// for b, and the runner learnt that answered callers do not always
	// come back.
	var more []chan error
	for i := range 4 {
		more = append(more, exec(fmt.Sprint("SELECT ", i)))
		eventually(t, "the statement to queue", func() bool { return c.batch.queued() == i+1 })
	}
	clk.Advance(40 * time.Millisecond)
	returned = clk.Now()
	call.answer <- nil
	wait(b)
	c.batch.mu.Lock()
	rtt, returns := c.batch.rtt, c.batch.returns
	c.batch.mu.Unlock()
	if returns >= 1 {
		t.Errorf("returns = %v after a caller did not come back", returns)
	}
	want := time.Duration(returns * float64(rtt) / 4)
	eventually(t, "the shorter linger", func() bool {
		at, ok := clk.Next()
		return ok && at.Sub(returned) == want
	})
	clk.Set(returned.Add(want))
	call = g.waitCalls(t, 3)
	if len(call.sqls) != 4 {
		t.Fatalf("call carries %v", call.sqls)
	}
	call.answer <- nil
	for _, d := range more {
		wait(d)
	}
	// Nobody queued: the runner waits for its four up to Window, then gives
	// up its slot.
	returned = clk.Now()
	eventually(t, "the linger timer", func() bool {
		at, ok := clk.Next()
		return ok && at.Sub(returned) == time.Second
	})
	clk.Advance(time.Second)
	eventually(t, "the runner to stop", func() bool { r, _, _ := c.batch.state(); return r == 0 })
}

// A parallel call starts as soon as waiting for the call in flight would
// cost the queue more than a round trip, and not before: when the queue
// holds more than the next call carries, or the call in flight is overdue.
// How much a call carries comes from what calls cost: D1 runs a call's
// statements one after another, so once a call's statements take longer
// than a round trip, the rest go in a parallel call.
//
// Calls are scarce here; TestLatencyFirstWhenCallsArePlentiful shows what
// changes when they are not.
func TestParallelCallWhenWaitingCostsMore(t *testing.T) {
	c, g, clk := groupClient(t, scarce(), CoalesceConfig{MaxInFlight: 4, Window: -1})
	exec := func(stmts []Statement) chan error {
		done := make(chan error, 1)
		go func() { _, err := c.Exec(context.Background(), stmts, Coalesce()); done <- err }()
		return done
	}
	// Teach the batcher what calls cost: 9 ms, and 1 ms per statement.
	for i, n := range []int{1, 11, 1, 11, 1, 11} {
		d := exec(selects(n))
		call := g.waitCalls(t, i+1)
		clk.Advance(time.Duration(9+n) * time.Millisecond)
		call.answer <- nil
		if err := <-d; err != nil {
			t.Fatal(err)
		}
		eventually(t, "the runner to stop", func() bool { r, _, _ := c.batch.state(); return r == 0 })
	}
	if base, per, ok := c.batch.cost.estimate(); !ok || base != 9*time.Millisecond || per != time.Millisecond {
		t.Fatalf("cost model: base %v, per statement %v, %v", base, per, ok)
	}
	taught := len(g.sent())

	// A call in flight; nine waiters fill the next call (9 ms of
	// statements), so they wait for it.
	var done []chan error
	done = append(done, exec(selects(1)))
	g.waitCalls(t, taught+1)
	for i := range 9 {
		done = append(done, exec(stmt(fmt.Sprint("SELECT 'waiter ", i, "'"))))
		eventually(t, "the waiter to queue", func() bool { return c.batch.queued() == i+1 })
	}
	if n := len(g.sent()); n != taught+1 {
		t.Fatalf("%d calls: waiters below a call's worth started a parallel call", n-taught)
	}
	// A tenth would wait a round trip more: a parallel call takes nine,
	// and another the tenth.
	done = append(done, exec(stmt("SELECT 'tenth'")))
	g.waitCalls(t, taught+3)
	var sizes []int
	for _, call := range g.sent()[taught+1:] {
		sizes = append(sizes, len(call.sqls))
	}
	slices.Sort(sizes) // the two parallel calls race to the transport
	if fmt.Sprint(sizes) != "[1 9]" {
		t.Fatalf("parallel calls of %v statements, want 9 and 1", sizes)
	}
	for _, call := range g.sent()[taught:] {
		call.answer <- nil
	}
	for _, d := range done {
		if err := <-d; err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "the runners to stop", func() bool { r, _, _ := c.batch.state(); return r == 0 })

	// A call overdue by more than two round trips: a waiter does not wait
	// for it.
	taught = len(g.sent())
	slow := exec(stmt("SELECT 'slow'"))
	call := g.waitCalls(t, taught+1)
	clk.Advance(time.Second)
	waiter := exec(stmt("SELECT 'waiter'"))
	g.waitCalls(t, taught+2).answer <- nil
	if err := <-waiter; err != nil {
		t.Fatal(err)
	}
	call.answer <- nil
	if err := <-slow; err != nil {
		t.Fatal(err)
	}
}

// When calls are scarce, the runner waits for the next slot while more
// statements join; priority work leaves first, on the reserve, and other
// work rides along in its call.
// While calls are plentiful, group commit adds no latency where a call
// would save it: a group that would wait more than a quarter of a round
// trip for the call in flight, in a queue whose waits add up to more than a
// round trip, gets a parallel call, which gathers the groups arriving with
// it; a returned call's runner waits for its callers only while they keep
// coming back; and the callers of calls that left together ride on
// together in one call.
func TestLatencyFirstWhenCallsArePlentiful(t *testing.T) {
	c, g, clk := groupClient(t, UnlimitedBudget(), CoalesceConfig{MaxInFlight: 4})
	exec := func(sql string) chan error { return execAsync(c, sql) }
	wait := func(d chan error) { t.Helper(); waitOK(t, d) }
	timerAt := func(what string, at time.Time) {
		t.Helper()
		eventually(t, what, func() bool { next, ok := clk.Next(); return ok && next.Equal(at) })
	}
	// A first call teaches the round trip: 20 ms. Its caller found the
	// batcher idle and made the call itself, and nothing queued meanwhile:
	// the runner ended with the call.
	d := exec("SELECT 'teach'")
	call := g.waitCalls(t, 1)
	clk.Advance(20 * time.Millisecond)
	call.answer <- nil
	wait(d)
	if r, _, _ := c.batch.state(); r != 0 {
		t.Fatalf("%d runners after a lone caller's call", r)
	}

	// a's call leaves at once. b would wait a round trip for it: no more
	// than a call's time in all, so b waits.
	a := exec("SELECT 'a'")
	g.waitCalls(t, 2)
	b := exec("SELECT 'b'")
	eventually(t, "b to queue", func() bool { return c.batch.queued() == 1 })
	if r, _, _ := c.batch.state(); r != 1 || len(g.sent()) != 2 {
		t.Fatalf("%d runners, %d calls: one waiter started a parallel call", r, len(g.sent()))
	}
	// With c the waits add up to two round trips: a parallel call starts,
	// and gathers d, which comes before arrivals pause for lingerGap.
	cc := exec("SELECT 'c'")
	eventually(t, "the parallel runner", func() bool { r, _, _ := c.batch.state(); return r == 2 })
	dd := exec("SELECT 'd'")
	eventually(t, "d to queue", func() bool { return c.batch.queued() == 3 })
	timerAt("the gathering timer", clk.Now().Add(lingerGap))
	if len(g.sent()) != 2 {
		t.Fatal("the parallel call left while groups were still arriving")
	}
	clk.Advance(lingerGap)
	call = g.waitCalls(t, 3)
	if want := []string{"SELECT 'b'", "SELECT 'c'", "SELECT 'd'"}; !slices.Equal(call.sqls, want) {
		t.Fatalf("the parallel call carries %v, want %v", call.sqls, want)
	}

	// a's call returns first, 2 ms before the other: a comes back at once,
	// and waits for the other call rather than leaving alone.
	clk.Advance(20*time.Millisecond - lingerGap)
	g.sent()[1].answer <- nil
	wait(a)
	a2 := exec("SELECT 'a2'")
	eventually(t, "a2 to queue", func() bool { return c.batch.queued() == 1 })
	if r, _, _ := c.batch.state(); r != 1 || len(g.sent()) != 3 {
		t.Fatalf("%d runners, %d calls: a's runner did not hand a over", r, len(g.sent()))
	}
	// The other call returns; its runner waits for all four, who come
	// straight back and leave together.
	clk.Advance(lingerGap)
	call.answer <- nil
	var more []chan error
	for i, d := range []chan error{b, cc, dd} {
		wait(d)
		more = append(more, exec(fmt.Sprint("SELECT ", i)))
	}
	call = g.waitCalls(t, 4)
	if len(call.sqls) != 4 || call.sqls[0] != "SELECT 'a2'" {
		t.Fatalf("the next call carries %v, want a2 and the three others", call.sqls)
	}
	clk.Advance(20 * time.Millisecond)
	call.answer <- nil
	wait(a2)
	// Only a2's caller comes back: the three others are missing, but while
	// calls are plentiful the runner waits only lingerGap for them, not the
	// round trip each of them would lose.
	returned := clk.Now()
	last := exec("SELECT 'last'")
	eventually(t, "last to queue", func() bool { return c.batch.queued() == 1 })
	timerAt("the short linger", returned.Add(lingerGap))
	clk.Advance(lingerGap)
	if call := g.waitCalls(t, 5); !slices.Equal(call.sqls, []string{"SELECT 'last'"}) {
		t.Fatalf("the last call carries %v", call.sqls)
	}
	g.sent()[4].answer <- nil
	for _, d := range append(more, last) {
		wait(d)
	}
}

// While calls are plentiful, the callers of a call that returns first are
// handed to a call that left with it only while their waits for it add up
// to a round trip at most. Three callers who would each wait 16 ms for the
// other call (48 ms in all, more than the 20 ms round trip) leave at once
// in a call of their own; a lone caller who would wait 2 ms is handed over
// (TestLatencyFirstWhenCallsArePlentiful).
func TestPlentifulHandoverOnlyWhenCheap(t *testing.T) {
	c, g, clk := groupClient(t, UnlimitedBudget(), CoalesceConfig{MaxInFlight: 4})
	exec := func(sql string) chan error { return execAsync(c, sql) }
	// A first call teaches the round trip: 20 ms.
	d := exec("SELECT 'teach'")
	call := g.waitCalls(t, 1)
	clk.Advance(20 * time.Millisecond)
	call.answer <- nil
	waitOK(t, d)

	// a's call leaves at once; b, c and d queue behind it and their waits
	// add up to more than a round trip: a parallel call gathers them.
	start := clk.Now()
	a := exec("SELECT 'a'")
	g.waitCalls(t, 2)
	var three []chan error
	for i, sql := range []string{"SELECT 'b'", "SELECT 'c'", "SELECT 'd'"} {
		three = append(three, exec(sql))
		eventually(t, "the group to queue", func() bool { return c.batch.queued() == i+1 })
	}
	eventually(t, "the gathering timer", func() bool { return clk.Timers() == 1 })
	clk.Advance(lingerGap)
	parallel := g.waitCalls(t, 3)
	if len(parallel.sqls) != 3 {
		t.Fatalf("the parallel call carries %v, want b, c and d", parallel.sqls)
	}

	// The parallel call returns 4 ms after a's left: a's call is due in
	// 16 ms. Handed over, the three would wait 48 ms for it: their runner
	// takes them on itself, and their next call leaves while a's is out.
	clk.Set(start.Add(4 * time.Millisecond))
	parallel.answer <- nil
	var next []chan error
	for i, d := range three {
		waitOK(t, d)
		next = append(next, exec(fmt.Sprint("SELECT ", i)))
	}
	call = g.waitCalls(t, 4)
	if got, want := slices.Sorted(slices.Values(call.sqls)), []string{"SELECT 0", "SELECT 1", "SELECT 2"}; !slices.Equal(got, want) {
		t.Fatalf("the next call carries %v, want the three in some order", call.sqls)
	}
	select {
	case err := <-a:
		t.Fatalf("a's call returned (%v) before the three left", err)
	default:
	}
	g.sent()[1].answer <- nil
	waitOK(t, a)
	call.answer <- nil
	for _, d := range next {
		waitOK(t, d)
	}
}

// The handover rule itself, in both regimes: a returned call's callers are
// handed to a call that left with it and is due back 18 ms later. While
// calls are plentiful, one caller is (18 ms of waiting), three are not
// (54 ms, more than the 20 ms round trip). When calls are scarce, waiting
// saves a call, so three are handed over too.
func TestHandoverWeighsWaitsOnlyWhenPlentiful(t *testing.T) {
	for _, tc := range []struct {
		name      string
		budget    Budget
		plentiful bool
	}{
		{"plentiful", UnlimitedBudget(), true},
		{"scarce", NewBudget(1200, 300*time.Second).WithBurst(10), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _, clk := groupClient(t, tc.budget, CoalesceConfig{MaxInFlight: 4})
			b := c.batch
			b.mu.Lock()
			defer b.mu.Unlock()
			if got := b.c.account.plentiful(normal, b.cfg.MaxInFlight, 20*time.Millisecond); got != tc.plentiful {
				t.Fatalf("plentiful = %v, want %v", got, tc.plentiful)
			}
			now := clk.Now()
			b.rtt = 20 * time.Millisecond
			// The returned call left 4 ms ago, the other 2 ms ago: due back
			// in 18 ms.
			returned := &flight{start: now.Add(-4 * time.Millisecond), first: now.Add(-4 * time.Millisecond), stmts: 3}
			out := &flight{start: now.Add(-2 * time.Millisecond), first: now.Add(-2 * time.Millisecond), stmts: 1}
			b.flights = []*flight{out}
			for _, answered := range []int{1, 3} {
				want := out
				if tc.plentiful && answered == 3 {
					want = nil
				}
				if got := b.nearbyFlight(returned, answered, now); got != want {
					t.Errorf("%d callers answered: handed over %v, want %v", answered, got != nil, want != nil)
				}
			}
		})
	}
}

// While calls are plentiful, a call carries no more statements than D1
// runs in plentifulSerial, however long the round trip: each of its callers
// waits for all of them. And the callers of calls that left together ride
// on together only when those calls' statements fit one call; otherwise
// each runner takes its own callers on, at once.
//
// Calls take 40 ms and 100 µs per statement: an eighth of a round trip
// would be 50 statements, plentifulSerial (2 ms) is 20.
func TestPlentifulCallsStayShort(t *testing.T) {
	c, g, clk := groupClient(t, UnlimitedBudget(), CoalesceConfig{MaxInFlight: 4, Window: time.Millisecond})
	const base, per = 40 * time.Millisecond, 100 * time.Microsecond
	for i, n := range []int{1, 11, 1, 11, 1, 11} {
		done := make(chan error, 1)
		go func() { _, err := c.Exec(context.Background(), selects(n), Coalesce()); done <- err }()
		call := g.waitCalls(t, i+1)
		clk.Advance(base + time.Duration(n)*per)
		call.answer <- nil
		waitOK(t, done)
		// The caller found the batcher idle and made the call itself, and
		// nobody queued meanwhile: the runner ended with the call.
		if r, _, _ := c.batch.state(); r != 0 {
			t.Fatalf("%d runners after a lone caller's call", r)
		}
	}
	taught := len(g.sent())
	c.batch.mu.Lock()
	limit := c.batch.callCap()
	c.batch.mu.Unlock()
	if want := int(plentifulSerial / per); limit != want {
		t.Fatalf("a call carries up to %d statements, want %d", limit, want)
	}

	// x's call leaves at once. 30 callers queue behind it, each with two
	// statements to make, one after the other: a parallel call gathers
	// them, 20 at most, and another the other 10.
	start := clk.Now()
	x := execAsync(c, "SELECT 'x'")
	g.waitCalls(t, taught+1)
	const callers = 30
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			for step := range 2 {
				if _, err := c.Exec(context.Background(), stmt(fmt.Sprintf("SELECT %d, %d", i, step)), Coalesce()); err != nil {
					t.Error(err)
				}
			}
		})
	}
	g.waitCalls(t, taught+2)
	eventually(t, "the rest to queue", func() bool { return c.batch.queued() == callers-20 })
	eventually(t, "the gathering timer", func() bool { return clk.Timers() == 1 })
	clk.Advance(lingerGap)
	g.waitCalls(t, taught+3)
	calls := g.sent()[taught:]
	if n1, n2 := len(calls[1].sqls), len(calls[2].sqls); n1 != 20 || n2 != 10 {
		t.Fatalf("the parallel calls carry %d and %d statements, want 20 and 10", n1, n2)
	}

	// x's call returns first: 1 + 20 statements do not fit one call, 1 + 10
	// do, so x's runner hands over to the third call's.
	clk.Set(start.Add(base + per))
	calls[0].answer <- nil
	waitOK(t, x)
	eventually(t, "x's runner to hand over", func() bool { r, _, _ := c.batch.state(); return r == 2 })
	// The 20-statement call returns: 20 + 11 do not fit one call either, so
	// its runner takes its 20 callers on at once, while the third call is
	// still out.
	clk.Set(start.Add(base + 20*per))
	calls[1].answer <- nil
	call := g.waitCalls(t, taught+4)
	if len(call.sqls) != 20 {
		t.Fatalf("the next call carries %d statements, want the 20 callers back", len(call.sqls))
	}
	for _, sql := range call.sqls {
		if !strings.HasSuffix(sql, ", 1") {
			t.Fatalf("the next call carries %q, not a second statement", sql)
		}
	}
	// The rest only has to finish: every call is answered, and time passes
	// for whatever runner waits.
	calls[2].answer <- nil
	call.answer <- nil
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	deadline := time.Now().Add(10 * time.Second)
	for next := taught + 4; ; { // from the call after the 20 callers' own
		select {
		case <-finished:
			return
		default:
		}
		if time.Now().After(deadline) {
			r, d, f := c.batch.state()
			t.Fatalf("timed out waiting for the callers to finish: %d queued, %d runners, %d departing, %d flights, %d timers, %d calls, next %d", c.batch.queued(), r, d, f, clk.Timers(), len(g.sent()), next)
		}
		for sent := g.sent(); next < len(sent); next++ {
			sent[next].answer <- nil
		}
		if clk.Timers() > 0 {
			clk.Advance(lingerGap)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

func TestPriorityWorkLeavesFirst(t *testing.T) {
	// One call per 2 s for work without priority, with a burst of 1;
	// priority work is not held to the pace.
	c, g, clk := groupClient(t, NewBudget(10, 10*time.Second).WithBurst(3).WithReserve(0.5),
		CoalesceConfig{MaxInFlight: 1, MaxStatements: 3, Window: -1})
	g.auto = func(*gateCall) (http.Header, bool) { return nil, true }
	start := clk.Now()
	if _, err := c.Exec(context.Background(), stmt("SELECT 'spends the burst'"), Coalesce()); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	exec := func(sql string, opts ...ExecOption) {
		wg.Go(func() {
			if _, err := c.Exec(context.Background(), stmt(sql), append(opts, Coalesce())...); err != nil {
				t.Error(err)
			}
		})
	}
	for i := range 3 {
		exec(fmt.Sprint("SELECT 'normal ", i, "'"))
		eventually(t, "the statement to queue", func() bool { return c.batch.queued() == i+1 })
	}
	eventually(t, "the runner to wait for the normal slot", func() bool {
		at, ok := clk.Next()
		return ok && at.Sub(start) == 2*time.Second
	})
	// A completion leaves at once, on the reserve, and takes the first two
	// waiting statements with it.
	exec("SELECT 'completion'", Priority())
	call := g.waitCalls(t, 2)
	want := []string{"SELECT 'completion'", "SELECT 'normal 0'", "SELECT 'normal 1'"}
	if strings.Join(call.sqls, "|") != strings.Join(want, "|") {
		t.Fatalf("call carries %v, want %v", call.sqls, want)
	}
	if clk.Now() != start {
		t.Fatal("time passed")
	}
	// The last one waits for the next normal slot: the completion moved the
	// pace on by 1 s.
	eventually(t, "the runner to wait for the next slot", func() bool {
		at, ok := clk.Next()
		return ok && at.Sub(start) == 3*time.Second && c.batch.queued() == 1
	})
	clk.Set(start.Add(3 * time.Second))
	wg.Wait()
	if n := len(g.sent()); n != 3 {
		t.Errorf("%d calls", n)
	}
}

// New work is turned away at once, with an accurate Retry-After, when the
// budget has no call for it before its deadline; priority work meeting a
// momentarily empty budget waits for its slot and lands.
func TestCompletionsWaitWhileClaimsAreShed(t *testing.T) {
	c, g, clk := groupClient(t, UnlimitedBudget().WithBurst(10).WithReserve(0.2), CoalesceConfig{Window: -1})
	hdr := rateHeaders(3, 60, 1200, 300)
	g.auto = func(*gateCall) (http.Header, bool) { h := hdr; return h, true }
	if _, err := c.Exec(context.Background(), stmt("SELECT 'learns the budget'"), Coalesce()); err != nil {
		t.Fatal(err)
	}
	start := clk.Now()
	// 3 calls left, 3 of them the reserve's: a claim with a 10 s deadline
	// is refused at once, and told to come back after the reset.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := c.Exec(ctx, stmt("INSERT INTO claims VALUES (1)"), Coalesce())
	var e *Error
	if !errors.As(err, &e) || !errors.Is(err, ErrBudget) || e.RetryAfter != 61*time.Second {
		t.Fatalf("claim: %v", err)
	}
	// A completion goes.
	if _, err := c.Exec(ctx, stmt("UPDATE t SET done = 1"), Coalesce(), Priority()); err != nil {
		t.Fatal(err)
	}
	// Now none is left: the next completion waits for the reset and lands.
	hdr = rateHeaders(0, 2, 1200, 300)
	if _, err := c.Exec(ctx, stmt("UPDATE t SET done = 2"), Coalesce(), Priority()); err != nil {
		t.Fatal(err)
	}
	done := make(chan error)
	go func() {
		_, err := c.Exec(ctx, stmt("UPDATE t SET done = 3"), Coalesce(), Priority(), Idempotent())
		done <- err
	}()
	eventually(t, "the completion to wait for the reset", func() bool {
		at, ok := clk.Next()
		return ok && at.Sub(start) == 3*time.Second
	})
	hdr = rateHeaders(1199, 300, 1200, 300)
	clk.Set(start.Add(3 * time.Second))
	if err := <-done; err != nil {
		t.Fatalf("the completion was lost: %v", err)
	}
	if n := len(g.sent()); n != 4 {
		t.Errorf("%d calls", n)
	}
}

// Below the ceiling, nobody is refused and nobody waits long: an open-loop
// load of new work over fake time, at 3/4 of what a budget of one call a
// second carries. The clock only moves when every caller so far has been
// answered or is queued behind a runner waiting for its slot.
func TestNoRefusalBelowTheCeiling(t *testing.T) {
	c, g, clk := groupClient(t, NewBudget(60, time.Minute).WithBurst(2), CoalesceConfig{MaxStatements: 100, Window: -1})
	g.auto = func(*gateCall) (http.Header, bool) { return nil, true }
	start := clk.Now()
	const perTick, ticks = 3, 200 // 3 every 50 ms: 60 per second for 10 s; the ceiling is 80
	var wg sync.WaitGroup
	var finished atomic.Int64
	var mu sync.Mutex
	var longest time.Duration // the longest a request took, in fake time
	quiet := func(callers int) func() bool {
		return func() bool {
			sent := 0
			for _, call := range g.sent() {
				sent += len(call.sqls)
			}
			c.batch.mu.Lock()
			arrived := c.batch.arrivals
			queued := c.batch.stmts
			c.batch.mu.Unlock()
			return arrived == uint64(callers) && finished.Load() == int64(sent) && (queued == 0 || clk.Timers() > 0)
		}
	}
	for tick := range ticks {
		for i := range perTick {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				t0 := clk.Now()
				_, err := c.Exec(ctx, stmt(fmt.Sprintf("SELECT %d", tick*perTick+i)), Coalesce())
				mu.Lock()
				longest = max(longest, clk.Now().Sub(t0))
				mu.Unlock()
				if err != nil {
					t.Error(err)
				}
				finished.Add(1)
			})
		}
		eventually(t, "the callers to be answered or queued", quiet((tick+1)*perTick))
		clk.Set(start.Add(time.Duration(tick+1) * 50 * time.Millisecond))
	}
	for finished.Load() < perTick*ticks {
		eventually(t, "the callers to be answered or queued", quiet(perTick*ticks))
		if next, ok := clk.Next(); ok {
			clk.Set(next)
		}
	}
	wg.Wait()
	calls := len(g.sent())
	if elapsed := clk.Now().Sub(start); calls > int(elapsed/time.Second)+3 {
		t.Errorf("%d calls in %v: over the budget's pace", calls, elapsed)
	}
	// Each waited about one pace interval (1.25 s for work without
	// Priority) at most: far within any deadline a request would have (the
	// middleware's is 10 s).
	if longest > 1500*time.Millisecond {
		t.Errorf("a request waited %v for its call", longest)
	}
	t.Logf("%d requests in %d calls; the longest wait %v", perTick*ticks, calls, longest)
}
