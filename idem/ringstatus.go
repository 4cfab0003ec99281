package idem

import (
	"slices"
	"time"
)

// Added are the databases a Moving ring adds: those of Homes not in
// Previous. A Stable ring adds none.
func (r Ring) Added() []string {
	if r.Phase != RingMoving {
		return nil
	}
	var out []string
	for _, id := range r.Homes {
		if !slices.Contains(r.Previous, id) {
			out = append(out, id)
		}
	}
	return out
}

// NotGiven are the databases of the newest ring (and, while it moves, of
// the one before) that the status has no HomeRing for: not given to the
// ledger that read it.
func (st RingStatus) NotGiven() []string {
	var out []string
	for _, id := range append(slices.Clone(st.Ring.Previous), st.Ring.Homes...) {
		if st.Home(id) == nil && !slices.Contains(out, id) {
			out = append(out, id)
		}
	}
	return out
}

// Lost reports whether the newest ring names the database h was read from
// but h holds no identity: the database was replaced or wiped (see
// ErrHomeLost).
func (st RingStatus) Lost(h HomeRing) bool {
	return h.Err == nil && h.Identity == "" && slices.Contains(st.Ring.Homes, h.ID)
}

// Now is the ledger clock's time of the status: the latest of its
// databases' reads; zero when none was read.
func (st RingStatus) Now() time.Time {
	var now time.Time
	for _, h := range st.Homes {
		if h.Err == nil && h.Now.After(now) {
			now = h.Now
		}
	}
	return now
}

// RecordedSince are the databases whose ring is newer in st than in
// before, the status of the same databases read earlier.
func (st RingStatus) RecordedSince(before RingStatus) []string {
	var out []string
	for _, h := range st.Homes {
		b := before.Home(h.ID)
		if h.Ring != nil && (b == nil || b.Ring == nil || b.Ring.Epoch() < h.Ring.Epoch()) {
			out = append(out, h.ID)
		}
	}
	return out
}
