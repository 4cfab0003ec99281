package idemclient_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/d1idem/d1idem/idemclient"
)

// Each test's server is a script of answers, and runs in fake time: the
// gaps between the requests it sees are exactly the client's waits.

var hexKey = regexp.MustCompile(`^[0-9a-f]{32}$`)

// A request of a guarded method without a key gets a fresh one of 128
// random bits; one with a key keeps it; other methods pass untouched. The
// caller's request is never modified.
func TestKeyMadeOrKept(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &script{steps: []http.HandlerFunc{created}}
		_, base := pipeServer(t, s, true)
		tr := &idemclient.Transport{Base: base}

		a := send(t, t.Context(), tr, "POST", "a")
		b := send(t, t.Context(), tr, "PATCH", "b")
		c := send(t, t.Context(), tr, "PUT", "c", idemclient.HeaderKey, "caller-key-1")
		req, _ := http.NewRequest("DELETE", "http://pipe/orders/1", nil)
		var d result
		req = req.WithContext(idemclient.WithReport(t.Context(), &d.report))
		do(t, tr, req, &d)
		if len(req.Header) != 0 {
			t.Errorf("the caller's request was modified: %v", req.Header)
		}
		got := s.requests()
		for i, r := range []result{a, b, c, d} {
			if r.err != nil || r.status != 201 || r.report.Attempts != 1 || len(got[i].keys) != 1 || got[i].keys[0] != r.report.Key {
				t.Errorf("request %d: %v; the server saw keys %q", i, r, got[i].keys)
			}
		}
		if !hexKey.MatchString(a.report.Key) || !hexKey.MatchString(b.report.Key) || !hexKey.MatchString(d.report.Key) {
			t.Errorf("made keys %q, %q, %q: want 32 hex digits", a.report.Key, b.report.Key, d.report.Key)
		}
		if a.report.Key == b.report.Key || a.report.Key == d.report.Key {
			t.Errorf("two requests got one key %q", a.report.Key)
		}
		if c.report.Key != "caller-key-1" {
			t.Errorf("the caller's key became %q", c.report.Key)
		}

		// Safe methods, and methods left out of Methods, pass untouched: no
		// key, no retry, no report.
		s.steps = []http.HandlerFunc{errorBody(503, idemclient.CodeLedgerUnavailable, "1")}
		only := &idemclient.Transport{Base: base, Methods: []string{"post"}}
		for _, r := range []result{send(t, t.Context(), tr, "GET", ""), send(t, t.Context(), only, "PUT", "x")} {
			if r.err != nil || r.status != 503 || r.report != (idemclient.Report{}) {
				t.Errorf("unguarded: %v", r)
			}
		}
		got = s.requests()
		if len(got) != 6 || got[4].method != "GET" || len(got[4].keys) != 0 || got[5].method != "PUT" || len(got[5].keys) != 0 {
			t.Errorf("unguarded requests seen: %+v", got[4:])
		}
	})
}

// Every retry sends the same key and the same body, and the Report counts
// the attempts and the time waited.
func TestSameKeyAndBodyAcrossRetries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &script{steps: []http.HandlerFunc{
			hangUp,
			errorBody(503, idemclient.CodeLedgerUnavailable, "1"),
			errorBody(429, "rate_limited", "2"),
			inProgress(1500, "2"),
			reply(409, `{"error":"idempotency_key_retry","message":"Retry the request."}`),
			created,
		}}
		_, base := pipeServer(t, s, true)
		start := time.Now()
		r := send(t, t.Context(), &idemclient.Transport{Base: base}, "POST", `{"sku":"tea"}`)
		if r.err != nil || r.status != 201 || r.body != `{"order":1}` || r.report.Attempts != 6 || r.report.Replayed {
			t.Fatalf("got %v", r)
		}
		for i, q := range s.requests() {
			if len(q.keys) != 1 || q.keys[0] != r.report.Key || q.body != `{"sku":"tea"}` {
				t.Errorf("attempt %d sent keys %q, body %q; want %q, %q", i+1, q.keys, q.body, r.report.Key, `{"sku":"tea"}`)
			}
		}
		gaps := s.gaps()
		// The backoff after attempt n is 250 ms doubled n-1 times, less up
		// to half; a hint is the least wait. After the hang-up: 125 to
		// 250 ms. Then the hints, longer than their backoffs: 1 s, 2 s.
		// Then 1.5 s or the backoff of 1 to 2 s, whichever is longer. A
		// retry answer is retried at once only after the first attempt: the
		// fifth waits its backoff, 2 to 4 s.
		if gaps[0] < 125*time.Millisecond || gaps[0] > 250*time.Millisecond ||
			gaps[1] != time.Second || gaps[2] != 2*time.Second || gaps[3] < 1500*time.Millisecond || gaps[3] > 2*time.Second ||
			gaps[4] < 2*time.Second || gaps[4] > 4*time.Second {
			t.Errorf("waits %v", gaps)
		}
		if r.report.Waited != time.Since(start) {
			t.Errorf("Report.Waited %v, but the request took %v", r.report.Waited, time.Since(start))
		}
	})
}

