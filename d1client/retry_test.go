package d1client

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/jarcoal/httpmock"
)

// recordDelays wraps r to record the time at which each HTTP attempt
// reaches it. In a synctest bubble, where an attempt through httpmock
// takes no time, the delays between successive attempts that the returned
// function gives are the client's waits before each retry.
func recordDelays(r httpmock.Responder) (httpmock.Responder, func() []time.Duration) {
	var mu sync.Mutex
	var at []time.Time
	record := func(req *http.Request) (*http.Response, error) {
		mu.Lock()
		at = append(at, time.Now())
		mu.Unlock()
		return r(req)
	}
	return record, func() []time.Duration {
		mu.Lock()
		defer mu.Unlock()
		var d []time.Duration
		for i := 1; i < len(at); i++ {
			d = append(d, at[i].Sub(at[i-1]))
		}
		return d
	}
}

func TestRetryPolicy(t *testing.T) {
	tests := []struct {
		name      string
		responses []string // fixtures, or "ok", "refused", "lost"
		stmts     []Statement
		opts      []ExecOption
		wantCalls int
		wantKind  kind // 0: success
	}{
		{"read retried after 500", []string{"internal_500", "ok"}, readStmt, nil, 2, 0},
		{"read retried after HTML 502", []string{"html_502", "html_504", "ok"}, readStmt, nil, 3, 0},
		{"read retried after overload", []string{"overloaded_429", "ok"}, readStmt, nil, 2, 0},
		{"read retried after lost connection", []string{"lost", "ok"}, readStmt, nil, 2, 0},
		{"read gives up after MaxAttempts", []string{"internal_500"}, readStmt, nil, 4, kindTransient},
		{"write not retried after 500", []string{"internal_500", "ok"}, writeStmt, nil, 1, kindTransient},
		{"write not retried after HTML 502", []string{"html_502", "ok"}, writeStmt, nil, 1, kindNonJSON},
		{"write not retried after overload", []string{"overloaded_429", "ok"}, writeStmt, nil, 1, kindOverloaded},
		{"write not retried after lost connection", []string{"lost", "ok"}, writeStmt, nil, 1, kindTransport},
		{"write not retried after success:false", []string{"success_false_200", "ok"}, writeStmt, []ExecOption{Idempotent()}, 1, kindEnvelope},
		{"write retried when the connection was refused", []string{"refused", "ok"}, writeStmt, nil, 2, 0},
		{"idempotent write retried after 500", []string{"internal_500", "html_503", "ok"}, writeStmt, []ExecOption{Idempotent()}, 3, 0},
		{"SQL error never retried", []string{"sql_error_syntax", "ok"}, readStmt, nil, 1, kindSQL},
		{"auth error never retried", []string{"auth_10000", "ok"}, readStmt, []ExecOption{Idempotent()}, 1, kindAuth},
		{"971 never retried", []string{"rate_limit_971", "ok"}, readStmt, []ExecOption{Idempotent()}, 1, kindRateLimited},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var rs []httpmock.Responder
			for _, r := range tc.responses {
				switch r {
				case "ok":
					rs = append(rs, ok1(t))
				case "refused":
					rs = append(rs, dialRefused)
				case "lost":
					rs = append(rs, httpmock.ConnectionFailure)
				default:
					rs = append(rs, replay(t, r))
				}
			}
			synctest.Test(t, func(t *testing.T) { // the backoff waits fake time
				c, tr := mockClient(t, sequence(rs...))
				_, err := c.Exec(context.Background(), tc.stmts, tc.opts...)
				if got := tr.GetTotalCallCount(); got != tc.wantCalls {
					t.Errorf("%d calls, want %d", got, tc.wantCalls)
				}
				if tc.wantKind == 0 {
					if err != nil {
						t.Fatalf("err = %v", err)
					}
					return
				}
				var e *Error
				if !errors.As(err, &e) || e.kind != tc.wantKind {
					t.Fatalf("err = %v, want kind %v", err, tc.wantKind)
				}
				if e.Attempts != tc.wantCalls {
					t.Errorf("Attempts = %d, want %d", e.Attempts, tc.wantCalls)
				}
			})
		})
	}
}

