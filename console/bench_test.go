package console

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/internal/d1test"
)

// fill inserts rows keys into the ledger in one statement (a recursive
// CTE): principals acct_0 to acct_999, last updated 50 ms apart up to now
// (a million rows span 14 hours, inside the retention), all completed but
// every 100,000th, pending; then one more pending key, acct_quiet/k,
// updated quietAge ago.
func fill(tb testing.TB, db *d1client.Client, rows int, quietAge time.Duration) {
	tb.Helper()
	now := time.Now().UnixMilli()
	_, err := db.Query(context.Background(), `WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?2)
INSERT INTO idempotency_keys (principal, key, fingerprint, status, generation, response_status, response_body, response_headers, created_at, updated_at)
SELECT 'acct_' || (i % 1000), 'key-' || i, 'fp', CASE WHEN i % 100000 = 0 THEN 'pending' ELSE 'completed' END, 1,
       CASE WHEN i % 100000 = 0 THEN NULL ELSE 200 END, CASE WHEN i % 100000 = 0 THEN NULL ELSE '{"ok":true}' END,
       CASE WHEN i % 100000 = 0 THEN NULL ELSE '{}' END, ?1 - 60000 - (?2 - i) * 50, ?1 - 60000 - (?2 - i) * 50 FROM n`, now, rows)
	if err != nil {
		tb.Fatal(err)
	}
	_, err = db.Query(context.Background(), `INSERT INTO idempotency_keys (principal, key, fingerprint, status, generation, created_at, updated_at)
VALUES ('acct_quiet', 'k', 'fp', 'pending', 1, ?1, ?1)`, time.Now().Add(-quietAge).UnixMilli())
	if err != nil {
		tb.Fatal(err)
	}
}

// BenchmarkPageCalls: the D1 calls of each page view, at 10 rows and at a
// million, with the console's reads checked for full scans (EXPLAIN QUERY
// PLAN on the statements they sent). d1-calls/view is the figure the
// page's footer shows; ns/op is a page view on d1local on this machine.
// The overview reads afresh each view (no refresh, so no shared read).
//
// Beside the pages, keys_deep_offset_naive reads the same deep page as
// keys_deep the naive way, by LIMIT and OFFSET: one D1 call too, but SQLite
// steps over every row before the page, where the cursor seeks to it.
// keys_pending filters on status, which no index holds: the page walks the
// updated_at index until it has a page of pending keys, or to the end when
// there are fewer (at a million rows with 11 pending, it reads them all);
// the overview's stuck keys are such a read, next to its counts, which read
// every row.
//
//	go test -run '^$' -bench BenchmarkPageCalls -benchtime 3x ./console/
func BenchmarkPageCalls(b *testing.B) {
	for _, rows := range []int{10, 1_000_000} {
		b.Run(fmt.Sprintf("rows=%d", rows), func(b *testing.B) {
			rec := &recorder{}
			db := d1test.Local(b).NewClientSchema(b, rec.install)
			// A TTL of 10 minutes: acct_quiet/k, updated 8 minutes ago,
			// stays owner-quiet (past 2 heartbeats of 200 s, inside the
			// TTL) for the whole run.
			fill(b, db, rows, 8*time.Minute)
			l, err := idem.New(db, idem.Config{TTL: 10 * time.Minute})
			if err != nil {
				b.Fatal(err)
			}
			h, err := New(Config{Ledger: l, Databases: []Database{{Name: "orders", Client: db}}, AllowRelease: true, Refresh: -1})
			if err != nil {
				b.Fatal(err)
			}
			deep := middleCursor(b, l.Admin(), rows)
			for _, pg := range []struct{ name, path string }{
				{"overview", "/"},
				{"keys", "/keys"},
				{"keys_deep", "/keys?cursor=" + deep},
				{"keys_deep_offset_naive", ""},
				{"keys_of_a_principal", "/keys?principal=acct_7"},
				{"keys_pending", "/keys?status=pending"},
				{"lookup", fmt.Sprintf("/key?principal=acct_%d&key=key-%d", (rows/2)%1000, rows/2)},
				{"release_confirmation", "/release?principal=acct_quiet&key=k&generation=1"},
			} {
				b.Run(pg.name, func(b *testing.B) {
					view := func() { offsetPage(b, db, rows/2) }
					if pg.path != "" {
						view = func() { getPage(b, h, pg.path) }
					}
					rec.take()
					before := db.Stats().Calls
					for b.Loop() {
						view()
					}
					b.ReportMetric(float64(db.Stats().Calls-before)/float64(b.N), "d1-calls/view")
					for _, p := range explain(b, db, rec.take()) {
						if p.scans() && (pg.name != "overview" || !statsSQL(p.sql)) {
							b.Errorf("%s scans the ledger table:\n%s", pg.name, p)
						}
					}
				})
			}
		})
	}
}

// getPage views a page of the console h, which must answer 200.
func getPage(b *testing.B, h http.Handler, path string) {
	req := httptest.NewRequest(http.MethodGet, path, nil)
	req.Host = "127.0.0.1"
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	if w.Code != http.StatusOK {
		b.Fatalf("GET %s: %d\n%s", path, w.Code, w.Body)
	}
}

// offsetPage reads the page of the keys page's rows that starts offset rows
// in, the naive way: LIMIT and OFFSET, in one D1 call.
func offsetPage(b *testing.B, db *d1client.Client, offset int) {
	res, err := db.Query(context.Background(), `SELECT principal, key, status, generation, response_status, created_at, updated_at
FROM idempotency_keys WHERE principal <> '' ORDER BY updated_at, principal, key LIMIT ? OFFSET ?`, idem.DefaultListLimit+1, offset)
	if err != nil || len(res.Rows) == 0 {
		b.Fatalf("the page at offset %d: %v, %d rows", offset, err, len(res.Rows))
	}
}

// middleCursor pages through half of the ledger's rows and returns the
// cursor there.
func middleCursor(tb testing.TB, a *idem.Admin, rows int) string {
	tb.Helper()
	opts := idem.ListOptions{Limit: min(idem.MaxListLimit, max(1, rows/2))}
	for read := 0; read < rows/2; read += opts.Limit {
		page, err := a.List(context.Background(), opts)
		if err != nil {
			tb.Fatal(err)
		}
		if opts.Cursor = page.NextCursor; opts.Cursor == "" {
			tb.Fatal("the ledger ended before its middle")
		}
	}
	return strings.Clone(opts.Cursor)
}
