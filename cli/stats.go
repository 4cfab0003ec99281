package cli

import (
	"fmt"
	"io"
	"sort"
	"strconv"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/internal/human"
)

func statsCommand(o *options) *cli.Command {
	return &cli.Command{
		Name:  "stats",
		Usage: "counts by status, keys awaiting retry, the oldest row, the sweep backlog, the database size and when it reaches 10 GB",
		Description: `Summarises the ledger in one D1 call per database (a read-only batch): how many
keys are pending and completed, how many pending keys are past --ttl, awaiting
the retry that takes them over (their owner died, or they were released), the
oldest row, the sweep backlog (rows last updated more than --retention ago), the
database size D1 reports, and when the database would reach D1's limit of 10 GB
a database. Counting reads the whole table, which D1 bills as rows read.

The 10 GB projection is an estimate at the current write rate. Rows per day are
the rows created within the retention, over the time they span (less than the
retention while the oldest row is younger); bytes per row are the database size
over its rows (an overestimate: the size includes SQLite's own pages and any
other table). Rows stay for the retention after their last update, so at that
rate the database levels off at rows per day x retention x bytes per row, and
until then grows by rows per day x bytes per row a day: if it levels off above
10 GB, the days to the limit are what is left of it over that growth; if below,
it does not reach the limit at this rate. Under 100 rows or an hour of writes it
says there is not enough data. Pass the application's --retention.

With several databases (--database or --database-id repeated, or
--databases-prefix) it shows each database, the totals, and each database's
projection: the limit is per database.

With --watch it refreshes every --interval until Ctrl-C, redrawn in place on a
terminal, one block per interval elsewhere, and with --json one JSON object per
line; each refresh adds the Cloudflare account's API budget as the last
response's Ratelimit headers gave it. It watches one database.

   d1idem stats
   d1idem stats --ttl 1m --retention 48h --json
   d1idem stats --databases-prefix ledger-
   d1idem stats --watch --interval 10s`,
		Flags: append([]cli.Flag{
			ttlFlag(),
			&cli.DurationFlag{Name: "retention", Value: idem.DefaultRetention, Usage: "the retention the sweep uses: rows last updated more than `DURATION` ago are its backlog"},
			jsonFlag(),
		}, append(watchFlags(), connFlags()...)...),
		Action: o.stats,
	}
}

func (o *options) stats(c *cli.Context) error {
	ttl, retention, err := ledgerFlags(c)
	if err != nil {
		return err
	}
	interval, err := watchInterval(c)
	if err != nil {
		return err
	}
	return withDatabases(c, o, existing, func(cn *conn) error {
		a, err := admin(o, cn, idem.Config{TTL: ttl, MaxLease: ttl, Retention: retention})
		if err != nil {
			return err
		}
		if c.Bool(flagWatch) {
			base := statsJSONOf(idem.Stats{}, cn.where, ttl, retention)
			base.hints = statsHintsOf(c)
			return o.watchStats(c, a, cn, base, interval)
		}
		st, err := a.Stats(c.Context)
		if err != nil {
			return ledgerErr("stats", err)
		}
		out := statsJSONOf(st, cn.where, ttl, retention)
		out.hints = statsHintsOf(c)
		if c.Bool(flagJSON) {
			return printJSON(c.App.Writer, out)
		}
		return renderStats(c.App.Writer, st, out)
	}, func(s *dbSet) error {
		if c.Bool(flagWatch) {
			return usagef("--watch watches one database; name one, or leave --watch out to see all %d", len(s.conns))
		}
		return o.statsMany(c, s, ttl, retention)
	})
}

// ptr returns a pointer to a copy of v.
func ptr[T any](v T) *T { return &v }

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
	// SizeLimit projects when the database reaches D1's 10 GB limit.
	SizeLimit *projectionJSON `json:"size_limit,omitempty"`

	hints statsHints // for people only
}

// statsHints are the commands the stats view suggests, with the flags that
// make them run as they are when pasted.
type statsHints struct{ stuck, sweep string }

// statsHintsOf repeats the command line's connection flags, and the
// lease's or the retention that the suggested command takes.
func statsHintsOf(c *cli.Context) statsHints {
	h := connHint(c)
	return statsHints{stuck: "d1idem keys stuck" + h + setDurations(c, "ttl"), sweep: "d1idem sweep --all" + h + setDurations(c, "retention")}
}

func statsJSONOf(st idem.Stats, where string, ttl, retention time.Duration) statsJSON {
	out := statsJSON{Database: where, Keys: st.Keys, ByStatus: map[string]int64{}, TTLMS: ttl.Milliseconds(),
		Stuck: st.Stuck, RetentionMS: retention.Milliseconds(), SweepBacklog: st.SweepBacklog, SizeBytes: st.SizeBytes,
		SizeLimit: ptr(project(st, retention).json())}
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
	return printFields(w, statsFields(st, out))
}

// statsFields are the lines of the stats view, as printFields takes them.
func statsFields(st idem.Stats, out statsJSON) [][2]string {
	ttl, retention := time.Duration(out.TTLMS)*time.Millisecond, time.Duration(out.RetentionMS)*time.Millisecond
	fields := [][2]string{
		{"ledger on", out.Database}, // "database orders", "local database ...", "orders-db (...)"
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
	fields = append(fields, [2]string{"awaiting retry", awaitingText(st, ttl, out.hints)}, [2]string{"oldest row", oldestText(st.Oldest)},
		[2]string{"sweep backlog", backlogText(out.SweepBacklog, retention, out.hints)}, [2]string{"database size", formatBytes(out.SizeBytes)},
		[2]string{"10 GB limit", project(st, retention).text(retention)})
	return fields
}

// awaitingText describes the pending rows past the TTL.
func awaitingText(st idem.Stats, ttl time.Duration, h statsHints) string {
	k := st.OldestStuck
	if k == nil {
		return fmt.Sprintf("none: no pending key is past the %s TTL", human.Duration(ttl))
	}
	return fmt.Sprintf("%d pending past the %s TTL, taken over by their next retry (the oldest: %s / %s, updated %s); see '%s'",
		st.Stuck, human.Duration(ttl), display(k.Principal), display(k.Key), human.Age(k.SinceUpdate()), h.stuck)
}

func oldestText(k *idem.KeyRecord) string {
	if k == nil {
		return "-"
	}
	return fmt.Sprintf("%s / %s: %s, last updated %s (%s)", display(k.Principal), display(k.Key),
		display(string(k.Status)), human.Age(k.SinceUpdate()), human.Time(k.UpdatedAt))
}

func backlogText(n int64, retention time.Duration, h statsHints) string {
	if n == 0 {
		return fmt.Sprintf("none older than the %s retention", human.Duration(retention))
	}
	them := "them"
	if n == 1 {
		them = "it"
	}
	return fmt.Sprintf("%s older than the %s retention: '%s' deletes %s", plural(n, "row", "rows"), human.Duration(retention), h.sweep, them)
}
