package cli

import (
	"fmt"
	"strconv"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/d1idem/d1idem"
	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/idem"
)

func statsCommand(o *options) *cli.Command {
	return &cli.Command{
		Name:  "stats",
		Usage: "counts by status, stuck keys, the oldest row, the sweep backlog and the database size",
		Description: `Summarises the ledger in one D1 call (a read-only batch): how many keys are
pending and completed, how many pending keys are stuck (no update for longer
than --ttl), the oldest row, the sweep backlog (rows last updated more than
--retention ago) and the database size D1 reports. Counting reads the whole
table, which D1 bills as rows read.

   d1idem stats
   d1idem stats --ttl 1m --retention 48h --json`,
		Flags: append([]cli.Flag{
			ttlFlag(),
			&cli.DurationFlag{Name: "retention", Value: idem.DefaultRetention, Usage: "the retention the sweep uses: rows last updated more than `DURATION` ago are its backlog"},
			jsonFlag(),
		}, connFlags()...),
		Action: func(c *cli.Context) error {
			if err := noArgs(c); err != nil {
				return err
			}
			ttl, err := positiveDuration(c, "ttl")
			if err != nil {
				return err
			}
			retention, err := positiveDuration(c, "retention")
			if err != nil {
				return err
			}
			return withConn(c, o, func(cn *conn) error { return stats(c, o, cn, ttl, retention) })
		},
	}
}

// statsJSON is stats --json.
type statsJSON struct {
	Database     string           `json:"database"`
	Keys         int64            `json:"keys"`
	ByStatus     map[string]int64 `json:"by_status"`
	TTLMS        int64            `json:"ttl_ms"`
	Stuck        int64            `json:"stuck"`
	OldestStuck  *keySummaryJSON  `json:"oldest_stuck"`
	Oldest       *keySummaryJSON  `json:"oldest"`
	RetentionMS  int64            `json:"retention_ms"`
	SweepBacklog int64            `json:"sweep_backlog"`
	SizeBytes    int64            `json:"size_bytes"`
}

func stats(c *cli.Context, o *options, cn *conn, ttl, retention time.Duration) error {
	t := d1idem.Table
	byStatus := newQuery(o).add("SELECT status, count(*) FROM " + t + " GROUP BY status ORDER BY status")
	counts := newQuery(o).add("SELECT (SELECT count(*) FROM "+t+" WHERE status = 'pending' AND updated_at < ").now().add(" - ?)", ttl.Milliseconds()).
		add(", (SELECT count(*) FROM "+t+" WHERE updated_at < ").now().add(" - ?)", retention.Milliseconds())
	oldest := newQuery(o).add("SELECT " + summaryColumns + ", ").now().add(" FROM " + t + " ORDER BY updated_at, principal, key LIMIT 1")
	oldestStuck := newQuery(o).add("SELECT "+summaryColumns+", ").now().
		add(" FROM "+t+" WHERE status = 'pending' AND updated_at < ").now().add(" - ? ORDER BY updated_at, principal, key LIMIT 1", ttl.Milliseconds())
	res, err := cn.db.Exec(c.Context, []d1client.Statement{byStatus.statement(), counts.statement(), oldest.statement(), oldestStuck.statement()})
	if err != nil {
		return fmt.Errorf("stats: %w", err)
	}
	out := statsJSON{Database: cn.where, ByStatus: map[string]int64{"pending": 0, "completed": 0}, TTLMS: ttl.Milliseconds(),
		RetentionMS: retention.Milliseconds(), SizeBytes: res[0].Meta.SizeAfter}
	var statuses []string
	for _, r := range res[0].Rows {
		var status string
		var n int64
		if err := r.Scan(&status, &n); err != nil {
			return fmt.Errorf("stats: reading the counts: %w", err)
		}
		if _, ok := out.ByStatus[status]; !ok {
			statuses = append(statuses, status)
		}
		out.ByStatus[status] = n
		out.Keys += n
	}
	if err := res[1].Rows[0].Scan(&out.Stuck, &out.SweepBacklog); err != nil {
		return fmt.Errorf("stats: reading the counts: %w", err)
	}
	var oldestRow, stuckRow *keyRow
	for i, dst := range []**keyRow{&oldestRow, &stuckRow} {
		if rows := res[2+i].Rows; len(rows) > 0 {
			k, err := scanSummary(rows[0])
			if err != nil {
				return fmt.Errorf("stats: reading a row: %w", err)
			}
			*dst = &k
		}
	}
	if oldestRow != nil {
		j := oldestRow.summaryJSON(ttl)
		out.Oldest = &j
	}
	if stuckRow != nil {
		j := stuckRow.summaryJSON(ttl)
		out.OldestStuck = &j
	}
	w := c.App.Writer
	if c.Bool(flagJSON) {
		return printJSON(w, out)
	}

	fields := [][2]string{
		{"database", cn.where},
		{"keys", strconv.FormatInt(out.Keys, 10)},
		{"  pending", strconv.FormatInt(out.ByStatus["pending"], 10)},
		{"  completed", strconv.FormatInt(out.ByStatus["completed"], 10)},
	}
	for _, s := range statuses {
		fields = append(fields, [2]string{"  " + display(s), strconv.FormatInt(out.ByStatus[s], 10) + " (not a status of the spec)"})
	}
	stuck := fmt.Sprintf("none without an update for longer than the %s TTL", formatDuration(ttl))
	if stuckRow != nil {
		stuck = fmt.Sprintf("%d without an update for longer than the %s TTL (the oldest: %s / %s, for %s); see 'd1idem keys stuck'",
			out.Stuck, formatDuration(ttl), display(stuckRow.Principal), display(stuckRow.Key), formatDuration(stuckRow.sinceUpdate()))
	}
	fields = append(fields, [2]string{"stuck pending", stuck})
	oldestText := "-"
	if oldestRow != nil {
		oldestText = fmt.Sprintf("%s / %s: %s, last updated %s (%s)", display(oldestRow.Principal), display(oldestRow.Key),
			display(oldestRow.Status), formatAge(oldestRow.sinceUpdate()), formatUTC(oldestRow.UpdatedAt))
	}
	fields = append(fields, [2]string{"oldest row", oldestText})
	backlog := fmt.Sprintf("none older than the %s retention", formatDuration(retention))
	if out.SweepBacklog > 0 {
		them := "them"
		if out.SweepBacklog == 1 {
			them = "it"
		}
		backlog = fmt.Sprintf("%s older than the %s retention: 'd1idem sweep --all' deletes %s",
			plural(out.SweepBacklog, "row", "rows"), formatDuration(retention), them)
	}
	fields = append(fields, [2]string{"sweep backlog", backlog}, [2]string{"database size", formatBytes(out.SizeBytes)})
	return printFields(w, fields)
}
