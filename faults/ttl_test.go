package faults

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/examples/orders/ordersapi"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/idem/idemhttp"
)

// A handler that outlives the TTL with heartbeats disabled: a retry takes
// the key over at generation 2 and completes; the old owner's completion is
// fenced out (logged, not stored). Under transactional completion the old
// owner's business write is aborted with it, so the write happens exactly
// once; with a direct write (the spec's Worker) it happens twice, which is
// the hole the spec admits and idemhttp.Tx closes.
func TestSlowOwnerTakenOverAndFencedOut(t *testing.T) {
	t.Parallel()
	const ttl = 500 * time.Millisecond
	for _, tc := range []struct {
		name      string
		direct    bool
		wantBiz   int
		wantExecs []string // business rows' executions, in order
	}{
		{name: "transactional", wantBiz: 1, wantExecs: []string{"x2"}},
		{name: "direct_write_spec_hole", direct: true, wantBiz: 2, wantExecs: []string{"x2", "x1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w := newWorld(t)
			gate := make(chan struct{})
			started := make(chan string, 8)
			h := &bizHandler{direct: tc.direct, before: func(_ context.Context, exec string) {
				started <- exec
				if exec == "x1" {
					<-gate // the first owner stalls well past the TTL
				}
			}}
			st := w.newStack(idem.Config{TTL: ttl, Heartbeat: -1}, func(db *d1client.Client) http.Handler { h.db = db; return h })
			send := func() answer { return post(bg, st.srv.URL, "acct", "slow", `{"sku":"tea"}`) }

			firstCh := make(chan answer, 1)
			go func() { firstCh <- send() }()
			<-started
			as := retryUntilFinal(t, 10*time.Second, send)
			b := as[len(as)-1]
			if b.Status != http.StatusCreated || b.replayed() || execOf(b.Body) != "x2" {
				t.Fatalf("retries:\n  %s", summarize(as))
			}
			// By D1's clock, which stamped both.
			claimAt, takeoverAt := w.claimAndTakeover()
			if takeoverAt-claimAt <= ttl.Milliseconds() {
				t.Errorf("taken over %d ms after the claim by D1's clock, within the TTL %v", takeoverAt-claimAt, ttl)
			}
			for _, a := range as[:len(as)-1] {
				if a.Status != http.StatusConflict || a.code() != idemhttp.CodeKeyInProgress {
					t.Errorf("retry before the takeover: %s", a)
				}
			}
			close(gate) // the old owner finishes, and is fenced out
			a := <-firstCh
			t.Logf("old owner's answer: %s", a)

			r, _ := w.row("acct", "slow")
			if r.Status != "completed" || r.Generation != 2 || execOf(r.body()) != "x2" {
				t.Fatalf("row %+v %s", r, r.body())
			}
			comps := w.completions()
			if len(comps) != 1 || comps[0].Generation != 2 {
				t.Errorf("completions %+v, want one at generation 2", comps)
			}
			fenced := st.logs.find("fenced out")
			if len(fenced) != 1 || fenced[0].Attrs["generation"] != "1" {
				t.Errorf("fenced-out log lines %+v, want one for generation 1", fenced)
			}
			biz := w.business()[pk{"acct", "slow"}]
			var execs []string
			for _, row := range biz {
				execs = append(execs, row.Exec)
			}
			if strings.Join(execs, ",") != strings.Join(tc.wantExecs, ",") {
				t.Errorf("business rows by %v, want %v", execs, tc.wantExecs)
			}
			if tc.direct {
				t.Logf("direct write: the mutation ran %d times (the spec's admitted hole)", len(biz))
			} else {
				w.assertOnce(t, "acct", "slow", 2)
			}
			if rp := send(); !rp.replayed() || rp.replayable() != b.replayable() {
				t.Errorf("replay %s, want the new owner's %s", rp, b)
			}
		})
	}
}

