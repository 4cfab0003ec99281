package faults

// Regression tests of bugs this suite found in other packages. Each comment
// says what must hold and what breaks without it; a failure message starts
// with "BUG(<package>)" and names the symptom.

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/examples/orders/ordersapi"
	"github.com/d1idem/d1idem/idem"
)

// Under transactional completion, an owner whose completion is fenced out
// (a takeover superseded it) has had its business write aborted with the
// batch: the middleware answers its request with what the ledger holds (a
// replay of the stored response, or 409 in progress), never with the
// handler's own response, which would be a 201 with the Location of an
// order that does not exist.
func TestRegressionFencedOutTxOwnerAnswersUncommittedWrite(t *testing.T) {
	t.Parallel()
	const ttl = 500 * time.Millisecond
	w := newWorld(t)
	db := w.client()
	if err := ordersapi.EnsureSchema(bg, db); err != nil {
		t.Fatal(err)
	}
	l, err := idem.New(db, idem.Config{TTL: ttl, Heartbeat: -1})
	if err != nil {
		t.Fatal(err)
	}
	h, err := ordersapi.New(ordersapi.Config{Ledger: l, DB: db, DelayHeader: "X-Delay"})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	body := `{"sku":"tea","qty":1}`
	firstCh := make(chan answer, 1)
	// Stalled 3 s past the TTL: room enough for a retry to take it over on
	// a loaded machine.
	go func() { firstCh <- post(bg, srv.URL+"/v1/orders", "tok", "order-x", body, "X-Delay", "3500ms") }()
	until(t, 5*time.Second, 10*time.Millisecond, "the claim", func() bool { _, ok := w.row("tok", "order-x"); return ok })
	as := retryUntilFinal(t, 10*time.Second, func() answer { return post(bg, srv.URL+"/v1/orders", "tok", "order-x", body) })
	winner := as[len(as)-1]
	first := <-firstCh
	if winner.Status != http.StatusCreated {
		t.Fatalf("the takeover: %s", winner)
	}
	get := func(loc string) answer {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+loc, nil)
		req.Header.Set("Authorization", "Bearer tok")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			return answer{Err: err}
		}
		res.Body.Close()
		return answer{Status: res.StatusCode}
	}
	if g := get(winner.Header.Get("Location")); g.Status != http.StatusOK {
		t.Fatalf("the stored order: GET %s = %s", winner.Header.Get("Location"), g)
	}
	if first.Status == http.StatusCreated && first.replayable() != winner.replayable() {
		g := get(first.Header.Get("Location"))
		t.Errorf("BUG(idem): the fenced-out owner answered its client %s (Location %s, which GETs %d) although its order was never committed; the stored response, which every retry replays, is %s",
			first, first.Header.Get("Location"), g.Status, winner)
	}
}

// A release moves the generation on and makes the lease stale, rather than
// deleting the pending row: a deleted row would let the next claim start
// again at generation 1, a generation an earlier, superseded owner still
// holds (ABA). A claims (generation 1) and stalls past the TTL; B takes
// over (generation 2) and releases (its handler panicked); C's claim must
// not get generation 1, or A's completion passes the fence over C's live
// reservation. Every generation of a key is unique.
func TestRegressionReleaseRestartsGenerationABA(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	l := mustLedger(t, w.client(), idem.Config{TTL: 300 * time.Millisecond, Heartbeat: -1})
	a := mustBegin(t, l, "acct", "aba")
	time.Sleep(350 * time.Millisecond)
	b := mustBegin(t, l, "acct", "aba")
	if b.Outcome != idem.Execute || b.Reservation.Generation != 2 {
		t.Fatalf("takeover: %+v", b)
	}
	if ok, err := l.Release(bg, b.Reservation); !ok || err != nil {
		t.Fatalf("release: %v %v", ok, err)
	}
	c := mustBegin(t, l, "acct", "aba")
	if c.Outcome != idem.Execute {
		t.Fatalf("fresh claim: %+v", c)
	}
	resp := func(s string) idem.Response {
		return idem.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"exec":"` + s + `"}`)}
	}
	ca, err := l.CompleteTx(bg, a.Reservation, resp("A"), []d1client.Statement{{
		SQL: `INSERT INTO business (principal, key, exec_id, at) VALUES ('acct', 'aba', 'A', 0)`}})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := l.Complete(bg, c.Reservation, resp("C"))
	if err != nil {
		t.Fatal(err)
	}
	if ca.Stored || !cc.Stored {
		r, _ := w.row("acct", "aba")
		t.Errorf("BUG(idem): after a takeover (generation 2) and its release, a fresh claim restarted at generation %d; the superseded generation-1 owner's completion was stored=%v (its business write committed: %v) and the current owner's stored=%v; the row holds %s",
			c.Reservation.Generation, ca.Stored, len(w.business()[pk{"acct", "aba"}]) == 1, cc.Stored, r.body())
	}
}

// A client that disconnects while the handler is still working does not
// cancel the handler's context: the middleware keeps client disconnects out
// of it (a started mutation is finished and stored), and the orders handler
// gives up with panic(http.ErrAbortHandler), which releases the key, only
// when its lease is lost. A handler that took the disconnect for a lost
// lease would answer 503, which the middleware would store as the key's
// response, and every retry would replay that 503.
func TestRegressionOrdersClientDisconnectPoisonsKey(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	db := w.client()
	if err := ordersapi.EnsureSchema(bg, db); err != nil {
		t.Fatal(err)
	}
	l, err := idem.New(db, idem.Config{TTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	h, err := ordersapi.New(ordersapi.Config{Ledger: l, DB: db, DelayHeader: "X-Delay"})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	body := `{"sku":"tea","qty":1}`
	ctx, cancel := context.WithTimeout(bg, 200*time.Millisecond)
	defer cancel()
	if a := post(ctx, srv.URL+"/v1/orders", "tok", "order-d", body, "X-Delay", "1s"); a.Err == nil {
		t.Fatalf("the client did not give up: %s", a)
	}
	var as []answer
	until(t, 10*time.Second, 50*time.Millisecond, "a final answer", func() bool {
		a := post(bg, srv.URL+"/v1/orders", "tok", "order-d", body)
		as = append(as, a)
		return a.Status == http.StatusCreated || (a.replayed() && len(as) > 3)
	})
	last := as[len(as)-1]
	orders := w.count(`SELECT count(*) FROM orders WHERE idempotency_key = 'order-d'`)
	if last.Status != http.StatusCreated || orders != 1 {
		t.Errorf("BUG(examples/orders/ordersapi): after the client of the first request went away, every retry gets %s; %d orders exist. Answers:\n  %s",
			last, orders, summarize(as))
	}
}