// The server's hint is the least wait: the in-progress answer's
// retry_after_ms (more precise than its Retry-After), else Retry-After, in
// seconds or as a date; Stripe's in-progress 409 is retried too. Without a
// hint, or with a shorter one, the first backoff: 125 to 250 ms.
func TestHintsHonoured(t *testing.T) {
	backoff := [2]time.Duration{125 * time.Millisecond, 250 * time.Millisecond}
	for _, tc := range []struct {
		name   string
		answer func() http.HandlerFunc // made in the bubble, for its clock
		wait   [2]time.Duration        // the least and the most
	}{
		{"in progress: retry_after_ms over Retry-After", func() http.HandlerFunc { return inProgress(1500, "2") }, [2]time.Duration{1500 * time.Millisecond, 1500 * time.Millisecond}},
		{"in progress: Retry-After alone", func() http.HandlerFunc { return inProgress(-1, "3") }, [2]time.Duration{3 * time.Second, 3 * time.Second}},
		{"in progress: hint shorter than the backoff", func() http.HandlerFunc { return inProgress(10, "1") }, backoff},
		{"in progress: no hint", func() http.HandlerFunc { return inProgress(-1, "") }, backoff},
		{"in progress: Stripe's idempotency_key_in_use", func() http.HandlerFunc {
			return reply(409, `{"error":{"code":"idempotency_key_in_use","message":"in use","type":"invalid_request_error"}}`)
		}, backoff},
		{"503 ledger unavailable", func() http.HandlerFunc { return errorBody(503, idemclient.CodeLedgerUnavailable, "2") }, [2]time.Duration{2 * time.Second, 2 * time.Second}},
		{"503 budget exhausted", func() http.HandlerFunc { return errorBody(503, idemclient.CodeBudgetExhausted, "7") }, [2]time.Duration{7 * time.Second, 7 * time.Second}},
		{"503 ledger busy", func() http.HandlerFunc { return errorBody(503, idemclient.CodeLedgerBusy, "1") }, [2]time.Duration{time.Second, time.Second}},
		{"503 not committed", func() http.HandlerFunc { return errorBody(503, idemclient.CodeMutationAbandoned, "1") }, [2]time.Duration{time.Second, time.Second}},
		{"429 seconds", func() http.HandlerFunc { return reply(429, "slow down", "Retry-After", "3") }, [2]time.Duration{3 * time.Second, 3 * time.Second}},
		{"503 date", func() http.HandlerFunc {
			return reply(503, "", "Retry-After", time.Now().Add(4*time.Second).UTC().Format(http.TimeFormat))
		}, [2]time.Duration{4 * time.Second, 4 * time.Second}},
		{"503 without hint", func() http.HandlerFunc { return reply(503, "") }, backoff},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := &script{steps: []http.HandlerFunc{tc.answer(), created}}
				_, base := pipeServer(t, s, true)
				r := send(t, t.Context(), &idemclient.Transport{Base: base}, "POST", "x")
				if r.err != nil || r.status != 201 || r.report.Attempts != 2 {
					t.Fatalf("got %v", r)
				}
				if g := s.gaps()[0]; g < tc.wait[0] || g > tc.wait[1] {
					t.Errorf("waited %v, want %v to %v", g, tc.wait[0], tc.wait[1])
				}
			})
		})
	}
}

