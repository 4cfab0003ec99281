package idem_test

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/internal/d1test"
)

// seedRow inserts a ledger row last written age before now (created twice
// as long ago).
func seedRow(t *testing.T, db *d1client.Client, now time.Time, principal, key, status string, gen int64, age time.Duration, respStatus any, headers, body any) {
	t.Helper()
	_, err := db.Query(bg, `INSERT INTO idempotency_keys (principal, key, fingerprint, status, generation, response_status, response_body, response_headers, created_at, updated_at)
VALUES (?, ?, 'fp', ?, ?, ?, ?, ?, ?, ?)`, principal, key, status, gen, respStatus, body, headers, now.Add(-2*age).UnixMilli(), now.Add(-age).UnixMilli())
	if err != nil {
		t.Fatal(err)
	}
}

// The administrative reads, on both backends, with the ledger's clock:
// one key, filtered and paginated lists, stuck keys, the sweep backlog and
// the summary.
func TestAdminReads(t *testing.T) {
	d1test.ForEach(t, func(t *testing.T, b *d1test.Backend) {
		db := b.NewClientSchema(t)
		clk := newClock()
		now := clk.Now()
		seedRow(t, db, now, "acct_42", "order-7", "pending", 1, 12*time.Minute, nil, nil, nil)
		seedRow(t, db, now, "acct_42", "order-8", "pending", 2, 5*time.Minute, nil, nil, nil)
		seedRow(t, db, now, "acct_7", "pay-1", "pending", 1, 5*time.Second, nil, nil, nil)
		seedRow(t, db, now, "acct_42", "order-1", "completed", 1, 2*time.Hour, 201, `{"content-type":"application/json","location":"/v1/orders/17"}`, `{"id":17}`)
		seedRow(t, db, now, "acct_9", "old-1", "completed", 1, 73*time.Hour, 200, `{}`, "ok")
		seedRow(t, db, now, "acct_9", "old-2", "pending", 3, 30*time.Hour, nil, nil, nil)
		a := newLedger(t, db, idem.Config{Clock: clk.Now}).Admin()

		checkAdminGet(t, a, now)
		checkAdminList(t, a)
		checkAdminStats(t, a, now, b.Name == d1test.NameLocal)

		// The sweep deletes the two rows past the 24h retention, and only
		// them.
		if n, err := a.SweepBacklog(bg); err != nil || n != 2 {
			t.Errorf("SweepBacklog = %d, %v", n, err)
		}
		if n, err := a.Sweep(bg); err != nil || n != 2 {
			t.Errorf("Sweep = %d, %v", n, err)
		}
		if n, err := a.Sweep(bg); err != nil || n != 0 {
			t.Errorf("second Sweep = %d, %v", n, err)
		}
		if got := listKeys(t, a, idem.ListOptions{}); got != "order-1 order-7 order-8 pay-1" {
			t.Errorf("after the sweep: %s", got)
		}
	})
}

// checkAdminGet checks Admin.Get on TestAdminReads's rows: a completed
// key with its response, a stuck one, a live one and a missing one.
func checkAdminGet(t *testing.T, a *idem.Admin, now time.Time) {
	t.Helper()
	k, err := a.Get(bg, "acct_42", "order-1")
	if err != nil {
		t.Fatal(err)
	}
	h, herr := k.StoredHeaders()
	if k.Status != idem.StatusCompleted || k.Generation != 1 || *k.ResponseStatus != 201 || *k.ResponseBody != `{"id":17}` ||
		h["location"] != "/v1/orders/17" || herr != nil || !k.AsOf.Equal(now) || k.SinceUpdate() != 2*time.Hour || k.Age() != 4*time.Hour || k.Stuck {
		t.Errorf("Get: %+v %v %v", k, h, herr)
	}
	if k, _ := a.Get(bg, "acct_42", "order-7"); !k.Stuck || k.Fingerprint != "fp" || k.ResponseStatus != nil {
		t.Errorf("Get of a stuck key: %+v", k)
	}
	if k, _ := a.Get(bg, "acct_7", "pay-1"); k.Stuck {
		t.Errorf("a key updated 5s ago is stuck: %+v", k)
	}
	if _, err := a.Get(bg, "acct_42", "nope"); !errors.Is(err, idem.ErrKeyNotFound) {
		t.Errorf("Get of a missing key: %v", err)
	}
}

// listKeys returns the keys of the first page List gives for opts,
// space-separated.
func listKeys(t *testing.T, a *idem.Admin, opts idem.ListOptions) string {
	t.Helper()
	page, err := a.List(bg, opts)
	if err != nil {
		t.Fatalf("List(%+v): %v", opts, err)
	}
	var out []string
	for _, k := range page.Keys {
		out = append(out, k.Key)
	}
	return strings.Join(out, " ")
}