// The same through the example orders API, whose handler creates the order
// through idemhttp.Tx: the stalled first request (X-Delay beyond the TTL,
// heartbeats off) is taken over by a retry, and exactly one order exists,
// the one the stored response names.
func TestOrdersAPITakeoverCreatesOneOrder(t *testing.T) {
	t.Parallel()
	const ttl = 500 * time.Millisecond
	w := newWorld(t)
	db := w.client()
	if err := ordersapi.EnsureSchema(bg, db); err != nil {
		t.Fatal(err)
	}
	logs := &logSink{}
	l, err := idem.New(db, idem.Config{TTL: ttl, Heartbeat: -1, Logger: newLogger(logs)})
	if err != nil {
		t.Fatal(err)
	}
	h, err := ordersapi.New(ordersapi.Config{Ledger: l, DB: db, DelayHeader: "X-Delay"})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	url := srv.URL + "/v1/orders"
	body := `{"sku":"tea","qty":3}`

	firstCh := make(chan answer, 1)
	// The first request stalls 3 s past the TTL: room enough for a retry to
	// take it over on a loaded machine.
	go func() { firstCh <- post(bg, url, "tok_a", "order-1", body, "X-Delay", "3500ms") }()
	until(t, 5*time.Second, 10*time.Millisecond, "the first request's claim", func() bool {
		_, ok := w.row("tok_a", "order-1")
		return ok
	})
	as := retryUntilFinal(t, 10*time.Second, func() answer { return post(bg, url, "tok_a", "order-1", body) })
	b := as[len(as)-1]
	if b.Status != http.StatusCreated || b.replayed() {
		t.Fatalf("retries:\n  %s", summarize(as))
	}
	a := <-firstCh
	t.Logf("stalled first request's answer: %s", a)
	r, _ := w.row("tok_a", "order-1")
	if r.Status != "completed" || r.Generation != 2 || r.body() != b.Body {
		t.Fatalf("row %+v %s", r, r.body())
	}
	ids := w.query(`SELECT id FROM orders WHERE principal = ? AND idempotency_key = ?`, "tok_a", "order-1")
	if len(ids) != 1 {
		t.Fatalf("%d orders for one key", len(ids))
	}
	id, _ := ids[0][0].Text()
	if b.Header.Get("Location") != "/v1/orders/"+id || execOf(b.Body) != id {
		t.Errorf("the stored response names %s, the order is %s", b.Header.Get("Location"), id)
	}
	if f := logs.find("fenced out"); len(f) != 1 {
		t.Errorf("%d fenced-out log lines", len(f))
	}
	if rp := post(bg, url, "tok_a", "order-1", body); !rp.replayed() || rp.replayable() != b.replayable() {
		t.Errorf("replay %s, want %s", rp, b)
	}
}

// With heartbeats on, a slow but live owner is never taken over. The
// instance runs on an injected clock that the test moves: six times it
// moves the clock on by 2/3 of the TTL (four TTLs in all), waits for the
// owner's heartbeat to renew the lease at the new time (the row's
// updated_at), and sends a retry, which must get 409 in progress; a retry
// made after such a step without the renewal would take the key over. Then
// the owner finishes, and its completion is stored at generation 1. Nothing
// here depends on how fast the machine is: the lease's own real-time
// limits (the TTL without a successful heartbeat, MaxLease) are minutes
// away.
func TestHeartbeatKeepsSlowLiveOwner(t *testing.T) {
	t.Parallel()
	const ttl = 30 * time.Second // by the injected clock
	w := newWorld(t)
	clock := newManualClock()
	gate := make(chan struct{})
	var cancelled atomic.Value
	h := &bizHandler{before: func(ctx context.Context, exec string) {
		select {
		case <-gate:
		case <-ctx.Done():
			cancelled.Store(context.Cause(ctx).Error())
		}
	}}
	st := w.newStack(idem.Config{TTL: ttl, Heartbeat: 250 * time.Millisecond, Clock: clock.Now},
		func(db *d1client.Client) http.Handler { h.db = db; return h })
	send := func() answer { return post(bg, st.srv.URL, "acct", "live", `{"sku":"tea"}`) }
	firstCh := make(chan answer, 1)
	go func() { firstCh <- send() }()
	until(t, 30*time.Second, 10*time.Millisecond, "the claim", func() bool { return h.runs() == 1 })
	for step := 1; step <= 6; step++ {
		now := clock.Advance(ttl * 2 / 3).UnixMilli()
		until(t, 30*time.Second, 10*time.Millisecond, "a heartbeat at the new time", func() bool {
			r, _ := w.row("acct", "live")
			return r.UpdatedAt == now
		})
		// The owner is past the typical handler time (1 s before any
		// was measured): ask again when its renewed lease would end
		// (30 s and the millisecond a takeover needs), not in a tight loop.
		if a := send(); a.Status != http.StatusConflict || a.code() != idemhttp.CodeKeyInProgress || a.Header.Get("Retry-After") != "31" ||
			!strings.Contains(string(a.Body), `"retry_after_ms":30001`) {
			close(gate) // let the owner finish, so the server can close
			t.Fatalf("step %d (%v past the claim): a retry got %s, want 409 %s with Retry-After: 31", step, time.Duration(step)*ttl*2/3, a, idemhttp.CodeKeyInProgress)
		}
	}
	close(gate)
	a := <-firstCh
	if a.Status != http.StatusCreated || a.replayed() || execOf(a.Body) != "x1" {
		t.Fatalf("the live owner's answer: %s", a)
	}
	if c := cancelled.Load(); c != nil {
		t.Fatalf("the live owner's context was cancelled: %v", c)
	}
	if h.runs() != 1 {
		t.Errorf("handler ran %d times", h.runs())
	}
	if w.eventCount("takeover") != 0 {
		t.Error("a live owner was taken over")
	}
	w.assertOnce(t, "acct", "live", 1)
	if rp := send(); !rp.replayed() || rp.replayable() != a.replayable() {
		t.Errorf("replay %s, want %s", rp, a)
	}
}

// manualClock is a clock for Config.Clock that moves only when told.
type manualClock struct {
	mu sync.Mutex
	t  time.Time
}

func newManualClock() *manualClock { return &manualClock{t: time.Now().Truncate(time.Millisecond)} }

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Advance moves the clock on by d and returns the new time.
func (c *manualClock) Advance(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
	return c.t
}
