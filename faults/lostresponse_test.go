package faults

import (
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/idem/idemhttp"
)

// A claim that commits but whose answer is lost (round trip 1): the client
// cannot know the row exists, so the middleware fails closed (503) without
// running the handler; the orphaned pending row answers 409 in progress
// until the TTL, measured by D1, and is then taken over at generation 2. The
// mutation runs once. The cost of the lost answer is one TTL, which is as
// far as physics allows: nobody can tell an orphaned claim from a live one.
func TestLostResponseOnClaim(t *testing.T) {
	t.Parallel()
	const ttl = 2 * time.Second
	w := newWorld(t)
	h := &bizHandler{}
	st := w.newStack(idem.Config{TTL: ttl}, func(db *d1client.Client) http.Handler { h.db = db; return h })
	w.setPolicy(once(isClaim, d1local.Fault{LoseResponse: true}))

	r := lostClaimFailsClosed(t, w, h, post(bg, st.srv.URL, "acct", "lost-claim", `{"n":1}`))
	// Before the TTL: in progress, with a Retry-After of at most the TTL
	// (the estimate of when the owner is done, within its lease). Checked
	// when D1's clock shows the retry ended inside the TTL (a machine
	// stalled for the whole TTL may take the key over instead).
	a := post(bg, st.srv.URL, "acct", "lost-claim", `{"n":1}`)
	if age := w.d1Now() - r.UpdatedAt; age > ttl.Milliseconds() {
		t.Logf("the first retry ended %d ms after the claim by D1's clock, past the TTL: %s", age, a)
	} else if a.Status != http.StatusConflict || a.code() != idemhttp.CodeKeyInProgress || (a.Header.Get("Retry-After") != "1" && a.Header.Get("Retry-After") != "2") {
		t.Fatalf("retry %d ms after the claim, before the TTL: %s", age, a)
	}
	as := retryUntilFinal(t, 10*time.Second, func() answer { return post(bg, st.srv.URL, "acct", "lost-claim", `{"n":1}`) })
	first := as[len(as)-1]
	if first.Status != http.StatusCreated || first.replayed() {
		t.Fatalf("answers after the lost claim:\n  %s", summarize(as))
	}
	// The takeover happened no sooner than the TTL after the claim, by D1's
	// clock.
	claimAt, takeoverAt := w.claimAndTakeover()
	if takeoverAt-claimAt < ttl.Milliseconds() {
		t.Errorf("taken over %d ms after the claim, before the TTL (%v)", takeoverAt-claimAt, ttl)
	}
	w.assertOnce(t, "acct", "lost-claim", 2)
	if h.runs() != 1 {
		t.Errorf("handler ran %d times", h.runs())
	}
	if a := post(bg, st.srv.URL, "acct", "lost-claim", `{"n":1}`); !a.replayed() || a.replayable() != first.replayable() {
		t.Errorf("replay %s differs from the first answer %s", a, first)
	}

	lostClaimThroughLedger(t, w, st.ledger, ttl)
}

// lostClaimFailsClosed checks the first answer a1 to a request whose
// claim committed and whose answer was lost: a 503 with Retry-After, the
// handler not run, and the claim's row pending at generation 1, which it
// returns.
func lostClaimFailsClosed(t *testing.T, w *world, h *bizHandler, a1 answer) ledgerRow {
	t.Helper()
	if a1.Status != http.StatusServiceUnavailable || a1.code() != idemhttp.CodeLedgerUnavailable || a1.Header.Get("Retry-After") == "" {
		t.Fatalf("first answer: %s, want 503 %s with Retry-After", a1, idemhttp.CodeLedgerUnavailable)
	}
	if h.runs() != 0 {
		t.Fatal("the handler ran although round trip 1 failed")
	}
	if n := w.injectedCount("lost_response@claim"); n != 1 {
		t.Fatalf("%d lost claim answers injected", n)
	}
	r, ok := w.row("acct", "lost-claim")
	if !ok || r.Status != "pending" || r.Generation != 1 {
		t.Fatalf("the lost claim did not commit: %+v %v", r, ok)
	}
	return r
}