// checkAdminList checks Admin.List on TestAdminReads's rows: its filters,
// its pages, and the options and cursors it refuses.
func checkAdminList(t *testing.T, a *idem.Admin) {
	t.Helper()
	for _, tc := range []struct {
		opts idem.ListOptions
		want string
	}{
		{idem.ListOptions{}, "old-1 old-2 order-1 order-7 order-8 pay-1"},
		{idem.ListOptions{Principal: "acct_42"}, "order-1 order-7 order-8"},
		{idem.ListOptions{Status: idem.StatusPending}, "old-2 order-7 order-8 pay-1"},
		{idem.ListOptions{Status: idem.StatusCompleted, Principal: "acct_9"}, "old-1"},
		{idem.ListOptions{OlderThan: 10 * time.Minute}, "old-1 old-2 order-1 order-7"},
		{idem.ListOptions{OlderThan: 24 * time.Hour, Status: idem.StatusPending}, "old-2"},
		{idem.ListOptions{Principal: "nobody"}, ""},
	} {
		if got := listKeys(t, a, tc.opts); got != tc.want {
			t.Errorf("List(%+v) = %q, want %q", tc.opts, got, tc.want)
		}
	}
	// Pages of 4: a cursor, then the rest and none.
	first, err := a.List(bg, idem.ListOptions{Limit: 4})
	if err != nil || len(first.Keys) != 4 || first.NextCursor == "" {
		t.Fatalf("first page: %+v %v", first, err)
	}
	rest, err := a.List(bg, idem.ListOptions{Limit: 4, Cursor: first.NextCursor})
	if err != nil || len(rest.Keys) != 2 || rest.Keys[0].Key != "order-8" || rest.NextCursor != "" {
		t.Fatalf("second page: %+v %v", rest, err)
	}
	for _, bad := range []idem.ListOptions{{Cursor: first.NextCursor + "x"}, {Limit: -1}, {Limit: idem.MaxListLimit + 1}, {Status: "done"}, {OlderThan: -time.Second}} {
		if _, err := a.List(bg, bad); err == nil {
			t.Errorf("List(%+v) accepted", bad)
		}
	}
	if _, err := a.List(bg, idem.ListOptions{Cursor: "v1.bogus.12345678"}); !errors.Is(err, idem.ErrBadCursor) {
		t.Errorf("a bad cursor: %v", err)
	}
}

// checkAdminStats checks the stuck keys (as List gives them) and
// Admin.Stats on TestAdminReads's rows; the database's size is checked
// where the backend reports it (local).
func checkAdminStats(t *testing.T, a *idem.Admin, now time.Time, local bool) {
	t.Helper()
	stuck, err := a.List(bg, idem.ListOptions{Status: idem.StatusPending, OlderThan: idem.DefaultTTL, Limit: 2})
	if err != nil || len(stuck.Keys) != 2 || stuck.Keys[0].Key != "old-2" || stuck.Keys[1].Key != "order-7" || !stuck.Keys[0].Stuck || stuck.NextCursor == "" {
		t.Errorf("stuck keys: %+v %v", stuck, err)
	}

	st, err := a.Stats(bg)
	if err != nil {
		t.Fatal(err)
	}
	if st.Keys != 6 || st.ByStatus[idem.StatusPending] != 4 || st.ByStatus[idem.StatusCompleted] != 2 || st.Stuck != 3 ||
		st.SweepBacklog != 2 || st.Oldest == nil || st.Oldest.Key != "old-1" || st.OldestStuck == nil || st.OldestStuck.Key != "old-2" {
		t.Errorf("Stats: %+v", st)
	}
	// Created within the 24h retention: order-7, order-8, pay-1 and
	// order-1 (created twice their age ago); the oldest, old-1, 146h ago.
	if st.Created != 4 || !st.FirstCreated.Equal(now.Add(-146*time.Hour).Truncate(time.Millisecond)) || !st.AsOf.Equal(now) {
		t.Errorf("Stats: Created %d, FirstCreated %v, AsOf %v", st.Created, st.FirstCreated, st.AsOf)
	}
	if local && st.SizeBytes <= 0 {
		t.Errorf("Stats.SizeBytes = %d", st.SizeBytes)
	}
}

// With D1's clock (no Clock configured) the reads carry D1's time.
func TestAdminD1Clock(t *testing.T) {
	db := d1test.Local(t).NewClientSchema(t)
	now := time.Now()
	seedRow(t, db, now, "p", "stuck", "pending", 1, 10*time.Minute, nil, nil, nil)
	a := newLedger(t, db, idem.Config{}).Admin()
	k, err := a.Get(bg, "p", "stuck")
	if err != nil || !k.Stuck || k.AsOf.Before(now.Add(-time.Minute)) || k.AsOf.After(time.Now().Add(time.Minute)) {
		t.Fatalf("%+v %v", k, err)
	}
}

