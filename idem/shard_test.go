package idem_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/idem/idemhttp"
	"github.com/d1idem/d1idem/internal/d1test"
)

// bearer is the principal of a request: its bearer token.
func bearer(r *http.Request) (string, error) {
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || tok == "" {
		return "", errors.New("no token")
	}
	return tok, nil
}

// cluster is a set of databases with the ledger's schema, by ID.
type cluster struct {
	dbs map[string]*d1client.Client
	ids []string // sorted
}

func newCluster(t testing.TB, b *d1test.Backend, n int, mod ...func(*d1client.Config)) *cluster {
	t.Helper()
	c := &cluster{dbs: map[string]*d1client.Client{}}
	for range n {
		db := b.NewClientSchema(t, mod...)
		c.dbs[db.DatabaseID()] = db
		c.ids = append(c.ids, db.DatabaseID())
	}
	slices.Sort(c.ids)
	return c
}

// ledger returns a sharded ledger on the databases with these IDs (all of
// them when none is given).
func (c *cluster) ledger(t testing.TB, cfg idem.Config, ids ...string) *idem.Ledger {
	t.Helper()
	if len(ids) == 0 {
		ids = c.ids
	}
	var homes []idem.Home
	for _, id := range ids {
		homes = append(homes, idem.Home{DB: c.dbs[id]})
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	l, err := idem.NewSharded(homes, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// keys returns "principal/key status generation" for every key row of
// database id, sorted.
func (c *cluster) keys(t testing.TB, id string) []string {
	t.Helper()
	res, err := c.dbs[id].Query(bg, "SELECT principal, key, status, generation FROM idempotency_keys WHERE principal <> '' ORDER BY principal, key")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range res.Rows {
		var p, k, st string
		var g int64
		if err := r.Scan(&p, &k, &st, &g); err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprintf("%s/%s %s %d", p, k, st, g))
	}
	return out
}

// where returns the IDs of the databases holding principal's key.
func (c *cluster) where(t testing.TB, principal, key string) []string {
	t.Helper()
	var out []string
	for _, id := range c.ids {
		for _, k := range c.keys(t, id) {
			if strings.HasPrefix(k, principal+"/"+key+" ") {
				out = append(out, id)
			}
		}
	}
	return out
}

// principal returns the first "acct-<i>" for which ok holds.
func principal(t testing.TB, ok func(p string) bool) string {
	t.Helper()
	for i := range 10000 {
		if p := fmt.Sprint("acct-", i); ok(p) {
			return p
		}
	}
	t.Fatal("no such principal")
	return ""
}

func mustRing(t testing.TB, l *idem.Ledger) idem.Ring {
	t.Helper()
	r, err := l.Ring(bg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// Principals live in the database the ring routes them to, and only there;
// the administrative API reads, merges and sums across the databases; each
// database holds the spec's rows and one ring row, which no request and no
// administrative read sees.
func TestShardedLedgerRoutesPrincipals(t *testing.T) {
	d1test.ForEach(t, func(t *testing.T, b *d1test.Backend) {
		c := newCluster(t, b, 3)
		l := c.ledger(t, idem.Config{Heartbeat: -1})
		initRingOnce(t, c, l)
		r := mustRing(t, l)
		const n = 24
		per := map[string]int{}
		for i := range n {
			p := fmt.Sprint("acct-", i)
			d := begin(t, l, p, "k", "fp")
			if d.Outcome != idem.Execute {
				t.Fatalf("%s: %v", p, d.Outcome)
			}
			complete(t, l, d.Reservation, 201, fmt.Sprintf(`{"p":%q}`, p))
			if got := c.where(t, p, "k"); len(got) != 1 || got[0] != r.Home(p) {
				t.Errorf("%s: its key is in %v, its home is %s", p, got, r.Home(p))
			}
			per[r.Home(p)]++
			if d := begin(t, l, p, "k", "fp"); d.Outcome != idem.Replay || string(d.Response.Body) != fmt.Sprintf(`{"p":%q}`, p) {
				t.Errorf("%s: replay %v %s", p, d.Outcome, d.Response.Body)
			}
		}
		ringRowsHidden(t, c, l)
		a := l.Admin()
		shardedStats(t, a, n, per)
		listed := listAllPages(t, a, n)
		if len(listed) != n || !slices.IsSortedFunc(listed, byUpdatedAt) {
			t.Errorf("List gave %d keys, out of order? %v", len(listed), listed)
		}
		p0 := "acct-0"
		page, err := a.List(bg, idem.ListOptions{Principal: p0})
		if err != nil || len(page.Keys) != 1 || page.Keys[0].Principal != p0 {
			t.Errorf("List of one principal: %+v %v", page, err)
		}
		if k, err := a.Get(bg, p0, "k"); err != nil || k.Status != idem.StatusCompleted {
			t.Errorf("Get: %+v %v", k, err)
		}
		if n, err := a.Sweep(bg); err != nil || n != 0 {
			t.Errorf("Sweep: %d %v", n, err)
		}
		if n, err := a.SweepBacklog(bg); err != nil || n != 0 {
			t.Errorf("SweepBacklog: %d %v", n, err)
		}
		if s, err := a.List(bg, idem.ListOptions{Status: idem.StatusPending, OlderThan: idem.DefaultTTL}); err != nil || len(s.Keys) != 0 {
			t.Errorf("stuck keys: %+v %v", s, err)
		}
	})
}

// initRingOnce checks that l, sharded over c, refuses requests before its
// ring is recorded, that InitRing records version 1 over every home, and
// that a second InitRing is refused.
func initRingOnce(t *testing.T, c *cluster, l *idem.Ledger) {
	t.Helper()
	if _, err := l.Begin(bg, "p", "k", "fp"); !errors.Is(err, idem.ErrNoRing) {
		t.Fatalf("Begin before InitRing: %v, want ErrNoRing", err)
	}
	st, err := l.Admin().InitRing(bg)
	if err != nil {
		t.Fatal(err)
	}
	want := idem.Ring{Version: 1, Phase: idem.RingStable, Homes: c.ids}
	if st.Ring.String() != want.String() || len(st.Homes) != 3 {
		t.Fatalf("InitRing: %+v", st)
	}
	if _, err := l.Admin().InitRing(bg); !errors.Is(err, idem.ErrRingConflict) {
		t.Fatalf("a second InitRing: %v, want ErrRingConflict", err)
	}
}

// ringRowsHidden checks that the ring row and the identity row are the
// only other rows of each database, and that neither a request nor the
// administrative API reads them.
func ringRowsHidden(t *testing.T, c *cluster, l *idem.Ledger) {
	t.Helper()
	for _, id := range c.ids {
		res, err := c.dbs[id].Query(bg, "SELECT key, fingerprint FROM idempotency_keys WHERE principal = '' ORDER BY key")
		if err != nil || len(res.Rows) != 2 {
			t.Fatalf("%s: ring rows %v %v", id, res, err)
		}
		var homeKey, identity string
		if err := res.Rows[0].Scan(&homeKey, &identity); err != nil || homeKey != "d1idem:home" || identity != id {
			t.Errorf("%s: identity row %s %s, %v", id, homeKey, identity, err)
		}
	}
	if _, err := l.Begin(bg, "", "d1idem:ring", "fp"); !errors.Is(err, idem.ErrNoPrincipal) {
		t.Errorf("Begin on the ring row: %v", err)
	}
	if _, err := l.Admin().Get(bg, "", "d1idem:ring"); !errors.Is(err, idem.ErrNoPrincipal) {
		t.Errorf("Admin.Get on the ring row: %v", err)
	}
}

// shardedStats checks that Stats sums the n completed keys across the
// databases, and that HomeStats gives each database its own (per home).
func shardedStats(t *testing.T, a *idem.Admin, n int, per map[string]int) {
	t.Helper()
	stats, err := a.Stats(bg)
	if err != nil || stats.Keys != int64(n) || stats.ByStatus[idem.StatusCompleted] != int64(n) || stats.Oldest == nil || stats.Created != int64(n) || stats.FirstCreated.IsZero() {
		t.Fatalf("Stats: %+v, %v", stats, err)
	}
	hs, err := a.HomeStats(bg)
	if err != nil || len(hs) != 3 {
		t.Fatalf("HomeStats: %v %v", hs, err)
	}
	for _, h := range hs {
		if h.Stats.Keys != int64(per[h.Home]) {
			t.Errorf("HomeStats %s: %d keys, want %d", h.Home, h.Stats.Keys, per[h.Home])
		}
	}
}

// listAllPages follows List's cursor in pages of 5 and returns each key
// as "updated_at/principal/key"; more than n+1 pages fail t.
func listAllPages(t *testing.T, a *idem.Admin, n int) []string {
	t.Helper()
	var listed []string
	cursor := ""
	for pages := 0; ; pages++ {
		page, err := a.List(bg, idem.ListOptions{Limit: 5, Cursor: cursor})
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range page.Keys {
			listed = append(listed, fmt.Sprintf("%d/%s/%s", k.UpdatedAt.UnixMilli(), k.Principal, k.Key))
		}
		if cursor = page.NextCursor; cursor == "" {
			break
		}
		if pages > n {
			t.Fatal("List does not end")
		}
	}
	return listed
}

// byUpdatedAt orders listAllPages's "updated_at/principal/key" entries as
// List does.
func byUpdatedAt(x, y string) int {
	var a, b int64
	var ra, rb string
	fmt.Sscanf(x, "%d/%s", &a, &ra)
	fmt.Sscanf(y, "%d/%s", &b, &rb)
	if a != b {
		return int(a - b)
	}
	return strings.Compare(ra, rb)
}

// A ledger on one database is the N = 1 case of a sharded one, and the
// ring survives the spec's sweep with any retention.
func TestShardedOneHomeAndSweep(t *testing.T) {
	b := d1test.Local(t)
	c := newCluster(t, b, 1)
	clk := newClock()
	l := c.ledger(t, idem.Config{Heartbeat: -1, Clock: clk.Now})
	if _, err := l.Admin().InitRing(bg); err != nil {
		t.Fatal(err)
	}
	d := begin(t, l, "p", "k", "fp")
	complete(t, l, d.Reservation, 200, "ok")
	clk.Advance(100 * 365 * 24 * time.Hour)
	if n, err := l.Admin().Sweep(bg); err != nil || n != 1 {
		t.Fatalf("Sweep: %d %v", n, err)
	}
	if st, err := l.Admin().RingStatus(bg); err != nil || st.Homes[0].Ring == nil {
		t.Fatalf("the ring did not survive the sweep: %+v %v", st, err)
	}
	if d := begin(t, l, "p", "k", "fp"); d.Outcome != idem.Execute {
		t.Fatalf("after the sweep: %v", d.Outcome)
	}
}

func TestNewShardedValidation(t *testing.T) {
	b := d1test.Local(t)
	db := b.NewClient(t)
	for _, tc := range []struct {
		homes []idem.Home
		want  string
	}{
		{nil, "no homes"},
		{[]idem.Home{{ID: "a"}}, "nil D1 client"},
		{[]idem.Home{{ID: "a", DB: db}, {ID: "a", DB: db}}, "two homes"},
		{[]idem.Home{{ID: "a\x00b", DB: db}}, "control"},
		{[]idem.Home{{ID: strings.Repeat("x", 256), DB: db}}, "1 to 255"},
	} {
		if _, err := idem.NewSharded(tc.homes, idem.Config{}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NewSharded(%v): %v, want %q", tc.homes, err, tc.want)
		}
	}
	if _, err := idem.NewSharded([]idem.Home{{DB: db}}, idem.Config{TTL: -1}); err == nil {
		t.Error("an invalid Config was accepted")
	}
	l := newLedger(t, db, idem.Config{})
	if _, err := l.Ring(bg); !errors.Is(err, idem.ErrNotSharded) {
		t.Errorf("Ring of New: %v", err)
	}
	if _, err := l.Admin().Grow(bg, "x"); !errors.Is(err, idem.ErrNotSharded) {
		t.Errorf("Grow of New: %v", err)
	}
}

// ringOf returns the ring after growing r by the given homes (Moving).
func grown(r idem.Ring, add ...string) idem.Ring {
	homes := append(slices.Clone(r.Homes), add...)
	slices.Sort(homes)
	return idem.Ring{Version: r.Version + 1, Phase: idem.RingMoving, Homes: homes, Previous: r.Homes}
}

// initRing records version 1 over the databases with these IDs.
func (c *cluster) initRing(t testing.TB, cfg idem.Config, ids ...string) idem.Ring {
	t.Helper()
	st, err := c.ledger(t, cfg, ids...).Admin().InitRing(bg)
	if err != nil {
		t.Fatal(err)
	}
	return st.Ring
}

// A change of the ring, step by step: a replica that has not seen it yet
// is refused at the old home and learns it; a moved principal's keys are
// answered from its old home (replay, in progress, reuse), its new keys go
// to its new home, and a stale reservation at the old home is moved (its
// owner fenced out); the old route is dropped only after DropAt, and a
// replica still routing by an older ring learns the stable one.
func TestGrowPhases(t *testing.T) {
	d1test.ForEach(t, func(t *testing.T, b *d1test.Backend) {
		c := newCluster(t, b, 3)
		clk := newClock()
		cfg := idem.Config{Heartbeat: -1, Clock: clk.Now, TTL: time.Second}
		v1 := c.initRing(t, cfg, c.ids[0], c.ids[1])
		op, r1, late := c.ledger(t, cfg), c.ledger(t, cfg), c.ledger(t, cfg)
		for _, l := range []*idem.Ledger{r1, late} {
			if r := mustRing(t, l); r.String() != v1.String() {
				t.Fatalf("replica routes by %s, want %s", r, v1)
			}
		}
		v2 := grown(v1, c.ids[2])
		moved := principal(t, func(p string) bool { return v2.PreviousHome(p) != "" })
		g := growPhases{c: c, clk: clk, op: op, r1: r1, late: late, v1: v1, v2: v2, moved: moved,
			unmoved: principal(t, func(p string) bool { return v2.PreviousHome(p) == "" }),
			oldHome: v1.Home(moved), newHome: v2.Home(moved)}

		// Keys of the moved principal before the change, at its old home.
		d := begin(t, r1, moved, "done", "fp")
		complete(t, r1, d.Reservation, 201, "done")
		live := begin(t, r1, moved, "live", "fp").Reservation
		abandoned := begin(t, r1, moved, "abandoned", "fp").Reservation

		st, err := op.Admin().Grow(bg, c.ids[2])
		if err != nil || st.Ring.String() != v2.String() {
			t.Fatalf("Grow: %s, %v", st.Ring, err)
		}
		if !st.DropAt.Equal(clk.Now().Add(2*24*time.Hour - time.Second - 30*time.Second)) {
			t.Errorf("DropAt %s, want two retentions less the TTL and half the margin after %s", st.DropAt, clk.Now())
		}

		g.newKeyAtNewHome(t)
		g.oldKeysAnsweredFromOldHome(t)
		g.staleReservationMoves(t, live, abandoned)
		g.unmovedPrincipalStays(t)
		g.oldRouteDroppedAtDropAt(t)
	})
}

// growPhases is TestGrowPhases's cluster, clock and ledgers (the
// operator's, a replica r1 that serves the requests, and a replica late
// that sees no request until the end), its rings before (v1) and after
// (v2) the growth, a principal that moves (from oldHome to newHome) and
// one that does not.
type growPhases struct {
	c                *cluster
	clk              *clock
	op, r1, late     *idem.Ledger
	v1, v2           idem.Ring
	moved, unmoved   string
	oldHome, newHome string
}

// newKeyAtNewHome checks that r1, which still routes by v1, is refused at
// the old home, learns v2 and claims the moved principal's new key at its
// new home.
func (g growPhases) newKeyAtNewHome(t *testing.T) {
	t.Helper()
	d := begin(t, g.r1, g.moved, "new", "fp")
	if d.Outcome != idem.Execute {
		t.Fatalf("new key: %v", d.Outcome)
	}
	complete(t, g.r1, d.Reservation, 201, "new")
	if got := mustRing(t, g.r1); got.String() != g.v2.String() {
		t.Fatalf("r1 routes by %s after the refusal, want %s", got, g.v2)
	}
	if got := g.c.where(t, g.moved, "new"); !slices.Equal(got, []string{g.newHome}) {
		t.Errorf("new key in %v, want the new home %s", got, g.newHome)
	}
}

// oldKeysAnsweredFromOldHome checks that the moved principal's keys at
// the old home are answered from there (replay, reuse, in progress), and
// its new key from the new home.
func (g growPhases) oldKeysAnsweredFromOldHome(t *testing.T) {
	t.Helper()
	if d := begin(t, g.r1, g.moved, "done", "fp"); d.Outcome != idem.Replay || string(d.Response.Body) != "done" {
		t.Errorf("replay from the old home: %v", d.Outcome)
	}
	if d := begin(t, g.r1, g.moved, "done", "other"); d.Outcome != idem.Reused {
		t.Errorf("reuse at the old home: %v", d.Outcome)
	}
	if d := begin(t, g.r1, g.moved, "live", "fp"); d.Outcome != idem.InProgress {
		t.Errorf("in progress at the old home: %v", d.Outcome)
	}
	if d := begin(t, g.r1, g.moved, "new", "fp"); d.Outcome != idem.Replay || string(d.Response.Body) != "new" {
		t.Errorf("replay from the new home: %v", d.Outcome)
	}
	// Admin.Get says which home it found each row in.
	for key, want := range map[string]string{"done": g.oldHome, "new": g.newHome} {
		if k, err := g.op.Admin().Get(bg, g.moved, key); err != nil || k.Home != want {
			t.Errorf("Get(%s).Home = %q, %v; want %q", key, k.Home, err, want)
		}
	}
}

// staleReservationMoves checks that a stale reservation at the old home
// (abandoned's) moves to the new home, its owner fenced out, while a live
// owner there (live, renewed) completes.
func (g growPhases) staleReservationMoves(t *testing.T, live, abandoned *idem.Reservation) {
	t.Helper()
	g.clk.Advance(2 * time.Second)
	if ok, err := g.r1.Renew(bg, live); !ok || err != nil {
		t.Fatalf("renewing a live reservation at the old home: %v %v", ok, err)
	}
	d := begin(t, g.r1, g.moved, "abandoned", "fp")
	if d.Outcome != idem.Execute {
		t.Fatalf("stale reservation: %v", d.Outcome)
	}
	if got := g.c.where(t, g.moved, "abandoned"); !slices.Equal(got, []string{g.newHome}) {
		t.Errorf("moved reservation in %v, want %s", got, g.newHome)
	}
	if done := complete(t, g.r1, abandoned, 201, "late"); done.Stored {
		t.Error("the superseded owner's completion at the old home was stored")
	}
	complete(t, g.r1, d.Reservation, 201, "retried")
	if done := complete(t, g.r1, live, 201, "live"); !done.Stored {
		t.Error("the live owner's completion at the old home was fenced out")
	}
	if d := begin(t, g.r1, g.moved, "live", "fp"); d.Outcome != idem.Replay || string(d.Response.Body) != "live" {
		t.Errorf("replay of the live key: %v", d.Outcome)
	}
}

// unmovedPrincipalStays checks that a principal the growth does not move
// keeps its new keys where they were.
func (g growPhases) unmovedPrincipalStays(t *testing.T) {
	t.Helper()
	d := begin(t, g.r1, g.unmoved, "k", "fp")
	if got := g.c.where(t, g.unmoved, "k"); !slices.Equal(got, []string{g.v1.Home(g.unmoved)}) {
		t.Errorf("unmoved principal's key in %v, want %s", got, g.v1.Home(g.unmoved))
	}
	complete(t, g.r1, d.Reservation, 200, "")
}

// oldRouteDroppedAtDropAt checks that the old route is not dropped before
// DropAt and is at DropAt, in every home; that late (routing by v1) and
// r1 (by v2 moving) both learn v2 stable; that no key moved; and that a
// home already in the ring cannot be added again.
func (g growPhases) oldRouteDroppedAtDropAt(t *testing.T) {
	t.Helper()
	st, err := g.op.Admin().AdvanceRing(bg)
	if !errors.Is(err, idem.ErrDropNotDue) || st.Ring.String() != g.v2.String() {
		t.Fatalf("AdvanceRing before DropAt: %s, %v", st.Ring, err)
	}
	g.clk.Advance(st.DropAt.Sub(g.clk.Now()))
	st, err = g.op.Admin().AdvanceRing(bg)
	stable := idem.Ring{Version: 2, Phase: idem.RingStable, Homes: g.v2.Homes}
	if err != nil || st.Ring.String() != stable.String() {
		t.Fatalf("AdvanceRing at DropAt: %s, %v", st.Ring, err)
	}
	for _, h := range st.Homes {
		if h.Ring == nil || h.Ring.String() != stable.String() {
			t.Errorf("home %s holds %v", h.ID, h.Ring)
		}
	}
	if d := begin(t, g.late, g.moved, "new", "fp"); d.Outcome != idem.Replay {
		t.Errorf("late replica: %v", d.Outcome)
	}
	if d := begin(t, g.r1, g.moved, "new", "fp"); d.Outcome != idem.Replay {
		t.Errorf("r1: %v", d.Outcome)
	}
	for _, l := range []*idem.Ledger{g.late, g.r1} {
		if got := mustRing(t, l); got.String() != stable.String() {
			t.Errorf("a replica routes by %s, want %s", got, stable)
		}
	}
	if got := g.c.where(t, g.moved, "done"); !slices.Equal(got, []string{g.oldHome}) {
		t.Errorf("the old key moved: %v", got)
	}
	if _, err := g.op.Admin().Grow(bg, g.c.ids[2]); err == nil {
		t.Error("Grow accepted a home already in the ring")
	}
}

// A database that cannot be written during a change: the change is
// recorded in the others, the ledger stays exactly-once (a replica that
// knows the change claims a moved principal's keys at the old home until
// that home records it), and AdvanceRing finishes the recording. Only the
// unreachable database's principals are refused meanwhile.
func TestGrowWithAnUnreachableOldHome(t *testing.T) {
	var down sync.Map // database ID -> "ring writes" or "all"
	b := d1test.LocalConfig(t, d1local.Config{Faults: func(r d1local.Request) d1local.Fault {
		what, ok := down.Load(r.DatabaseID)
		if ok && (what == "all" || slices.ContainsFunc(r.Statements, func(s string) bool { return strings.Contains(s, "response_body = excluded.response_body") })) {
			return d1local.Fault{Internal: true}
		}
		return d1local.Fault{}
	}})
	fast := func(c *d1client.Config) { c.Retry = d1client.RetryPolicy{MaxAttempts: 2, BaseDelay: time.Millisecond} }
	c := newCluster(t, b, 3, fast)
	clk := newClock()
	cfg := idem.Config{Heartbeat: -1, Clock: clk.Now}
	// The unreachable database is an old home other than the coordinator
	// (the first ID), so the change is recorded before it fails there.
	a, unreachable, added := c.ids[0], c.ids[1], c.ids[2]
	v1 := c.initRing(t, cfg, a, unreachable)
	v2 := grown(v1, added)
	stale, op := c.ledger(t, cfg), c.ledger(t, cfg)
	mustRing(t, stale)
	moved := principal(t, func(p string) bool { return v2.PreviousHome(p) == unreachable })
	atA := principal(t, func(p string) bool { return v2.Home(p) == a })

	down.Store(unreachable, "ring writes")
	st, err := op.Admin().Grow(bg, added)
	if err == nil || !strings.Contains(err.Error(), "recorded at 2 of its 3") {
		t.Fatalf("Grow with a database down: %v", err)
	}
	if h := st.Homes[slices.Index(c.ids, unreachable)]; h.Err == nil {
		t.Errorf("the status does not show the failure: %+v", h)
	}
	down.Store(unreachable, "all")
	knows := c.ledger(t, cfg)
	if r := mustRing(t, knows); r.String() != v2.String() {
		t.Fatalf("a replica loads %s, want %s from the homes it can reach", r, v2)
	}
	if _, err := knows.Begin(bg, moved, "k", "fp"); err == nil {
		t.Error("a principal of the unreachable database was served")
	}
	if d := begin(t, knows, atA, "k", "fp"); d.Outcome != idem.Execute {
		t.Errorf("a principal of a reachable database: %v", d.Outcome)
	}

	// Back up, still without the change: both replicas claim the moved
	// principal's keys at its old home.
	down.Delete(unreachable)
	d := begin(t, knows, moved, "k1", "fp")
	complete(t, knows, d.Reservation, 201, "k1")
	d = begin(t, stale, moved, "k2", "fp")
	complete(t, stale, d.Reservation, 201, "k2")
	for _, k := range []string{"k1", "k2"} {
		if got := c.where(t, moved, k); !slices.Equal(got, []string{unreachable}) {
			t.Errorf("%s in %v, want the old home %s", k, got, unreachable)
		}
	}
	if got := mustRing(t, stale); got.Version != 1 {
		t.Errorf("stale learnt %s from a home that had not recorded it", got)
	}

	// AdvanceRing records the change there (too recently to drop it).
	if st, err := op.Admin().AdvanceRing(bg); !errors.Is(err, idem.ErrDropNotDue) {
		t.Fatalf("AdvanceRing: %+v %v", st, err)
	}
	d = begin(t, stale, moved, "k3", "fp")
	if d.Outcome != idem.Execute {
		t.Fatalf("k3: %v", d.Outcome)
	}
	complete(t, stale, d.Reservation, 201, "k3")
	if got := c.where(t, moved, "k3"); !slices.Equal(got, []string{added}) {
		t.Errorf("k3 in %v, want the new home %s", got, added)
	}
	for _, l := range []*idem.Ledger{stale, knows} {
		for _, k := range []string{"k1", "k2", "k3"} {
			if d := begin(t, l, moved, k, "fp"); d.Outcome != idem.Replay || string(d.Response.Body) != k {
				t.Errorf("%s: %v %s", k, d.Outcome, d.Response.Body)
			}
		}
	}
}

// A replica cut off across two changes learns the newest ring from the
// first database it reaches, and routes every key where it is.
func TestReplicaPartitionedAcrossTwoChanges(t *testing.T) {
	d1test.ForEach(t, func(t *testing.T, b *d1test.Backend) {
		c := newCluster(t, b, 4)
		clk := newClock()
		cfg := idem.Config{Heartbeat: -1, Clock: clk.Now}
		v1 := c.initRing(t, cfg, c.ids[0], c.ids[1])
		cut, op, other := c.ledger(t, cfg), c.ledger(t, cfg), c.ledger(t, cfg)
		mustRing(t, cut)
		v2 := grown(v1, c.ids[2])
		v3 := grown(idem.Ring{Version: 2, Phase: idem.RingStable, Homes: v2.Homes}, c.ids[3])
		var ps []string
		for i := range 40 {
			ps = append(ps, fmt.Sprint("acct-", i))
		}
		write := func(key string) {
			for _, p := range ps {
				d := begin(t, other, p, key, "fp")
				if d.Outcome != idem.Execute {
					t.Fatalf("%s %s: %v", p, key, d.Outcome)
				}
				complete(t, other, d.Reservation, 201, p+key)
			}
		}
		write("v1")
		if _, err := op.Admin().Grow(bg, c.ids[2]); err != nil {
			t.Fatal(err)
		}
		write("v2-moving")
		st, _ := op.Admin().RingStatus(bg)
		clk.Advance(st.DropAt.Sub(clk.Now()))
		if _, err := op.Admin().AdvanceRing(bg); err != nil {
			t.Fatal(err)
		}
		write("v2")
		if st, err := op.Admin().Grow(bg, c.ids[3]); err != nil || st.Ring.String() != v3.String() {
			t.Fatalf("second Grow: %s %v", st.Ring, err)
		}
		write("v3-moving")
		// cut has routed by v1 all along.
		for _, p := range ps {
			for _, k := range []string{"v2-moving", "v2", "v3-moving"} {
				d := begin(t, cut, p, k, "fp")
				if d.Outcome != idem.Replay || string(d.Response.Body) != p+k {
					t.Errorf("%s %s: %v", p, k, d.Outcome)
				}
			}
			d := begin(t, cut, p, "new", "fp")
			if d.Outcome != idem.Execute {
				t.Fatalf("%s new: %v", p, d.Outcome)
			}
			if got := c.where(t, p, "new"); !slices.Equal(got, []string{v3.Home(p)}) {
				t.Errorf("%s's new key in %v, want %s", p, got, v3.Home(p))
			}
		}
		if got := mustRing(t, cut); got.String() != v3.String() {
			t.Errorf("cut routes by %s, want %s", got, v3)
		}
	})
}

// One database down, or over its limits: only the principals it holds (or
// whose new keys it would hold) are refused, with 503; the others are
// served, and a moved principal's keys at its old home still replay.
func TestShardFaultIsolation(t *testing.T) {
	var faults sync.Map // database ID -> d1local.Fault
	b := d1test.LocalConfig(t, d1local.Config{Faults: func(r d1local.Request) d1local.Fault {
		if f, ok := faults.Load(r.DatabaseID); ok {
			return f.(d1local.Fault)
		}
		return d1local.Fault{}
	}})
	fast := func(c *d1client.Config) { c.Retry = d1client.RetryPolicy{MaxAttempts: 2, BaseDelay: time.Millisecond} }
	c := newCluster(t, b, 4, fast)
	cfg := idem.Config{Heartbeat: -1}
	v1 := c.initRing(t, cfg, c.ids[:3]...)
	l := c.ledger(t, cfg)
	var runs atomic.Int64
	srv := httptest.NewServer(idemhttp.Must(l, idemhttp.Options{Principal: bearer, Timeout: 2 * time.Second})(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, "created")
		})))
	defer srv.Close()
	post := func(principal, key string) (int, string) { return postThing(t, srv, principal, key) }
	var ps []string
	for i := range 30 {
		ps = append(ps, fmt.Sprint("acct-", i))
	}
	bad := c.ids[1]
	for _, f := range []d1local.Fault{{BadGateway: true}, {Overloaded: true}, {Internal: true}} {
		faults.Store(bad, f)
		key := fmt.Sprintf("%+v", f)
		for _, p := range ps {
			status, body := post(p, key)
			switch {
			case v1.Home(p) == bad && (status != 503 || !strings.Contains(body, idemhttp.CodeLedgerUnavailable)):
				t.Errorf("%+v: %s on the faulty database: %d %s", f, p, status, body)
			case v1.Home(p) != bad && status != 201:
				t.Errorf("%+v: %s on a healthy database: %d %s", f, p, status, body)
			}
		}
	}
	faults.Delete(bad)

	// During a change, with the new database down: keys at the old homes
	// still replay; new keys of the principals moving to it are refused.
	for _, p := range ps {
		if status, _ := post(p, "before"); status != 201 {
			t.Fatalf("%s: %d", p, status)
		}
	}
	if _, err := l.Admin().Grow(bg, c.ids[3]); err != nil {
		t.Fatal(err)
	}
	v2 := mustRing(t, l)
	faults.Store(c.ids[3], d1local.Fault{BadGateway: true})
	before := runs.Load()
	for _, p := range ps {
		if status, body := post(p, "before"); status != 201 || body != "created" {
			t.Errorf("%s: replay of a key at its old home: %d %s", p, status, body)
		}
		status, _ := post(p, "after")
		if want := 201; v2.Home(p) == c.ids[3] {
			want = 503
			if status != want {
				t.Errorf("%s (moving to the faulty database): new key %d, want %d", p, status, want)
			}
		} else if status != want {
			t.Errorf("%s: new key %d, want %d", p, status, want)
		}
	}
	moved := 0
	for _, p := range ps {
		if v2.Home(p) == c.ids[3] {
			moved++
		}
	}
	if got, want := runs.Load()-before, int64(len(ps)-moved); got != want || moved == 0 {
		t.Errorf("%d executions for %d principals (%d moving to the faulty database), want %d", got, len(ps), moved, want)
	}
}

// postThing sends POST /v1/things for principal with Idempotency-Key key
// to srv, and returns the answer's status and body; a 503 must carry
// Retry-After.
func postThing(t *testing.T, srv *httptest.Server, principal, key string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/things", strings.NewReader("{}"))
	req.Header.Set("Authorization", "Bearer "+principal)
	req.Header.Set(idemhttp.HeaderKey, key)
	res, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	if res.StatusCode == http.StatusServiceUnavailable && res.Header.Get("Retry-After") == "" {
		t.Errorf("503 without Retry-After: %s", body)
	}
	return res.StatusCode, string(body)
}

// calls returns the D1 calls the cluster's clients have sent.
func (c *cluster) calls() int64 {
	var n int64
	for _, db := range c.dbs {
		n += db.Stats().Calls
	}
	return n
}

// transitionCalls measures D1 calls per request, one request at a time,
// while a ring grows from 2 to 3 databases, for moved and unmoved
// principals: first executions (Begin and Complete) and replays, during
// the change (Moving) and after it (Stable).
func transitionCalls(t testing.TB, b *d1test.Backend, principals int) map[string]float64 {
	t.Helper()
	c := newCluster(t, b, 3)
	clk := newClock()
	cfg := idem.Config{Heartbeat: -1, Clock: clk.Now}
	v1 := c.initRing(t, cfg, c.ids[0], c.ids[1])
	l := c.ledger(t, cfg)
	v2 := grown(v1, c.ids[2])
	var moved, unmoved []string
	for i := 0; len(moved) < principals || len(unmoved) < principals; i++ {
		p := fmt.Sprint("acct-", i)
		if v2.PreviousHome(p) != "" {
			if len(moved) < principals {
				moved = append(moved, p)
			}
		} else if len(unmoved) < principals {
			unmoved = append(unmoved, p)
		}
	}
	out := map[string]float64{}
	measure := func(name string, ps []string, fn func(p string)) {
		start := c.calls()
		for _, p := range ps {
			fn(p)
		}
		out[name] = float64(c.calls()-start) / float64(len(ps))
	}
	first := func(key string) func(p string) {
		return func(p string) {
			d := begin(t, l, p, key, "fp")
			if d.Outcome != idem.Execute {
				t.Fatalf("%s %s: %v", p, key, d.Outcome)
			}
			complete(t, l, d.Reservation, 201, key)
		}
	}
	replay := func(key string) func(p string) {
		return func(p string) {
			if d := begin(t, l, p, key, "fp"); d.Outcome != idem.Replay {
				t.Fatalf("%s %s: %v", p, key, d.Outcome)
			}
		}
	}
	mustRing(t, l)
	measure("stable/first", append(slices.Clone(moved), unmoved...), first("before"))
	if _, err := l.Admin().Grow(bg, c.ids[2]); err != nil {
		t.Fatal(err)
	}
	measure("moving/unmoved/first", unmoved, first("during"))
	measure("moving/unmoved/replay", unmoved, replay("during"))
	measure("moving/moved/first", moved, first("during"))
	measure("moving/moved/replay_old_home", moved, replay("before"))
	measure("moving/moved/replay_new_home", moved, replay("during"))
	st, err := l.Admin().RingStatus(bg)
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(st.DropAt.Sub(clk.Now()))
	if _, err := l.Admin().AdvanceRing(bg); err != nil {
		t.Fatal(err)
	}
	measure("stable/moved/first", moved, first("after"))
	measure("stable/moved/replay", moved, replay("after"))
	return out
}

// The cost of a change, in D1 calls per request (one at a time, so no
// call is shared): nothing for unmoved principals; for a moved principal
// one more call (the read of its old home) unless its key is at the old
// home; nothing once the change is over.
func TestShardedCallsPerRequest(t *testing.T) {
	d1test.ForEach(t, func(t *testing.T, b *d1test.Backend) {
		got := transitionCalls(t, b, 6)
		want := map[string]float64{
			"stable/first":                 2,
			"moving/unmoved/first":         2,
			"moving/unmoved/replay":        1,
			"moving/moved/first":           3,
			"moving/moved/replay_old_home": 1,
			"moving/moved/replay_new_home": 2,
			"stable/moved/first":           2,
			"stable/moved/replay":          1,
		}
		for k, w := range want {
			if got[k] != w {
				t.Errorf("%s: %v calls per request, want %v", k, got[k], w)
			}
		}
	})
}

// The ring operations refuse what would break routing, and a replica
// without a Home for a database of the ring refuses only the principals
// routed there.
func TestRingOperationsRefuse(t *testing.T) {
	b := d1test.Local(t)
	c := newCluster(t, b, 3)
	noSchema := b.NewClient(t)
	clk := newClock()
	cfg := idem.Config{Heartbeat: -1, Clock: clk.Now}

	// Several databases holding keys cannot start a ring.
	for _, id := range c.ids[:2] {
		l := newLedger(t, c.dbs[id], cfg)
		complete(t, l, begin(t, l, "p-"+id, "k", "fp").Reservation, 200, "")
	}
	if _, err := c.ledger(t, cfg, c.ids[0], c.ids[1]).Admin().InitRing(bg); err == nil || !strings.Contains(err.Error(), "holds keys") {
		t.Errorf("InitRing over databases with keys: %v", err)
	}
	v1 := c.initRing(t, cfg, c.ids[0]) // one database with keys: fine
	c.dbs[noSchema.DatabaseID()] = noSchema
	op := c.ledger(t, cfg, append(slices.Clone(c.ids), noSchema.DatabaseID())...)
	for _, tc := range []struct {
		id, want string
	}{
		{c.ids[1], "holds keys"},
		{noSchema.DatabaseID(), "no such table"},
		{c.ids[0], "already in the ring"},
		{"elsewhere", "no Home"},
	} {
		if _, err := op.Admin().Grow(bg, tc.id); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Grow(%s): %v, want %q", tc.id, err, tc.want)
		}
	}
	if _, err := op.Admin().Grow(bg); err == nil {
		t.Error("Grow of nothing")
	}
	if st, err := op.Admin().AdvanceRing(bg); err != nil || st.Ring.String() != v1.String() {
		t.Errorf("AdvanceRing on a stable ring: %s %v", st.Ring, err)
	}
	if _, err := op.Admin().Grow(bg, c.ids[2]); err != nil {
		t.Fatal(err)
	}
	// A replica that was not given the new database.
	partial := c.ledger(t, cfg, c.ids[0])
	r := mustRing(t, partial)
	moving := principal(t, func(p string) bool { return r.Home(p) == c.ids[2] })
	staying := principal(t, func(p string) bool { return r.Home(p) == c.ids[0] })
	if _, err := partial.Begin(bg, moving, "k", "fp"); !errors.Is(err, idem.ErrUnknownHome) {
		t.Errorf("a principal routed to a database the replica lacks: %v", err)
	}
	if d := begin(t, partial, staying, "k", "fp"); d.Outcome != idem.Execute {
		t.Errorf("a principal routed to a database it has: %v", d.Outcome)
	}
}

