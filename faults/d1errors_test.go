package faults

import (
	"net/http"
	"testing"
	"time"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/idem/idemhttp"
)

// D1's error answers -- 500/7500 internal, 429/971 rate limit, 429/7500
// overloaded, an HTML 502 from the edge -- on round trip 1 (the claim) and
// round trip 2 (the transactional completion), each before the commit and,
// where D1 can fail that way, after it (AfterCommit: the write stands but
// the answer is an error). Whatever the failure, the client's retries end
// with the business write made exactly once, one stored completion, and a
// replay equal to the first success. The generation at the end tells which
// path was taken: 1 when nothing was orphaned, 2 when a committed claim (or
// an uncommitted completion) was left pending and taken over after the TTL.
func TestD1ErrorsOnBothRoundTrips(t *testing.T) {
	t.Parallel()
	const ttl = 600 * time.Millisecond
	rateLimit := d1local.Fault{RateLimit: true, RetryAfter: time.Second}
	type want struct {
		firstStatus int
		firstCode   string // "" for the handler's 201
		gen         int64
		runs        int64
	}
	cases := []struct {
		name   string
		target func(calls) bool
		fault  d1local.Fault
		want   want
	}{
		// Round trip 1: Begin is not retried (a claim that may have
		// committed is never repeated blindly); the middleware fails closed.
		{"claim/internal500", isClaim, d1local.Fault{Internal: true}, want{503, idemhttp.CodeLedgerUnavailable, 1, 1}},
		{"claim/internal500+after_commit", isClaim, d1local.Fault{Internal: true, AfterCommit: true}, want{503, idemhttp.CodeLedgerUnavailable, 2, 1}},
		{"claim/overloaded429", isClaim, d1local.Fault{Overloaded: true}, want{503, idemhttp.CodeLedgerUnavailable, 1, 1}},
		{"claim/overloaded429+after_commit", isClaim, d1local.Fault{Overloaded: true, AfterCommit: true}, want{503, idemhttp.CodeLedgerUnavailable, 2, 1}},
		{"claim/badgateway502", isClaim, d1local.Fault{BadGateway: true}, want{503, idemhttp.CodeLedgerUnavailable, 1, 1}},
		{"claim/badgateway502+after_commit", isClaim, d1local.Fault{BadGateway: true, AfterCommit: true}, want{503, idemhttp.CodeLedgerUnavailable, 2, 1}},
		{"claim/ratelimit971", isClaim, rateLimit, want{503, idemhttp.CodeBudgetExhausted, 1, 1}},
		// Round trip 2: the fenced completion is retried until it lands;
		// after an ambiguous failure the retry's guard finds it landed.
		{"completion/internal500", isCompletion, d1local.Fault{Internal: true}, want{201, "", 1, 1}},
		{"completion/internal500+after_commit", isCompletion, d1local.Fault{Internal: true, AfterCommit: true}, want{201, "", 1, 1}},
		{"completion/overloaded429", isCompletion, d1local.Fault{Overloaded: true}, want{201, "", 1, 1}},
		{"completion/overloaded429+after_commit", isCompletion, d1local.Fault{Overloaded: true, AfterCommit: true}, want{201, "", 1, 1}},
		{"completion/badgateway502", isCompletion, d1local.Fault{BadGateway: true}, want{201, "", 1, 1}},
		{"completion/badgateway502+after_commit", isCompletion, d1local.Fault{BadGateway: true, AfterCommit: true}, want{201, "", 1, 1}},
		// A 971 blocks every call of the client for Retry-After: the
		// transactional completion cannot land or be released, the client
		// is told to retry (nothing committed), and the pending row is taken
		// over after the TTL by the second execution.
		{"completion/ratelimit971", isCompletion, rateLimit, want{503, idemhttp.CodeMutationAbandoned, 2, 2}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w := newWorld(t)
			h := &bizHandler{}
			st := w.newStack(idem.Config{TTL: ttl}, func(db *d1client.Client) http.Handler { h.db = db; return h })
			w.setPolicy(once(tc.target, tc.fault))
			send := func() answer { return post(bg, st.srv.URL, "acct", "k-"+tc.name, `{"sku":"tea"}`) }

			first := send()
			if first.Status != tc.want.firstStatus || first.code() != tc.want.firstCode {
				t.Fatalf("first answer %s, want %d %q", first, tc.want.firstStatus, tc.want.firstCode)
			}
			if first.Status == http.StatusServiceUnavailable && first.Header.Get("Retry-After") == "" {
				t.Errorf("503 without Retry-After: %s", first)
			}
			if n := w.injectedCount(faultName(tc.fault) + "@"); n != 1 {
				t.Fatalf("fault injected %d times", n)
			}
			as := append([]answer{first}, retryUntilFinal(t, 15*time.Second, send)...)
			var success answer
			for _, a := range as {
				if a.Status == http.StatusCreated && !a.replayed() {
					success = a
					break
				}
			}
			if success.Status == 0 {
				t.Fatalf("no first success among the answers:\n  %s", summarize(as))
			}
			w.assertOnce(t, "acct", "k-"+tc.name, tc.want.gen)
			if h.runs() != tc.want.runs {
				t.Errorf("handler ran %d times, want %d; answers:\n  %s", h.runs(), tc.want.runs, summarize(as))
			}
			if r := send(); !r.replayed() || r.replayable() != success.replayable() {
				t.Errorf("replay %s differs from the first success %s", r, success)
			}
			for _, a := range as {
				if a.Status >= 500 && a.Status != http.StatusServiceUnavailable || a.Err != nil {
					t.Errorf("unexpected answer %s", a)
				}
			}
			t.Logf("answers:\n  %s", summarize(as))
		})
	}
}
