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
	"testing"
	"testing/synctest"
	"time"

	"github.com/d1idem/d1idem/d1client/budget"
)

// The mechanism of group commit, in fake time (testing/synctest): calls go
// through a gate, which holds each call until the test answers it, so the
// test decides when each D1 call returns; gcpolicy_test.go covers the
// rules themselves.

// gate is an HTTP transport whose calls wait until the test answers them.
// A call holding a statement whose SQL contains "missing_table" is
// answered as D1 answers it: 400, code 7500, no such table.
type gate struct {
	mu    sync.Mutex
	calls []*gateCall
}

type gateCall struct {
	at     time.Time // when it was sent
	sqls   []string  // its statements' SQL, in order
	answer chan http.Header
}

func (g *gate) RoundTrip(req *http.Request) (*http.Response, error) {
	body, _ := io.ReadAll(req.Body)
	c := &gateCall{at: time.Now(), answer: make(chan http.Header, 1)}
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
	g.mu.Unlock()
	var h http.Header
	select {
	case h = <-c.answer:
	case <-req.Context().Done():
		return nil, req.Context().Err()
	}
	status, answer := 200, okResults(len(c.sqls))
	if slices.ContainsFunc(c.sqls, func(s string) bool { return strings.Contains(s, "missing_table") }) {
		status, answer = 400, `{"result":[],"success":false,"errors":[{"code":7500,"message":"no such table: missing_table: SQLITE_ERROR"}],"messages":[]}`
	}
	res := &http.Response{StatusCode: status, Header: http.Header{"Content-Type": {"application/json"}},
		Body: io.NopCloser(strings.NewReader(answer)), Request: req}
	for k, v := range h {
		res.Header[k] = v
	}
	return res, nil
}

// sent returns the calls made so far, once every goroutine of the bubble
// is blocked.
func (g *gate) sent() []*gateCall {
	synctest.Wait()
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.calls)
}

// answer answers call i (0-based) and waits for the bubble to settle.
func (g *gate) answer(t *testing.T, i int) {
	t.Helper()
	calls := g.sent()
	if i >= len(calls) {
		t.Fatalf("no call %d: %d calls", i+1, len(calls))
	}
	calls[i].answer <- nil
	synctest.Wait()
}

// sizes returns the statements of each call, and when each was sent,
// after start.
func (g *gate) sizes(start time.Time) (sizes []int, at []time.Duration) {
	for _, c := range g.sent() {
		sizes = append(sizes, len(c.sqls))
		at = append(at, c.at.Sub(start))
	}
	return sizes, at
}

// gcClient returns a Client whose calls go through a gate. When the test
// ends, the fake time moves on until its runners have stopped waiting for
// callers, and calls left unanswered have timed out (time stops once the
// bubble's main goroutine returns).
func gcClient(t testing.TB, b budget.Budget, cc CoalesceConfig) (*Client, *gate) {
	t.Helper()
	g := &gate{}
	t.Cleanup(func() { time.Sleep(DefaultAttemptTimeout + time.Second) })
	c, err := New(Config{BaseURL: testBaseURL, AccountID: testAccount, DatabaseID: testDatabase,
		HTTPClient: &http.Client{Transport: g}, Account: newTestAccount(t, b), Coalesce: cc, Retry: NoRetry()})
	if err != nil {
		t.Fatal(err)
	}
	return c, g
}

func stmt(sql string) []Statement { return []Statement{{SQL: sql}} }

// execAsync runs coalesced calls of each SQL in turn and returns the
// channel of the first error (nil when all succeed).
func execAsync(c *Client, cl ExecOption, sqls ...string) chan error {
	return execAsyncCtx(context.Background(), c, cl, sqls...)
}

// execAsyncCtx is execAsync in ctx.
func execAsyncCtx(ctx context.Context, c *Client, cl ExecOption, sqls ...string) chan error {
	done := make(chan error, 1)
	go func() {
		for _, s := range sqls {
			if _, err := c.Exec(ctx, stmt(s), Coalesce(), cl); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	return done
}

var normalWork = Operation("exec") // an option that changes nothing

// warm makes one call that takes rtt, so that the Account knows a round
// trip.
func warm(t *testing.T, c *Client, g *gate, rtt time.Duration) {
	t.Helper()
	done := execAsync(c, normalWork, "SELECT 'warm'")
	n := len(g.sent())
	time.Sleep(rtt)
	g.answer(t, n-1)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// A caller that finds group commit idle is sent at once.
func TestIdleCallerLeavesAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, g := gcClient(t, budget.Unlimited(), CoalesceConfig{Window: time.Second})
		start := time.Now()
		done := execAsync(c, normalWork, "SELECT 1")
		if sizes, at := g.sizes(start); !slices.Equal(sizes, []int{1}) || at[0] != 0 {
			t.Fatalf("calls %v at %v, want one at once", sizes, at)
		}
		g.answer(t, 0)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	})
}

