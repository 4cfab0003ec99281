package d1client

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"sync"
	"time"
)

// Budget is how a client spends Cloudflare's API budget: a local limit of
// Calls calls in any window of length Per (kept with a margin of Per/300,
// since Cloudflare counts calls as they arrive), the Burst of calls that may go
// at once ahead of the even pace, and the Reserve kept for Priority work.
// Cloudflare allows 1200 API calls per 5 minutes per user, counted across
// every token, tool and the dashboard, and going over blocks every API call
// of the account for 5 minutes.
//
// The local limit is an upper bound, and the account's pace when
// Cloudflare's rate-limit headers are absent; when they are present, the
// account's own remaining calls and reset time set the pace (see Account).
// The zero Budget is Cloudflare's limit, 1200 calls per 300 s, with the
// default burst and reserve. Make others with NewBudget and UnlimitedBudget,
// and adjust them with WithBurst and WithReserve.
type Budget struct {
	calls      int
	per        time.Duration
	unlimited  bool
	burst      int // valid when burstSet
	burstSet   bool
	reserve    float64 // valid when reserveSet
	reserveSet bool
}

// Cloudflare's global API limit, the zero Budget's.
const (
	defaultBudgetCalls = 1200
	defaultBudgetPer   = 300 * time.Second
)

// DefaultBurst is the calls a Budget lets go at once, ahead of the even
// pace, unless WithBurst says otherwise.
const DefaultBurst = 10

// DefaultReserve is the share of the pace a Budget keeps for Priority work
// unless WithReserve says otherwise.
const DefaultReserve = 0.2

// MinReserve and MaxReserve bound the share WithReserve accepts. There is
// always a reserve: without one, work without Priority could take every
// call, and a completion meeting an empty budget would fail, leaving its
// request to run a second time once its reservation expired.
const (
	MinReserve = 0.01
	MaxReserve = 0.9
)

// NewBudget returns a Budget of calls calls in any window of length per.
// New refuses it unless calls is from 2 to 1,000,000 (at least one call of
// every window is kept for Priority work) and per from 1 ms to 24 h.
func NewBudget(calls int, per time.Duration) Budget {
	return Budget{calls: calls, per: per}
}

// UnlimitedBudget returns a Budget with no local limit, for d1local and
// tests. Cloudflare's rate-limit headers, where a server sends them, still
// set the pace.
func UnlimitedBudget() Budget { return Budget{unlimited: true} }

// WithBurst returns b with a burst of calls calls: how many may go at once,
// ahead of the even pace, after a quiet spell. New refuses a burst outside
// 1 to 1000. It is never more than the local limit's Calls.
func (b Budget) WithBurst(calls int) Budget {
	b.burst, b.burstSet = calls, true
	return b
}

// WithReserve returns b with share (MinReserve to MaxReserve, 0.01 to 0.9)
// of the pace kept for Priority work: calls without Priority go at most at
// (1 - share) of the pace, with a burst that much smaller, and never take
// the last calls of a window that their smaller burst leaves, and never the
// last one. New and NewAccount refuse any other share, 0 included.
func (b Budget) WithReserve(share float64) Budget {
	b.reserve, b.reserveSet = share, true
	return b
}

// isDefaultLimit reports whether b's local limit is the zero Budget's.
func (b Budget) isDefaultLimit() bool { return !b.unlimited && b.calls == 0 && b.per == 0 }

// Calls returns the calls allowed per window; 0 for an unlimited budget.
func (b Budget) Calls() int {
	switch {
	case b.unlimited:
		return 0
	case b.isDefaultLimit():
		return defaultBudgetCalls
	}
	return b.calls
}

