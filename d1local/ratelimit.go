package d1local

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// RateLimit is an account-wide API rate limit, the one Cloudflare applies to
// every account: at most Limit calls per Window, counted across every
// database, endpoint and client; the call that finds the window spent, and
// every call after it for Block, is refused with HTTP 429, code 971 and a
// Retry-After header. A window starts with the first call after the
// previous one ended (or after a block). Window is at most 24 hours. The
// zero RateLimit is no limit.
type RateLimit struct {
	Limit  int
	Window time.Duration
	// Block is how long an exceeded budget refuses every call; 0 means 300
	// s, as on Cloudflare.
	Block time.Duration
}

// CloudflareRateLimit returns Cloudflare's API limit: 1200 calls per 300 s,
// and a 300 s block once exceeded.
func CloudflareRateLimit() RateLimit {
	return RateLimit{Limit: 1200, Window: 300 * time.Second, Block: defaultBlock}
}

// maxRateLimitWindow is the longest Window a RateLimit may have.
const maxRateLimitWindow = 24 * time.Hour

// defaultBlock is Cloudflare's block after the limit is exceeded.
const defaultBlock = 300 * time.Second

// ParseRateLimit parses a rate limit written as CALLS/WINDOW, such as "1200/300s"
// or "600/5m" (the block is 300 s). "off" and "" are the zero RateLimit.
func ParseRateLimit(s string) (RateLimit, error) {
	if s == "" || s == "off" {
		return RateLimit{}, nil
	}
	calls, window, ok := strings.Cut(s, "/")
	n, err := strconv.Atoi(calls)
	if !ok || err != nil || n <= 0 {
		return RateLimit{}, fmt.Errorf("rate limit %q: want CALLS/WINDOW with CALLS a positive integer, such as 1200/300s", s)
	}
	d, err := time.ParseDuration(window)
	switch {
	case err != nil:
		return RateLimit{}, fmt.Errorf("rate limit %q: want CALLS/WINDOW with WINDOW a duration (1s to 24h), such as 1200/300s", s)
	case d < time.Second:
		return RateLimit{}, fmt.Errorf("rate limit %q: want CALLS/WINDOW with WINDOW a duration of at least 1s, such as 1200/300s", s)
	}
	b := RateLimit{Limit: n, Window: d, Block: defaultBlock}
	if err := b.validate(); err != nil {
		// What is left to fail is the window's upper bound.
		return RateLimit{}, fmt.Errorf("rate limit %q: want CALLS/WINDOW with WINDOW a duration of at most 24h, such as 1200/300s", s)
	}
	return b, nil
}

// String formats b as ParseRateLimit reads it.
func (b RateLimit) String() string {
	if b.IsZero() {
		return "off"
	}
	return fmt.Sprintf("%d/%s", b.Limit, b.Window)
}

// IsZero reports whether b is the zero RateLimit, no limit.
func (b RateLimit) IsZero() bool { return b == RateLimit{} }

func (b RateLimit) validate() error {
	if b.IsZero() {
		return nil
	}
	if b.Limit <= 0 || b.Window <= 0 || b.Block < 0 {
		return errors.New("d1local: RateLimit needs a positive Limit and Window, and a Block of 0 (300 s) or more")
	}
	if b.Window > maxRateLimitWindow {
		return fmt.Errorf("d1local: RateLimit's Window is %v, over the longest allowed, %v", b.Window, maxRateLimitWindow)
	}
	return nil
}

// limiter keeps the account's budget.
type limiter struct {
	b     RateLimit
	now   func() time.Time
	mu    sync.Mutex
	start time.Time // the current window's start; zero when none is open
	count int       // calls in the current window
	until time.Time // the end of the current block, if any
}

func newLimiter(b RateLimit, now func() time.Time) *limiter {
	if b.IsZero() {
		return nil
	}
	if b.Block == 0 {
		b.Block = defaultBlock
	}
	return &limiter{b: b, now: now}
}

// budgetState is what the Ratelimit headers report.
type budgetState struct {
	remaining int
	reset     time.Duration // until the window ends, or the block does
	blocked   bool
}

// take counts one call, unless the budget is blocked or spent (which
// starts a block); blocked in the answer means the call is refused.
func (l *limiter) take() budgetState {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	if now.Before(l.until) {
		return budgetState{reset: l.until.Sub(now), blocked: true}
	}
	if l.start.IsZero() || !now.Before(l.start.Add(l.b.Window)) {
		l.start, l.count = now, 0
	}
	if l.count >= l.b.Limit {
		l.until = now.Add(l.b.Block)
		l.start = time.Time{}
		return budgetState{reset: l.b.Block, blocked: true}
	}
	l.count++
	return budgetState{remaining: l.b.Limit - l.count, reset: l.start.Add(l.b.Window).Sub(now)}
}

// peek reports the state without counting a call.
func (l *limiter) peek() budgetState {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	switch {
	case now.Before(l.until):
		return budgetState{reset: l.until.Sub(now), blocked: true}
	case l.start.IsZero() || !now.Before(l.start.Add(l.b.Window)):
		return budgetState{remaining: l.b.Limit, reset: l.b.Window}
	}
	return budgetState{remaining: l.b.Limit - l.count, reset: l.start.Add(l.b.Window).Sub(now)}
}

// setHeaders sets Cloudflare's rate-limit headers (IETF ratelimit-headers
// draft) for st, and Retry-After when the call is refused.
func (l *limiter) setHeaders(h http.Header, st budgetState) {
	reset := ceilSeconds(st.reset)
	h.Set("Ratelimit", fmt.Sprintf(`"default";r=%d;t=%d`, st.remaining, reset))
	h.Set("Ratelimit-Policy", fmt.Sprintf(`"burst";q=%d;w=%d`, l.b.Limit, ceilSeconds(l.b.Window)))
	if st.blocked {
		h.Set("Retry-After", strconv.FormatInt(reset, 10))
	}
}

// ceilSeconds rounds d up to whole seconds, as Retry-After is given.
func ceilSeconds(d time.Duration) int64 {
	return int64(math.Ceil(d.Seconds()))
}

// rateLimited is Cloudflare's answer to a call over the account's limit.
func rateLimited() *apiError {
	return &apiError{status: http.StatusTooManyRequests, code: 971,
		message: "Please wait and consider throttling your request speed"}
}