// A short hint repeated while the first request runs on (the issue of a
// client that obeyed a 100 ms hint literally and gave up after 10 tries
// in 1 s): the waits grow, never below the hint nor half the backoff, and
// the request is answered when the first one is done, 40 s later.
func TestShortHintNeverTightLoop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var first time.Time
		var mu sync.Mutex
		s := &script{steps: []http.HandlerFunc{func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			if first.IsZero() {
				first = time.Now()
			}
			done := time.Since(first) >= 40*time.Second
			mu.Unlock()
			if done {
				created(w, r)
				return
			}
			inProgress(100, "1")(w, r)
		}}}
		_, base := pipeServer(t, s, true)
		r := send(t, t.Context(), &idemclient.Transport{Base: base}, "POST", "x")
		if r.err != nil || r.status != 201 {
			t.Fatalf("got %v", r)
		}
		gaps := s.gaps()
		for i, g := range gaps {
			backoff := min(250*time.Millisecond<<i, 10*time.Second)
			if g < max(100*time.Millisecond, backoff/2) || g > backoff {
				t.Errorf("wait %d: %v, want %v to %v", i+1, g, max(100*time.Millisecond, backoff/2), backoff)
			}
		}
		if n := len(gaps) + 1; n > 14 {
			t.Errorf("%d attempts in 40 s", n)
		}
		t.Logf("%d attempts, waits %v", len(gaps)+1, gaps)
	})
}

// Other 5xx are retried only with RetryServerErrors, and never d1idem's
// final 500s nor a replay.
func TestServerErrorsRetriedWhenConfigured(t *testing.T) {
	final500 := func(code string) http.HandlerFunc { return errorBody(500, code, "") }
	for _, tc := range []struct {
		name         string
		retry5xx     bool
		first        http.HandlerFunc
		wantAttempts int
		replayed     bool
	}{
		{"500 by default", false, reply(500, "boom"), 1, false},
		{"502 by default", false, reply(502, "<html>bad gateway</html>"), 1, false},
		{"500 configured", true, reply(500, "boom"), 2, false},
		{"502 configured", true, reply(502, "<html>bad gateway</html>"), 2, false},
		{"504 configured", true, reply(504, ""), 2, false},
		{"500 mutation failed", true, final500(idemclient.CodeMutationAbandoned), 1, false},
		{"500 record unreadable", true, final500(idemclient.CodeRecordUnreadable), 1, false},
		{"500 principal invalid", true, final500(idemclient.CodePrincipalInvalid), 1, false},
		{"500 replayed", true, reply(500, `{"error":"boom"}`, idemclient.HeaderReplayed, "true"), 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := &script{steps: []http.HandlerFunc{tc.first, created}}
				_, base := pipeServer(t, s, true)
				tr := &idemclient.Transport{Base: base, Policy: idemclient.Policy{RetryServerErrors: tc.retry5xx}}
				r := send(t, t.Context(), tr, "POST", "x")
				if r.err != nil || r.report.Attempts != tc.wantAttempts || len(s.requests()) != tc.wantAttempts || r.report.Replayed != tc.replayed {
					t.Fatalf("got %v, want %d attempts", r, tc.wantAttempts)
				}
				if tc.wantAttempts == 1 {
					// The answer comes back whole, although its start was read.
					want := httptest.NewRecorder()
					tc.first(want, httptest.NewRequest("POST", "/", nil))
					if r.status != want.Code || r.body != want.Body.String() {
						t.Errorf("got %d %q, the server sent %d %q", r.status, r.body, want.Code, want.Body)
					}
				} else if r.status != 201 {
					t.Errorf("got %v", r)
				}
			})
		})
	}
}

// A 4xx other than in-progress, retry and 429 is the answer: returned whole,
// after one attempt.
func TestClientErrorsNotRetried(t *testing.T) {
	for _, first := range []http.HandlerFunc{
		errorBody(400, idemclient.CodeKeyRequired, ""),
		errorBody(400, idemclient.CodeKeyInvalid, ""),
		errorBody(401, idemclient.CodeUnauthenticated, ""),
		errorBody(413, idemclient.CodeBodyTooLarge, ""),
		reply(404, "not found"),
		reply(409, `{"error":"order_exists","message":"The order exists."}`),
		reply(409, "conflict, not JSON"),
		reply(409, `{"error":"idempotency_key_in_progress"`), // cut short: not JSON
		reply(422, `{"error":"invalid_sku"}`),
		reply(400, strings.Repeat("x", 100<<10)), // longer than what is read to classify
		reply(409, `{"error":"idempotency_key_in_progress"}`+strings.Repeat(" ", 100<<10)),
	} {
		synctest.Test(t, func(t *testing.T) {
			s := &script{steps: []http.HandlerFunc{first, created}}
			_, base := pipeServer(t, s, true)
			r := send(t, t.Context(), &idemclient.Transport{Base: base}, "POST", "x")
			want := httptest.NewRecorder()
			first(want, httptest.NewRequest("POST", "/", nil))
			if r.err != nil || r.report.Attempts != 1 || len(s.requests()) != 1 || r.status != want.Code || r.body != want.Body.String() {
				t.Errorf("got %.200v, want %d %.100q after 1 attempt", r, want.Code, want.Body)
			}
		})
	}
}