// A sharded ledger without a ring, or without a Home for a database of
// it, fails closed (503), and the log says what to do.
func TestShardedMiddlewareSaysWhatToFix(t *testing.T) {
	b := d1test.Local(t)
	c := newCluster(t, b, 2)
	var logs bytes.Buffer
	var mu sync.Mutex
	cfg := idem.Config{Heartbeat: -1, Logger: slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, nil))}
	serve := func(l *idem.Ledger, principal string) int {
		h := idemhttp.Must(l, idemhttp.Options{Principal: bearer})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
		req := httptest.NewRequest("POST", "/x", strings.NewReader("{}"))
		req.Header.Set("Authorization", "Bearer "+principal)
		req.Header.Set(idemhttp.HeaderKey, "k")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code
	}
	if code := serve(c.ledger(t, cfg), "p"); code != 503 {
		t.Errorf("no ring: %d", code)
	}
	r := c.initRing(t, cfg)
	lacking := c.ledger(t, cfg, c.ids[0])
	p := principal(t, func(p string) bool { return r.Home(p) == c.ids[1] })
	if code := serve(lacking, p); code != 503 {
		t.Errorf("a principal of a database the replica lacks: %d", code)
	}
	mu.Lock()
	out := logs.String()
	mu.Unlock()
	for _, want := range []string{"record one with Admin.InitRing", "give every replica every database of the ring", "no Home for"} {
		if !strings.Contains(out, want) {
			t.Errorf("the log does not say %q:\n%s", want, out)
		}
	}
}

