package idem_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1client/budget"
	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/internal/d1test"
)

// Explain gives each state its reason, what the next retry gets and what
// to do, with the generations of one story: a quiet owner's key released
// at generation 1 is taken over by the retry at generation 3, and the
// released row (generation 2) says so too.
func TestExplain(t *testing.T) {
	db := d1test.Local(t).NewClientSchema(t)
	clk := newClock()
	now := clk.Now()
	seedRow(t, db, now, "p", "live", "pending", 1, 5*time.Second, nil, nil, nil)
	// Claimed 25s ago, renewed by nobody since.
	if _, err := db.Query(bg, `INSERT INTO idempotency_keys (principal, key, fingerprint, status, generation, created_at, updated_at)
VALUES ('p', 'quiet', 'fp', 'pending', 1, ?, ?)`, now.Add(-25*time.Second).UnixMilli(), now.Add(-25*time.Second).UnixMilli()); err != nil {
		t.Fatal(err)
	}
	seedRow(t, db, now, "p", "old", "pending", 2, 5*time.Minute, nil, nil, nil)
	seedRow(t, db, now, "p", "done", "completed", 1, time.Hour, 201, `{}`, "ok")
	seedRow(t, db, now, "p", "odd", "weird", 1, time.Hour, nil, nil, nil)
	a := newLedger(t, db, idem.Config{Clock: clk.Now, Heartbeat: 10 * time.Second}).Admin()
	if a.QuietAfter() != 20*time.Second {
		t.Errorf("QuietAfter = %v", a.QuietAfter())
	}
	for _, tc := range []struct {
		key        string
		state      idem.KeyState
		reason     string
		next       string
		remedy     string
		release    *idem.ReleaseAdvice
		generation int64
	}{
		{"live", idem.KeyInFlight, "last updated 5s ago, within the 30s TTL", "until it completes, or until 30s without an update", "renews the row every 10s): wait", nil, 2},
		{"quiet", idem.KeyOwnerQuiet, "no update for 25s (a live owner renews every 10s), inside the 30s TTL", "until the TTL has passed, in 5s",
			"release the key (at generation 1, with force", &idem.ReleaseAdvice{Generation: 1, Force: true}, 3},
		{"old", idem.KeyAwaitingRetry, "past the 30s TTL (released, or its owner stopped renewing it)", "takes the key over (generation 3)", "Nothing needs releasing.", nil, 3},
		{"done", idem.KeyCompleted, "retries replay the stored response", "until the sweep deletes the row (24h after its last update)", "", nil, 0},
		{"odd", idem.KeyUnknown, "not a status the ledger writes", "", "", nil, 0},
	} {
		k, err := a.Get(bg, "p", tc.key)
		if err != nil {
			t.Fatal(err)
		}
		e := a.Explain(&k)
		if k.State != tc.state || e.State != tc.state || e.Reason != tc.reason || !strings.Contains(e.Next, tc.next) || !strings.Contains(e.Remedy, tc.remedy) ||
			(e.Release == nil) != (tc.release == nil) || e.Release != nil && *e.Release != *tc.release || e.TakeoverGeneration != tc.generation {
			t.Errorf("%s: state %s, %+v", tc.key, k.State, e)
		}
	}

	// The quiet key, released as its explanation says, is awaiting retry at
	// generation 2, released, and its retry takes it over at generation 3.
	res, err := a.Release(bg, "p", "quiet", 1, idem.ReleaseOptions{Force: true})
	if err != nil || !res.Released || res.Generation != 2 {
		t.Fatalf("Release = %+v, %v", res, err)
	}
	clk.Advance(4 * time.Second)
	k, err := a.Get(bg, "p", "quiet")
	if err != nil {
		t.Fatal(err)
	}
	e := a.Explain(&k)
	if !k.Released() || e.State != idem.KeyAwaitingRetry || e.TakeoverGeneration != 3 || !strings.Contains(e.Next, "(generation 3)") ||
		e.Reason != "released 4s ago (a release sets the last update one TTL, 30s, back)" {
		t.Errorf("after the release: released %v, %+v", k.Released(), e)
	}
	if k, _ := a.Get(bg, "p", "old"); k.Released() {
		t.Errorf("a row updated after its creation reads as released")
	}
}

