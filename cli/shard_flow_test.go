package cli

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/internal/d1test"
)

// TestShardedFlow runs the CLI over a ledger across several databases, on
// d1local and on workerd (through the bridge): the schema on each, the
// first ring, stats per database and in total, growing from 2 databases to
// 3 while the application serves, keys routed and merged across them, the
// refused and then due drop of the old route, and a sweep of them all.
func TestShardedFlow(t *testing.T) {
	d1test.ForEach(t, func(t *testing.T, b *d1test.Backend) {
		e := newShardEnv(t, b, 3)
		r := e.must(t, 2, "schema", "apply")
		if strings.Count(r.stdout, "Created idempotency_keys") != 2 || !strings.Contains(r.stdout, "Check the live shape with 'd1idem schema verify"+e.hint(2)+"'") {
			t.Errorf("schema apply: %s", r)
		}
		e.must(t, 2, "schema", "verify")
		// Keys need the ring: the error says how to record it.
		r = e.run(t, 2, "keys", "list")
		if r.code != exitError || !strings.Contains(r.stderr, "keys list: no ring is recorded in these databases: run 'd1idem ring init"+e.hint(2)) {
			t.Errorf("keys list before the ring: %s", r)
		}
		r = e.must(t, 2, "ring", "init")
		if !strings.HasPrefix(r.stdout, "Recorded version 1 of the ring, stable, over 2 databases: "+e.ids[0]+", "+e.ids[1]+".\n") {
			t.Errorf("ring init: %s", r)
		}

		app := e.ledger(t)
		e.serve(t, app, "order-1", time.Second, principals(40)...)
		checkStatsSplit(t, e, 2, 40)

		// Grow: the new database's schema, then the ring.
		e.must(t, 1, "schema", "apply", "--database-id", e.ids[2])
		r = e.run(t, 3, "ring", "grow")
		if r.code != exitUsage || !strings.Contains(r.stderr, "name the databases to add with --add (named here and not in the ring: "+e.ids[2]+")") {
			t.Errorf("ring grow without --add: %s", r)
		}
		r = e.must(t, 3, "ring", "grow", "--add", e.ids[2])
		if !strings.HasPrefix(r.stdout, fmt.Sprintf("Started version 2: %s joins the ring of %s, %s, moving about 1 in 3 of the principals (33%%) to it.\n", e.ids[2], e.ids[0], e.ids[1])) {
			t.Errorf("ring grow: %s", r)
		}
		checkMoving(t, e)

		// A moved principal: its old key is answered from its old home, its
		// new key goes to its new one; keys get says which holds each.
		p := e.moved(t, 2)
		e.serve(t, app, "order-2", time.Second, p)
		old, now := idem.Rendezvous(p, e.ids[:2]), idem.Rendezvous(p, e.ids)
		r = e.must(t, 3, "keys", "get", "--principal", p, "--key", "order-1")
		if !strings.HasPrefix(r.stdout, "database         "+old+" (the principal's home before version 2; its new keys go to "+now+")\n") {
			t.Errorf("keys get of the old key: %s", r)
		}
		r = e.must(t, 3, "keys", "get", "--principal", p, "--key", "order-2", "--json")
		var k keyDetailJSON
		if err := json.Unmarshal([]byte(r.stdout), &k); err != nil || k.Database != now || k.Key != "order-2" {
			t.Errorf("keys get --json of the new key: %v %s", err, r)
		}
		r = e.must(t, 3, "keys", "list", "--principal", p)
		if !strings.Contains(r.stdout, "order-1") || !strings.Contains(r.stdout, "order-2") {
			t.Errorf("keys list across the databases: %s", r)
		}

		// The drop is refused before DropAt, done after it.
		r = e.run(t, 3, "ring", "advance")
		if r.code != exitError || !strings.HasPrefix(r.stderr, "d1idem: ring advance: not yet: until 2026-03-03T02:59:") || strings.Count(r.stderr, "\n") != 1 {
			t.Errorf("ring advance before DropAt: %s", r)
		}
		e.clk.Advance(48 * time.Hour)
		r = e.must(t, 3, "ring", "advance")
		if !strings.HasPrefix(r.stdout, "Version 2 is stable: the old route is dropped") {
			t.Errorf("ring advance after DropAt: %s", r)
		}

		// Every row is now past the 24h retention: the sweep clears all
		// three databases.
		r = e.must(t, 3, "sweep", "--all", "--json")
		var sj sweepJSON
		if err := json.Unmarshal([]byte(r.stdout), &sj); err != nil || sj.Deleted != 41 || !sj.Complete || len(sj.Databases) != 3 {
			t.Errorf("sweep: %v %s", err, r)
		}
		checkStatsSplit(t, e, 3, 0)
	})
}

