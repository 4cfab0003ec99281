package idemclient

import (
	"errors"
	"net/http"
	"testing"
	"time"
)

const ms = time.Millisecond

// The schedule, with the random part fixed: u = 0 takes none of the
// backoff off, u near 1 takes off half.
func TestPolicyWaitSchedule(t *testing.T) {
	var p Policy
	full := []time.Duration{250 * ms, 500 * ms, time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 10 * time.Second, 10 * time.Second}
	for i, want := range full {
		n := i + 1
		for _, c := range []Class{Unavailable, InProgress} {
			if got, err := p.wait(n, 0, Outcome{Class: c}, 0); got != want || err != nil {
				t.Errorf("%v after attempt %d, u=0: %v, %v; want %v", c, n, got, err, want)
			}
			if got, err := p.wait(n, 0, Outcome{Class: c}, 0.999999); got < want/2 || got > want/2+ms || err != nil {
				t.Errorf("%v after attempt %d, u≈1: %v, %v; want about %v", c, n, got, err, want/2)
			}
		}
	}
	// The hint is the least wait, not added to the backoff.
	for _, tc := range []struct {
		n    int
		hint time.Duration
		want time.Duration
	}{
		{1, 100 * ms, 250 * ms}, {1, 3 * time.Second, 3 * time.Second}, {5, 3 * time.Second, 4 * time.Second}, {5, 30 * time.Second, 30 * time.Second},
	} {
		if got, _ := p.wait(tc.n, 0, Outcome{Class: InProgress, RetryAfter: tc.hint}, 0); got != tc.want {
			t.Errorf("attempt %d, hint %v: %v, want %v", tc.n, tc.hint, got, tc.want)
		}
	}
	// RetryNow: at once after the first attempt, else backed off.
	if got, err := p.wait(1, 0, Outcome{Class: RetryNow}, 0.5); got != 0 || err != nil {
		t.Errorf("RetryNow after attempt 1: %v, %v", got, err)
	}
	if got, _ := p.wait(3, 0, Outcome{Class: RetryNow}, 0); got != time.Second {
		t.Errorf("RetryNow after attempt 3: %v", got)
	}
	// Other backoffs.
	p = Policy{InitialBackoff: 20 * time.Second}
	if got, _ := p.wait(4, 0, Outcome{Class: Unavailable}, 0); got != 20*time.Second {
		t.Errorf("InitialBackoff over the default MaxBackoff: %v", got)
	}
	p = Policy{InitialBackoff: ms, MaxBackoff: 5 * ms}
	if got, _ := p.wait(100, 0, Outcome{Class: Unavailable}, 0); got != 5*ms {
		t.Errorf("after 100 attempts: %v", got)
	}
}

// What stops the retries.
func TestPolicyStops(t *testing.T) {
	for _, tc := range []struct {
		p       Policy
		n       int
		elapsed time.Duration
		o       Outcome
		want    error
	}{
		{Policy{}, 1, 0, Outcome{Class: Final}, ErrNotRetried},
		{Policy{RetryServerErrors: true}, 1, 0, Outcome{Class: Reused}, ErrNotRetried},
		{Policy{}, 1, 0, Outcome{Class: ServerError}, ErrNotRetried},
		{Policy{RetryServerErrors: true}, 1, 0, Outcome{Class: ServerError}, nil},
		{Policy{MaxAttempts: 3}, 2, 0, Outcome{Class: Unavailable}, nil},
		{Policy{MaxAttempts: 3}, 3, 0, Outcome{Class: Unavailable}, ErrMaxAttempts},
		{Policy{MaxAttempts: 1}, 1, 0, Outcome{Class: RetryNow}, ErrMaxAttempts},
		{Policy{}, 1000, 0, Outcome{Class: Unavailable}, nil}, // no bound on attempts by default
		{Policy{}, 3, 59 * time.Second, Outcome{Class: InProgress}, nil},
		{Policy{}, 3, 59 * time.Second, Outcome{Class: InProgress, RetryAfter: time.Second}, nil},
		{Policy{}, 3, 59 * time.Second, Outcome{Class: InProgress, RetryAfter: 1001 * ms}, ErrMaxElapsed},
		{Policy{}, 5, 57 * time.Second, Outcome{Class: InProgress}, ErrMaxElapsed}, // a backoff of 4 s
		{Policy{MaxElapsed: 2 * time.Hour}, 3, time.Hour, Outcome{Class: Unavailable, RetryAfter: 300 * time.Second}, nil},
		{Policy{MaxElapsed: -1}, 3, 1000 * time.Hour, Outcome{Class: Unavailable}, nil},
	} {
		_, err := tc.p.wait(tc.n, tc.elapsed, tc.o, 0)
		if !errors.Is(err, tc.want) || (err == nil) != (tc.want == nil) {
			t.Errorf("%+v after attempt %d at %v, %+v: %v, want %v", tc.p, tc.n, tc.elapsed, tc.o, err, tc.want)
		}
	}
}

// The random part spreads the waits over the upper half of the backoff.
func TestPolicyWaitJitter(t *testing.T) {
	seen := map[time.Duration]bool{}
	for range 100 {
		d, err := Policy{}.Wait(3, 0, Outcome{Class: Unavailable})
		if err != nil || d <= 500*ms || d > time.Second {
			t.Fatalf("%v, %v: want (500ms, 1s]", d, err)
		}
		seen[d] = true
	}
	if len(seen) < 50 {
		t.Errorf("%d distinct waits in 100", len(seen))
	}
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	for v, want := range map[string]time.Duration{
		"":    0,
		"0":   0,
		" 3 ": 3 * time.Second,
		"1.5": 1500 * ms,
		"-1":  0,
		"abc": 0,
		"1e9": maxHint,
		"Inf": 0,
		"NaN": 0,
		now.Add(90 * time.Second).Format(http.TimeFormat):  90 * time.Second,
		now.Add(-90 * time.Second).Format(http.TimeFormat): 0,
		now.Add(90 * time.Second).Format(time.RFC850):      90 * time.Second,
	} {
		if got := parseRetryAfter(v, now); got != want {
			t.Errorf("parseRetryAfter(%q) = %v, want %v", v, got, want)
		}
	}
}

func TestClassString(t *testing.T) {
	for c, want := range map[Class]string{Final: "final", InProgress: "in progress", Reused: "reused", 42: "Class(42)"} {
		if c.String() != want {
			t.Errorf("%d: %q", c, c.String())
		}
	}
}
