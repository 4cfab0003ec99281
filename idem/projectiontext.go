package idem

import (
	"fmt"
	"time"

	"github.com/d1idem/d1idem/internal/human"
)

// String is the projection for an operator, in full: "in about 6.0 days at
// this rate: 100000 rows a day x 10.0 kB a row, levelling off at 30.0 GB
// within the 24h retention".
func (p Projection) String() string {
	switch {
	case p.Reason != "":
		return "not enough data to project: " + p.Reason
	case p.Reaches && p.Days == 0:
		return "reached: the database is at D1's 10 GB limit, and writes to it fail; grow the ledger (see 'd1idem ring --help')"
	case p.Reaches:
		return fmt.Sprintf("in about %s at this rate: %s a day x %s a row, levelling off at %s within the %s retention",
			days(p.Days), rows(p.RowsPerDay), human.Size(p.BytesPerRow), human.Size(p.LevelBytes), human.Duration(p.Retention))
	}
	return fmt.Sprintf("not reached at this rate: %s a day x %s a row level off at %s (%s of 10 GB) within the %s retention",
		rows(p.RowsPerDay), human.Size(p.BytesPerRow), human.Size(p.LevelBytes), percent(p.LevelBytes/D1MaxBytes), human.Duration(p.Retention))
}

// Short is the projection in a table's cell: "in about 6.0 days".
func (p Projection) Short() string {
	switch {
	case p.Reason != "":
		return "not enough data"
	case p.Reaches && p.Days == 0:
		return "reached"
	case p.Reaches:
		return "in about " + days(p.Days)
	}
	return fmt.Sprintf("not at this rate (levels off at %s of it)", percent(p.LevelBytes/D1MaxBytes))
}

// days is a number of days: "5h" under a day, "3.5 days" under ten, "41 days".
func days(d float64) string {
	switch {
	case d < 1:
		return human.Duration(time.Duration(d * float64(24*time.Hour)))
	case d < 10:
		return fmt.Sprintf("%.1f days", d)
	}
	return fmt.Sprintf("%.0f days", d)
}

// rows is a rate of rows: "1200 rows", "2.5 million rows".
func rows(n float64) string {
	if n >= 1e6 {
		return fmt.Sprintf("%.1f million rows", n/1e6)
	}
	return fmt.Sprintf("%.0f rows", n)
}

// percent is a fraction as a percentage: "12%", "0.02%".
func percent(f float64) string {
	if f < 0.01 {
		return fmt.Sprintf("%.2g%%", 100*f)
	}
	return fmt.Sprintf("%.0f%%", 100*f)
}
