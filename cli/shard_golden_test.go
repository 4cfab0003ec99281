package cli

import (
	"context"
	"regexp"
	"testing"
	"time"

	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/internal/d1test"
)

// TestShardedOperatorGolden is the operator's flow over a ledger across
// several databases, on d1local with a clock the test moves, as a golden
// transcript: the schema and the first ring over 2 databases, the
// application writing keys through idem.NewSharded, stats per database and
// in total with the 10 GB projection, growing to 3 databases, keys get,
// list, stuck and release finding each key's home while the ring moves,
// the drop of the old route, growing to 5, and a sweep across them all.
func TestShardedOperatorGolden(t *testing.T) {
	e := newShardEnv(t, d1test.Local(t), 5)
	// The sweep's summary says how long it took, on the wall clock.
	elapsed := regexp.MustCompile(`(\(\d+ D1 calls?), [0-9.]+m?s\)`)
	tr := &transcript{t: t, e: e, mask: func(s string) string { return elapsed.ReplaceAllString(s, "$1, ELAPSED)") }}
	tr.run(2, "schema", "apply")
	tr.run(2, "ring", "init")
	app := e.ledger(t)
	moved := e.movedBetween(t, 2, 3)
	d, err := app.Begin(context.Background(), moved, "order-p", "fp-order-p")
	if err != nil || d.Outcome != idem.Execute {
		t.Fatalf("Begin: %v, %v", d.Outcome, err)
	}
	e.serve(t, app, "order-1", 15*time.Second, principals(300)...)
	tr.note("300 principals served, one key each, one every 15s; %s's order-p is left pending", moved)
	tr.run(2, "stats")
	tr.run(3, "schema", "apply")
	tr.run(3, "ring", "grow", "--add", e.ids[2])
	e.serve(t, app, "order-2", time.Second, moved)
	tr.note("%s, which moves from %s to %s, sends order-2", moved, idem.Rendezvous(moved, e.ids[:2]), idem.Rendezvous(moved, e.ids[:3]))
	tr.run(3, "keys", "get", "--principal", moved, "--key", "order-1")
	tr.run(3, "keys", "get", "--principal", moved, "--key", "order-2")
	tr.run(3, "keys", "list", "--principal", moved)
	tr.run(3, "keys", "stuck")
	tr.run(3, "keys", "release", "--principal", moved, "--key", "order-p", "--generation", "1")
	tr.run(3, "stats")
	e.clk.Advance(48 * time.Hour)
	tr.note("48 hours later")
	tr.run(3, "ring", "advance")
	tr.run(5, "schema", "apply")
	tr.run(5, "ring", "grow", "--add", e.ids[3], "--add", e.ids[4])
	tr.run(5, "sweep", "--all", "--batch", "1000")
	tr.run(5, "stats")
	golden(t, "sharded_operator", tr.b.String())
}
