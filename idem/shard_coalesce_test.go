package idem_test

import (
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/internal/d1test"
)

// A replica that has not seen a change claims many keys at once at an old
// home that has recorded it: group commit carries their claims in one
// batch, whose ring guard aborts it all; each caller, sent again alone, is
// refused by its own guard, learns the new ring and routes again, so every
// key executes once, in the home the new ring gives it (the moved
// principals' at their new home). The randomized shard run sends its calls
// alone (its schedule must say which caller goes first), so this is where
// the guard meets group commit.
func TestRingGuardAbortsACoalescedBatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const callers = 12
		var hold atomic.Pointer[chan struct{}]
		var widest atomic.Int64 // the most claims one call carried
		b := d1test.InProcess(t, d1local.Config{Faults: func(r d1local.Request) d1local.Fault {
			n := int64(strings.Count(strings.Join(r.Statements, "\n"), "'pending', 1,"))
			for w := widest.Load(); n > w && !widest.CompareAndSwap(w, n); w = widest.Load() {
			}
			if ch := hold.Swap(nil); ch != nil && n > 0 {
				<-*ch // the first claim waits until every caller has queued behind it
			}
			return d1local.Fault{}
		}})
		c := newCluster(t, b, 3)
		cfg := idem.Config{Heartbeat: -1, Logger: slog.New(slog.DiscardHandler)}
		v1 := c.initRing(t, cfg, c.ids[0], c.ids[1])
		var homes []idem.Home
		for _, id := range c.ids {
			homes = append(homes, idem.Home{DB: b.Database(id).Client(t, func(c *d1client.Config) { c.Coalesce.MaxInFlight = 1 })})
		}
		replica, err := idem.NewSharded(homes, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if r := mustRing(t, replica); r.String() != v1.String() {
			t.Fatalf("the replica routes by %s", r)
		}
		st, err := c.ledger(t, cfg).Admin().Grow(bg, c.ids[2])
		if err != nil {
			t.Fatal(err)
		}
		v2 := st.Ring
		// Half of them move to the new home, half stay; all claimed at the
		// same old home by version 1.
		var movers, stayers []string
		for i := 0; len(movers)+len(stayers) < callers; i++ {
			p := fmt.Sprint("acct-", i)
			switch {
			case v1.Home(p) != c.ids[0]:
			case v2.PreviousHome(p) != "" && len(movers) < callers/2:
				movers = append(movers, p)
			case v2.PreviousHome(p) == "" && len(stayers) < callers/2:
				stayers = append(stayers, p)
			}
		}
		ps := append(movers, stayers...)
		release := make(chan struct{})
		hold.Store(&release)
		outcomes := make([]idem.Outcome, len(ps))
		errs := make([]error, len(ps))
		var wg sync.WaitGroup
		for i, p := range ps {
			wg.Go(func() {
				d, err := replica.Begin(bg, p, "k", "fp")
				outcomes[i], errs[i] = d.Outcome, err
			})
		}
		synctest.Wait() // the first claim held, the others queued behind it
		close(release)
		wg.Wait()
		if w := widest.Load(); w < 2 {
			t.Errorf("no call carried several claims (at most %d): group commit was not exercised", w)
		}
		for i, p := range ps {
			want := v2.Home(p)
			if errs[i] != nil || outcomes[i] != idem.Execute {
				t.Errorf("%s: %v, %v; want Execute", p, outcomes[i], errs[i])
			} else if got := c.where(t, p, "k"); len(got) != 1 || got[0] != want {
				t.Errorf("%s (moved: %v): its key is in %v, want %s", p, v2.PreviousHome(p) != "", got, want)
			}
		}
		if r := mustRing(t, replica); r.String() != v2.String() {
			t.Errorf("the replica routes by %s, want %s", r, v2)
		}
	})
}