// A KeyRecord's, a ReleaseResult's and a Stats' JSON keep the field names
// and encodings of d1idem's --json: times in UTC with milliseconds and as
// Unix milliseconds, ages and durations in milliseconds.
func TestAdminJSON(t *testing.T) {
	db := d1test.Local(t).NewClientSchema(t)
	clk := newClock()
	now := clk.Now()
	seedRow(t, db, now, "p", "done", "completed", 1, time.Hour, 201, `{"location":"/v1/x"}`, "ok")
	seedRow(t, db, now, "p", "stuck", "pending", 1, time.Hour, nil, nil, nil)
	a := newLedger(t, db, idem.Config{Clock: clk.Now}).Admin()
	k, err := a.Get(bg, "p", "done")
	if err != nil {
		t.Fatal(err)
	}
	checkJSON(t, k, `{"principal":"p","key":"done","fingerprint":"fp","status":"completed","state":"completed","generation":1,"response_status":201,`+
		`"response_headers_raw":"{\"location\":\"/v1/x\"}","response_body":"ok","stuck":false,"created_at":"2025-12-31T22:00:00.000Z","created_at_ms":1767218400000,`+
		`"updated_at":"2025-12-31T23:00:00.000Z","updated_at_ms":1767222000000,"age_ms":7200000,"since_update_ms":3600000,"response_headers":{"location":"/v1/x"},"response_body_bytes":2}`)
	if k, _ := a.Get(bg, "p", "stuck"); !strings.Contains(jsonOf(t, k), `"response_status":null,"stuck":true,`) {
		t.Errorf("a pending row's JSON: %s", jsonOf(t, k))
	}
	seedRow(t, db, now, "p", "bare", "completed", 1, time.Hour, 204, `{}`, nil)
	if k, _ := a.Get(bg, "p", "bare"); !strings.Contains(jsonOf(t, k), `"response_headers":{}`) || strings.Contains(jsonOf(t, k), "response_body_bytes") {
		t.Errorf("a completed row without headers or body: %s", jsonOf(t, k))
	}
	res, err := a.Release(bg, "p", "stuck", 1, idem.ReleaseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	checkJSON(t, res, `{"released":true,"to_generation":2,"forced":false,"principal":"p","key":"stuck","from_generation":1,"takeover_generation":3,"action":"expired",`+
		`"from_status":"pending","status":"pending","state":"awaiting_retry","since_update_ms":3600000,"age_ms":7200000}`)
	st, err := a.Stats(bg)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	b, _ := json.Marshal(st)
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	for field, want := range map[string]any{"keys": 3.0, "stuck": 1.0, "sweep_backlog": 0.0, "ttl_ms": 30000.0, "retention_ms": 86400000.0} {
		if m[field] != want {
			t.Errorf("Stats JSON %s = %v, want %v: %s", field, m[field], want, b)
		}
	}
	if o, ok := m["oldest"].(map[string]any); !ok || o["key"] != "bare" || m["oldest_stuck"].(map[string]any)["key"] != "stuck" || m["by_status"].(map[string]any)["pending"] != 1.0 {
		t.Errorf("Stats JSON: %s", b)
	}
}

func jsonOf(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func checkJSON(t *testing.T, v any, want string) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil || string(b) != want {
		t.Errorf("JSON:\n got %s, %v\nwant %s", b, err, want)
	}
}

// Overview reads every database a sharded ledger was given, with no ring
// recorded, and keeps going past one it cannot read: that one has its
// error, and the total is the others'.
func TestOverview(t *testing.T) {
	b := d1test.Local(t)
	c := newCluster(t, b, 2)
	now := newClock()
	for _, id := range c.ids {
		seedRow(t, c.dbs[id], now.Now(), "p-"+id, "k", "completed", 1, time.Hour, 201, `{}`, "ok")
	}
	gone := b.NewClient(t) // a database without the ledger's table
	homes := []idem.Home{{DB: c.dbs[c.ids[0]]}, {DB: c.dbs[c.ids[1]]}, {ID: "gone", DB: gone}}
	l, err := idem.NewSharded(homes, idem.Config{Clock: now.Now})
	if err != nil {
		t.Fatal(err)
	}
	ov, err := l.Admin().Overview(bg)
	if err != nil || len(ov.Homes) != 3 || ov.Total.Keys != 2 || ov.Total.ByStatus[idem.StatusCompleted] != 2 {
		t.Fatalf("Overview = %+v, %v", ov, err)
	}
	for _, h := range ov.Homes {
		if bad := h.Home == "gone"; bad != (h.Err != nil) || !bad && h.Stats.Keys != 1 {
			t.Errorf("home %s: %+v", h.Home, h)
		}
	}
	if err := ov.Err(); err == nil || !errors.Is(err, d1client.ErrSQL) || !strings.Contains(err.Error(), "home gone") {
		t.Errorf("Overview.Err = %v", err)
	}
}

// SweepAll sweeps every database the ledger was given, batch by batch in
// turn, until each backlog is clear or MaxBatches; a dry run counts them;
// Progress hears each batch.
func TestSweepAll(t *testing.T) {
	c := newCluster(t, d1test.Local(t), 2)
	clk := newClock()
	for i, id := range c.ids {
		for j := range 4 + 3*i { // 4 and 7 rows past the 24h retention
			seedRow(t, c.dbs[id], clk.Now(), id, string(rune('a'+j)), "completed", 1, 25*time.Hour, 200, `{}`, "ok")
		}
		seedRow(t, c.dbs[id], clk.Now(), id, "fresh", "completed", 1, time.Hour, 200, `{}`, "ok")
	}
	a := c.ledger(t, idem.Config{Clock: clk.Now, SweepBatch: 3}).Admin()
	dry, err := a.SweepAll(bg, idem.SweepOptions{DryRun: true})
	if err != nil || dry.Backlog != 11 || *dry.Homes[0].Backlog != 4 || *dry.Homes[1].Backlog != 7 || dry.Deleted != 0 {
		t.Fatalf("dry run: %+v, %v", dry, err)
	}
	one, err := a.SweepAll(bg, idem.SweepOptions{MaxBatches: 1})
	if err != nil || one.Deleted != 6 || one.Batches != 2 || one.Complete {
		t.Fatalf("one batch each: %+v, %v", one, err)
	}
	var heard []idem.SweepProgress
	all, err := a.SweepAll(bg, idem.SweepOptions{Progress: func(p idem.SweepProgress) { heard = append(heard, p) }})
	// Left: 1 and 4 rows; batches of 3: a (1, short), b (3), b (1, short).
	if err != nil || all.Deleted != 5 || all.Batches != 3 || !all.Complete || all.Homes[0].Batches != 1 || all.Homes[1].Deleted != 4 || len(heard) != 3 || heard[2].Deleted != 5 {
		t.Fatalf("until clear: %+v, %v; progress %+v", all, err, heard)
	}
	for _, id := range c.ids {
		if keys := c.keys(t, id); len(keys) != 1 {
			t.Errorf("%s keeps %v", id, keys)
		}
	}
}

// SweepAll says before a batch how long it waits for the API budget, and
// names the database that failed.
func TestSweepAllBudgetAndFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := d1test.InProcess(t, d1local.Config{})
		db := b.NewClientSchema(t, func(c *d1client.Config) { c.Budget = budget.New(3, time.Minute) })
		clk := newClock()
		for j := range 5 {
			seedRow(t, db, clk.Now(), "p", string(rune('a'+j)), "completed", 1, 25*time.Hour, 200, `{}`, "ok")
		}
		a := newLedger(t, db, idem.Config{Clock: clk.Now, SweepBatch: 1}).Admin()
		var waits int
		res, err := a.SweepAll(bg, idem.SweepOptions{Progress: func(p idem.SweepProgress) {
			if p.Wait > 0 {
				waits++
			}
		}})
		if err != nil || res.Deleted != 5 || !res.Complete || waits == 0 {
			t.Errorf("SweepAll = %+v, %v; %d waits announced", res, err, waits)
		}
		gone := newLedger(t, b.NewClient(t), idem.Config{Clock: clk.Now}).Admin()
		_, err = gone.SweepAll(bg, idem.SweepOptions{})
		var he *idem.HomeError
		if !errors.As(err, &he) || !errors.Is(err, d1client.ErrSQL) {
			t.Errorf("SweepAll on a database without the table: %v", err)
		}
	})
}