// Per returns the window; 0 for an unlimited budget.
func (b Budget) Per() time.Duration {
	switch {
	case b.unlimited:
		return 0
	case b.isDefaultLimit():
		return defaultBudgetPer
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

// Kept returns the calls of each window, the local Budget's and the
// account's (see Account), that work without Priority never takes: the
// burst it does not get, and at least one. A completion meeting a budget
// that new work has spent still finds them.
func (b Budget) Kept() int {
	burst := b.Burst()
	return max(1, burst-normalBurst(burst, b.Reserve()))
}

// normalBurst is the burst of work without Priority: the rest of a burst
// of burst calls after the reserve's share, at least one call.
func normalBurst(burst int, reserve float64) int {
	return max(1, int(float64(burst-1)*(1-reserve)))
}

// Unlimited reports whether the budget has no local limit.
func (b Budget) Unlimited() bool { return b.unlimited }

// String describes the budget, such as "1200 calls per 5m0s".
func (b Budget) String() string {
	if b.unlimited {
		return "unlimited"
	}
	return fmt.Sprintf("%d calls per %s", b.Calls(), b.Per())
}

func (b Budget) validate() error {
	if !b.unlimited && !b.isDefaultLimit() &&
		(b.calls < 2 || b.calls > 1_000_000 || b.per < time.Millisecond || b.per > 24*time.Hour) {
		return invalidf("Config.Budget is %d calls per %s; accepted: the zero Budget (1200 calls per 300 s), UnlimitedBudget(), or NewBudget with 2 to 1000000 calls per 1ms to 24h (one call of each window is kept for Priority work)", b.calls, b.per)
	}
	if b.burstSet && (b.burst < 1 || b.burst > 1000) {
		return invalidf("Config.Budget's burst is %d; accepted: 1 to 1000 (the default is %d)", b.burst, DefaultBurst)
	}
	if b.reserveSet && !(b.reserve >= MinReserve && b.reserve <= MaxReserve) {
		return invalidf("Config.Budget's reserve is %v; accepted: %v to %v (the default is %v): Priority work (completions) always keeps a share", b.reserve, MinReserve, MaxReserve, DefaultReserve)
	}
	return nil
}

// class is how a call draws on the budget.
type class uint8

const (
	normal   class = iota // new work: claims, lookups, reads
	priority              // round-trip-2 work: see Priority
)

// Constants of the account's pacing.
const (
	// resetMargin is added to a reset time before calls resume after a
	// window ran out: Ratelimit's t is whole seconds.
	resetMargin = time.Second
	// windowSlack is how far two reset times may differ and still name the
	// same window.
	windowSlack = 1500 * time.Millisecond
	// ringMargin widens the local ring's window by this share of Per (a
	// second of Cloudflare's 300 s): the account's budget is judged by
	// when calls arrive, and calls sent exactly Per apart can arrive
	// closer than that when the earlier one took longer to get there (a
	// benchmark at 20 requests/s saw 1201 arrivals within 300 s without
	// it).
	ringMargin = 300
	// othersHalfLife smooths the estimate of the calls others spend.
	othersHalfLife = 15 * time.Second
	// minShare is the least share of the account's even pace a client
	// takes.
	minShare = 1.0 / 64
)

// Account is the API budget of one Cloudflare account as this process sees
// it. Cloudflare counts calls per user, across every token, tool and the
// dashboard, and reports the remaining calls and the time to reset on every
// response (the Ratelimit and Ratelimit-Policy headers); the Account reads
// them, so that replicas of a service, wrangler and the dashboard share one
// budget with no coordination of their own, and it paces this process's
// calls:
//
//   - The remaining calls are spent evenly over the time to the reset, less
//     what others are seen to spend, with Budget.Burst calls allowed at once
//     after a quiet spell. Without the headers, the local Budget's own even
//     pace applies; it is always an upper bound.
//   - Calls with Priority are not held to the even pace: they go as soon
//     as the account has a call left, by the headers' view (this process's
//     share of it, while others spend), the local Budget's hard window
//     (Calls per Per) and a 971 block. Others go at most at
//     (1 - Budget.Reserve) of the pace, and never take the window's last
//     calls (Budget.Kept, and as many for each other process while others
//     spend), so completions find a call when new work is being turned
//     away.
//   - After an HTTP 429 with code 971, nothing is sent until the block ends.
//
// Clients given the same Account (Config.Account) share all of this, as
// clients of several databases on one account should. An Account is safe
// for concurrent use.
type Account struct {
	budget  Budget // validated
	burst   int
	reserve float64

	mu        sync.Mutex
	ring      []time.Time // send times of the last Calls calls, oldest at head once full
	head      int
	localPace pace      // the local Budget's even pace
	acctPace  pace      // the account's, from the headers
	paceEnd   time.Time // the end of the window acctPace was kept in; zero: none
	inflight  int       // calls taken and not yet answered

	view    accountView
	sample  headerSample  // the last header, for the estimate of others' spending
	others  float64       // calls per second others spend, smoothed
	ours    float64       // and this process
	replies int64         // answers received
	sentAt  []time.Time   // send times of the calls in flight, oldest first
	rtt     time.Duration // smoothed time from a call's send to its answer; see roundTrip

	blockedUntil time.Time
	changed      chan struct{} // closed, and replaced, when the view changes
}

// accountView is the account's budget as the last Ratelimit headers gave it.
type accountView struct {
	seen      time.Time // when the headers arrived; zero when never
	remaining int       // the headers' r, less this process's calls since
	header    int       // the headers' own r
	reset     time.Time
	quota     int           // Ratelimit-Policy's q; 0 when unknown
	window    time.Duration // and w
}

type headerSample struct {
	at      time.Time
	r       int
	reset   time.Time
	replies int64
}

// NewAccount returns an Account that paces calls within b. Pass it to the
// Config of every Client that uses the same Cloudflare account (user).
func NewAccount(b Budget) (*Account, error) {
	if err := b.validate(); err != nil {
		return nil, err
	}
	return newAccount(b), nil
}

func newAccount(b Budget) *Account {
	a := &Account{budget: b, burst: b.Burst(), reserve: b.Reserve(), changed: make(chan struct{})}
	if !b.unlimited {
		a.ring = make([]time.Time, 0, b.Calls())
	}
	return a
}

// Budget returns the Budget the Account was made with.
func (a *Account) Budget() Budget { return a.budget }

// String describes the Account by its Budget.
func (a *Account) String() string { return "d1client.Account{" + a.budget.String() + "}" }

// BudgetState is what an Account knows of its budget at one moment.
type BudgetState struct {
	// Seen is when the last Ratelimit headers arrived; zero when none have.
	// Remaining and Reset are what they said: the calls left to the whole
	// account, and when its window resets. Quota and Window are the
	// Ratelimit-Policy's, zero when it was absent.
	Seen      time.Time
	Remaining int
	Reset     time.Time
	Quota     int
	Window    time.Duration
	// Estimate is the calls this process believes the account has left
	// now: Remaining, less its own calls since and what others are expected
	// to have spent; -1 without headers, or once their window has ended.
	Estimate int
	// OthersRate is the calls per second other clients of the account are
	// seen to spend.
	OthersRate float64
	// Pace is the time between calls at the current even pace. Work
	// without Priority goes at most at (1 - Reserve) of it; Priority work
	// is not held to it. Zero when nothing limits the pace.
	Pace time.Duration
	// InFlight is the calls sent and not yet answered.
	InFlight int
	// BlockedUntil is the end of a 971 block, if one is on.
	BlockedUntil time.Time
}

// State returns the Account's view of the budget.
func (a *Account) State() BudgetState {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := time.Now()
	st := BudgetState{
		Seen: a.view.seen, Remaining: a.view.header, Reset: a.view.reset,
		Quota: a.view.quota, Window: a.view.window, Estimate: -1, OthersRate: a.others,
		InFlight: a.inflight,
	}
	if a.fresh(now) {
		st.Estimate = a.estimate(now)
	}
	if now.Before(a.blockedUntil) {
		st.BlockedUntil = a.blockedUntil
	}
	st.Pace = max(a.localInterval(), a.accountInterval(now))
	return st
}

// waitReason says what a call waits for.
type waitReason uint8

const (
	notWaiting waitReason = iota
	waitBudget
	waitBlock
)

// slot returns the earliest time a call of class c may be sent, and what it
// waits for until then.
func (a *Account) slot(now time.Time, c class) (time.Time, waitReason) {
	if now.Before(a.blockedUntil) {
		return a.blockedUntil, waitBlock
	}
	at := now
	if t := a.localSlot(now, c); t.After(at) {
		at = t
	}
	if t := a.accountSlot(now, c); t.After(at) {
		at = t
	}
	if at.After(now) {
		return at, waitBudget
	}
	return now, notWaiting
}

// classBurst is the burst of class c. Work without Priority bursts less,
// so that Priority work finds a call at once even when the rest of the
// pace is spent.
func (a *Account) classBurst(c class) int {
	if c == priority {
		return a.burst
	}
	return normalBurst(a.burst, a.reserve)
}

// cost is what a call of class c adds to a pace's debt: work without
// Priority counts for 1/(1 - Reserve) calls, so it gets at most
// (1 - Reserve) of the pace.
func (a *Account) cost(c class) float64 {
	if c == normal {
		return 1 / (1 - a.reserve)
	}
	return 1
}

// tolerance is the debt at which a call of class c with a burst of burst
// calls may still go.
func (a *Account) tolerance(c class, burst int) float64 {
	return float64(burst-1) * a.cost(c)
}

// reserveFloor is the calls at the end of a window that work without
// Priority never takes (Budget.Kept), so that a completion always finds a
// call of the window, whatever the Budget.
func (a *Account) reserveFloor() int { return a.budget.Kept() }

// pace is an even pace with a burst, kept as a debt in calls that drains
// at one call per interval: a call may go while the debt is at most its
// tolerance, and adds its cost. Kept in calls rather than as a time, a
// burst stays a number of calls when the interval changes.
type pace struct {
	debt float64
	at   time.Time
}

func (p *pace) level(now time.Time, interval time.Duration) float64 {
	if interval <= 0 {
		return 0
	}
	return max(0, p.debt-float64(now.Sub(p.at))/float64(interval))
}

// slot returns when the debt drains to tolerance.
func (p *pace) slot(now time.Time, interval time.Duration, tolerance float64) time.Time {
	over := p.level(now, interval) - tolerance
	if interval <= 0 || over <= 0 {
		return now
	}
	return now.Add(time.Duration(math.Ceil(over * float64(interval))))
}

func (p *pace) take(now time.Time, interval time.Duration, cost float64) {
	if interval <= 0 {
		return
	}
	p.debt, p.at = p.level(now, interval)+cost, now
}

// localInterval is the time between calls at the local Budget's even
// pace; 0 when unlimited.
func (a *Account) localInterval() time.Duration {
	if a.budget.unlimited {
		return 0
	}
	return a.budget.Per() / time.Duration(a.budget.Calls())
}

// localSlot is when the local Budget lets a call of class c go: its ring
// (never more than Calls in any window of length Per) and, without
// Priority, its even pace.
func (a *Account) localSlot(now time.Time, c class) time.Time {
	if a.budget.unlimited {
		return now
	}
	calls, per := a.budget.Calls(), a.budget.Per()
	at := now
	// The ring: a call may go once the window holds fewer than Calls
	// calls, or, without Priority, fewer than Calls - floor.
	keep := 0
	if c == normal {
		keep = min(a.reserveFloor(), calls-1)
	}
	if n := len(a.ring); n >= calls-keep {
		// The call that must leave the window first is the (n-(calls-keep))th
		// oldest.
		if t := a.ringAt(n - (calls - keep)).Add(per + per/ringMargin); t.After(at) {
			at = t
		}
	}
	if c == priority {
		return at // not held to the even pace
	}
	if t := a.localPace.slot(now, a.localInterval(), a.tolerance(c, a.classBurst(c))); t.After(at) {
		at = t
	}
	return at
}

// ringAt returns the i-th oldest send time of the ring.
func (a *Account) ringAt(i int) time.Time {
	if len(a.ring) < cap(a.ring) {
		return a.ring[i]
	}
	return a.ring[(a.head+i)%len(a.ring)]
}

// fresh reports whether the headers' view still describes the current
// window: it ends at the reset, plus a margin for the rounding of t.
func (a *Account) fresh(now time.Time) bool {
	return !a.view.seen.IsZero() && now.Before(a.view.end())
}

func (v *accountView) end() time.Time { return v.reset.Add(resetMargin) }

// accountInterval is the time between calls at the account's even pace
// from the headers: the calls left to this process (the remaining calls,
// less what others are seen to spend, and at least this process's share of
// them) spread over the time to the reset; or, once the window has reset and until new
// headers come, the policy's even pace. It is 0 when the headers set no
// pace, or when no call is left before the reset.
func (a *Account) accountInterval(now time.Time) time.Duration {
	var rem int
	var span time.Duration
	switch {
	case a.fresh(now):
		rem, span = a.estimate(now), max(a.view.reset.Sub(now), resetMargin)
		if rem <= 0 {
			return 0
		}
	case a.view.quota > 0 && a.view.window > 0:
		rem, span = a.view.quota, a.view.window
	default:
		return 0
	}
	even := float64(rem) / span.Seconds() // calls per second for the account
	return time.Duration(float64(time.Second) / max(even-a.others, even*a.share()))
}

// share is this process's share of what the account spends, at least
// minShare: the least it takes of the account's even pace, so that an
// overestimate of what others spend never stops it.
func (a *Account) share() float64 {
	if a.ours+a.others <= 0 {
		return 1
	}
	return max(a.ours/(a.ours+a.others), minShare)
}

// ourShare is this process's share of n of the account's calls left: all
// of them while nobody else is seen to spend, else its share of what the
// account spends (see share), rounded down.
func (a *Account) ourShare(n int) int {
	if a.others <= 0 {
		return n
	}
	return int(float64(n) * a.share())
}

// accountFloor is the calls of the account's window that work without
// Priority leaves: the Budget.Kept calls of this process's Priority work,
// and while others spend, as many for each other process spending as much:
// Kept / share. This process's share of them is then Kept again (see
// ourShare).
func (a *Account) accountFloor() int {
	k := a.reserveFloor()
	if a.others <= 0 {
		return k
	}
	return int(math.Ceil(float64(k) / a.share()))
}

// estimate is the calls this process believes the account has left now:
// the headers' r, less this process's calls since, less what others are
// expected to have spent since and to spend while a call is in flight; and
// while others spend, one more is left alone, since they cannot know of
// this process's calls in flight.
func (a *Account) estimate(now time.Time) int {
	rem := a.view.remaining
	if a.others > 0 {
		ahead := now.Sub(a.view.seen) + a.rtt
		rem -= int(math.Ceil(a.others*ahead.Seconds())) + 1
	}
	return rem
}

// accountSlot is when the account's pace lets a call of class c go. The
// account's burst is shared like its pace: this process bursts its share
// of it. Priority work is not held to the pace: it goes while this
// process's share of the calls left before the reset holds one (see
// ourShare), so that the Priority work of several processes seeing the
// same headers does not overrun the account (a 971). Work without
// Priority leaves enough of them for it (see accountFloor).
func (a *Account) accountSlot(now time.Time, c class) time.Time {
	if c == priority {
		// Calls in flight are this process's own since the headers, which
		// other processes cannot know of yet: they count against its share.
		if a.fresh(now) && a.ourShare(a.estimate(now)+a.inflight) <= a.inflight {
			return a.view.end() // nothing left to this process before the reset
		}
		return now
	}
	burst := max(1, int(math.Round(float64(a.classBurst(c))*a.share())))
	if a.fresh(now) {
		left := a.estimate(now) - a.accountFloor()
		if left <= 0 {
			return a.view.end() // nothing left before the reset
		}
		burst = min(burst, left)
	}
	at := a.acctPace.slot(now, a.accountInterval(now), a.tolerance(c, burst))
	if a.fresh(now) && at.After(a.view.end()) {
		at = a.view.end() // a new window, and a new pace, begin sooner
	}
	return at
}

// take records a call of class c sent at now, which slot allowed.
func (a *Account) take(now time.Time, c class) {
	if !a.budget.unlimited {
		if len(a.ring) < cap(a.ring) {
			a.ring = append(a.ring, now)
		} else {
			a.ring[a.head] = now
			a.head = (a.head + 1) % len(a.ring)
		}
		a.localPace.take(now, a.localInterval(), a.cost(c))
	}
	if !a.fresh(now) && a.paceEnd.Before(now) && !a.paceEnd.IsZero() {
		a.acctPace = pace{} // the window has ended: so has its pace
	}
	a.acctPace.take(now, a.accountInterval(now), a.cost(c))
	a.paceEnd = time.Time{}
	if a.fresh(now) {
		a.view.remaining--
		a.paceEnd = a.view.end()
	}
	a.inflight++
	a.sentAt = append(a.sentAt, now)
}

// tryTake takes a call of class c if one may go now. Otherwise it returns
// when one may, what it waits for, and a channel closed when the view
// changes.
func (a *Account) tryTake(c class) (ok bool, at time.Time, why waitReason, changed <-chan struct{}) {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := time.Now()
	at, why = a.slot(now, c)
	if why == notWaiting {
		a.take(now, c)
		return true, now, notWaiting, nil
	}
	return false, at, why, a.changed
}

// acquire takes a call of class c, waiting for it as long as the context
// allows, and returns how long it waited (zero when it took one at once or
// took none). It gives up at once, with an ErrBudget error that says when a
// call may go, when it is clear the call could not go and come back (a
// round trip, see roundTrip) before the context's deadline; during a 971
// block it gives up at once with ErrRateLimited. It takes no call when less
// than a round trip is left before the deadline (tooLate).
func (a *Account) acquire(ctx context.Context, c class) (time.Duration, *Error) {
	var since time.Time // when it started waiting
	dl, hasDeadline := ctx.Deadline()
	for {
		rtt := a.roundTrip()
		if hasDeadline {
			if left := time.Until(dl); left < rtt {
				return 0, tooLate(left, rtt)
			}
		}
		ok, at, why, changed := a.tryTake(c)
		if ok {
			if since.IsZero() {
				return 0, nil
			}
			return time.Since(since), nil
		}
		now := time.Now()
		wait := at.Sub(now)
		if why == waitBlock {
			return 0, blockedError(at, wait)
		}
		if hasDeadline && time.Until(dl) < wait+rtt {
			// The call could not go, and finish, before the deadline.
			return 0, a.exhausted(wait)
		}
		if since.IsZero() {
			since = now
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			e := a.exhausted(max(time.Until(at), 0)) // what is left of the wait
			e.Err = ctx.Err()
			return 0, e
		case <-timer.C:
		case <-changed:
			timer.Stop()
		}
	}
}

// roundTrip is the expected time from a call's send to its answer: the
// smoothed round trip of the answers so far; zero before the first. A call
// is not sent with less than that left before its context's deadline: it
// would be cut off on its way back, its outcome unknown (see tooLate).
func (a *Account) roundTrip() time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.rtt
}

// tooLate is the error of a call not sent because only left, less than a
// round trip of rtt, remained before its context's deadline. Nothing was
// sent, so it is not ambiguous; it matches context.DeadlineExceeded.
func tooLate(left, rtt time.Duration) *Error {
	return &Error{kind: kindTransport, Err: context.DeadlineExceeded, notSent: true,
		Message: fmt.Sprintf("not sent: %s left before the context's deadline, less than a round trip (%s): the call could not finish in time",
			max(left, 0).Round(time.Millisecond), rtt.Round(time.Millisecond))}
}

// nextSlot returns when a call of class c could be sent, and what it
// would wait for.
func (a *Account) nextSlot(c class) (time.Time, waitReason) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.slot(time.Now(), c)
}

