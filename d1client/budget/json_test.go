package budget

import (
	"encoding/json"
	"testing"
	"time"
)

// A State's JSON says what the last Ratelimit headers said; null when none
// arrived.
func TestStateJSON(t *testing.T) {
	seen := time.Date(2026, 3, 1, 3, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		st   State
		want string
	}{
		{State{}, `null`},
		{State{Seen: seen, Remaining: 1100, Reset: seen.Add(90 * time.Second)},
			`{"seen":"2026-03-01T03:00:00.000Z","remaining":1100,"reset":"2026-03-01T03:01:30.000Z","policy":null}`},
		{State{Seen: seen, Remaining: 7, Reset: seen.Add(time.Second), Quota: 1200, Window: 5 * time.Minute, Estimate: 3},
			`{"seen":"2026-03-01T03:00:00.000Z","remaining":7,"reset":"2026-03-01T03:00:01.000Z","policy":{"quota":1200,"window_ms":300000}}`},
	} {
		if b, err := json.Marshal(tc.st); err != nil || string(b) != tc.want {
			t.Errorf("json.Marshal(%+v) = %s, %v; want %s", tc.st, b, err, tc.want)
		}
	}
}