// The callers a call answers ride in the next one: its runner departs as
// soon as all of them are back, and when one does not come back, once none
// came back for the gap (2 ms).
func TestCallersRideTogether(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, g := gcClient(t, budget.Unlimited(), CoalesceConfig{MaxInFlight: 1})
		start := time.Now()
		first := execAsync(c, normalWork, "SELECT 'a0'", "SELECT 'b0'")
		g.sent()
		var others []chan error
		for i := 1; i <= 5; i++ {
			others = append(others, execAsync(c, normalWork, fmt.Sprintf("SELECT 'a%d'", i), fmt.Sprintf("SELECT 'b%d'", i)))
		}
		time.Sleep(20 * time.Millisecond)
		g.answer(t, 0) // a0: its caller comes back with b0 and rides with a1..a5
		time.Sleep(20 * time.Millisecond)
		g.answer(t, 1) // six callers: five come back with b1..b5, the first is done
		time.Sleep(10 * time.Millisecond)
		g.answer(t, 2)
		for _, d := range append(others, first) {
			if err := <-d; err != nil {
				t.Fatal(err)
			}
		}
		sizes, at := g.sizes(start)
		if !slices.Equal(sizes, []int{1, 6, 5}) || !slices.Equal(at, []time.Duration{0, 20 * time.Millisecond, 42 * time.Millisecond}) {
			t.Errorf("calls of %v statements at %v; want 1, 6, 5 at 0, 20 ms (all back), 42 ms (one missing: the 2 ms gap)", sizes, at)
		}
	})
}

// While calls are plentiful, callers who would each wait long for the call
// in flight, more than a round trip in all, get a call of their own, which
// gathers those arriving with them until none arrived for the gap.
func TestParallelCallGathers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, g := gcClient(t, budget.Unlimited(), CoalesceConfig{})
		warm(t, c, g, 20*time.Millisecond)
		start := time.Now()
		lone := execAsync(c, normalWork, "SELECT 'lone'")
		g.sent()
		time.Sleep(time.Millisecond)
		var others []chan error
		for i := range 3 {
			others = append(others, execAsync(c, normalWork, fmt.Sprintf("SELECT %d", i)))
			g.sent()
		}
		time.Sleep(5 * time.Millisecond)
		calls := g.sent()
		sizes, at := g.sizes(start)
		if !slices.Equal(sizes[1:], []int{1, 3}) || at[2] != 3*time.Millisecond {
			t.Errorf("calls of %v statements at %v; want the three together 2 ms after the last arrived (3 ms)", sizes[1:], at[1:])
		}
		for i := range calls {
			calls[i].answer <- nil
		}
		for _, d := range append(others, lone) {
			if err := <-d; err != nil {
				t.Fatal(err)
			}
		}
	})
}

// A runner whose call returns while a call that left just after it is
// still out hands its callers over: they ride on together.
func TestCallsThatLeftTogetherRideOnTogether(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, g := gcClient(t, budget.Unlimited(), CoalesceConfig{})
		warm(t, c, g, 20*time.Millisecond)
		start := time.Now()
		a := execAsync(c, normalWork, "SELECT 'a1'", "SELECT 'a2'")
		g.sent()
		time.Sleep(time.Millisecond)
		var rest []chan error
		for i := range 3 {
			rest = append(rest, execAsync(c, normalWork, fmt.Sprintf("SELECT 'x%d'", i), fmt.Sprintf("SELECT 'y%d'", i)))
		}
		time.Sleep(5 * time.Millisecond)
		if sizes, _ := g.sizes(start); !slices.Equal(sizes[1:], []int{1, 3}) {
			t.Fatalf("calls %v, want a's alone and the three together", sizes[1:])
		}
		time.Sleep(14 * time.Millisecond) // a's call is back after 20 ms; the other is due 3 ms later
		g.answer(t, 1)
		time.Sleep(3 * time.Millisecond)
		g.answer(t, 2) // the four callers come back, and leave at once together
		sizes, at := g.sizes(start)
		if !slices.Equal(sizes[1:], []int{1, 3, 4}) || at[3] != 23*time.Millisecond {
			t.Fatalf("calls of %v statements at %v; want the four second statements together at 23 ms", sizes[1:], at[1:])
		}
		g.answer(t, 3)
		for _, d := range append(rest, a) {
			if err := <-d; err != nil {
				t.Fatal(err)
			}
		}
	})
}

