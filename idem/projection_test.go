package idem_test

import (
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/d1idem/d1idem/idem"
)

// TestProjection checks the arithmetic of the 10 GB projection: rows per
// day from the rows created within the retention over the time they span,
// bytes per row from the size, the level at which the database settles,
// and the days to the limit when that level is above it.
func TestProjection(t *testing.T) {
	now := time.Date(2026, 3, 1, 3, 0, 0, 0, time.UTC)
	const day = 24 * time.Hour
	for _, tc := range []struct {
		name      string
		st        idem.Stats
		retention time.Duration
		reason    string // a substring of Reason; "" when there is an estimate
		rowsDay   float64
		perRow    float64
		level     float64
		reaches   bool
		days      float64
	}{
		{name: "no size", st: idem.Stats{Keys: 500, Created: 500, FirstCreated: now.Add(-2 * time.Hour), AsOf: now}, retention: day,
			reason: "D1 reported no database size"},
		{name: "empty", st: idem.Stats{SizeBytes: 28672, AsOf: now}, retention: day, reason: "no rows yet"},
		{name: "too young", st: idem.Stats{SizeBytes: 1e6, Keys: 500, Created: 500, FirstCreated: now.Add(-30 * time.Minute), AsOf: now}, retention: day,
			reason: "the oldest row was created 30m ago; the rate needs 1h of writes"},
		{name: "too few", st: idem.Stats{SizeBytes: 1e6, Keys: 99, Created: 99, FirstCreated: now.Add(-3 * time.Hour), AsOf: now}, retention: day,
			reason: "99 rows created in the last 3h; the rate needs 100"},
		// Filling: 1,000 rows in the first 2 hours = 12,000 a day, at
		// 2,000 bytes a row (2 MB / 1,000 rows); over a 24h retention the
		// database settles at 12,000 x 1 x 2,000 = 24 MB: far below 10 GB.
		{name: "settles below", st: idem.Stats{SizeBytes: 2e6, Keys: 1000, Created: 1000, FirstCreated: now.Add(-2 * time.Hour), AsOf: now}, retention: day,
			rowsDay: 12000, perRow: 2000, level: 24e6},
		// 100,000 rows in the last hour = 2.4 million a day at 16,000
		// bytes a row (1.6 GB / 100,000): over a 24h retention 38.4 GB, so
		// the limit is reached: (10 GB - 1.6 GB) / (2.4e6 x 16,000 bytes a
		// day) = 8.4 / 38.4 = 0.21875 days = 5h15m.
		{name: "reaches", st: idem.Stats{SizeBytes: 1.6e9, Keys: 100000, Created: 100000, FirstCreated: now.Add(-time.Hour), AsOf: now}, retention: day,
			rowsDay: 2.4e6, perRow: 16000, level: 38.4e9, reaches: true, days: 0.21875},
		// In steady state the span is the retention (72h), whatever the
		// oldest row's age (a backlog not swept yet): 300,000 rows
		// created in 72h = 100,000 a day; 400,000 rows in 4 GB = 10,000
		// bytes a row; settles at 100,000 x 3 x 10,000 = 3 GB.
		{name: "steady", st: idem.Stats{SizeBytes: 4e9, Keys: 400000, Created: 300000, FirstCreated: now.Add(-200 * time.Hour), AsOf: now}, retention: 3 * day,
			rowsDay: 100000, perRow: 10000, level: 3e9},
		// A longer retention takes the same rate over the limit: 30 days
		// of 100,000 rows a day x 10,000 bytes = 30 GB; from 4 GB at 1 GB
		// a day: 6 days.
		{name: "long retention", st: idem.Stats{SizeBytes: 4e9, Keys: 400000, Created: 400000, FirstCreated: now.Add(-4 * day), AsOf: now}, retention: 30 * day,
			rowsDay: 100000, perRow: 10000, level: 30e9, reaches: true, days: 6},
		{name: "at the limit", st: idem.Stats{SizeBytes: 1e10, Keys: 1, Created: 1, FirstCreated: now.Add(-time.Hour), AsOf: now}, retention: day,
			reaches: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.st.Retention = tc.retention
			p := tc.st.Projection()
			b, err := json.Marshal(p)
			if err != nil {
				t.Fatal(err)
			}
			var j struct {
				LimitBytes   int64    `json:"limit_bytes"`
				Reason       *string  `json:"not_enough_data"`
				ReachesLimit bool     `json:"reaches_limit"`
				DaysToLimit  *float64 `json:"days_to_limit"`
			}
			if err := json.Unmarshal(b, &j); err != nil || j.LimitBytes != 1e10 {
				t.Fatalf("JSON %s, %v", b, err)
			}
			if tc.reason != "" {
				if !strings.Contains(p.Reason, tc.reason) || j.Reason == nil || *j.Reason != p.Reason || j.DaysToLimit != nil {
					t.Errorf("Reason %q, want %q; JSON %s", p.Reason, tc.reason, b)
				}
				return
			}
			near := func(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(1, math.Abs(b)) }
			if p.Reason != "" || !near(p.RowsPerDay, tc.rowsDay) || !near(p.BytesPerRow, tc.perRow) || !near(p.LevelBytes, tc.level) ||
				p.Reaches != tc.reaches || !near(p.Days, tc.days) {
				t.Errorf("Projection = %+v", p)
			}
			if j.ReachesLimit != tc.reaches || tc.reaches != (j.DaysToLimit != nil) || j.Reason != nil {
				t.Errorf("JSON %s", b)
			}
		})
	}
}

// TestProjectionText: the 10 GB projection for operators, in full and in a
// table's cell.
func TestProjectionText(t *testing.T) {
	for _, tc := range []struct {
		p          idem.Projection
		text, cell string
	}{
		{idem.Projection{Retention: 24 * time.Hour, Reason: "no rows yet"}, "not enough data to project: no rows yet", "not enough data"},
		{idem.Projection{Retention: 24 * time.Hour, RowsPerDay: 12000, BytesPerRow: 2000, LevelBytes: 24e6},
			"not reached at this rate: 12000 rows a day x 2.0 kB a row level off at 24.0 MB (0.24% of 10 GB) within the 24h retention", "not at this rate (levels off at 0.24% of it)"},
		{idem.Projection{Retention: 24 * time.Hour, RowsPerDay: 2.4e6, BytesPerRow: 16000, LevelBytes: 38.4e9, Reaches: true, Days: 0.21875},
			"in about 5h15m at this rate: 2.4 million rows a day x 16.0 kB a row, levelling off at 38.4 GB within the 24h retention", "in about 5h15m"},
		{idem.Projection{Retention: 24 * time.Hour, RowsPerDay: 1e5, BytesPerRow: 1e4, LevelBytes: 30e9, Reaches: true, Days: 6},
			"in about 6.0 days at this rate: 100000 rows a day x 10.0 kB a row, levelling off at 30.0 GB within the 24h retention", "in about 6.0 days"},
		{idem.Projection{Reaches: true}, "reached: the database is at D1's 10 GB limit", "reached"},
	} {
		if got := tc.p.String(); !strings.HasPrefix(got, tc.text) {
			t.Errorf("String(%+v) = %q, want %q", tc.p, got, tc.text)
		}
		if got := tc.p.Short(); got != tc.cell {
			t.Errorf("Short(%+v) = %q, want %q", tc.p, got, tc.cell)
		}
	}
}