// Admin.Release applies the one release rule: fenced by generation, the
// row moves one generation on and its last update is set to the TTL plus
// one millisecond ago; it is never deleted. Without Force only a stuck row
// is released; with it, a live pending row and a completed one too, but
// not a completed one with PendingOnly.
func TestAdminRelease(t *testing.T) {
	d1test.ForEach(t, func(t *testing.T, b *d1test.Backend) {
		db := b.NewClientSchema(t)
		clk := newClock()
		l := newLedger(t, db, idem.Config{Clock: clk.Now, Heartbeat: -1})
		r := releaseRun{l: l, a: l.Admin(), clk: clk}

		owner := r.releaseOnlyStuck(t)
		d := r.releaseFences(t, owner)
		// A live owner with Force: released; its completion is fenced out.
		res, err := r.a.Release(bg, "p", "k", 3, idem.ReleaseOptions{Force: true})
		if err != nil || !res.Released || res.Generation != 4 {
			t.Fatalf("forced release: %+v %v", res, err)
		}
		if c := complete(t, l, d.Reservation, 201, "forced out"); c.Stored {
			t.Error("a force-released owner's completion was stored")
		}
		r.releaseCompleted(t)
		if _, err := r.a.Release(bg, "p", "nope", 1, idem.ReleaseOptions{Force: true}); !errors.Is(err, idem.ErrKeyNotFound) {
			t.Errorf("release of a missing key: %v", err)
		}
		// Nothing ever deleted the row.
		res2, _ := db.Query(bg, "SELECT count(*) FROM idempotency_keys")
		if n, _ := res2.Rows[0][0].Int64(); n != 1 {
			t.Errorf("%d rows", n)
		}
	})
}

// releaseRun is TestAdminRelease's ledger, its administrative API and its
// clock; the steps release key "k" of principal "p".
type releaseRun struct {
	l   *idem.Ledger
	a   *idem.Admin
	clk *clock
}

// fp is the fingerprint of a POST /v1/orders with this body.
func (r releaseRun) fp(body string) string {
	f, _ := idem.Fingerprint("POST", "/v1/orders", http.Header{}, r.l.Config().FingerprintHeaders, strings.NewReader(body))
	return f
}

// updatedAt returns the generation and the last update (ms) of key's row.
func (r releaseRun) updatedAt(t *testing.T, key string) (int64, int64) {
	t.Helper()
	k, err := r.a.Get(bg, "p", key)
	if err != nil {
		t.Fatal(err)
	}
	return k.Generation, k.UpdatedAt.UnixMilli()
}

// releaseOnlyStuck claims the key and checks that a release without Force
// refuses its live owner, and releases it once it is stuck: at the next
// generation, its last update TTL + 1ms in the past. It returns the
// released owner's reservation.
func (r releaseRun) releaseOnlyStuck(t *testing.T) *idem.Reservation {
	t.Helper()
	owner := begin(t, r.l, "p", "k", r.fp("a")).Reservation
	r.clk.Advance(10 * time.Second)
	res, err := r.a.Release(bg, "p", "k", 1, idem.ReleaseOptions{})
	if err != nil || res.Released || res.Before.Stuck || res.Generation != 1 {
		t.Fatalf("release of a live owner: %+v %v", res, err)
	}
	r.clk.Advance(idem.DefaultTTL)
	res, err = r.a.Release(bg, "p", "k", 1, idem.ReleaseOptions{})
	if err != nil || !res.Released || !res.Before.Stuck || res.Before.Generation != 1 || res.Generation != 2 {
		t.Fatalf("release of a stuck key: %+v %v", res, err)
	}
	if gen, at := r.updatedAt(t, "k"); gen != 2 || at != r.clk.Now().Add(-idem.DefaultTTL-time.Millisecond).UnixMilli() {
		t.Errorf("released row: generation %d, updated_at %d", gen, at)
	}
	return owner
}

