package cli

import (
	"fmt"
	"io"
	"sort"
	"strconv"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/d1idem/d1idem/idem"
)

func statsCommand(o *options) *cli.Command {
	return &cli.Command{
		Name:  "stats",
		Usage: "counts by status, keys awaiting retry, the oldest row, the sweep backlog and the database size",
		Description: `Summarises the ledger in one D1 call (a read-only batch): how many keys are
pending and completed, how many pending keys are past --ttl, awaiting the retry
that takes them over (their owner died, or they were released), the oldest row,
the sweep backlog (rows last updated more than --retention ago) and the
database size D1 reports. Counting reads the whole table, which D1 bills as
rows read.

   d1idem stats
   d1idem stats --ttl 1m --retention 48h --json`,
		Flags: append([]cli.Flag{
			ttlFlag(),
			&cli.DurationFlag{Name: "retention", Value: idem.DefaultRetention, Usage: "the retention the sweep uses: rows last updated more than `DURATION` ago are its backlog"},
			jsonFlag(),
		}, connFlags()...),
		Action: o.stats,
	}
}

func (o *options) stats(c *cli.Context) error {
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
	return withConn(c, o, existing, func(cn *conn) error {
		a, err := admin(o, cn, idem.Config{TTL: ttl, MaxLease: ttl, Retention: retention})
		if err != nil {
			return err
		}
		st, err := a.Stats(c.Context)
		if err != nil {
			return ledgerErr("stats", err)
		}
		out := statsJSONOf(st, cn.where, ttl, retention)
		if c.Bool(flagJSON) {
			return printJSON(c.App.Writer, out)
		}
		return renderStats(c.App.Writer, st, out)
	})
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

func statsJSONOf(st idem.Stats, where string, ttl, retention time.Duration) statsJSON {
	out := statsJSON{Database: where, Keys: st.Keys, ByStatus: map[string]int64{}, TTLMS: ttl.Milliseconds(),
		Stuck: st.Stuck, RetentionMS: retention.Milliseconds(), SweepBacklog: st.SweepBacklog, SizeBytes: st.SizeBytes}
	for status, n := range st.ByStatus {
		out.ByStatus[string(status)] = n
	}
	if st.Oldest != nil {
		j := summaryJSON(st.Oldest, leaseOf(ttl, 0))
		out.Oldest = &j
	}
	if st.OldestStuck != nil {
		j := summaryJSON(st.OldestStuck, leaseOf(ttl, 0))
		out.OldestStuck = &j
	}
	return out
}

// renderStats writes stats for people, from the ledger's stats and their
// JSON form (which carries the database, TTL and retention).
func renderStats(w io.Writer, st idem.Stats, out statsJSON) error {
	ttl, retention := time.Duration(out.TTLMS)*time.Millisecond, time.Duration(out.RetentionMS)*time.Millisecond
	fields := [][2]string{
		{"database", out.Database},
		{"keys", strconv.FormatInt(out.Keys, 10)},
		{"  " + string(idem.StatusPending), strconv.FormatInt(st.ByStatus[idem.StatusPending], 10)},
		{"  " + string(idem.StatusCompleted), strconv.FormatInt(st.ByStatus[idem.StatusCompleted], 10)},
	}
	var others []string
	for status := range st.ByStatus {
		if !status.Valid() {
			others = append(others, string(status))
		}
	}
	sort.Strings(others)
	for _, s := range others {
		fields = append(fields, [2]string{"  " + display(s), strconv.FormatInt(out.ByStatus[s], 10) + " (not a status the ledger writes)"})
	}
	fields = append(fields, [2]string{"awaiting retry", awaitingText(st, ttl)}, [2]string{"oldest row", oldestText(st.Oldest)},
		[2]string{"sweep backlog", backlogText(out.SweepBacklog, retention)}, [2]string{"database size", formatBytes(out.SizeBytes)})
	return printFields(w, fields)
}

// awaitingText describes the pending rows past the TTL.
func awaitingText(st idem.Stats, ttl time.Duration) string {
	k := st.OldestStuck
	if k == nil {
		return fmt.Sprintf("none: no pending key is past the %s TTL", formatDuration(ttl))
	}
	return fmt.Sprintf("%d pending past the %s TTL, taken over by their next retry (the oldest: %s / %s, updated %s); see 'd1idem keys stuck'",
		st.Stuck, formatDuration(ttl), display(k.Principal), display(k.Key), formatAge(k.SinceUpdate()))
}

func oldestText(k *idem.KeyRecord) string {
	if k == nil {
		return "-"
	}
	return fmt.Sprintf("%s / %s: %s, last updated %s (%s)", display(k.Principal), display(k.Key),
		display(string(k.Status)), formatAge(k.SinceUpdate()), formatTime(k.UpdatedAt))
}

func backlogText(n int64, retention time.Duration) string {
	if n == 0 {
		return fmt.Sprintf("none older than the %s retention", formatDuration(retention))
	}
	them := "them"
	if n == 1 {
		them = "it"
	}
	return fmt.Sprintf("%s older than the %s retention: 'd1idem sweep --all' deletes %s", plural(n, "row", "rows"), formatDuration(retention), them)
}
