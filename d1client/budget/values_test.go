package budget

import (
	"math"
	"strings"
	"testing"
	"time"
)

// The zero Budget is Cloudflare's limit; Unlimited() has none; a Budget
// is a value, so changing one changes no other's.
func TestBudgetValues(t *testing.T) {
	var zero Budget
	if zero.Calls() != 1200 || zero.Per() != 300*time.Second || zero.IsUnlimited() || zero.String() != "1200 calls per 5m0s" {
		t.Errorf("zero Budget = %v (%d, %v)", zero, zero.Calls(), zero.Per())
	}
	if u := Unlimited(); !u.IsUnlimited() || u.Calls() != 0 || u.String() != "unlimited" {
		t.Errorf("Unlimited() = %v", u)
	}
	if b := New(7, time.Minute); b.Calls() != 7 || b.Per() != time.Minute || b.IsUnlimited() {
		t.Errorf("New(7, 1m) = %v", b)
	}
	if b := (Budget{}); b.Burst() != DefaultBurst || b.Reserve() != DefaultReserve {
		t.Errorf("zero Budget: burst %d, reserve %v", b.Burst(), b.Reserve())
	}
	b := New(30, time.Minute)
	if w := b.WithBurst(5).WithReserve(0.5); w.Burst() != 5 || w.Reserve() != 0.5 || b.Burst() != DefaultBurst || w.Calls() != 30 {
		t.Errorf("WithBurst/WithReserve: %d %v, the original %d", w.Burst(), w.Reserve(), b.Burst())
	}
	if _, err := NewAccount(New(0, time.Second)); err == nil || !strings.HasPrefix(err.Error(), "budget: 0 calls per 1s; accepted:") {
		t.Errorf("NewAccount of an invalid budget: %v", err)
	}
	if _, err := NewAccount(Budget{}.WithReserve(0)); err == nil || !strings.Contains(err.Error(), "accepted: 0.01 to 0.9") {
		t.Errorf("NewAccount without a reserve: %v", err)
	}
	if a, _ := NewAccount(Budget{}); a.String() != "budget.Account{1200 calls per 5m0s}" || a.Budget() != (Budget{}) {
		t.Errorf("Account = %v", a)
	}
}

// Validate refuses each bound's outside, saying what it got and what it
// accepts, and accepts the bounds themselves.
func TestBudgetValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		b    Budget
		want string
	}{
		{"no calls", New(0, time.Second), "0 calls per 1s; accepted: the zero Budget (1200 calls per 300 s), Unlimited(), or New with 2 to 1000000 calls per 1ms to 24h"},
		{"negative calls", New(-1, time.Second), "-1 calls per 1s; accepted:"},
		{"no window", New(5, 0), "5 calls per 0s; accepted:"},
		{"a week", New(5, 7*24*time.Hour), "5 calls per 168h0m0s; accepted:"},
		{"one call", New(1, time.Hour), "1 calls per 1h0m0s; accepted:"},
		{"too many calls", New(1_000_001, time.Hour), "1000001 calls per 1h0m0s; accepted:"},
		{"burst of none", New(10, time.Second).WithBurst(0), "burst is 0; accepted: 1 to 1000 (the default is 10)"},
		{"negative burst", Unlimited().WithBurst(-3), "burst is -3; accepted: 1 to 1000"},
		{"burst too large", Budget{}.WithBurst(1001), "burst is 1001; accepted: 1 to 1000"},
		{"reserve of all", Budget{}.WithReserve(1), "reserve is 1; accepted: 0.01 to 0.9 (the default is 0.2)"},
		{"reserve too small", Budget{}.WithReserve(0.001), "reserve is 0.001; accepted: 0.01 to 0.9"},
		{"NaN reserve", Budget{}.WithReserve(math.NaN()), "reserve is NaN; accepted: 0.01 to 0.9"},
	} {
		if err := tc.b.Validate(); err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%s: Validate() = %v, want %q", tc.name, err, tc.want)
		}
	}
	for _, b := range []Budget{
		{}, Unlimited(), New(2, time.Millisecond), New(1_000_000, 24*time.Hour),
		New(5, time.Second).WithBurst(1).WithReserve(MaxReserve), Unlimited().WithBurst(1000).WithReserve(MinReserve),
	} {
		if err := b.Validate(); err != nil {
			t.Errorf("Validate of %v (burst %d, reserve %v): %v", b, b.Burst(), b.Reserve(), err)
		}
	}
}