// releaseFences checks the fence after a release of owner's generation 1:
// the old generation is refused, and the old owner's writes match nothing;
// the same request takes the key over at once (generation 3, which it
// returns), another is refused.
func (r releaseRun) releaseFences(t *testing.T, owner *idem.Reservation) idem.Decision {
	t.Helper()
	if res, err := r.a.Release(bg, "p", "k", 1, idem.ReleaseOptions{Force: true}); err != nil || res.Released || res.Generation != 2 {
		t.Errorf("release of a superseded generation: %+v %v", res, err)
	}
	if ok, err := r.l.Renew(bg, owner); ok || err != nil {
		t.Errorf("the released owner renewed: %v %v", ok, err)
	}
	if d := begin(t, r.l, "p", "k", r.fp("b")); d.Outcome != idem.Reused {
		t.Errorf("another request after the release: %v", d.Outcome)
	}
	d := begin(t, r.l, "p", "k", r.fp("a"))
	if d.Outcome != idem.Execute || d.Reservation.Generation != 3 {
		t.Fatalf("retry after the release: %+v", d)
	}
	if c := complete(t, r.l, owner, 201, "old owner"); c.Stored {
		t.Error("the released owner's completion was stored")
	}
	return d
}

// releaseCompleted completes the key at generation 5 and checks that a
// release without Force refuses the completed row; with it, its response
// is forgotten and the same request executes again, one generation on.
func (r releaseRun) releaseCompleted(t *testing.T) {
	t.Helper()
	d := begin(t, r.l, "p", "k", r.fp("a"))
	if d.Outcome != idem.Execute || d.Reservation.Generation != 5 || !complete(t, r.l, d.Reservation, 201, "first").Stored {
		t.Fatalf("%+v", d)
	}
	if res, err := r.a.Release(bg, "p", "k", 5, idem.ReleaseOptions{}); err != nil || res.Released || res.Before.Status != idem.StatusCompleted {
		t.Fatalf("release of a completed row without Force: %+v %v", res, err)
	}
	if res, err := r.a.Release(bg, "p", "k", 5, idem.ReleaseOptions{Force: true, PendingOnly: true}); err != nil || res.Released || res.Before.Status != idem.StatusCompleted {
		t.Fatalf("forced release of a completed row, pending only: %+v %v", res, err)
	}
	res, err := r.a.Release(bg, "p", "k", 5, idem.ReleaseOptions{Force: true})
	if err != nil || !res.Released || res.Before.Status != idem.StatusCompleted || res.Generation != 6 {
		t.Fatalf("forced release of a completed row: %+v %v", res, err)
	}
	k, _ := r.a.Get(bg, "p", "k")
	if k.Status != idem.StatusPending || k.ResponseStatus != nil || k.ResponseBody != nil || k.ResponseHeaders != nil || !k.Stuck {
		t.Errorf("after resetting a completed row: %+v", k)
	}
	if d := begin(t, r.l, "p", "k", r.fp("a")); d.Outcome != idem.Execute || d.Reservation.Generation != 7 {
		t.Errorf("retry after resetting a completed row: %+v", d)
	}
}

// Ledger.Release and Admin.Release are one rule: the same statement, the
// same resulting row.
func TestOneReleaseRule(t *testing.T) {
	db := d1test.Local(t).NewClientSchema(t)
	clk := newClock()
	l := newLedger(t, db, idem.Config{Clock: clk.Now, Heartbeat: -1, TTL: 7 * time.Second})
	byOwner := begin(t, l, "p", "owner", "fp").Reservation
	begin(t, l, "p", "admin", "fp")
	clk.Advance(8 * time.Second)
	if ok, err := l.Release(bg, byOwner); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if res, err := l.Admin().Release(bg, "p", "admin", 1, idem.ReleaseOptions{}); !res.Released || err != nil {
		t.Fatal(res, err)
	}
	rows, err := db.Query(bg, "SELECT key, status, generation, updated_at, response_status IS NULL FROM idempotency_keys ORDER BY key")
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("pending 2 %d 1", clk.Now().Add(-7*time.Second-time.Millisecond).UnixMilli())
	for _, r := range rows.Rows {
		var key, status string
		var gen, at, null int64
		if err := r.Scan(&key, &status, &gen, &at, &null); err != nil {
			t.Fatal(err)
		}
		if got := fmt.Sprintf("%s %d %d %d", status, gen, at, null); got != want {
			t.Errorf("%s released to %s, want %s", key, got, want)
		}
	}
}

// TestOtherStatuses: the statuses the ledger does not write, sorted; the
// spec's two are never among them.
func TestOtherStatuses(t *testing.T) {
	st := idem.Stats{ByStatus: map[idem.Status]int64{idem.StatusPending: 3, idem.StatusCompleted: 0, "weird": 1, "\x1b[2Jdone": 2, "Pending": 1}}
	if got := st.OtherStatuses(); !slices.Equal(got, []idem.Status{"\x1b[2Jdone", "Pending", "weird"}) {
		t.Errorf("OtherStatuses = %q", got)
	}
	if got := (idem.Stats{}).OtherStatuses(); got != nil {
		t.Errorf("OtherStatuses of no rows = %q", got)
	}
}