// spare reports whether a call of class c may go now.
func (a *Account) spare(c class) bool {
	at, why := a.nextSlot(c)
	return why == notWaiting || !at.After(time.Now())
}

// plentiful reports whether calls of class c are plentiful: one may go
// now, and the even pace allows at least n of them in a round trip of rtt.
func (a *Account) plentiful(c class, n int, rtt time.Duration) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := time.Now()
	if _, why := a.slot(now, c); why != notWaiting {
		return false
	}
	step := time.Duration(float64(max(a.localInterval(), a.accountInterval(now))) * a.cost(c))
	return step == 0 || step*time.Duration(n) <= rtt
}

func (a *Account) exhausted(wait time.Duration) *Error {
	return &Error{kind: kindBudget, RetryAfter: wait, notSent: true,
		Message: fmt.Sprintf("not sent: the request budget (%s) has no call for it; one may go in %s", a.budget, wait.Round(time.Millisecond))}
}

func blockedError(until time.Time, wait time.Duration) *Error {
	return &Error{kind: kindRateLimited, StatusCode: http.StatusTooManyRequests, Codes: []int{971},
		RetryAfter: wait, BlockedUntil: until, notSent: true,
		Message: "not sent: Cloudflare's global API rate limit blocks this account until " + until.UTC().Format(time.RFC3339)}
}