// When calls are scarce, statements wait for the budget together, and
// priority work leaves first: here new work waits for the next window
// (its last call is kept for priority work), a completion arrives and takes
// that call, and the oldest new work rides along where there is room. The
// completion takes it at the even pace when its deadline allows (a call
// every 500 ms, the new work's call having counted for 1.25 of them), and
// at once when its deadline could not wait.
func TestScarceCallsCarryPriorityFirst(t *testing.T) {
	for _, tc := range []struct {
		name    string
		timeout time.Duration // the completion's; 0: none
		at      time.Duration // when its call goes
	}{
		{"no deadline", 0, 625 * time.Millisecond},
		{"a deadline after the pace", time.Second, 625 * time.Millisecond},
		{"a deadline before the pace", 100 * time.Millisecond, 0},
	} {
		t.Run(tc.name, func(t *testing.T) { testScarceCallsCarryPriorityFirst(t, tc.timeout, tc.at) })
	}
}

func testScarceCallsCarryPriorityFirst(t *testing.T, timeout, wantAt time.Duration) {
	synctest.Test(t, func(t *testing.T) {
		c, g := gcClient(t, budget.New(2, time.Second).WithBurst(1), CoalesceConfig{MaxStatements: 3})
		start := time.Now()
		first := execAsync(c, normalWork, "SELECT 'first'")
		g.answer(t, 0)
		if err := <-first; err != nil {
			t.Fatal(err)
		}
		var all []chan error
		for i := range 3 {
			all = append(all, execAsync(c, normalWork, fmt.Sprintf("SELECT 'new%d'", i)))
			g.sent()
		}
		if n := len(g.sent()); n != 1 {
			t.Fatalf("%d calls: new work took the window's last call", n)
		}
		ctx := context.Background()
		if timeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, timeout)
			defer cancel()
		}
		all = append(all, execAsyncCtx(ctx, c, Priority(), "SELECT 'done'"))
		calls := g.sent()
		if len(calls) < 2 {
			time.Sleep(wantAt)
			calls = g.sent()
		}
		if len(calls) != 2 || calls[1].at != start.Add(wantAt) || !slices.Equal(calls[1].sqls, []string{"SELECT 'done'", "SELECT 'new0'", "SELECT 'new1'"}) {
			for _, c := range calls {
				t.Logf("call at %v: %v", c.at.Sub(start), c.sqls)
			}
			t.Fatalf("want a second call after %v, the completion first, then the oldest new work", wantAt)
		}
		g.answer(t, 1)
		time.Sleep(2 * time.Second) // the window moves on
		if calls := g.sent(); len(calls) != 3 || !slices.Equal(calls[2].sqls, []string{"SELECT 'new2'"}) || calls[2].at.Sub(start) < time.Second {
			t.Fatalf("%d calls; want the third, with the rest, once the first has left the window", len(calls))
		}
		g.answer(t, 2)
		for _, d := range all {
			if err := <-d; err != nil {
				t.Fatal(err)
			}
		}
	})
}

// A caller whose deadline comes before the budget's next call is turned
// away at once, with when a call could go; nothing waits or is sent.
func TestDeadlineBeforeTheSlotFailsAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, g := gcClient(t, budget.New(2, 10*time.Second).WithBurst(1), CoalesceConfig{})
		first := execAsync(c, normalWork, "SELECT 1")
		g.answer(t, 0)
		if err := <-first; err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		start := time.Now()
		_, err := c.Exec(ctx, stmt("SELECT 2"), Coalesce())
		var e *Error
		if !errors.As(err, &e) || !errors.Is(err, ErrBudget) || e.RetryAfter <= time.Second || time.Since(start) != 0 {
			t.Fatalf("err %v after %v, want ErrBudget at once with a Retry-After past the deadline", err, time.Since(start))
		}
		if n := len(g.sent()); n != 1 {
			t.Errorf("%d calls sent", n)
		}
	})
}