// A key reused for another request is a *KeyReusedError, never retried.
func TestKeyReusedIsTypedError(t *testing.T) {
	for _, status := range []int{409, 422} {
		synctest.Test(t, func(t *testing.T) {
			s := &script{steps: []http.HandlerFunc{errorBody(status, idemclient.CodeKeyReused, ""), created}}
			_, base := pipeServer(t, s, true)
			r := send(t, t.Context(), &idemclient.Transport{Base: base}, "POST", "x", idemclient.HeaderKey, "k-1")
			var e *idemclient.KeyReusedError
			if !errors.As(r.err, &e) || e.Key != "k-1" || e.Status != status || e.Message != "the message of idempotency_key_reused" {
				t.Fatalf("got %v (%#v)", r, e)
			}
			if len(s.requests()) != 1 || r.report.Attempts != 1 {
				t.Errorf("%d attempts", len(s.requests()))
			}
			if want := `idemclient: Idempotency-Key "k-1" was already used for a different request`; !strings.Contains(r.err.Error(), want) {
				t.Errorf("error %q, want it to contain %q", r.err, want)
			}
		})
	}
}

// A body that cannot be sent again is sent once: what would be retried is an
// *UnknownOutcomeError saying why.
func TestBodyNotReplayableSentOnce(t *testing.T) {
	for _, first := range []http.HandlerFunc{hangUp, errorBody(503, idemclient.CodeLedgerUnavailable, "1"), inProgress(100, "1")} {
		synctest.Test(t, func(t *testing.T) {
			s := &script{steps: []http.HandlerFunc{first, created}}
			_, base := pipeServer(t, s, true)
			var r result
			req, _ := http.NewRequestWithContext(idemclient.WithReport(t.Context(), &r.report), "POST", "http://pipe/orders",
				io.NopCloser(strings.NewReader("once"))) // no GetBody
			do(t, &idemclient.Transport{Base: base}, req, &r)
			var e *idemclient.UnknownOutcomeError
			if !errors.As(r.err, &e) || !errors.Is(r.err, idemclient.ErrBodyNotReplayable) || e.Attempts != 1 || e.Key != r.report.Key {
				t.Fatalf("got %v", r)
			}
			if got := s.requests(); len(got) != 1 || got[0].body != "once" {
				t.Errorf("the server saw %+v", got)
			}
		})
	}
}