func TestBackoffGrowsWithJitterAndCap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, delays := recordDelays(replay(t, "internal_500"))
		c, _ := mockClient(t, r, func(cfg *Config) {
			cfg.Retry = RetryPolicy{MaxAttempts: 6, BaseDelay: 100 * time.Millisecond, MaxDelay: 400 * time.Millisecond}
		})
		_, _ = c.Exec(context.Background(), readStmt)
		sleeps := delays()
		caps := []time.Duration{100, 200, 400, 400, 400}
		if len(sleeps) != len(caps) {
			t.Fatalf("sleeps = %v", sleeps)
		}
		for i, d := range sleeps {
			hi := caps[i] * time.Millisecond
			if d < hi/2 || d > hi {
				t.Errorf("sleep %d = %v, want within [%v, %v]", i, d, hi/2, hi)
			}
		}
	})
}

func TestRetryAfterHonouredUpToCap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		overloaded := func(retryAfter string) httpmock.Responder {
			return func(req *http.Request) (*http.Response, error) {
				res, err := replay(t, "overloaded_429")(req)
				if err == nil {
					res.Header.Set("Retry-After", retryAfter)
				}
				return res, err
			}
		}
		r, delays := recordDelays(sequence(overloaded("3"), ok1(t)))
		c, tr := mockClient(t, r, func(cfg *Config) {
			cfg.Retry.MaxRetryAfter = 5 * time.Second
		})
		if _, err := c.Exec(context.Background(), readStmt); err != nil {
			t.Fatal(err)
		}
		if sleeps := delays(); len(sleeps) != 1 || sleeps[0] != 3*time.Second || tr.GetTotalCallCount() != 2 {
			t.Errorf("sleeps = %v, calls = %d; want one 3s sleep, 2 calls", sleeps, tr.GetTotalCallCount())
		}

		// A Retry-After beyond the cap ends the retries; the error carries it.
		c, tr = mockClient(t, sequence(overloaded("60"), ok1(t)), func(cfg *Config) {
			cfg.Retry.MaxRetryAfter = 5 * time.Second
		})
		start := time.Now()
		_, err := c.Exec(context.Background(), readStmt)
		var e *Error
		if !errors.As(err, &e) || e.kind != kindOverloaded || e.RetryAfter != time.Minute || tr.GetTotalCallCount() != 1 || time.Since(start) != 0 {
			t.Fatalf("err = %v, calls = %d, after %v", err, tr.GetTotalCallCount(), time.Since(start))
		}
	})
}

func TestContextDeadlineWins(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, tr := mockClient(t, replay(t, "internal_500"), func(cfg *Config) {
			cfg.Retry = RetryPolicy{MaxAttempts: 10, BaseDelay: time.Second, MaxDelay: time.Second}
		})
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err := c.Exec(ctx, readStmt)
		if !errors.Is(err, ErrTransient) {
			t.Fatalf("err = %v", err)
		}
		// No retry starts that could not finish before the deadline: the
		// call does not even wait for one.
		if tr.GetTotalCallCount() != 1 || time.Since(start) != 0 {
			t.Errorf("calls = %d, returned after %v", tr.GetTotalCallCount(), time.Since(start))
		}

		// A cancelled context is never sent.
		ctx, cancel = context.WithCancel(context.Background())
		cancel()
		c, tr = mockClient(t, ok1(t))
		_, err = c.Exec(ctx, readStmt)
		if !errors.Is(err, context.Canceled) || tr.GetTotalCallCount() != 0 {
			t.Errorf("err = %v after %d calls, want context.Canceled and none", err, tr.GetTotalCallCount())
		}
	})
}

func TestRetryUntilDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, tr := mockClient(t, replay(t, "internal_500"), func(cfg *Config) {
			cfg.Retry = RetryPolicy{MaxAttempts: 2, BaseDelay: time.Millisecond, MaxDelay: 2 * time.Millisecond}
		})
		ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
		defer cancel()
		_, err := c.Exec(ctx, writeStmt, Idempotent(), RetryUntilDeadline())
		// The last failure is the server's 500, or, when the deadline struck
		// while the last attempt was in flight, that attempt's ambiguous end.
		if !errors.Is(err, ErrTransient) && !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v", err)
		}
		if n := tr.GetTotalCallCount(); n <= 2 {
			t.Errorf("%d calls: RetryUntilDeadline stopped at MaxAttempts", n)
		}
	})
}

