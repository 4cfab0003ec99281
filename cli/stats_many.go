package cli

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/internal/human"
)

// dbStats is one database's stats, or why they could not be read.
type dbStats struct {
	cn  *conn
	st  idem.Stats
	err error
}

// statsMany is stats over several databases: each one's (one D1 call
// each), and the totals.
func (o *options) statsMany(c *cli.Context, s *dbSet, ttl, retention time.Duration) error {
	per := make([]dbStats, len(s.conns))
	for i, cn := range s.conns {
		a, err := admin(o, cn, idem.Config{TTL: ttl, MaxLease: ttl, Retention: retention})
		if err != nil {
			return err
		}
		st, err := a.Stats(c.Context)
		per[i] = dbStats{cn: cn, st: st, err: cn.named(c, err)}
	}
	total := sumStats(per)
	if c.Bool(flagJSON) {
		out := statsManyJSON{statsJSON: statsJSONOf(total, s.where(), ttl, retention)}
		out.SizeLimit = nil // the limit is per database
		for _, d := range per {
			out.Databases = append(out.Databases, dbStatsJSONOf(d, ttl, retention))
		}
		if err := printJSON(c.App.Writer, out); err != nil {
			return err
		}
	} else if err := renderStatsMany(c.App.Writer, per, total, ttl, retention, statsHintsOf(c)); err != nil {
		return err
	}
	return unread(per)
}

// unread is an error naming the databases whose stats could not be read.
func unread(per []dbStats) error {
	var bad []string
	for _, d := range per {
		if d.err != nil {
			bad = append(bad, d.cn.label()+": "+describe(d.err))
		}
	}
	return couldNotRead("stats", bad)
}

// couldNotRead is cmd's error for the databases it could not read, each
// "label: cause"; nil for none.
func couldNotRead(cmd string, bad []string) error {
	if len(bad) == 0 {
		return nil
	}
	return fmt.Errorf("%s: %s could not be read: %s", cmd, plural(int64(len(bad)), "database", "databases"), strings.Join(bad, "; "))
}

// sumStats adds up the stats that could be read.
func sumStats(per []dbStats) idem.Stats {
	out := idem.Stats{ByStatus: map[idem.Status]int64{idem.StatusPending: 0, idem.StatusCompleted: 0}}
	for _, d := range per {
		if d.err != nil {
			continue
		}
		s := d.st
		out.Keys, out.Stuck, out.SweepBacklog = out.Keys+s.Keys, out.Stuck+s.Stuck, out.SweepBacklog+s.SweepBacklog
		out.SizeBytes, out.Created = out.SizeBytes+s.SizeBytes, out.Created+s.Created
		for status, n := range s.ByStatus {
			out.ByStatus[status] += n
		}
		out.Oldest, out.OldestStuck = updatedFirst(out.Oldest, s.Oldest), updatedFirst(out.OldestStuck, s.OldestStuck)
		if !s.FirstCreated.IsZero() && (out.FirstCreated.IsZero() || s.FirstCreated.Before(out.FirstCreated)) {
			out.FirstCreated = s.FirstCreated
		}
		if s.AsOf.After(out.AsOf) {
			out.AsOf = s.AsOf
		}
	}
	return out
}

// updatedFirst is the row of the two last updated longest ago; nil ones
// lose.
func updatedFirst(a, b *idem.KeyRecord) *idem.KeyRecord {
	if a == nil || (b != nil && b.UpdatedAt.Before(a.UpdatedAt)) {
		return b
	}
	return a
}

// statsManyJSON is stats --json over several databases: the totals, and
// each database.
type statsManyJSON struct {
	statsJSON
	Databases []dbStatsJSON `json:"databases"`
}

// dbStatsJSON is one database's stats: its label, its ID, and its figures
// or the error that kept them.
type dbStatsJSON struct {
	statsJSON
	ID    string  `json:"id"`
	Error *string `json:"error"`
}

func dbStatsJSONOf(d dbStats, ttl, retention time.Duration) dbStatsJSON {
	out := dbStatsJSON{statsJSON: statsJSONOf(d.st, d.cn.label(), ttl, retention), ID: d.cn.databaseID}
	if d.err != nil {
		msg := describe(d.err)
		out.Error, out.SizeLimit = &msg, nil
	}
	return out
}

// renderStatsMany writes stats over several databases for people: a row
// per database and the totals, then the totals' details.
func renderStatsMany(w io.Writer, per []dbStats, total idem.Stats, ttl, retention time.Duration, h statsHints) error {
	header := []string{"DATABASE", "KEYS", "PENDING", "COMPLETED", "AWAITING RETRY", "BACKLOG", "SIZE", "ROWS/DAY", "10 GB LIMIT"}
	var rows [][]string
	for _, d := range per {
		if d.err != nil {
			rows = append(rows, []string{d.cn.label(), "unreadable: " + describe(d.err), "", "", "", "", "", "", ""})
			continue
		}
		p := project(d.st, retention)
		rows = append(rows, append(statsRow(d.cn.label(), d.st), rateText(p), p.short()))
	}
	rows = append(rows, append(statsRow("total", total), "", ""))
	if err := printTable(w, header, rows); err != nil {
		return err
	}
	fmt.Fprintln(w)
	return printFields(w, [][2]string{
		{"awaiting retry", awaitingText(total, ttl, h)},
		{"oldest row", oldestText(total.Oldest)},
		{"sweep backlog", backlogText(total.SweepBacklog, retention, h)},
		{"10 GB limit", fmt.Sprintf("per database, at the rate its rows were created within the %s retention\n(not enough data under %d rows or %s of writes; see 'd1idem stats --help')",
			human.Duration(retention), minSampleRows, human.Duration(minSampleSpan))},
	})
}

// statsRow is a row of the table: the counts and the size.
func statsRow(label string, st idem.Stats) []string {
	return []string{label, strconv.FormatInt(st.Keys, 10), strconv.FormatInt(st.ByStatus[idem.StatusPending], 10),
		strconv.FormatInt(st.ByStatus[idem.StatusCompleted], 10), strconv.FormatInt(st.Stuck, 10),
		strconv.FormatInt(st.SweepBacklog, 10), shortBytes(float64(st.SizeBytes))}
}

// rateText is a projection's rows per day in a table's cell.
func rateText(p projection) string {
	if p.RowsPerDay == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f", p.RowsPerDay)
}