// block stops every call until until (a 971 answer).
func (a *Account) block(until time.Time) {
	a.mu.Lock()
	if until.After(a.blockedUntil) {
		a.blockedUntil = until
	}
	a.notify()
	a.mu.Unlock()
}

// blocked returns the 971 error while a block is on.
func (a *Account) blocked() *Error {
	a.mu.Lock()
	until := a.blockedUntil
	now := time.Now()
	a.mu.Unlock()
	if now.Before(until) {
		return blockedError(until, until.Sub(now))
	}
	return nil
}

func (a *Account) notify() {
	close(a.changed)
	a.changed = make(chan struct{})
}

// answered records the answer to a call taken earlier: its rate-limit
// headers, if it had any (h is nil when no response arrived).
func (a *Account) answered(h http.Header) {
	var lim rateLimit
	var pol ratePolicy
	var okLim, okPol bool
	if h != nil {
		lim, okLim = parseRateLimit(h.Values("Ratelimit"))
		pol, okPol = parseRatePolicy(h.Values("Ratelimit-Policy"), lim.name)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	now := time.Now()
	a.inflight = max(a.inflight-1, 0)
	a.replies++
	if len(a.sentAt) > 0 {
		// Answers mostly come in the order of the calls: close enough.
		d := now.Sub(a.sentAt[0])
		a.sentAt = a.sentAt[1:]
		// Only an answer measures a round trip: a call that got none (its
		// attempt timed out, its caller gave up) says nothing of it.
		switch {
		case h == nil:
		case a.rtt == 0:
			a.rtt = d
		default:
			a.rtt += (d - a.rtt) / 8
		}
	}
	if okPol {
		a.view.quota, a.view.window = pol.quota, pol.window
	}
	if !okLim {
		return
	}
	// A window resets within its length: a reset further off is bounded
	// by the policy's window.
	if w := a.view.window; w > 0 && lim.reset > w {
		lim.reset = w
	}
	reset := now.Add(lim.reset)
	// Calls still in flight may or may not be counted in r: count them as
	// spent.
	est := lim.remaining - a.inflight
	same := a.fresh(now) && reset.Sub(a.view.reset).Abs() <= windowSlack
	if same {
		a.view.remaining = min(a.view.remaining, est)
		a.view.reset = maxTime(a.view.reset, reset)
	} else {
		a.view.remaining, a.view.reset = est, reset
		a.acctPace, a.paceEnd = pace{}, time.Time{} // a new window: the old one's pace is over
	}
	a.view.seen, a.view.header = now, lim.remaining
	a.estimateOthers(now, lim.remaining, reset)
	a.notify()
}

// estimateOthers updates the smoothed rate at which others spend the
// account's calls: between two headers of one window, r fell by the calls
// of everyone, and this process answered replies of its own.
func (a *Account) estimateOthers(now time.Time, r int, reset time.Time) {
	prev := a.sample
	cur := headerSample{at: now, r: r, reset: reset, replies: a.replies}
	switch {
	case prev.at.IsZero() || reset.Sub(prev.reset).Abs() > windowSlack:
		a.sample = cur // a new window: no sample across it
		return
	case r > prev.r:
		return // an older answer arriving late
	}
	a.sample = cur
	dt := now.Sub(prev.at)
	if dt <= 0 {
		return
	}
	ours := float64(cur.replies - prev.replies)
	others := max(float64(prev.r-r)-ours, 0)
	alpha := 1 - math.Exp2(-dt.Seconds()/othersHalfLife.Seconds())
	a.others += alpha * (others/dt.Seconds() - a.others)
	a.ours += alpha * (ours/dt.Seconds() - a.ours)
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// BudgetWait returns how long the next call without Priority would wait for
// the budget; zero when one may be sent now.
func (c *Client) BudgetWait() time.Duration {
	at, _ := c.account.nextSlot(normal)
	return max(0, time.Until(at))
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
