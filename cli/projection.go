package cli

import (
	"fmt"
	"time"

	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/internal/human"
)

// d1MaxBytes is D1's limit on the size of one database: 10 GB (10^10
// bytes), which cannot be raised.
const d1MaxBytes = 10_000_000_000

// The least sample the write rate is measured from.
const (
	minSampleRows = 100
	minSampleSpan = time.Hour
)

// projection is when a database would reach D1's size limit at the rate
// its rows are being written. The estimate: rows per day are the rows
// created within the retention, over the time they span (the retention, or
// less when the oldest row is younger); bytes per row are the database's
// size over its rows (an overestimate, since the size includes SQLite's
// fixed pages and any other table). Rows stay for the retention after
// their last update, so at that rate the database levels off at rows per
// day x the retention in days x bytes per row; while it fills up to that,
// it grows by rows per day x bytes per row a day. If it levels off above
// the limit, the days to the limit are what is left of it over that
// growth; if below, it never reaches the limit at this rate.
type projection struct {
	// Reason says why there is no estimate: too few rows, too short a
	// span, or no size reported. "" when there is one.
	Reason      string
	RowsPerDay  float64
	BytesPerRow float64
	// LevelBytes is the size at which the database levels off at this
	// rate.
	LevelBytes float64
	// Reaches reports that it reaches the limit, in Days (0: it has).
	Reaches bool
	Days    float64
}

// project estimates when a database with these stats reaches D1's size
// limit, rows staying for retention.
func project(st idem.Stats, retention time.Duration) projection {
	switch {
	case st.SizeBytes <= 0:
		return projection{Reason: "D1 reported no database size"}
	case st.SizeBytes >= d1MaxBytes:
		return projection{Reaches: true}
	case st.Keys == 0 || st.FirstCreated.IsZero():
		return projection{Reason: "no rows yet"}
	}
	span := min(retention, st.AsOf.Sub(st.FirstCreated))
	switch {
	case span < minSampleSpan:
		return projection{Reason: fmt.Sprintf("the oldest row was created %s ago; the rate needs %s of writes", human.Duration(max(span, 0)), human.Duration(minSampleSpan))}
	case st.Created < minSampleRows:
		return projection{Reason: fmt.Sprintf("%s created in the last %s; the rate needs %d", plural(st.Created, "row", "rows"), human.Duration(span), minSampleRows)}
	}
	day := 24 * time.Hour
	p := projection{
		RowsPerDay:  float64(st.Created) * float64(day) / float64(span),
		BytesPerRow: float64(st.SizeBytes) / float64(st.Keys),
	}
	p.LevelBytes = p.RowsPerDay * float64(retention) / float64(day) * p.BytesPerRow
	if p.LevelBytes >= d1MaxBytes {
		p.Reaches = true
		p.Days = (d1MaxBytes - float64(st.SizeBytes)) / (p.RowsPerDay * p.BytesPerRow)
	}
	return p
}

// text is the projection for people, in full.
func (p projection) text(retention time.Duration) string {
	switch {
	case p.Reason != "":
		return "not enough data to project: " + p.Reason
	case p.Reaches && p.Days == 0:
		return "reached: the database is at D1's 10 GB limit, and writes to it fail; grow the ledger (see 'd1idem ring --help')"
	case p.Reaches:
		return fmt.Sprintf("in about %s at this rate: %s a day x %s a row, levelling off at %s within the %s retention",
			formatDays(p.Days), rowsText(p.RowsPerDay), shortBytes(p.BytesPerRow), shortBytes(p.LevelBytes), human.Duration(retention))
	}
	return fmt.Sprintf("not reached at this rate: %s a day x %s a row level off at %s (%s of 10 GB) within the %s retention",
		rowsText(p.RowsPerDay), shortBytes(p.BytesPerRow), shortBytes(p.LevelBytes), percent(p.LevelBytes/d1MaxBytes), human.Duration(retention))
}

// short is the projection in a table's cell.
func (p projection) short() string {
	switch {
	case p.Reason != "":
		return "not enough data"
	case p.Reaches && p.Days == 0:
		return "reached"
	case p.Reaches:
		return "in about " + formatDays(p.Days)
	}
	return fmt.Sprintf("not at this rate (levels off at %s of it)", percent(p.LevelBytes/d1MaxBytes))
}

// projectionJSON is a projection under --json.
type projectionJSON struct {
	LimitBytes   int64    `json:"limit_bytes"`
	Reason       *string  `json:"not_enough_data"`
	RowsPerDay   *float64 `json:"rows_per_day"`
	BytesPerRow  *float64 `json:"bytes_per_row"`
	LevelBytes   *float64 `json:"level_bytes"`
	ReachesLimit bool     `json:"reaches_limit"`
	DaysToLimit  *float64 `json:"days_to_limit"`
}

func (p projection) json() projectionJSON {
	out := projectionJSON{LimitBytes: d1MaxBytes, ReachesLimit: p.Reaches}
	if p.Reason != "" {
		out.Reason = &p.Reason
		return out
	}
	if p.Reaches {
		out.DaysToLimit = &p.Days
	}
	if p.RowsPerDay > 0 {
		out.RowsPerDay, out.BytesPerRow, out.LevelBytes = &p.RowsPerDay, &p.BytesPerRow, &p.LevelBytes
	}
	return out
}

// formatDays is a number of days for people: "5h" under a day, "3.5 days"
// under ten, "41 days".
func formatDays(d float64) string {
	switch {
	case d < 1:
		return human.Duration(time.Duration(d * float64(24*time.Hour)))
	case d < 10:
		return fmt.Sprintf("%.1f days", d)
	}
	return fmt.Sprintf("%.0f days", d)
}

// rowsText is a rate of rows: "1200 rows", "2.5 million rows".
func rowsText(n float64) string {
	if n >= 1e6 {
		return fmt.Sprintf("%.1f million rows", n/1e6)
	}
	return fmt.Sprintf("%.0f rows", n)
}

// shortBytes is a size with a decimal prefix, as D1's limit is stated:
// "812 bytes", "1.5 kB", "9.8 GB".
func shortBytes(n float64) string {
	for _, u := range []struct {
		size float64
		name string
	}{{1e9, "GB"}, {1e6, "MB"}, {1e3, "kB"}} {
		if n >= u.size {
			return fmt.Sprintf("%.1f %s", n/u.size, u.name)
		}
	}
	return fmt.Sprintf("%.0f bytes", n)
}

// percent is a fraction as a percentage: "12%", "0.02%".
func percent(f float64) string {
	if f < 0.01 {
		return fmt.Sprintf("%.2g%%", 100*f)
	}
	return fmt.Sprintf("%.0f%%", 100*f)
}
