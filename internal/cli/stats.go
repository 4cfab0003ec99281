package cli

import (
	"fmt"
	"sort"
	"strconv"
	"time"

	"github.com/urfave/cli/v2"

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
	a, err := admin(o, cn, idem.Config{TTL: ttl, MaxLease: ttl, Retention: retention})
	if err != nil {
		return err
	}
	st, err := a.Stats(c.Context)
	if err != nil {
		return ledgerErr("stats", err)
	}
	out := statsJSON{Database: cn.where, Keys: st.Keys, ByStatus: map[string]int64{}, TTLMS: ttl.Milliseconds(),
		Stuck: st.Stuck, RetentionMS: retention.Milliseconds(), SweepBacklog: st.SweepBacklog, SizeBytes: st.SizeBytes}
	var others []string
	for status, n := range st.ByStatus {
		out.ByStatus[string(status)] = n
		if !status.Valid() {
			others = append(others, string(status))
		}
	}
	sort.Strings(others)
	if st.Oldest != nil {
		j := summaryJSON(st.Oldest)
		out.Oldest = &j
	}
	if st.OldestStuck != nil {
		j := summaryJSON(st.OldestStuck)
		out.OldestStuck = &j
	}
	w := c.App.Writer
	if c.Bool(flagJSON) {
		return printJSON(w, out)
	}

	fields := [][2]string{
		{"database", cn.where},
		{"keys", strconv.FormatInt(out.Keys, 10)},
		{"  " + string(idem.StatusPending), strconv.FormatInt(st.ByStatus[idem.StatusPending], 10)},
		{"  " + string(idem.StatusCompleted), strconv.FormatInt(st.ByStatus[idem.StatusCompleted], 10)},
	}
	for _, s := range others {
		fields = append(fields, [2]string{"  " + display(s), strconv.FormatInt(out.ByStatus[s], 10) + " (not a status of the spec)"})
	}
	stuck := fmt.Sprintf("none without an update for longer than the %s TTL", formatDuration(ttl))
	if k := st.OldestStuck; k != nil {
		stuck = fmt.Sprintf("%d without an update for longer than the %s TTL (the oldest: %s / %s, for %s); see 'd1idem keys stuck'",
			out.Stuck, formatDuration(ttl), display(k.Principal), display(k.Key), formatDuration(k.SinceUpdate()))
	}
	fields = append(fields, [2]string{"stuck pending", stuck})
	oldestText := "-"
	if k := st.Oldest; k != nil {
		oldestText = fmt.Sprintf("%s / %s: %s, last updated %s (%s)", display(k.Principal), display(k.Key),
			display(string(k.Status)), formatAge(k.SinceUpdate()), formatTime(k.UpdatedAt))
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