// A queued caller whose deadline comes within a round trip is dropped
// before its call leaves: nothing of it is sent, and the error says so.
func TestQueuedCallerDroppedBeforeItsDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, g := gcClient(t, budget.Unlimited(), CoalesceConfig{MaxInFlight: 1})
		warm(t, c, g, 20*time.Millisecond)
		busy := execAsync(c, normalWork, "SELECT 'busy'")
		g.sent()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
		defer cancel()
		late := make(chan error, 1)
		go func() { _, err := c.Exec(ctx, stmt("SELECT 'late'"), Coalesce()); late <- err }()
		g.sent()
		time.Sleep(15 * time.Millisecond) // 15 ms left: less than the 20 ms round trip
		g.answer(t, 1)
		err := <-late
		var e *Error
		if !errors.As(err, &e) || !e.notSent || e.Ambiguous || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err %v, want not sent, not ambiguous", err)
		}
		for _, call := range g.sent() {
			if slices.Contains(call.sqls, "SELECT 'late'") {
				t.Fatal("the late caller's statement was sent")
			}
		}
		if err := <-busy; err != nil {
			t.Fatal(err)
		}
	})
}

// A 971 that arrives while callers wait for the budget fails them all,
// unsent.
func TestBlockFailsTheQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, g := gcClient(t, budget.New(2, 10*time.Second).WithBurst(1), CoalesceConfig{})
		first := execAsync(c, normalWork, "SELECT 1")
		g.answer(t, 0)
		if err := <-first; err != nil {
			t.Fatal(err)
		}
		waiting := execAsync(c, normalWork, "SELECT 2")
		g.sent()
		c.account.Block(time.Now().Add(time.Minute))
		err := <-waiting
		if !errors.Is(err, ErrRateLimited) {
			t.Fatalf("err %v, want ErrRateLimited", err)
		}
		if n := len(g.sent()); n != 1 {
			t.Errorf("%d calls sent", n)
		}
	})
}

// answerAll answers every call so far, and again the calls those lead to,
// until no call is left unanswered.
func (g *gate) answerAll() {
	for answered := 0; ; {
		calls := g.sent()
		if answered == len(calls) {
			return
		}
		for _, c := range calls[answered:] {
			c.answer <- nil
		}
		answered = len(calls)
	}
}

// wantOneFailing waits for busy, which must succeed, and for the callers
// of done: caller failing must get an SQL error, the others none.
func wantOneFailing(t *testing.T, busy chan error, done []chan error, failing int) {
	t.Helper()
	if err := <-busy; err != nil {
		t.Fatal(err)
	}
	for i, d := range done {
		if err := <-d; (i == failing) != errors.Is(err, ErrSQL) || i != failing && err != nil {
			t.Errorf("caller %d got %v", i, err)
		}
	}
}

// A statement that fails in a shared call aborts the whole batch, and the
// error does not say whose it was: the callers are sent again in halves
// until the failing one is alone; it gets its own SQL error, the others
// their results.
func TestSharedBatchFailureIsFoundByHalving(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, g := gcClient(t, budget.Unlimited(), CoalesceConfig{MaxInFlight: 1})
		busy := execAsync(c, normalWork, "SELECT 'busy'")
		g.sent()
		var done []chan error
		for i := range 4 {
			sql := fmt.Sprintf("INSERT INTO t VALUES (%d)", i)
			if i == 2 {
				sql = "INSERT INTO missing_table VALUES (2)"
			}
			done = append(done, execAsync(c, normalWork, sql))
			g.sent()
		}
		g.answerAll()
		wantOneFailing(t, busy, done, 2)
		sizes, _ := g.sizes(time.Now())
		if !slices.Equal(sizes, []int{1, 4, 2, 2, 1, 1}) {
			t.Errorf("calls of %v statements; want the four together, then two halves, then the failing half's two alone", sizes)
		}
	})
}