// No attempt starts after the context's deadline: a wait that would end
// past it ends the request at once, and one cut short by the context ends
// it then.
func TestContextEndsRetries(t *testing.T) {
	t.Run("deadline", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s := &script{steps: []http.HandlerFunc{errorBody(503, idemclient.CodeLedgerUnavailable, "3")}}
			_, base := pipeServer(t, s, true)
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			start := time.Now()
			r := send(t, ctx, &idemclient.Transport{Base: base}, "POST", "x")
			// Attempts at 0, 3, 6 and 9 s; the next would start at 12 s.
			var e *idemclient.UnknownOutcomeError
			if !errors.As(r.err, &e) || !errors.Is(r.err, context.DeadlineExceeded) || e.Attempts != 4 || e.LastStatus != 503 ||
				e.LastCode != idemclient.CodeLedgerUnavailable || e.RetryAfter != 3*time.Second {
				t.Fatalf("got %v", r)
			}
			if d := time.Since(start); d != 9*time.Second {
				t.Errorf("gave up after %v, want 9s", d)
			}
		})
	})
	t.Run("hint past the deadline", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s := &script{steps: []http.HandlerFunc{inProgress(30_000, "30"), created}}
			_, base := pipeServer(t, s, true)
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			start := time.Now()
			r := send(t, ctx, &idemclient.Transport{Base: base}, "POST", "x")
			var e *idemclient.UnknownOutcomeError
			if !errors.As(r.err, &e) || !errors.Is(r.err, context.DeadlineExceeded) || e.Attempts != 1 || e.RetryAfter != 30*time.Second {
				t.Fatalf("got %v", r)
			}
			if d := time.Since(start); d != 0 {
				t.Errorf("waited %v for nothing", d)
			}
		})
	})
	t.Run("cancelled while waiting", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s := &script{steps: []http.HandlerFunc{inProgress(5000, "5"), created}}
			_, base := pipeServer(t, s, true)
			ctx, cancel := context.WithCancel(t.Context())
			time.AfterFunc(2*time.Second, cancel)
			start := time.Now()
			r := send(t, ctx, &idemclient.Transport{Base: base}, "POST", "x")
			var e *idemclient.UnknownOutcomeError
			if !errors.As(r.err, &e) || !errors.Is(r.err, context.Canceled) || e.Attempts != 1 {
				t.Fatalf("got %v", r)
			}
			if d := time.Since(start); d != 2*time.Second {
				t.Errorf("returned after %v, want 2s", d)
			}
		})
	})
	t.Run("cancelled during an attempt", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			s := &script{steps: []http.HandlerFunc{func(w http.ResponseWriter, r *http.Request) {
				cancel()
				<-r.Context().Done() // the client hung up
			}, created}}
			_, base := pipeServer(t, s, true)
			r := send(t, ctx, &idemclient.Transport{Base: base}, "POST", "x")
			var e *idemclient.UnknownOutcomeError
			if !errors.As(r.err, &e) || !errors.Is(r.err, context.Canceled) || e.Attempts != 1 || e.Err == nil {
				t.Fatalf("got %v", r)
			}
		})
	})
}

// Giving up is an *UnknownOutcomeError that says so and carries the key; a
// later request with that key is the same request to the server.
func TestGiveUpErrorCarriesKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &script{steps: []http.HandlerFunc{inProgress(2000, "2"), inProgress(2000, "2"), inProgress(2000, "2"), created}}
		_, base := pipeServer(t, s, true)
		tr := &idemclient.Transport{Base: base, Policy: idemclient.Policy{MaxAttempts: 3}}
		r := send(t, t.Context(), tr, "POST", "x")
		var e *idemclient.UnknownOutcomeError
		if !errors.As(r.err, &e) || !errors.Is(r.err, idemclient.ErrMaxAttempts) {
			t.Fatalf("got %v", r)
		}
		want := idemclient.UnknownOutcomeError{Key: r.report.Key, Attempts: 3, LastStatus: 409, LastCode: idemclient.CodeKeyInProgress,
			RetryAfter: 2 * time.Second, Stop: idemclient.ErrMaxAttempts}
		if *e != want {
			t.Errorf("got %+v, want %+v", *e, want)
		}
		msg := fmt.Sprintf(`idemclient: outcome unknown after 3 attempts (last answer: 409 Conflict, idempotency_key_in_progress, retry after 2s): `+
			`Policy.MaxAttempts attempts made; keep Idempotency-Key %q and retry with it later`, e.Key)
		if !strings.HasSuffix(r.err.Error(), msg) {
			t.Errorf("error %q\nwant it to end with %q", r.err, msg)
		}

		later := send(t, t.Context(), tr, "POST", "x", idemclient.HeaderKey, e.Key)
		if later.err != nil || later.status != 201 || later.report.Key != e.Key {
			t.Fatalf("later: %v", later)
		}
		for i, q := range s.requests() {
			if len(q.keys) != 1 || q.keys[0] != e.Key {
				t.Errorf("request %d had keys %q", i+1, q.keys)
			}
		}

		// A network error as the last attempt's outcome, and MaxElapsed.
		s2 := &script{steps: []http.HandlerFunc{hangUp}}
		_, base2 := pipeServer(t, s2, true)
		start := time.Now()
		r = send(t, t.Context(), &idemclient.Transport{Base: base2, Policy: idemclient.Policy{MaxElapsed: 5 * time.Second}}, "POST", "x")
		if !errors.As(r.err, &e) || !errors.Is(r.err, idemclient.ErrMaxElapsed) || e.Err == nil || e.LastStatus != 0 ||
			!strings.Contains(r.err.Error(), "(last: ") || time.Since(start) > 5*time.Second {
			t.Fatalf("got %v after %v", r, time.Since(start))
		}
	})
}

