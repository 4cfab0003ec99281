package idem_test

import (
	"errors"
	"fmt"
	"net/http"
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

		keys := func(opts idem.ListOptions) string {
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
			if got := keys(tc.opts); got != tc.want {
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

		stuck, err := a.Stuck(bg, 2)
		if err != nil || stuck.Total != 3 || len(stuck.Keys) != 2 || stuck.Keys[0].Key != "old-2" || stuck.Keys[1].Key != "order-7" {
			t.Errorf("Stuck: %+v %v", stuck, err)
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
		if b.Name == d1test.NameLocal && st.SizeBytes <= 0 {
			t.Errorf("Stats.SizeBytes = %d", st.SizeBytes)
		}

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
		if got := keys(idem.ListOptions{}); got != "order-1 order-7 order-8 pay-1" {
			t.Errorf("after the sweep: %s", got)
		}
	})
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
// is released; with it, a live pending row and a completed one too.
func TestAdminRelease(t *testing.T) {
	d1test.ForEach(t, func(t *testing.T, b *d1test.Backend) {
		db := b.NewClientSchema(t)
		clk := newClock()
		l := newLedger(t, db, idem.Config{Clock: clk.Now, Heartbeat: -1})
		a := l.Admin()
		fp := func(body string) string {
			f, _ := idem.Fingerprint("POST", "/v1/orders", http.Header{}, l.Config().FingerprintHeaders, strings.NewReader(body))
			return f
		}
		updatedAt := func(key string) (int64, int64) {
			t.Helper()
			k, err := a.Get(bg, "p", key)
			if err != nil {
				t.Fatal(err)
			}
			return k.Generation, k.UpdatedAt.UnixMilli()
		}

		// A live owner: refused without Force.
		owner := begin(t, l, "p", "k", fp("a")).Reservation
		clk.Advance(10 * time.Second)
		res, err := a.Release(bg, "p", "k", 1, idem.ReleaseOptions{})
		if err != nil || res.Released || res.Before.Stuck || res.Generation != 1 {
			t.Fatalf("release of a live owner: %+v %v", res, err)
		}
		// Stuck: released, at the next generation, TTL + 1ms in the past.
		clk.Advance(idem.DefaultTTL)
		res, err = a.Release(bg, "p", "k", 1, idem.ReleaseOptions{})
		if err != nil || !res.Released || !res.Before.Stuck || res.Before.Generation != 1 || res.Generation != 2 {
			t.Fatalf("release of a stuck key: %+v %v", res, err)
		}
		if gen, at := updatedAt("k"); gen != 2 || at != clk.Now().Add(-idem.DefaultTTL-time.Millisecond).UnixMilli() {
			t.Errorf("released row: generation %d, updated_at %d", gen, at)
		}
		// The fence: the old generation is refused, and the old owner's
		// writes match nothing.
		if res, err := a.Release(bg, "p", "k", 1, idem.ReleaseOptions{Force: true}); err != nil || res.Released || res.Generation != 2 {
			t.Errorf("release of a superseded generation: %+v %v", res, err)
		}
		if ok, err := l.Renew(bg, owner); ok || err != nil {
			t.Errorf("the released owner renewed: %v %v", ok, err)
		}
		// The same request takes it over at once; another is refused.
		if d := begin(t, l, "p", "k", fp("b")); d.Outcome != idem.Reused {
			t.Errorf("another request after the release: %v", d.Outcome)
		}
		d := begin(t, l, "p", "k", fp("a"))
		if d.Outcome != idem.Execute || d.Reservation.Generation != 3 {
			t.Fatalf("retry after the release: %+v", d)
		}
		if c := complete(t, l, owner, 201, "old owner"); c.Stored {
			t.Error("the released owner's completion was stored")
		}
		// A live owner with Force: released; its completion is fenced out.
		res, err = a.Release(bg, "p", "k", 3, idem.ReleaseOptions{Force: true})
		if err != nil || !res.Released || res.Generation != 4 {
			t.Fatalf("forced release: %+v %v", res, err)
		}
		if c := complete(t, l, d.Reservation, 201, "forced out"); c.Stored {
			t.Error("a force-released owner's completion was stored")
		}
		// A completed row: refused without Force; with it, its response is
		// forgotten and the same request executes again, one generation on.
		d = begin(t, l, "p", "k", fp("a"))
		if d.Outcome != idem.Execute || d.Reservation.Generation != 5 || !complete(t, l, d.Reservation, 201, "first").Stored {
			t.Fatalf("%+v", d)
		}
		if res, err := a.Release(bg, "p", "k", 5, idem.ReleaseOptions{}); err != nil || res.Released || res.Before.Status != idem.StatusCompleted {
			t.Fatalf("release of a completed row without Force: %+v %v", res, err)
		}
		res, err = a.Release(bg, "p", "k", 5, idem.ReleaseOptions{Force: true})
		if err != nil || !res.Released || res.Before.Status != idem.StatusCompleted || res.Generation != 6 {
			t.Fatalf("forced release of a completed row: %+v %v", res, err)
		}
		k, _ := a.Get(bg, "p", "k")
		if k.Status != idem.StatusPending || k.ResponseStatus != nil || k.ResponseBody != nil || k.ResponseHeaders != nil || !k.Stuck {
			t.Errorf("after resetting a completed row: %+v", k)
		}
		if d := begin(t, l, "p", "k", fp("a")); d.Outcome != idem.Execute || d.Reservation.Generation != 7 {
			t.Errorf("retry after resetting a completed row: %+v", d)
		}
		if _, err := a.Release(bg, "p", "nope", 1, idem.ReleaseOptions{Force: true}); !errors.Is(err, idem.ErrKeyNotFound) {
			t.Errorf("release of a missing key: %v", err)
		}
		// Nothing ever deleted the row.
		res2, _ := db.Query(bg, "SELECT count(*) FROM idempotency_keys")
		if n, _ := res2.Rows[0][0].Int64(); n != 1 {
			t.Errorf("%d rows", n)
		}
	})
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