// A sharded sweep with one database down deletes on the others, returns
// how many it deleted there, and names the database that failed.
func TestShardedSweepNamesAFailedHome(t *testing.T) {
	var faults sync.Map // database ID -> d1local.Fault
	b := d1test.LocalConfig(t, d1local.Config{Faults: func(r d1local.Request) d1local.Fault {
		if f, ok := faults.Load(r.DatabaseID); ok {
			return f.(d1local.Fault)
		}
		return d1local.Fault{}
	}})
	c := newCluster(t, b, 2, func(c *d1client.Config) { c.Retry = d1client.NoRetry() })
	clk := newClock()
	cfg := idem.Config{Heartbeat: -1, Clock: clk.Now}
	ring := c.initRing(t, cfg, c.ids...)
	l := c.ledger(t, cfg)
	perHome := map[string]int64{}
	for i := 0; perHome[c.ids[0]] < 2 || perHome[c.ids[1]] < 2; i++ {
		p := fmt.Sprint("acct-", i)
		d := begin(t, l, p, "k", "fp")
		complete(t, l, d.Reservation, 200, "ok")
		perHome[ring.Home(p)]++
	}
	clk.Advance(100 * 365 * 24 * time.Hour)
	bad, good := c.ids[1], c.ids[0]
	faults.Store(bad, d1local.Fault{Internal: true})
	n, err := l.Admin().Sweep(bg)
	if n != perHome[good] || err == nil || !strings.Contains(err.Error(), "home "+bad) || strings.Contains(err.Error(), "home "+good) {
		t.Fatalf("Sweep with %s down: %d, %v; want %d deleted and an error naming %s", bad, n, err, perHome[good], bad)
	}
	faults.Delete(bad)
	if n, err := l.Admin().Sweep(bg); err != nil || n != perHome[bad] {
		t.Fatalf("Sweep once %s is back: %d, %v; want %d", bad, n, err, perHome[bad])
	}
}

