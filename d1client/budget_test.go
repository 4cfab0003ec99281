package d1client

import (
	"context"
	"errors"
	"sort"
	"sync"
	"testing"
	"time"
)

// fakeClock is a clock that only moves when a sleeper sleeps.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (f *fakeClock) now() time.Time { f.mu.Lock(); defer f.mu.Unlock(); return f.t }

func (f *fakeClock) sleep(ctx context.Context, d time.Duration) error {
	f.mu.Lock()
	f.t = f.t.Add(d)
	f.mu.Unlock()
	return ctx.Err()
}

func fakeLimiter(b Budget) (*budgetLimiter, *fakeClock) {
	clk := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	l := newBudgetLimiter(b)
	l.now, l.sleep = clk.now, clk.sleep
	return l, clk
}

func TestBudgetWaitsOrFailsByDeadline(t *testing.T) {
	l, clk := fakeLimiter(NewBudget(3, time.Second))
	ctx := context.Background()
	for i := 0; i < 3; i++ {
		if e := l.wait(ctx); e != nil {
			t.Fatalf("call %d: %v", i, e)
		}
	}
	// A caller whose deadline comes before a call frees gets ErrBudget at
	// once, with the wait it would need.
	dctx, cancel := context.WithDeadline(ctx, clk.now().Add(500*time.Millisecond))
	defer cancel()
	e := l.wait(dctx)
	if e == nil || !errors.Is(e, ErrBudget) || e.RetryAfter != time.Second {
		t.Fatalf("err = %v", e)
	}
	if !clk.now().Equal(time.Unix(1_700_000_000, 0)) {
		t.Fatal("the failing caller waited")
	}
	// A caller without a deadline waits for the window to free a call.
	start := clk.now()
	if e := l.wait(ctx); e != nil {
		t.Fatal(e)
	}
	if waited := clk.now().Sub(start); waited != time.Second {
		t.Fatalf("waited %v, want 1s", waited)
	}
	if got := UnlimitedBudget().String(); got != "unlimited" {
		t.Errorf("UnlimitedBudget() = %q", got)
	}
}

// Whatever the concurrency, no window of length Per ever holds more than
// Calls calls.
func TestBudgetIsNeverExceeded(t *testing.T) {
	b := NewBudget(7, 300*time.Millisecond)
	l, _ := fakeLimiter(b)
	var mu sync.Mutex
	var stamps []time.Time
	l.onReserve = func(t time.Time) { mu.Lock(); stamps = append(stamps, t); mu.Unlock() }
	var wg sync.WaitGroup
	for g := 0; g < 32; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 20; i++ {
				if e := l.wait(context.Background()); e != nil {
					t.Error(e)
					return
				}
			}
		}()
	}
	wg.Wait()
	if len(stamps) != 640 {
		t.Fatalf("%d reservations", len(stamps))
	}
	sort.Slice(stamps, func(i, j int) bool { return stamps[i].Before(stamps[j]) })
	for i := b.Calls(); i < len(stamps); i++ {
		if d := stamps[i].Sub(stamps[i-b.Calls()]); d < b.Per() {
			t.Fatalf("calls %d and %d are %v apart: %d calls within %v", i-b.Calls(), i, d, b.Calls()+1, b.Per())
		}
	}
}