// After a 971 the client refuses to send until the block ends.
func TestRateLimitBlockIsNeverRetriedBeforeItEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, tr := mockClient(t, sequence(replay(t, "rate_limit_971"), ok1(t)))
		_, err := c.Exec(context.Background(), readStmt, Idempotent())
		var e *Error
		if !errors.As(err, &e) || e.kind != kindRateLimited || e.RetryAfter != 287*time.Second {
			t.Fatalf("err = %v", err)
		}
		until := e.BlockedUntil
		for i := 0; i < 3; i++ {
			_, err = c.Exec(context.Background(), readStmt)
			if !errors.As(err, &e) || e.kind != kindRateLimited || e.RetryAfter <= 280*time.Second || e.StatusCode != 429 {
				t.Fatalf("call during the block: err = %v", err)
			}
		}
		// Up to its last instant.
		time.Sleep(time.Until(until) - time.Nanosecond)
		if _, err = c.Exec(context.Background(), readStmt); !errors.Is(err, ErrRateLimited) {
			t.Fatalf("call at the block's last instant: err = %v", err)
		}
		if n := tr.GetTotalCallCount(); n != 1 {
			t.Fatalf("%d calls sent during the block, want 1", n)
		}
		// Once the block has passed, calls flow again.
		time.Sleep(time.Nanosecond)
		if _, err := c.Exec(context.Background(), readStmt); err != nil {
			t.Fatal(err)
		}
	})
}

// A Retry-After too large for a time.Duration (1e12 seconds, a date in the
// year 9999) is bounded to an hour, not wrapped into the past; a 971 that
// says so blocks the account for that hour, not for nothing.
func TestRetryAfterClamped(t *testing.T) {
	now := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, v := range []string{"1e12", "99999999999999999999", "1e400", "Inf", "9300000000", "Fri, 31 Dec 9999 23:59:59 GMT"} {
		if d, ok := parseRetryAfter(v, now); !ok || d != maxRetryAfter {
			t.Errorf("Retry-After %q = %v, %v; want %v", v, d, ok, maxRetryAfter)
		}
	}
	for v, want := range map[string]time.Duration{"30": 30 * time.Second, "0.5": 500 * time.Millisecond, "0": 0, "Wed, 01 Jan 2025 00:00:10 GMT": 10 * time.Second, "Tue, 31 Dec 2024 00:00:00 GMT": 0} {
		if d, ok := parseRetryAfter(v, now); !ok || d != want {
			t.Errorf("Retry-After %q = %v, %v; want %v", v, d, ok, want)
		}
	}
	for _, v := range []string{"", "-5", "NaN", "soon"} {
		if d, ok := parseRetryAfter(v, now); ok {
			t.Errorf("Retry-After %q = %v, read", v, d)
		}
	}
	blocked := func(req *http.Request) (*http.Response, error) {
		res := httpmock.NewStringResponse(http.StatusTooManyRequests, `{"success":false,"errors":[{"code":971,"message":"Please wait and consider throttling your request speed"}]}`)
		res.Header.Set("Retry-After", "1e12")
		return res, nil
	}
	synctest.Test(t, func(t *testing.T) {
		c, _ := mockClient(t, blocked)
		_, err := c.Exec(t.Context(), readStmt)
		var e *Error
		if !errors.As(err, &e) || !errors.Is(err, ErrRateLimited) || e.RetryAfter != maxRetryAfter ||
			!e.BlockedUntil.Equal(time.Now().Add(maxRetryAfter)) {
			t.Fatalf("err = %v (retry after %v, blocked until %v)", err, e.RetryAfter, e.BlockedUntil)
		}
		if st := c.Account().State(); !st.BlockedUntil.Equal(e.BlockedUntil) {
			t.Errorf("the account is blocked until %v, want %v", st.BlockedUntil, e.BlockedUntil)
		}
	})
}