// Halving costs two calls per halving: 32 callers of one shared call, one
// of them failing, are answered with 10 calls more (rather than 32), each
// with its own result.
func TestSharedBatchFailureCostsAFewCalls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, g := gcClient(t, budget.Unlimited(), CoalesceConfig{MaxInFlight: 1})
		busy := execAsync(c, normalWork, "SELECT 'busy'")
		g.sent()
		var done []chan error
		for i := range 32 {
			sql := fmt.Sprintf("INSERT INTO t VALUES (%d)", i)
			if i == 19 {
				sql = "INSERT INTO missing_table VALUES (19)"
			}
			done = append(done, execAsync(c, normalWork, sql))
		}
		synctest.Wait()
		g.answerAll()
		wantOneFailing(t, busy, done, 19)
		if sizes, _ := g.sizes(time.Now()); len(sizes) != 1+1+10 || sizes[1] != 32 {
			t.Errorf("calls of %v statements; want the 32 together, then 10 halves", sizes)
		}
	})
}

// Overload is shed at once: with the default budget's pace (a call every
// 250 ms) and calls of 4 statements, callers are queued while the calls
// that carry the work ahead of them would leave within 500 ms of the next
// (MaxQueueWait): 12 of them; the next are refused at once, unsent, with
// ErrShed and the time after which the queue should have room. Priority
// work is never refused, and the callers queued are all answered.
func TestOverloadIsShedAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, g := gcClient(t, budget.Budget{}, CoalesceConfig{MaxStatements: 4, MaxInFlight: 1})
		busy := execAsync(c, normalWork, "SELECT 'busy'")
		g.sent()
		var queued []chan error
		for i := range 16 {
			start := time.Now()
			done := execAsync(c, normalWork, fmt.Sprintf("SELECT %d", i))
			synctest.Wait()
			select {
			case err := <-done:
				var de *Error
				if i < 12 || !errors.Is(err, ErrShed) || !errors.As(err, &de) || de.RetryAfter != ms(500) || time.Since(start) != 0 {
					t.Fatalf("caller %d: %v, after %v", i, err, time.Since(start))
				}
			default:
				if i >= 12 {
					t.Fatalf("caller %d queued behind 12 others: they leave in calls of 4, 250 ms apart", i)
				}
				queued = append(queued, done)
			}
		}
		queued = append(queued, execAsync(c, Priority(), "SELECT 'priority'"))
		synctest.Wait()
		for ; len(g.sent()) < 5; time.Sleep(time.Second) {
			g.answerAll()
		}
		g.answerAll()
		for i, done := range append(queued, busy) {
			if err := <-done; err != nil {
				t.Errorf("queued caller %d: %v", i, err)
			}
		}
	})
}

// A statement holding several SQL statements is refused before it is
// queued: it never spoils a shared batch, and the others share theirs.
func TestMultiStatementCallerNeverJoinsABatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, g := gcClient(t, budget.Unlimited(), CoalesceConfig{MaxInFlight: 1})
		busy := execAsync(c, normalWork, "SELECT 'busy'")
		g.sent()
		var done []chan error
		for i := range 4 {
			sql := fmt.Sprintf("SELECT %d", i)
			if i == 1 {
				sql = "SELECT 1; SELECT 2"
			}
			done = append(done, execAsync(c, normalWork, sql))
			g.sent()
		}
		g.answerAll()
		if err := <-busy; err != nil {
			t.Fatal(err)
		}
		for i, d := range done {
			err := <-d
			switch {
			case i == 1 && !errors.Is(err, ErrInvalid):
				t.Errorf("the multi-statement caller got %v", err)
			case i != 1 && err != nil:
				t.Errorf("caller %d got %v", i, err)
			}
		}
		if sizes, _ := g.sizes(time.Now()); !slices.Equal(sizes, []int{1, 3}) {
			t.Errorf("calls of %v statements; want the three valid callers together", sizes)
		}
	})
}

// A caller whose context ends while it is queued is withdrawn: it is
// never sent, and its error is not ambiguous.
func TestQueuedCallerWithdraws(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, g := gcClient(t, budget.Unlimited(), CoalesceConfig{MaxInFlight: 1})
		busy := execAsync(c, normalWork, "SELECT 'busy'")
		g.sent()
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		_, err := c.Exec(ctx, stmt("SELECT 'withdrawn'"), Coalesce())
		var e *Error
		if !errors.As(err, &e) || e.Ambiguous || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v", err)
		}
		g.answerAll()
		if err := <-busy; err != nil {
			t.Fatal(err)
		}
		if sizes, _ := g.sizes(time.Now()); !slices.Equal(sizes, []int{1}) {
			t.Errorf("calls of %v statements: the withdrawn caller was sent", sizes)
		}
	})
}
