package budget

import (
	"encoding/json"
)

// stateTime is how State's JSON writes a time: UTC, to the millisecond,
// RFC 3339.
const stateTime = "2006-01-02T15:04:05.000Z"

// MarshalJSON writes what the last Ratelimit headers said: when they
// arrived (seen), the calls they left the account (remaining), when their
// window resets (reset), and Ratelimit-Policy's quota and window (policy:
// quota, window_ms; null when it was absent). A State no headers reached
// is null.
func (s State) MarshalJSON() ([]byte, error) {
	if s.Seen.IsZero() {
		return []byte("null"), nil
	}
	type policy struct {
		Quota    int   `json:"quota"`
		WindowMS int64 `json:"window_ms"`
	}
	out := struct {
		Seen      string  `json:"seen"`
		Remaining int     `json:"remaining"`
		Reset     string  `json:"reset"`
		Policy    *policy `json:"policy"`
	}{Seen: s.Seen.UTC().Format(stateTime), Remaining: s.Remaining, Reset: s.Reset.UTC().Format(stateTime)}
	if s.Quota > 0 {
		out.Policy = &policy{Quota: s.Quota, WindowMS: s.Window.Milliseconds()}
	}
	return json.Marshal(out)
}
