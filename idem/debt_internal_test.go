package idem

import (
	"testing"
	"time"

	"github.com/d1idem/d1idem/d1client/budget"
)

// A claim owes what its own reservation will need: with a route's TTL
// (BeginOptions.TTL) under the ledger's, the heartbeats it owes are those
// of the route's TTL, scaled as Hold scales them, and the debt lives as
// long as that lease can, not the ledger's.
func TestDebtFollowsTheReservationsTTL(t *testing.T) {
	l := &Ledger{cfg: Config{TTL: 30 * time.Second, Heartbeat: 10 * time.Second, MaxLease: 5 * time.Minute}}
	for _, tc := range []struct {
		ttl  time.Duration
		want budget.Terms
	}{
		{30 * time.Second, budget.Terms{Wait: minCompletionWindow, Life: 5*time.Minute + 30*time.Second + minCompletionWindow, Every: 10 * time.Second, EveryWait: 20 * time.Second}},
		{time.Second, budget.Terms{Wait: minCompletionWindow, Life: 5*time.Minute + time.Second + minCompletionWindow, Every: time.Second / 3, EveryWait: time.Second - time.Second/3}},
	} {
		if got := l.debtTerms(tc.ttl); got != tc.want {
			t.Errorf("ttl %v: terms %+v, want %+v", tc.ttl, got, tc.want)
		}
		if hb := l.heartbeatFor(tc.ttl); hb != tc.want.Every {
			t.Errorf("ttl %v: Hold renews every %v, but the debt owes a beat every %v", tc.ttl, hb, tc.want.Every)
		}
	}
	// Without heartbeats a claim owes its completion alone.
	l.cfg.Heartbeat = -1
	if got := l.debtTerms(time.Second); got.Every != 0 || got.EveryWait != 0 {
		t.Errorf("no heartbeat: terms %+v owe beats", got)
	}
}