// Grow refuses while the current ring is missing from one of its
// databases (ErrRingIncomplete), and changes nothing; once AdvanceRing has
// recorded it there, Grow goes ahead. The database joined (it holds its
// identity) but lacks the ring, as after an InitRing whose ring write
// failed there.
func TestGrowRefusesAnIncompleteRing(t *testing.T) {
	b := d1test.Local(t)
	c := newCluster(t, b, 3)
	cfg := idem.Config{Heartbeat: -1}
	c.initRing(t, cfg, c.ids[:2]...)
	if _, err := c.dbs[c.ids[1]].Query(bg, "DELETE FROM idempotency_keys WHERE principal = '' AND key = 'd1idem:ring'"); err != nil {
		t.Fatal(err)
	}
	a := c.ledger(t, cfg).Admin()
	if _, err := a.Grow(bg, c.ids[2]); !errors.Is(err, idem.ErrRingIncomplete) {
		t.Fatalf("Grow with the ring missing from %s: %v, want ErrRingIncomplete", c.ids[1], err)
	}
	st, err := a.RingStatus(bg)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range st.Homes {
		if h.ID == c.ids[2] && h.Ring != nil {
			t.Fatalf("a refused Grow recorded a ring in %s: %v", h.ID, h.Ring)
		}
	}
	if _, err := a.AdvanceRing(bg); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Grow(bg, c.ids[2]); err != nil {
		t.Fatalf("Grow once the ring is recorded everywhere: %v", err)
	}
}
