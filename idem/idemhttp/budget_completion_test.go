package idemhttp_test

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1client/budget"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/idem/idemhttp"
	"github.com/d1idem/d1idem/internal/d1test"
)

// A completion is never lost to the request budget: on a budget whose
// calls for new work are spent (here at once: two calls an hour with a
// burst of one, so no call frees during the test), the request that
// claimed still has its response stored, and a retry after the TTL, on
// another replica, replays it rather than running the handler a second
// time. Without the call every budget keeps for completions, and with the
// completion held to the even pace, the completion met an empty budget,
// and the retry took the reservation over and ran the handler again.
func TestCompletionStoredUnderSaturatedBudget(t *testing.T) {
	b := d1test.Local(t)
	admin := b.NewClientSchema(t) // the schema, outside the budget
	db := b.Database(admin.DatabaseID()).Client(t, func(c *d1client.Config) {
		c.Budget = budget.New(2, time.Hour).WithBurst(1)
	})
	var runs atomic.Int64
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte(`{"created":true}`))
	})
	opts := idemhttp.Options{Principal: func(*http.Request) (string, error) { return "acct_1", nil }, Timeout: 200 * time.Millisecond}
	serve := func(l *idem.Ledger, key string) *httptest.ResponseRecorder {
		t.Helper()
		req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{"sku":"a"}`))
		req.Header.Set("Idempotency-Key", key)
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		idemhttp.Must(l, opts)(handler).ServeHTTP(rec, req)
		return rec
	}

	ledger := newLedger(t, db, idem.Config{Heartbeat: -1})
	if rec := serve(ledger, "k1"); rec.Code != http.StatusCreated || rec.Header().Get(idemhttp.HeaderReplayed) != "" {
		t.Fatalf("first request: %d %s", rec.Code, rec.Body)
	}
	// New work finds the budget spent: it is turned away.
	if rec := serve(ledger, "k2"); rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), idemhttp.CodeBudgetExhausted) {
		t.Fatalf("second request: %d %s", rec.Code, rec.Body)
	}
	res, err := admin.Query(t.Context(), "SELECT status FROM idempotency_keys WHERE key = 'k1'")
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Rows) != 1 || res.Rows[0][0].String() != string(idem.StatusCompleted) {
		t.Errorf("k1's row: %v; want it completed", res.Rows)
	}

	// The client retries k1 once its TTL has passed, on another replica.
	later := func() time.Time { return time.Now().Add(idem.DefaultTTL + time.Minute) }
	replica := newLedger(t, admin, idem.Config{Heartbeat: -1, Clock: later})
	rec := serve(replica, "k1")
	if rec.Code != http.StatusCreated || rec.Header().Get(idemhttp.HeaderReplayed) != "true" {
		t.Errorf("the retry: %d %s (replayed %q)", rec.Code, rec.Body, rec.Header().Get(idemhttp.HeaderReplayed))
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("the handler ran %d times, want once", n)
	}
}

// Under steady load on the default budget, with a short TTL, no completion
// is lost to the budget once the window fills: 10 requests a second with a
// TTL of 1 s and handlers of 500 ms, past the end of the first 300 s
// window. Claims could wait 10 s for a call and completions only about
// 2 s, so once the window was full the claims won the calls, and
// completions failed with "one may go in 3.1s" (15 in 10 minutes, the
// first at 298 s); the client's retry after the TTL then ran those
// handlers again.
func TestSteadyLoadLosesNoCompletion(t *testing.T) {
	t.Parallel()
	steadyLoadLosesNone(t, loadSpec{Rate: 10, Duration: 6 * time.Minute, TTL: time.Second, Handler: 500 * time.Millisecond,
		Ledgers: 1, Latency: 20 * time.Millisecond})
}

// steadyLoadLosesNone runs spec in fake time: something executes, and no
// completion is lost (checkOwed).
func steadyLoadLosesNone(t *testing.T, spec loadSpec) {
	t.Helper()
	synctest.Test(t, func(t *testing.T) {
		r := runLoad(t, spec)
		checkOwed(t, spec, r)
		if r.Executed == 0 {
			t.Fatalf("%v: nothing executed", spec)
		}
	})
}

// The same with the TTL a route's own (Options.TTL) under the ledger's 30 s:
// a claim owes the completion and the heartbeats of its route's TTL (a
// heartbeat every 333 ms here), not the ledger's.
func TestSteadyLoadLosesNoCompletionRouteTTL(t *testing.T) {
	t.Parallel()
	steadyLoadLosesNone(t, loadSpec{Rate: 10, Duration: 6 * time.Minute, TTL: time.Second, LedgerTTL: 30 * time.Second,
		Handler: 900 * time.Millisecond, Ledgers: 1, Latency: 20 * time.Millisecond})
}

// On a small budget (10 calls an hour) seven claims that each take their
// own call are not all let through: only those whose completions the
// budget still holds calls for, the others are turned away with 503 and a
// Retry-After. The completions, 50 ms apart, each find their call, and the
// clients' retries after the TTL are replays. Before, the seven were let
// through, four completions failed, and their retries ran the handler
// again.
func TestSmallBudgetAdmitsOnlyWhatItOwes(t *testing.T) {
	spec := loadSpec{Rate: 10, Duration: 700 * time.Millisecond, TTL: 30 * time.Second,
		HandlerOf: func(i int) time.Duration { return time.Second - time.Duration(i)*50*time.Millisecond },
		Budget:    budget.New(10, time.Hour), Ledgers: 1, Latency: 20 * time.Millisecond}
	synctest.Test(t, func(t *testing.T) {
		r := runLoad(t, spec)
		checkOwed(t, spec, r)
		if r.Executed == 0 || r.Shed == 0 {
			t.Errorf("%v: %d executed, %d refused; want some of each", spec, r.Executed, r.Shed)
		}
	})
}

// Overload sheds early: offered twice what the budget's calls carry (calls
// of 8 statements at the default budget's pace, 4 a second: about 10 first
// executions a second), for a minute, the middleware answers the excess
// 503 idempotency_ledger_busy with a Retry-After at once, and the requests
// it admits keep their latency: in fake time, none waits a second and a
// half, and the answered stay at the ceiling. Without shedding the queue
// grew until every request waited out its Timeout (10 s).
func TestOverloadShedsEarly(t *testing.T) {
	spec := loadSpec{Rate: 20, Duration: time.Minute, TTL: time.Second, Ledgers: 1, Latency: 20 * time.Millisecond,
		Coalesce: d1client.CoalesceConfig{MaxStatements: 8}}
	synctest.Test(t, func(t *testing.T) {
		r := runLoad(t, spec)
		checkOwed(t, spec, r)
		slices.Sort(r.Latencies)
		slices.Sort(r.Refusals)
		t.Logf("answered p50 %v, p99 %v, slowest %v; refused %d, the slowest at %v", r.Latencies[len(r.Latencies)/2],
			r.Latencies[len(r.Latencies)*99/100], r.Latencies[len(r.Latencies)-1], r.Shed, r.Refusals[len(r.Refusals)-1])
		switch {
		case r.Busy == 0 || r.Busy != r.Shed:
			t.Errorf("%d refused, %d of them busy; want the excess refused busy", r.Shed, r.Busy)
		case r.Refusals[len(r.Refusals)-1] != 0:
			t.Errorf("a refusal took %v; want every one at once", r.Refusals[len(r.Refusals)-1])
		case r.Latencies[len(r.Latencies)-1] >= 1500*time.Millisecond:
			t.Errorf("an answered request took %v; want under 1.5 s", r.Latencies[len(r.Latencies)-1])
		case float64(r.Answered) < 0.9*spec.Duration.Seconds()*4*8/3:
			t.Errorf("%d answered in %v; want the ceiling, about %g", r.Answered, spec.Duration, spec.Duration.Seconds()*4*8/3)
		}
	})
}
