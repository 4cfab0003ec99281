package d1client

import (
	"runtime"
	"sync"
	"testing"
	"time"
)

// fakeClock is a clock that moves only when a test advances it. Its timers
// fire when the time passes theirs.
type fakeClock struct {
	mu     sync.Mutex
	t      time.Time
	timers map[*fakeTimer]bool
}

type fakeTimer struct {
	at time.Time
	ch chan time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{t: time.Unix(1_700_000_000, 0), timers: map[*fakeTimer]bool{}}
}

func (f *fakeClock) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.t
}

func (f *fakeClock) After(d time.Duration) (<-chan time.Time, func() bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	tm := &fakeTimer{at: f.t.Add(d), ch: make(chan time.Time, 1)}
	if d <= 0 {
		tm.ch <- f.t
		return tm.ch, func() bool { return false }
	}
	f.timers[tm] = true
	return tm.ch, func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		active := f.timers[tm]
		delete(f.timers, tm)
		return active
	}
}

// Set moves the clock to t (never back) and fires the timers due.
func (f *fakeClock) Set(t time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if t.After(f.t) {
		f.t = t
	}
	for tm := range f.timers {
		if !tm.at.After(f.t) {
			tm.ch <- f.t
			delete(f.timers, tm)
		}
	}
}

// Advance moves the clock on by d.
func (f *fakeClock) Advance(d time.Duration) { f.Set(f.Now().Add(d)) }

// Timers returns the number of timers waiting to fire.
func (f *fakeClock) Timers() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.timers)
}

// Next returns when the earliest timer fires, and whether there is one.
func (f *fakeClock) Next() (time.Time, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var next time.Time
	for tm := range f.timers {
		if next.IsZero() || tm.at.Before(next) {
			next = tm.at
		}
	}
	return next, !next.IsZero()
}

// eventually waits, in real time, for cond to hold: for goroutines to
// reach a state, never for a duration to pass. It fails the test after 10 s.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		runtime.Gosched()
		time.Sleep(100 * time.Microsecond)
	}
}
