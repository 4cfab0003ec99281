package idem_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/internal/d1test"
)

// A database of the ring that lost its identity (wiped, emptied, or
// replaced by another database with the schema) after one of its keys was
// answered is refused by routing (the replica that served the key and a
// new one), by AdvanceRing (even when it could not read the database
// first), by Grow and by InitRing; none of them takes it back into the
// ring, so the key never executes again. The principals of the other
// database are still served.
func TestLostHomeIsNeverReadmitted(t *testing.T) {
	for _, how := range []string{"emptied", "recreated", "replaced", "unreadable when AdvanceRing looked"} {
		t.Run(how, func(t *testing.T) {
			var down sync.Map // database ID -> failing
			b := d1test.LocalConfig(t, d1local.Config{Faults: func(r d1local.Request) d1local.Fault {
				if _, ok := down.LoadAndDelete(r.DatabaseID); ok {
					return d1local.Fault{Internal: true}
				}
				return d1local.Fault{}
			}})
			noRetry := func(c *d1client.Config) { c.Retry = d1client.NoRetry() }
			c := newCluster(t, b, 4, noRetry)
			a, lostID, added, spare := c.ids[0], c.ids[1], c.ids[2], c.ids[3]
			cfg := idem.Config{Heartbeat: -1}
			homes := func(db *d1client.Client) []idem.Home {
				return []idem.Home{{ID: a, DB: c.dbs[a]}, {ID: lostID, DB: db}, {ID: added, DB: c.dbs[added]}}
			}
			sharded := func(db *d1client.Client) *idem.Ledger {
				l, err := idem.NewSharded(homes(db), cfg)
				if err != nil {
					t.Fatal(err)
				}
				return l
			}
			served := sharded(c.dbs[lostID])
			r, err := c.ledger(t, cfg, a, lostID).Admin().InitRing(bg)
			if err != nil {
				t.Fatal(err)
			}
			p := principal(t, func(p string) bool { return r.Ring.Home(p) == lostID })
			q := principal(t, func(p string) bool { return r.Ring.Home(p) == a })
			complete(t, served, begin(t, served, p, "k", "fp").Reservation, 201, "first")

			db := c.dbs[lostID]
			switch how {
			case "emptied", "unreadable when AdvanceRing looked":
				_, err = db.Query(bg, "DELETE FROM idempotency_keys")
			case "recreated":
				if _, err = db.Query(bg, "DROP TABLE idempotency_keys"); err == nil {
					d1test.ApplySchema(t, db)
				}
			case "replaced":
				db = c.dbs[spare]
			}
			if err != nil {
				t.Fatal(err)
			}
			// The replicas given the database now under the lost home's ID:
			// one that routed before the loss (unless the Home was changed
			// to another database), one started after it.
			replicas := map[string]*idem.Ledger{"a replica started after the loss": sharded(db)}
			if how != "replaced" {
				replicas["the replica that served the key"] = served
			}
			op := sharded(db)
			refused := func(what string, err error) {
				t.Helper()
				if !errors.Is(err, idem.ErrHomeLost) || !strings.Contains(err.Error(), fmt.Sprintf("home %q", lostID)) {
					t.Errorf("%s: %v, want ErrHomeLost naming home %s", what, err, lostID)
				}
				if fix := idem.Remedy(err); !strings.Contains(fix, "restore it to a moment before the loss (D1 Time Travel)") {
					t.Errorf("%s: Remedy = %q", what, fix)
				}
				if err != nil && (strings.Contains(err.Error(), "AdvanceRing") || strings.Contains(err.Error(), "ring advance")) {
					t.Errorf("%s advises a step that would take the database back: %v", what, err)
				}
			}
			beginRefused := func(who string, l *idem.Ledger) {
				t.Helper()
				d, err := l.Begin(bg, p, "k", "fp")
				if err == nil {
					t.Fatalf("%s: Begin of the answered key = %v, want ErrHomeLost", who, d.Outcome)
				}
				refused(who+": Begin", err)
			}
			for who, l := range replicas {
				beginRefused(who, l)
			}

			if how == "unreadable when AdvanceRing looked" {
				down.Store(lostID, true) // its status read fails; the write does not
			}
			_, err = op.Admin().AdvanceRing(bg)
			refused("AdvanceRing", err)
			_, err = op.Admin().Grow(bg, added)
			refused("Grow", err)
			if _, err := op.Admin().InitRing(bg); err == nil {
				t.Error("InitRing over a ring with a lost database succeeded")
			}
			st, err := op.Admin().RingStatus(bg)
			if err != nil {
				t.Fatal(err)
			}
			for _, h := range st.Homes {
				if (h.ID == lostID || h.ID == added) && (h.Identity != "" || h.Ring != nil) {
					t.Errorf("home %s after the refusals: identity %q, ring %v", h.ID, h.Identity, h.Ring)
				}
			}
			replicas["a replica started after the ring operations"] = sharded(db)
			for who, l := range replicas {
				beginRefused(who+", after the ring operations", l)
			}
			if keys := c.keys(t, db.DatabaseID()); len(keys) != 0 {
				t.Errorf("the lost home's database holds %v: a key was executed again", keys)
			}
			// Only the lost database's principals are refused.
			if d := begin(t, op, q, "k", "fp"); d.Outcome != idem.Execute {
				t.Errorf("a principal of %s: %v", a, d.Outcome)
			}
		})
	}
}
