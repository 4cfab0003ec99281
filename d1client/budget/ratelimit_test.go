package budget

import (
	"net/http"
	"testing"
	"testing/synctest"
	"time"
)

// Cloudflare's budget headers are read the way the IETF draft's
// structured fields are written, leniently about spacing and order, and
// anything unreadable is ignored rather than guessed at.
func TestParseRateLimitHeaders(t *testing.T) {
	tests := []struct {
		name  string
		lines []string
		want  rateLimit // zero: nothing readable
	}{
		{"Cloudflare's", []string{`"default";r=50;t=30`}, rateLimit{"default", 50, 30 * time.Second}},
		{"spaces", []string{` "default" ; r = 50 ;t=30 `}, rateLimit{"default", 50, 30 * time.Second}},
		{"order", []string{`"default";t=30;r=50`}, rateLimit{"default", 50, 30 * time.Second}},
		{"a token name", []string{`default;r=5;t=1`}, rateLimit{"default", 5, time.Second}},
		{"none left", []string{`"default";r=0;t=300`}, rateLimit{"default", 0, 300 * time.Second}},
		{"other parameters", []string{`"default";r=5;t=1;pk=:YWJj:;x`}, rateLimit{"default", 5, time.Second}},
		{"the last of a repeated key", []string{`"d";r=1;r=9;t=5`}, rateLimit{"d", 9, 5 * time.Second}},
		{"the tightest of several", []string{`"a";r=10;t=5, "b";r=3;t=60`}, rateLimit{"b", 3, time.Minute}},
		{"the tightest of several lines", []string{`"a";r=10;t=5`, `"b";r=3;t=60`}, rateLimit{"b", 3, time.Minute}},
		{"a comma in a name", []string{`"a,b";r=4;t=2`}, rateLimit{"a,b", 4, 2 * time.Second}},
		{"an escaped name", []string{`"a\"b";r=4;t=2`}, rateLimit{`a"b`, 4, 2 * time.Second}},
		{"garbage beside a good member", []string{`garbage!!, "default";r=7;t=9`}, rateLimit{"default", 7, 9 * time.Second}},
		{"no name", []string{`r=50;t=30`}, rateLimit{}},
		{"no t", []string{`"default";r=50`}, rateLimit{}},
		{"not a number", []string{`"default";r=abc;t=30`}, rateLimit{}},
		{"negative", []string{`"default";r=-5;t=30`}, rateLimit{}},
		{"a decimal", []string{`"default";r=5.5;t=30`}, rateLimit{}},
		{"a string value", []string{`"default";r="5";t=30`}, rateLimit{}},
		{"too many digits", []string{`"default";r=1234567890123456;t=30`}, rateLimit{}},
		{"an upper-case key", []string{`"default";R=5;t=30`}, rateLimit{}},
		{"an empty value", []string{`"default";r=;t=30`}, rateLimit{}},
		{"an unterminated name", []string{`"default;r=5;t=1`}, rateLimit{}},
		{"junk after the name", []string{`"default"x;r=5;t=1`}, rateLimit{}},
		{"an inner list", []string{`("a" "b");r=5;t=1`}, rateLimit{}},
		{"empty", []string{``}, rateLimit{}},
		{"absent", nil, rateLimit{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := parseRateLimit(tc.lines)
			if ok != (tc.want != rateLimit{}) || got != tc.want {
				t.Errorf("parseRateLimit(%q) = %+v, %v; want %+v", tc.lines, got, ok, tc.want)
			}
		})
	}
	for _, tc := range []struct {
		lines []string
		limit string
		want  ratePolicy
	}{
		{[]string{`"burst";q=1200;w=300`}, "default", ratePolicy{"burst", 1200, 300 * time.Second}},
		{[]string{`"burst";q=1200;w=300, "default";q=100;w=60`}, "default", ratePolicy{"default", 100, time.Minute}},
		{[]string{`"x";q=0;w=300, "burst";q=10;w=1`}, "default", ratePolicy{"burst", 10, time.Second}},
		{[]string{`"burst";q=1200`}, "default", ratePolicy{}},
		{[]string{`"burst";q=1200;w=5m`}, "default", ratePolicy{}},
	} {
		got, ok := parseRatePolicy(tc.lines, tc.limit)
		if ok != (tc.want != ratePolicy{}) || got != tc.want {
			t.Errorf("parseRatePolicy(%q) = %+v, %v; want %+v", tc.lines, got, ok, tc.want)
		}
	}
}

// The parsers never panic, whatever the header holds.
func FuzzParseRateLimitHeaders(f *testing.F) {
	for _, s := range []string{`"default";r=50;t=30`, `"burst";q=1200;w=300`, `"a\"b";r=1;t=2, x;r=3;t=4`, `"`, `;`, `"x";=`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if lim, ok := parseRateLimit([]string{s}); ok && (lim.remaining < 0 || lim.reset < 0 || lim.reset > maxRateWindow) {
			t.Fatalf("%q: %+v", s, lim)
		}
		if pol, ok := parseRatePolicy([]string{s}, "default"); ok && (pol.quota <= 0 || pol.window <= 0 || pol.window > maxRateWindow) {
			t.Fatalf("%q: %+v", s, pol)
		}
	})
}

// A reset time too large for a time.Duration (t above about 9.2e9 s) is
// bounded, not wrapped into the past: with none of the account's calls
// left, the next call waits for the reset, at most the policy's window,
// rather than going at once.
func TestRateLimitResetClamped(t *testing.T) {
	for _, v := range []string{"9300000000", "999999999999999"} {
		lim, ok := parseRateLimit([]string{`"default";r=0;t=` + v})
		if !ok || lim.reset != maxRateWindow {
			t.Errorf("t=%s: %+v, %v; want a reset of %v", v, lim, ok, maxRateWindow)
		}
		pol, ok := parseRatePolicy([]string{`"default";q=1200;w=` + v}, "default")
		if !ok || pol.window != maxRateWindow {
			t.Errorf("w=%s: %+v, %v; want a window of %v", v, pol, ok, maxRateWindow)
		}
	}
	synctest.Test(t, func(t *testing.T) {
		for _, tc := range []struct {
			name   string
			policy string
			reset  time.Duration
		}{
			{"with a policy", `"default";q=1200;w=300`, 300 * time.Second},
			{"without one", "", maxRateWindow},
		} {
			a := newTestAccount(t, Unlimited())
			h := http.Header{"Ratelimit": {`"default";r=0;t=9300000000`}}
			if tc.policy != "" {
				h.Set("Ratelimit-Policy", tc.policy)
			}
			a.take(time.Now(), Priority)
			a.Answered(h)
			st := a.State()
			if !st.Reset.Equal(time.Now().Add(tc.reset)) {
				t.Errorf("%s: reset in %v, want %v", tc.name, time.Until(st.Reset), tc.reset)
			}
			for _, c := range []Class{Normal, Priority} {
				if at, why := a.NextSlot(c, time.Time{}); why != WaitBudget || !at.Equal(time.Now().Add(tc.reset+resetMargin)) {
					t.Errorf("%s: Class %d may go in %v (%v); want the reset, %v", tc.name, c, time.Until(at), why, tc.reset+resetMargin)
				}
			}
		}
	})
}
