package faults

// Failing tests for bugs found in other packages. They are left failing on
// purpose (the fix belongs to the package's owners); each message starts
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

// BUG(idem): under transactional completion, an owner whose completion is
// fenced out (a takeover superseded it) has had its business write aborted
// with the batch -- yet the middleware still sends the handler's own
// response to its client. The client is told 201 with the Location of an
// order that does not exist, while every retry replays another order: the
// client sees two different outcomes for one key, and the first one is a
// lie. The middleware ignores Completion.Stored == false after CompleteTx;
// it should answer with what the ledger holds (a replay of the stored
// response, or 409 in progress) or an error, never the uncommitted response.
func TestBugFencedOutTxOwnerAnswersUncommittedWrite(t *testing.T) {
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
	go func() { firstCh <- post(bg, srv.URL+"/v1/orders", "tok", "order-x", body, "X-Delay", "1200ms") }()
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

// BUG(idem): Release deletes the pending row, so the next claim of the key
// starts again at generation 1, a generation an earlier, superseded owner
// still holds (ABA). Sequence: A claims (generation 1) and stalls past the
// TTL; B takes over (generation 2) and releases (its handler panicked, or
// its transactional completion failed); C claims afresh -- generation 1
// again. A's completion then passes the fence and is stored over C's live
// reservation, and C, the only current owner, is fenced out. The spec's
// fencing invariant (at most one owner's generation is ever current) is
// broken; through the middleware with idem.Tx, A's business write commits
// and C's client is answered with C's never-committed response (see the
// test above). A release that keeps the generation monotonic (a tombstone,
// or bumping the generation instead of deleting) would close it.
func TestBugReleaseRestartsGenerationABA(t *testing.T) {
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
	ca, err := l.CompleteTx(bg, a.Reservation, resp("A"), []d1client.Statement{d1client.NewStatement(
		`INSERT INTO business (principal, key, exec_id, at) VALUES ('acct', 'aba', 'A', 0)`)})
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

// BUG(examples/orders/ordersapi): a client that disconnects while the
// handler is still working (here during X-Delay) cancels the handler's
// context; the handler takes that for a lost lease and answers 503
// {"error":"cancelled"}, which the middleware stores as the key's
// response. Every retry with the key then replays that 503 (with
// Idempotent-Replayed: true), and the order can never be created with this
// key. A handler should abort without a response (panic(http.ErrAbortHandler)
// makes the middleware release the reservation) only when the lease is lost,
// and carry on when only the client went away; the middleware could also
// keep client disconnects out of the handler's context, since it stores the
// response anyway.
func TestBugOrdersClientDisconnectPoisonsKey(t *testing.T) {
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