// Stuck splits the pending keys whose owner has gone quiet by the TTL,
// counts each group, and keeps the oldest of each up to the limit.
func TestStuck(t *testing.T) {
	db := d1test.Local(t).NewClientSchema(t)
	clk := newClock()
	now := clk.Now()
	seedRow(t, db, now, "p", "live", "pending", 1, 5*time.Second, nil, nil, nil)
	seedRow(t, db, now, "p", "quiet-1", "pending", 1, 25*time.Second, nil, nil, nil)
	seedRow(t, db, now, "p", "quiet-2", "pending", 1, 22*time.Second, nil, nil, nil)
	seedRow(t, db, now, "p", "old", "pending", 2, time.Hour, nil, nil, nil)
	seedRow(t, db, now, "p", "done", "completed", 1, time.Hour, 201, `{}`, "ok")
	a := newLedger(t, db, idem.Config{Clock: clk.Now, Heartbeat: 10 * time.Second}).Admin()
	st, err := a.Stuck(bg, 1)
	if err != nil || st.NOwnerQuiet != 2 || st.NAwaitingRetry != 1 || len(st.OwnerQuiet) != 1 || st.OwnerQuiet[0].Key != "quiet-1" ||
		len(st.AwaitingRetry) != 1 || st.AwaitingRetry[0].Key != "old" || st.Partial || st.QuietAfter != 20*time.Second {
		t.Fatalf("Stuck = %+v, %v", st, err)
	}
	b, _ := json.Marshal(st)
	for _, want := range []string{`"ttl_ms":30000,"quiet_after_ms":20000,"total":3,"owner_quiet":2,"awaiting_retry":1,"partial":false,"keys":[{`, `"key":"quiet-1"`, `"key":"old"`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("JSON lacks %s: %s", want, b)
		}
	}
	if _, err := a.Stuck(bg, 0); err == nil {
		t.Error("Stuck with limit 0 accepted")
	}
}

// TestKeyStateWords: a state reads as words in a sentence or a table.
func TestKeyStateWords(t *testing.T) {
	for s, want := range map[idem.KeyState]string{idem.KeyAwaitingRetry: "awaiting retry", idem.KeyOwnerQuiet: "owner quiet", idem.KeyCompleted: "completed", idem.KeyUnknown: "unknown status"} {
		if got := s.Words(); got != want {
			t.Errorf("%s.Words() = %q, want %q", s, got, want)
		}
	}
}
