package idem_test

import (
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/d1idem/d1idem/idem"
)

// TestRingStatusReadings: what a status says of its databases: which a
// moving ring adds, which it names but were not read, which were wiped,
// and the latest clock read.
func TestRingStatusReadings(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	moving := idem.Ring{Version: 2, Phase: idem.RingMoving, Homes: []string{"a", "b", "c"}, Previous: []string{"a", "b"}}
	st := idem.RingStatus{Ring: moving, Homes: []idem.HomeRing{
		{ID: "a", Identity: "a", Now: t0},
		{ID: "c", Now: t0.Add(time.Second)},
		{ID: "x", Err: errors.New("unreadable"), Now: t0.Add(time.Hour)},
	}}
	if got := moving.Added(); !slices.Equal(got, []string{"c"}) {
		t.Errorf("Added = %q", got)
	}
	if got := (idem.Ring{Version: 1, Phase: idem.RingStable, Homes: []string{"a"}}).Added(); got != nil {
		t.Errorf("a stable ring adds %q", got)
	}
	if got := st.NotGiven(); !slices.Equal(got, []string{"b"}) {
		t.Errorf("NotGiven = %q", got)
	}
	if st.Lost(st.Homes[0]) || !st.Lost(st.Homes[1]) || st.Lost(st.Homes[2]) {
		t.Errorf("Lost: a %v, c %v, x %v; want only c", st.Lost(st.Homes[0]), st.Lost(st.Homes[1]), st.Lost(st.Homes[2]))
	}
	if h := st.Home("c"); h == nil || h.ID != "c" || st.Home("b") != nil {
		t.Errorf("Home(c) = %v, Home(b) = %v", h, st.Home("b"))
	}
	if got := st.Now(); !got.Equal(t0.Add(time.Second)) {
		t.Errorf("Now = %v: the latest read that did not fail", got)
	}
	if got := (idem.RingStatus{}).Now(); !got.IsZero() {
		t.Errorf("Now of no read = %v", got)
	}
}

// TestRingJSON: a ring's JSON names its fields, previous [] when stable.
func TestRingJSON(t *testing.T) {
	b, err := json.Marshal(idem.Ring{Version: 1, Phase: idem.RingStable, Homes: []string{"a", "b"}})
	if want := `{"version":1,"phase":"stable","homes":["a","b"],"previous":[]}`; err != nil || string(b) != want {
		t.Errorf("%s, %v; want %s", b, err, want)
	}
}

// TestRecordedSince: the databases whose ring moved on between two reads.
func TestRecordedSince(t *testing.T) {
	v1 := idem.Ring{Version: 1, Phase: idem.RingStable, Homes: []string{"a", "b"}}
	v2 := idem.Ring{Version: 2, Phase: idem.RingMoving, Homes: []string{"a", "b", "c"}, Previous: []string{"a", "b"}}
	before := idem.RingStatus{Homes: []idem.HomeRing{{ID: "a", Ring: &v2}, {ID: "b", Ring: &v1}, {ID: "c"}}}
	after := idem.RingStatus{Homes: []idem.HomeRing{{ID: "a", Ring: &v2}, {ID: "b", Ring: &v2}, {ID: "c", Ring: &v2}}}
	if got := after.RecordedSince(before); !slices.Equal(got, []string{"b", "c"}) {
		t.Errorf("RecordedSince = %q", got)
	}
}
