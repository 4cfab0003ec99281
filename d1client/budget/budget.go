package budget

import (
	"fmt"
	"time"
)

// Budget is how a process spends Cloudflare's API budget: a local limit of
// Calls calls in any window of length Per (an upper bound, and the pace
// without rate-limit headers), the Burst of calls that may go at once ahead
// of the even pace, and the Reserve kept for Priority work. The zero Budget
// is Cloudflare's limit, 1200 calls per 300 s; make others with New and
// Unlimited, and adjust them with WithBurst and WithReserve.
type Budget struct {
	calls      int
	per        time.Duration
	unlimited  bool
	burst      int // valid when burstSet
	burstSet   bool
	reserve    float64 // valid when reserveSet
	reserveSet bool
}

const (
	// DefaultBurst is the calls a Budget lets go at once, ahead of the even
	// pace, unless WithBurst says otherwise.
	DefaultBurst = 10
	// DefaultReserve is the share of the pace a Budget keeps for Priority
	// work unless WithReserve says otherwise.
	DefaultReserve = 0.2
	// MinReserve and MaxReserve bound the share WithReserve accepts. There
	// is always a reserve, so that a completion always finds a call.
	MinReserve = 0.01
	MaxReserve = 0.9

	defaultCalls = 1200 // Cloudflare's global API limit, the zero Budget's
	defaultPer   = 300 * time.Second
)

// New returns a Budget of calls calls in any window of length per.
// Validate refuses it unless calls is from 2 to 1,000,000 (one call of each
// window is kept for Priority work) and per from 1 ms to 24 h.
func New(calls int, per time.Duration) Budget {
	return Budget{calls: calls, per: per}
}

// Unlimited returns a Budget with no local limit, for d1local and tests;
// rate-limit headers, where a server sends them, still set the pace.
func Unlimited() Budget { return Budget{unlimited: true} }

// WithBurst returns b with a burst of calls calls (at most Calls) that may
// go at once after a quiet spell. Validate refuses one outside 1 to 1000.
func (b Budget) WithBurst(calls int) Budget {
	b.burst, b.burstSet = calls, true
	return b
}

// WithReserve returns b with share (MinReserve to MaxReserve) of the pace,
// of its burst and of each window (Kept) kept for Priority work. Validate
// refuses any other share, 0 included.
func (b Budget) WithReserve(share float64) Budget {
	b.reserve, b.reserveSet = share, true
	return b
}

// isDefaultLimit reports whether b's local limit is the zero Budget's.
func (b Budget) isDefaultLimit() bool { return !b.unlimited && b.calls == 0 && b.per == 0 }

// Calls returns the calls allowed per window; 0 for an unlimited budget.
func (b Budget) Calls() int {
	if b.isDefaultLimit() {
		return defaultCalls
	}
	return b.calls // 0 when unlimited
}

// Per returns the window; 0 for an unlimited budget.
func (b Budget) Per() time.Duration {
	if b.isDefaultLimit() {
		return defaultPer
	}
	return b.per
}

// Burst returns the calls that may go at once ahead of the even pace.
func (b Budget) Burst() int {
	n := b.burst
	if !b.burstSet {
		n = DefaultBurst
	}
	if c := b.Calls(); c > 0 && n > c {
		n = c
	}
	return n
}

// Reserve returns the share of the pace kept for Priority work.
func (b Budget) Reserve() float64 {
	if !b.reserveSet {
		return DefaultReserve
	}
	return b.reserve
}

// Kept returns the calls of each window (the local Budget's and the
// account's) that Normal work never takes: the burst it does not get, at
// least one.
func (b Budget) Kept() int {
	burst := b.Burst()
	return max(1, burst-normalBurst(burst, b.Reserve()))
}

// normalBurst is the burst of Normal work: burst after the reserve's share, at least 1.
func normalBurst(burst int, reserve float64) int {
	return max(1, int(float64(burst-1)*(1-reserve)))
}

// IsUnlimited reports whether the budget has no local limit.
func (b Budget) IsUnlimited() bool { return b.unlimited }

// String describes the budget, such as "1200 calls per 5m0s".
func (b Budget) String() string {
	if b.unlimited {
		return "unlimited"
	}
	return fmt.Sprintf("%d calls per %s", b.Calls(), b.Per())
}

// Validate reports whether b is a Budget an Account accepts; its error says
// what is wrong and the accepted range.
func (b Budget) Validate() error {
	if !b.unlimited && !b.isDefaultLimit() &&
		(b.calls < 2 || b.calls > 1_000_000 || b.per < time.Millisecond || b.per > 24*time.Hour) {
		return fmt.Errorf("%d calls per %s; accepted: the zero Budget (1200 calls per 300 s), Unlimited(), or New with 2 to 1000000 calls per 1ms to 24h (one call of each window is kept for Priority work)", b.calls, b.per)
	}
	if b.burstSet && (b.burst < 1 || b.burst > 1000) {
		return fmt.Errorf("burst is %d; accepted: 1 to 1000 (the default is %d)", b.burst, DefaultBurst)
	}
	if b.reserveSet && !(b.reserve >= MinReserve && b.reserve <= MaxReserve) {
		return fmt.Errorf("reserve is %v; accepted: %v to %v (the default is %v): Priority work (completions) always keeps a share", b.reserve, MinReserve, MaxReserve, DefaultReserve)
	}
	return nil
}

// Background returns the Budget in which work without Priority (a sweep, a
// backfill) gets calls calls per window per: the calls every window keeps
// for Priority work (Kept) come on top, at the least reserve, so that the
// work's pace is that of the whole Budget within 1 %.
func Background(calls int, per time.Duration) Budget {
	for n := calls + 1; ; n++ {
		if b := New(n, per).WithReserve(MinReserve); n-b.Kept() >= calls {
			return b
		}
	}
}