// lostClaimThroughLedger checks the same failure seen through the ledger:
// Begin's error is an ambiguous transport error, and it is not retried (a
// claim is not idempotent by itself); Begin again finds the key in
// progress while the TTL, by D1's clock, has not passed.
func lostClaimThroughLedger(t *testing.T, w *world, ledger *idem.Ledger, ttl time.Duration) {
	t.Helper()
	w.setPolicy(once(isClaim, d1local.Fault{LoseResponse: true}))
	_, err := ledger.Begin(bg, "acct", "lost-claim-2", "fp")
	var de *d1client.Error
	if !errors.Is(err, d1client.ErrTransport) || !errors.As(err, &de) || !de.Ambiguous || de.Attempts != 1 {
		t.Fatalf("Begin after a lost claim answer: %v (%+v)", err, de)
	}
	d, err := ledger.Begin(bg, "acct", "lost-claim-2", "fp")
	r2, _ := w.row("acct", "lost-claim-2")
	if age := w.d1Now() - r2.CreatedAt; err != nil || age <= ttl.Milliseconds() && d.Outcome != idem.InProgress {
		t.Fatalf("Begin again, %d ms after the lost claim by D1's clock: %+v %v", age, d, err)
	}
}

// A completion that commits but whose answer is lost (round trip 2): the
// completion is retried (it is fenced, so a retry is safe), the retry finds
// the row completed with exactly its response (or, for a transactional
// completion, its guard aborts the retry), and the ledger reports the
// completion stored. The business write happens once, and the replay is
// the first answer, byte for byte.
func TestLostResponseOnCompletion(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		direct bool // the handler writes without idemhttp.Tx
		every  bool // every completion answer is lost, not only the first
	}{
		{name: "transactional"},
		{name: "transactional/every_attempt_lost", every: true},
		{name: "plain", direct: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w := newWorld(t)
			h := &bizHandler{direct: tc.direct}
			st := w.newStack(idem.Config{TTL: time.Second}, func(db *d1client.Client) http.Handler { h.db = db; return h })
			if tc.every {
				w.setPolicy(always(isCompletion, d1local.Fault{LoseResponse: true}))
			} else {
				w.setPolicy(once(isCompletion, d1local.Fault{LoseResponse: true}))
			}
			a := post(bg, st.srv.URL, "acct", "lost-done", `{"n":2}`)
			if a.Status != http.StatusCreated || a.replayed() {
				t.Fatalf("first answer: %s", a)
			}
			n := w.injectedCount("lost_response@completion")
			if n < 1 || (tc.every && n < 2) {
				t.Fatalf("%d lost completion answers injected", n)
			}
			w.setPolicy(nil)
			w.assertOnce(t, "acct", "lost-done", 1)
			if execOf(a.Body) != "x1" || h.runs() != 1 {
				t.Errorf("answer %s after %d runs", a, h.runs())
			}
			if r := post(bg, st.srv.URL, "acct", "lost-done", `{"n":2}`); !r.replayed() || r.replayable() != a.replayable() {
				t.Errorf("replay %s differs from the first answer %s", r, a)
			}
			if f := st.logs.find("fenced out"); len(f) != 0 {
				t.Errorf("a completion whose answer was lost was logged as fenced out: %+v", f)
			}
		})
	}

	// Through the ledger: Complete and CompleteTx report Stored.
	t.Run("ledger", func(t *testing.T) {
		t.Parallel()
		w := newWorld(t)
		l, err := idem.New(w.client(), idem.Config{TTL: time.Second, Heartbeat: -1})
		if err != nil {
			t.Fatal(err)
		}
		resp := idem.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"exec":"L"}`)}
		for i, tx := range []bool{false, true} {
			key := []string{"plain", "tx"}[i]
			d, err := l.Begin(bg, "acct", key, "fp")
			if err != nil || d.Outcome != idem.Execute {
				t.Fatal(d, err)
			}
			w.setPolicy(once(isCompletion, d1local.Fault{LoseResponse: true}))
			var c idem.Completion
			if tx {
				c, err = l.CompleteTx(bg, d.Reservation, resp, []d1client.Statement{{
					SQL: `INSERT INTO business (principal, key, exec_id, at) VALUES (?, ?, ?, 0)`, Params: []any{"acct", key, "L"}}})
			} else {
				c, err = l.Complete(bg, d.Reservation, resp)
			}
			if err != nil || !c.Stored {
				t.Errorf("%s: Stored=%v err=%v after a lost completion answer", key, c.Stored, err)
			}
			if w.injectedCount("lost_response@completion") != i+1 {
				t.Fatalf("%s: fault not injected", key)
			}
		}
		w.setPolicy(nil)
		w.assertOnce(t, "acct", "tx", 1)
		if got := len(w.business()[pk{"acct", "plain"}]); got != 0 {
			t.Errorf("%d business rows for the plain completion", got)
		}
	})
}