// checkStatsSplit checks stats --json over the first n databases: want
// keys in all, each database holding those of the principals its ring
// routes to it.
func checkStatsSplit(t *testing.T, e *shardEnv, n int, want int64) {
	t.Helper()
	checkStatsJSON(t, e, n, want, e.must(t, n, "stats", "--json"))
}

// checkStatsJSON is checkStatsSplit on the output r of stats --json.
func checkStatsJSON(t *testing.T, e *shardEnv, n int, want int64, r result) {
	t.Helper()
	var s statsManyJSON
	if err := json.Unmarshal([]byte(r.stdout), &s); err != nil {
		t.Fatal(err)
	}
	per := map[string]int64{}
	for _, p := range principals(int(want)) {
		per[idem.Rendezvous(p, e.ids[:n])]++
	}
	if s.Keys != want || len(s.Databases) != n || s.SizeLimit != nil {
		t.Errorf("stats --json: %s", r.stdout)
	}
	for _, d := range s.Databases {
		if d.Keys != per[d.ID] || d.Error != nil || d.SizeLimit == nil || d.SizeLimit.Reason == nil {
			t.Errorf("stats --json of %s: %d keys, want %d; %+v", d.ID, d.Keys, per[d.ID], d)
		}
	}
}

// checkMoving checks ring status --json while version 2 is moving.
func checkMoving(t *testing.T, e *shardEnv) {
	t.Helper()
	r := e.must(t, 3, "ring", "status", "--json")
	var st ringStatusJSON
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		t.Fatal(err)
	}
	if st.Ring == nil || st.Ring.Version != 2 || st.Ring.Phase != "moving" || len(st.Ring.Previous) != 2 || len(st.Adds) != 1 || st.Adds[0] != e.ids[2] ||
		st.DropAt == nil || *st.DropAtMS != testNow.Add(40*time.Second+2*24*time.Hour-time.Minute).UnixMilli() || len(st.Databases) != 3 {
		t.Errorf("ring status --json: %s", r.stdout)
	}
	for _, d := range st.Databases {
		if d.Ring == nil || d.Ring.Version != 2 || d.Error != nil {
			t.Errorf("ring status --json: %s: %+v", d.ID, d)
		}
	}
}

// TestShardedThroughBridge: several databases through one bridge, named by
// --bridge-url or D1IDEM_BRIDGE_URL: each is reached under its ID, as
// through the REST API, with no API token; the secret is never shown, and
// the budget the databases share is not metered (sweep's --max-calls is
// unlimited by default, and never waits).
func TestShardedThroughBridge(t *testing.T) {
	b := d1test.Workerd(t)
	for _, v := range []string{"CLOUDFLARE_API_TOKEN", "CLOUDFLARE_API_BASE_URL", "CLOUDFLARE_BASE_URL", "D1_DATABASE_ID", d1client.BridgeURLEnv} {
		t.Setenv(v, "")
	}
	e := newShardEnv(t, b, 2)
	conn := []string{"--account-id", b.AccountID, "--database-id", e.ids[0], "--database-id", e.ids[1]}
	run := func(args ...string) result {
		t.Helper()
		r := runCLI(t, e.opts(), append(args, conn...)...)
		if r.code != 0 || strings.Contains(r.stdout+r.stderr, b.Token) {
			t.Fatalf("d1idem %s (the bridge URL not shown): exit %d, or the secret shown: %s", strings.Join(args[:2], " "), r.code, r)
		}
		return r
	}
	r := run("schema", "apply", "--bridge-url", b.BridgeURL())
	if strings.Count(r.stdout, "Created idempotency_keys") != 2 || !strings.Contains(r.stdout, "through the bridge at "+b.BaseURL) {
		t.Errorf("schema apply through the bridge: %s", r)
	}
	run("ring", "init", "--bridge-url", b.BridgeURL())
	e.serve(t, e.ledger(t), "order-1", time.Second, principals(10)...)

	t.Setenv(d1client.BridgeURLEnv, b.BridgeURL())
	checkStatsJSON(t, e, 2, 10, run("stats", "--json"))
	e.clk.Advance(48 * time.Hour)
	r = run("sweep", "--all", "--batch", "1", "--json")
	var sj sweepJSON
	if err := json.Unmarshal([]byte(r.stdout), &sj); err != nil || sj.Deleted != 10 || !sj.Complete || sj.BudgetWaits != 0 || len(sj.Databases) != 2 {
		t.Errorf("sweep through the bridge: %v %s", err, r)
	}
}