// idempotency_key_retry after the first attempt is retried at once.
func TestRetryNowAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &script{steps: []http.HandlerFunc{reply(409, `{"error":"idempotency_key_retry","message":"Retry the request."}`), created}}
		_, base := pipeServer(t, s, true)
		r := send(t, t.Context(), &idemclient.Transport{Base: base}, "POST", "x")
		got := s.requests()
		if r.err != nil || r.status != 201 || len(got) != 2 || got[0].keys[0] != got[1].keys[0] || s.gaps()[0] != 0 {
			t.Fatalf("got %v; waits %v", r, s.gaps())
		}
	})
}

// bodyTracker is a base transport that records each answer's body.
type bodyTracker struct {
	base   http.RoundTripper
	mu     sync.Mutex
	bodies []*trackedBody
}

type trackedBody struct {
	io.ReadCloser
	read   atomic.Int64
	closed atomic.Bool
}

func (b *trackedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.read.Add(int64(n))
	return n, err
}

func (b *trackedBody) Close() error { b.closed.Store(true); return b.ReadCloser.Close() }

func (bt *bodyTracker) RoundTrip(req *http.Request) (*http.Response, error) {
	res, err := bt.base.RoundTrip(req)
	if err == nil {
		tb := &trackedBody{ReadCloser: res.Body}
		res.Body = tb
		bt.mu.Lock()
		bt.bodies = append(bt.bodies, tb)
		bt.mu.Unlock()
	}
	return res, err
}

// The answers of the attempts retried are read to their end and closed
// before the next attempt; the last one is the caller's.
func TestRetriedAnswersDrainedAndClosed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &script{steps: []http.HandlerFunc{
			reply(503, strings.Repeat("a", 1000)),
			inProgress(100, "1"),
			reply(500, strings.Repeat("b", 3000)),
			reply(503, strings.Repeat("c", 100<<10)), // longer than what is read to classify it
			created,
		}}
		_, base := pipeServer(t, s, true)
		bt := &bodyTracker{base: base}
		tr := &idemclient.Transport{Base: bt, Policy: idemclient.Policy{RetryServerErrors: true}}
		req, _ := http.NewRequest("POST", "http://pipe/orders", strings.NewReader("x"))
		res, err := tr.RoundTrip(req)
		if err != nil || res.StatusCode != 201 {
			t.Fatalf("got %v, %v", res, err)
		}
		want := []int64{1000, int64(len(`{"error":"idempotency_key_in_progress","message":"still running","retry_after_ms":100}`)), 3000, 100 << 10}
		for i, b := range bt.bodies[:4] {
			if !b.closed.Load() || b.read.Load() != want[i] {
				t.Errorf("answer %d: closed %v, %d bytes read, want %d", i+1, b.closed.Load(), b.read.Load(), want[i])
			}
		}
		if last := bt.bodies[4]; last.closed.Load() {
			t.Error("the final answer was closed before the caller read it")
		}
		res.Body.Close()
		if n := len(s.requests()); n != 5 {
			t.Errorf("%d requests", n)
		}
	})
}

// An invalid Policy fails each guarded request, naming the field, without
// sending it; its body is closed as a RoundTripper must.
func TestInvalidPolicy(t *testing.T) {
	for _, tc := range []struct {
		p    idemclient.Policy
		want string
	}{
		{idemclient.Policy{MaxAttempts: -1}, "Policy.MaxAttempts -1 is out of range"},
		{idemclient.Policy{InitialBackoff: -time.Second}, "Policy.InitialBackoff -1s is out of range"},
		{idemclient.Policy{MaxBackoff: -time.Second}, "Policy.MaxBackoff -1s is out of range"},
		{idemclient.Policy{InitialBackoff: time.Second, MaxBackoff: time.Millisecond}, "Policy.MaxBackoff 1ms is out of range"},
		{idemclient.Policy{MaxBackoff: 100 * time.Millisecond}, "Policy.MaxBackoff 100ms is out of range"}, // below the default InitialBackoff
	} {
		s := &script{steps: []http.HandlerFunc{created}}
		ts := httptest.NewServer(s)
		body := &trackedBody{ReadCloser: io.NopCloser(strings.NewReader("x"))}
		req, _ := http.NewRequest("POST", ts.URL, body)
		_, err := (&idemclient.Transport{Policy: tc.p}).RoundTrip(req)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !body.closed.Load() || len(s.requests()) != 0 {
			t.Errorf("%+v: %v (body closed: %v)", tc.p, err, body.closed.Load())
		}
		if tc.p.Validate() == nil {
			t.Errorf("%+v: Validate accepted it", tc.p)
		}
		ts.Close()
	}
	for _, p := range []idemclient.Policy{{}, {MaxAttempts: 1, MaxElapsed: -1}, {InitialBackoff: 20 * time.Second}, {InitialBackoff: time.Second, MaxBackoff: time.Second}} {
		if err := p.Validate(); err != nil {
			t.Errorf("%+v: %v", p, err)
		}
	}
}

