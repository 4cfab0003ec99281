package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/d1idem/d1idem/d1client/budget"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/internal/human"
	"github.com/d1idem/d1idem/internal/textsafe"
)

func statsCommand(o *options) *cli.Command {
	return &cli.Command{
		Name:        "stats",
		Usage:       "counts by status, keys awaiting retry, the oldest row, the sweep backlog, the database size and when it reaches 10 GB",
		Description: help("stats"),
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
	return o.withSet(c, existing, func(s *dbSet) error {
		l, err := o.ledger(s, idem.Config{TTL: ttl, MaxLease: ttl, Retention: retention}, false)
		if err != nil {
			return err
		}
		v := statsView{set: s, hints: statsHintsOf(c)}
		if c.Bool(flagWatch) {
			if !s.one() {
				return usagef("--watch watches one database; name one, or leave --watch out to see all %d", len(s.conns))
			}
			return o.watchStats(c, l.Admin(), v, interval)
		}
		ov, err := l.Admin().Overview(c.Context)
		if err != nil {
			return ledgerErr("stats", err)
		}
		if s.one() && ov.Homes[0].Err != nil {
			return ledgerErr("stats", ov.Homes[0].Err)
		}
		if err := v.print(c.App.Writer, ov, c.Bool(flagJSON)); err != nil {
			return err
		}
		return v.set.couldNotRead(c, "stats", func(id string) error {
			return ov.Homes[slices.IndexFunc(ov.Homes, func(h idem.HomeStats) bool { return h.Home == id })].Err
		})
	})
}

// statsView writes stats: one database's fields, or a table of several; or JSON.
type statsView struct {
	set   *dbSet
	hints statsHints
}

// statsHints are the commands the stats view suggests, ready to paste.
type statsHints struct{ stuck, sweep string }

// statsHintsOf repeats the connection, TTL and retention flags for the hints.
func statsHintsOf(c *cli.Context) statsHints {
	h := connHint(c)
	return statsHints{stuck: "d1idem keys stuck" + h + setDurations(c, "ttl"), sweep: "d1idem sweep --all" + h + setDurations(c, "retention")}
}

func (v statsView) print(w io.Writer, ov idem.Overview, asJSON bool) error {
	switch {
	case asJSON && v.set.one():
		return printObject(w, v.oneJSON(ov.Homes[0].Stats)...)
	case asJSON:
		return printObject(w, field{"database", v.set.where()}, ov.Total, field{"databases", v.homesJSON(ov)})
	case v.set.one():
		return printFields(w, v.fields(v.set.where(), ov.Homes[0].Stats))
	}
	return v.table(w, ov)
}

// oneJSON are the members of one database's stats under --json.
func (v statsView) oneJSON(st idem.Stats) []any {
	return []any{field{"database", v.set.where()}, st, field{"size_limit", st.Projection()}}
}

// homesJSON is each database's stats under --json, or the error that kept them.
func (v statsView) homesJSON(ov idem.Overview) []any {
	out := make([]any, len(ov.Homes))
	for i, h := range inOrder(v.set, ov.Homes, func(h idem.HomeStats) string { return h.Home }) {
		parts := []any{field{"database", v.set.label(h.Home)}, field{"id", h.Home}}
		if h.Err != nil {
			parts = append(parts, field{"error", describe(h.Err)})
		} else {
			parts = append(parts, h.Stats, field{"size_limit", h.Stats.Projection()}, field{"error", nil})
		}
		out[i], _ = object(parts...)
	}
	return out
}

// fields are the lines of one database's stats, as printFields takes them.
func (v statsView) fields(where string, st idem.Stats) [][2]string {
	fields := [][2]string{
		{"ledger on", where}, // "database orders", "local database ...", "orders-db (...)"
		{"keys", strconv.FormatInt(st.Keys, 10)},
		{"  " + string(idem.StatusPending), strconv.FormatInt(st.ByStatus[idem.StatusPending], 10)},
		{"  " + string(idem.StatusCompleted), strconv.FormatInt(st.ByStatus[idem.StatusCompleted], 10)},
	}
	for _, s := range st.OtherStatuses() {
		fields = append(fields, [2]string{"  " + textsafe.Display(string(s)), strconv.FormatInt(st.ByStatus[s], 10) + " (not a status the ledger writes)"})
	}
	return append(fields, [2]string{"awaiting retry", v.awaiting(st)}, [2]string{"oldest row", oldestText(st.Oldest)},
		[2]string{"sweep backlog", v.backlog(st)}, [2]string{"database size", human.Bytes(st.SizeBytes)},
		[2]string{"10 GB limit", st.Projection().String()})
}

// table writes the stats of several databases: a row each, then the totals.
func (v statsView) table(w io.Writer, ov idem.Overview) error {
	header := []string{"DATABASE", "KEYS", "PENDING", "COMPLETED", "AWAITING RETRY", "BACKLOG", "SIZE", "ROWS/DAY", "10 GB LIMIT"}
	var rows [][]string
	for _, h := range inOrder(v.set, ov.Homes, func(h idem.HomeStats) string { return h.Home }) {
		if h.Err != nil {
			rows = append(rows, []string{v.set.label(h.Home), "unreadable: " + describe(h.Err), "", "", "", "", "", "", ""})
			continue
		}
		p := h.Stats.Projection()
		rows = append(rows, append(statsRow(v.set.label(h.Home), h.Stats), rateText(p), p.Short()))
	}
	rows = append(rows, append(statsRow("total", ov.Total), "", ""))
	if err := printTable(w, header, rows); err != nil {
		return err
	}
	fmt.Fprintln(w)
	return printFields(w, [][2]string{
		{"awaiting retry", v.awaiting(ov.Total)},
		{"oldest row", oldestText(ov.Total.Oldest)},
		{"sweep backlog", v.backlog(ov.Total)},
		{"10 GB limit", fmt.Sprintf("per database, at the rate its rows were created within the %s retention\n(not enough data under %d rows or %s of writes; see 'd1idem stats --help')",
			human.Duration(ov.Total.Retention), idem.MinSampleRows, human.Duration(idem.MinSampleSpan))},
	})
}

// statsRow is a row of the table: the counts and the size.
func statsRow(label string, st idem.Stats) []string {
	return []string{label, strconv.FormatInt(st.Keys, 10), strconv.FormatInt(st.ByStatus[idem.StatusPending], 10),
		strconv.FormatInt(st.ByStatus[idem.StatusCompleted], 10), strconv.FormatInt(st.Stuck, 10),
		strconv.FormatInt(st.SweepBacklog, 10), human.Size(float64(st.SizeBytes))}
}

// awaiting describes the pending rows past the TTL.
func (v statsView) awaiting(st idem.Stats) string {
	k := st.OldestStuck
	if k == nil {
		return fmt.Sprintf("none: no pending key is past the %s TTL", human.Duration(st.TTL))
	}
	return fmt.Sprintf("%d pending past the %s TTL, taken over by their next retry (the oldest: %s / %s, updated %s); see '%s'",
		st.Stuck, human.Duration(st.TTL), textsafe.Display(k.Principal), textsafe.Display(k.Key), human.Age(k.SinceUpdate()), v.hints.stuck)
}

func oldestText(k *idem.KeyRecord) string {
	if k == nil {
		return "-"
	}
	return fmt.Sprintf("%s / %s: %s, last updated %s (%s)", textsafe.Display(k.Principal), textsafe.Display(k.Key),
		textsafe.Display(string(k.Status)), human.Age(k.SinceUpdate()), human.Time(k.UpdatedAt))
}

// backlog describes the rows past the retention.
func (v statsView) backlog(st idem.Stats) string {
	n, retention := st.SweepBacklog, human.Duration(st.Retention)
	if n == 0 {
		return fmt.Sprintf("none older than the %s retention", retention)
	}
	return fmt.Sprintf("%s older than the %s retention: '%s' deletes %s", human.Plural(n, "row", "rows"), retention, v.hints.sweep, pick(n == 1, "it", "them"))
}

// rateText is a projection's rows per day in a table's cell.
func rateText(p idem.Projection) string {
	if p.RowsPerDay == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f", p.RowsPerDay)
}

// stats --watch: the stats view every --interval, with the API budget the
// last response's Ratelimit headers gave.

// Flags of stats --watch.
const (
	flagWatch    = "watch"
	flagInterval = "interval"
)

// minWatchInterval is the shortest --interval: each refresh is a D1 call.
const minWatchInterval = time.Second

// ANSI sequences that move the cursor home and clear the screen.
const clearScreen = "\x1b[H\x1b[2J"

func watchFlags() []cli.Flag {
	return []cli.Flag{
		&cli.BoolFlag{Name: flagWatch, Usage: "refresh every --interval until Ctrl-C: in place on a terminal, one block (with --json, one JSON object per line) per interval elsewhere; with the API budget the last response's headers gave", DisableDefaultText: true},
		&cli.DurationFlag{Name: flagInterval, Value: 5 * time.Second, Usage: "with --watch, refresh every `DURATION` (at least 1s; one D1 call each)"},
	}
}

// watchInterval validates --interval, which needs --watch.
func watchInterval(c *cli.Context) (time.Duration, error) {
	d := c.Duration(flagInterval)
	switch {
	case c.IsSet(flagInterval) && !c.Bool(flagWatch):
		return 0, usagef("--interval needs --watch")
	case d < minWatchInterval:
		return 0, usagef("--interval %s is too short: each refresh is a D1 call; use at least %s", d, minWatchInterval)
	}
	return d, nil
}

// watchView is one refresh of stats --watch.
type watchView struct {
	at     time.Time // of the refresh, by the command's clock
	stats  idem.Stats
	budget budget.State
	// seen is when the budget was read, by the D1 client's clock (the
	// local one), which its times are in.
	seen time.Time
	err  error // the refresh failed; stats are not set
}

// watchStats runs the stats view every interval until the command's
// context ends (Ctrl-C), which is a clean stop. A first refresh that fails
// is the command's error; a later one is shown, and the watch goes on.
func (o *options) watchStats(c *cli.Context, a *idem.Admin, sv statsView, interval time.Duration) error {
	tick, stop := o.newTicker(interval)
	defer stop()
	render := o.watchRenderer(c, sv, interval)
	for first := true; ; first = false {
		st, err := a.Stats(c.Context)
		if c.Context.Err() != nil {
			return nil
		}
		if err != nil && first {
			return ledgerErr("stats", err)
		}
		if err := render(watchView{at: o.clock(), stats: st, budget: sv.set.conns[0].db.Account().State(), seen: time.Now(), err: err}); err != nil {
			return err
		}
		select {
		case <-c.Context.Done():
			return nil
		case <-tick:
		}
	}
}

// watchRenderer returns the function that writes one refresh: a JSON line
// with --json, the view redrawn in place on a terminal, a block otherwise.
func (o *options) watchRenderer(c *cli.Context, sv statsView, interval time.Duration) func(watchView) error {
	w := c.App.Writer
	if c.Bool(flagJSON) {
		return func(v watchView) error { return sv.watchJSON(w, v) }
	}
	tty := o.terminal(w)
	first := true
	return func(v watchView) error {
		switch {
		case tty:
			io.WriteString(w, clearScreen)
		case !first:
			fmt.Fprintln(w)
		}
		first = false
		return sv.watch(w, v, interval, tty)
	}
}

// newTicker returns ticks every d and a function that stops them.
func (o *options) newTicker(d time.Duration) (<-chan time.Time, func()) {
	if o.ticker != nil {
		return o.ticker(d)
	}
	t := time.NewTicker(d)
	return t.C, t.Stop
}

// clock is the time of a refresh: o.now, or the local clock.
func (o *options) clock() time.Time {
	if o.now != nil {
		return o.now()
	}
	return time.Now()
}

// watchJSON writes one refresh as a line of JSON: its time, stats --json's
// members (or its error), and the API budget (null when not reported).
func (sv statsView) watchJSON(w io.Writer, v watchView) error {
	parts := []any{field{"at", human.Time(v.at)}}
	if v.err != nil {
		parts = append(parts, field{"error", describe(ledgerErr("stats", v.err))})
	} else {
		parts = append(parts, sv.oneJSON(v.stats)...)
	}
	line, err := object(append(parts, field{"budget", budgetObject(v.budget, v.seen)})...)
	if err != nil {
		return err
	}
	return writeJSON(w, line, "")
}

// budgetObject is the API budget under --json; nil when none was reported.
func budgetObject(b budget.State, now time.Time) json.RawMessage {
	if b.Seen.IsZero() {
		return nil
	}
	v, _ := object(b, field{"reset_in_ms", max(0, b.Reset.Sub(now).Milliseconds())})
	return v
}

// watch writes one refresh for people: a heading, the stats and the budget.
func (sv statsView) watch(w io.Writer, v watchView, interval time.Duration, tty bool) error {
	heading := fmt.Sprintf("%s, every %s", human.Time(v.at), human.Duration(interval))
	if tty {
		heading += "; Ctrl-C stops"
	}
	fmt.Fprintln(w, heading)
	if v.err != nil {
		_, err := fmt.Fprintf(w, "this refresh failed: %s\n", describe(ledgerErr("stats", v.err)))
		return err
	}
	return printFields(w, append(sv.fields(sv.set.where(), v.stats), [2]string{"API budget", budgetText(v.budget, v.seen)}))
}

// budgetText describes the API budget the last response's headers gave.
func budgetText(b budget.State, now time.Time) string {
	if b.Seen.IsZero() {
		return "not reported: no response carried Ratelimit headers (d1local sends none unless it plays a budget)"
	}
	s := fmt.Sprintf("%d calls left", b.Remaining)
	if b.Quota > 0 {
		s += fmt.Sprintf(" of %d per %s", b.Quota, human.Duration(b.Window))
	}
	if reset := b.Reset.Sub(now); reset > 0 {
		s += ", resets in " + human.Duration(reset)
	} else {
		s += ", its window has reset since"
	}
	return s + fmt.Sprintf(" (as the response of %s said)", human.Age(now.Sub(b.Seen)))
}