// A certificate the client refuses is returned at once: the request was
// never sent, and a retry cannot change the certificate.
func TestCertificateErrorNotRetried(t *testing.T) {
	s := &script{steps: []http.HandlerFunc{created}}
	ts := httptest.NewUnstartedServer(s)
	ts.Config.ErrorLog = log.New(io.Discard, "", 0) // the handshake's failure
	ts.StartTLS()
	defer ts.Close()
	var r result
	req, _ := http.NewRequestWithContext(idemclient.WithReport(t.Context(), &r.report), "POST", ts.URL, strings.NewReader("x"))
	do(t, &idemclient.Transport{Base: &http.Transport{}}, req, &r)
	if _, ok := errors.AsType[*tls.CertificateVerificationError](r.err); !ok || r.report.Attempts != 1 || len(s.requests()) != 0 {
		t.Fatalf("got %v", r)
	}
}

// One Transport serves many requests at once, each with its own key and
// retries.
func TestConcurrentRequests(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		tries := map[string]int{}
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			key := r.Header.Get(idemclient.HeaderKey)
			body, _ := io.ReadAll(r.Body)
			mu.Lock()
			tries[key]++
			n := tries[key]
			mu.Unlock()
			switch n {
			case 1:
				hangUp(w, r)
			case 2:
				inProgress(300, "1")(w, r)
			default:
				w.WriteHeader(201)
				fmt.Fprintf(w, "%s %s", key, body)
			}
		})
		_, base := pipeServer(t, h, true)
		tr := &idemclient.Transport{Base: base}
		const n = 64
		results := make([]result, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() { results[i] = send(t, t.Context(), tr, "POST", fmt.Sprint(i)) })
		}
		wg.Wait()
		for i, r := range results {
			if r.err != nil || r.status != 201 || r.body != fmt.Sprintf("%s %d", r.report.Key, i) || r.report.Attempts != 3 {
				t.Errorf("request %d: %v", i, r)
			}
		}
		if len(tries) != n {
			t.Errorf("%d keys for %d requests", len(tries), n)
		}
	})
}

// Bodies from GetBody are sent again; a GetBody that fails ends the request.
func TestGetBody(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &script{steps: []http.HandlerFunc{hangUp, hangUp, created}}
		_, base := pipeServer(t, s, true)
		var r result
		req, _ := http.NewRequestWithContext(idemclient.WithReport(t.Context(), &r.report), "POST", "http://pipe/", bytes.NewReader([]byte("bytes")))
		do(t, &idemclient.Transport{Base: base}, req, &r)
		if r.err != nil || r.status != 201 || r.report.Attempts != 3 {
			t.Fatalf("got %v", r)
		}
		for _, q := range s.requests() {
			if q.body != "bytes" {
				t.Errorf("sent %q", q.body)
			}
		}

		req, _ = http.NewRequest("POST", "http://pipe/", strings.NewReader("x"))
		boom := errors.New("boom")
		req.GetBody = func() (io.ReadCloser, error) { return nil, boom }
		s.steps = []http.HandlerFunc{errorBody(503, idemclient.CodeLedgerUnavailable, "1")}
		_, err := (&idemclient.Transport{Base: base}).RoundTrip(req)
		var e *idemclient.UnknownOutcomeError
		if !errors.As(err, &e) || !errors.Is(err, boom) || e.Attempts != 1 || e.LastStatus != 503 {
			t.Fatalf("got %v", err)
		}
	})
}
