package cli

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/urfave/cli/v2"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1client/budget"
	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/internal/human"
)

// defaultMaxCalls is sweep's share of the account's API limit
// (d1local.CloudflareBudget: 1200 calls per 5 minutes) by default.
const defaultMaxCalls = 200

func sweepCommand(o *options) *cli.Command {
	return &cli.Command{
		Name:        "sweep",
		Usage:       "delete rows past the retention window, in bounded batches, within an API budget",
		Description: help("sweep"),
		Flags: append([]cli.Flag{
			&cli.DurationFlag{Name: "retention", Value: idem.DefaultRetention, Usage: "delete rows last updated more than `DURATION` ago; never less than the retention your API promises clients (at least 11m30s: the default lease, plus the TTL, plus a minute)"},
			&cli.IntFlag{Name: "batch", Value: idem.DefaultSweepBatch, Usage: fmt.Sprintf("delete at most `N` rows per DELETE (1 to %d)", idem.MaxSweepBatch)},
			&cli.BoolFlag{Name: "all", Usage: "repeat until a batch comes back short (the backlog is clear)", DisableDefaultText: true},
			&cli.BoolFlag{Name: "dry-run", Usage: "count the rows that would be deleted (one COUNT query); delete nothing", DisableDefaultText: true},
			&cli.IntFlag{Name: "max-calls", Value: defaultMaxCalls, Usage: "at most `N` D1 calls per 5 minutes, leaving the rest of the account's 1200 to the application; 0 (unlimited) only with --local or a bridge", DefaultText: "200, unlimited with --local or a bridge"},
			jsonFlag(),
		}, connFlags()...),
		Action: o.sweep,
	}
}

func (o *options) sweep(c *cli.Context) error {
	if err := noArgs(c); err != nil {
		return err
	}
	batch := c.Int("batch")
	if batch < 1 || batch > idem.MaxSweepBatch {
		return usagef("--batch %d is out of range: use 1 to %d", batch, idem.MaxSweepBatch)
	}
	maxCalls, err := maxCalls(c)
	if err != nil {
		return err
	}
	retention, err := positiveDuration(c, "retention") // 0 would be the library's default, not 0
	if err != nil {
		return err
	}
	s := &sweeper{c: c, o: o, retention: retention, batch: batch}
	var mods []func(*d1client.Config)
	if maxCalls > 0 {
		s.maxCalls, s.per = maxCalls, cmp.Or(o.budgetWindow, d1local.CloudflareRateLimit().Window)
		mods = append(mods, func(cfg *d1client.Config) { cfg.Budget = budget.Background(maxCalls, s.per) })
	}
	err = o.withSet(c, existing, s.run, mods...)
	if errors.Is(err, d1client.ErrRateLimited) {
		err = hintedError{err, "use a lower --max-calls"}
	}
	return err
}

// maxCalls reads --max-calls: 0 (unlimited, the default there) only with --local or a bridge.
func maxCalls(c *cli.Context) (int, error) {
	n := c.Int("max-calls")
	_, bridge, _ := bridgeURL(c) // a bad combination is reported by openConn
	unmetered := c.String(flagLocal) != "" || bridge
	limit := d1local.CloudflareRateLimit().Limit
	switch {
	case n < 0:
		return 0, usagef("--max-calls %d must not be negative", n)
	case n == 0 && !unmetered:
		return 0, usagef("--max-calls 0 (unlimited) is only allowed with --local or a bridge: against Cloudflare's API, leave the application room within the account's %d calls per 5 minutes", limit)
	case n >= limit && !unmetered:
		return 0, usagef("--max-calls %d leaves nothing of the account's %d calls per 5 minutes to the application (going over blocks every API call of the account for 5 minutes): use fewer", n, limit)
	case unmetered && !c.IsSet("max-calls"):
		return 0, nil // neither d1local nor a bridge is metered by the API limit
	}
	return n, nil
}

// sweeper runs one sweep command.
type sweeper struct {
	c         *cli.Context
	o         *options
	retention time.Duration
	batch     int
	maxCalls  int // --max-calls, per window per: the client's budget
	per       time.Duration

	waits  int           // budget waits announced
	waited time.Duration // their total

	set      *dbSet
	start    time.Time
	estimate int64 // rows to delete, counted first on a terminal; -1 unknown
	tty      bool
}

// run sweeps the databases of set with idem's SweepAll, one batch of each
// in turn, all within the one budget of their shared account; with
// --dry-run it counts their backlogs.
func (s *sweeper) run(set *dbSet) error {
	s.start, s.estimate, s.set = time.Now(), -1, set
	// The application's TTL and lease are assumed to be the defaults: the
	// retention must outlast them (see idem.Config.Retention).
	l, err := s.o.ledger(set, idem.Config{Retention: s.retention, SweepBatch: s.batch}, false)
	if err != nil {
		return err
	}
	a := l.Admin()
	if s.c.Bool("dry-run") {
		res, err := a.SweepAll(s.c.Context, idem.SweepOptions{DryRun: true})
		if err != nil {
			return ledgerErr("sweep --dry-run", s.named(err))
		}
		return s.print(res, true)
	}
	s.tty = !s.c.Bool(flagJSON) && s.o.terminal(s.c.App.Writer)
	if s.tty && s.c.Bool("all") {
		res, err := a.SweepAll(s.c.Context, idem.SweepOptions{DryRun: true})
		if err != nil {
			return ledgerErr("sweep: counting the backlog", s.named(err))
		}
		s.estimate = res.Backlog
	}
	opts := idem.SweepOptions{MaxBatches: 1, Progress: s.progress}
	if s.c.Bool("all") {
		opts.MaxBatches = 0
	}
	res, err := a.SweepAll(s.c.Context, opts)
	if s.tty && res.Batches > 0 {
		fmt.Fprintln(s.c.App.Writer)
	}
	if err != nil {
		return s.interrupted(res, err)
	}
	return s.print(res, false)
}

// named turns a *idem.HomeError into its error, labelled when there are several databases.
func (s *sweeper) named(err error) error {
	var he *idem.HomeError
	if !errors.As(err, &he) {
		return err
	}
	err = he.Err
	if !s.set.one() {
		err = fmt.Errorf("%s: %w", s.set.label(he.Home), err)
	}
	return err
}

// print writes what the sweep did, or with a dry run would do.
func (s *sweeper) print(res idem.SweepResult, dryRun bool) error {
	w := s.c.App.Writer
	if s.c.Bool(flagJSON) {
		return printObject(w, s.json(res, dryRun)...)
	}
	if !dryRun {
		_, err := fmt.Fprintln(w, s.summary(res))
		return err
	}
	n := res.Backlog
	if !s.set.one() {
		_, err := fmt.Fprintf(w, "Dry run: %s last updated more than %s ago would be deleted from %d databases (%s), in batches of %d. Nothing was deleted.\n",
			human.Plural(n, "row", "rows"), human.Duration(s.retention), len(s.set.conns), s.split(res, true), s.batch)
		return err
	}
	batches := (n + int64(s.batch) - 1) / int64(s.batch)
	_, err := fmt.Fprintf(w, "Dry run: %s last updated more than %s ago would be deleted (%s of %d with --all; one sweep without --all deletes %d). Nothing was deleted.\n",
		human.Plural(n, "row", "rows"), human.Duration(s.retention), human.Plural(batches, "batch", "batches"), s.batch, min(n, int64(s.batch)))
	return err
}

// json are the members of sweep --json.
func (s *sweeper) json(res idem.SweepResult, dryRun bool) []any {
	parts := []any{field{"dry_run", dryRun}, field{"retention_ms", s.retention.Milliseconds()}, field{"batch_size", s.batch}}
	if dryRun {
		parts = append(parts, field{"would_delete", res.Backlog})
		res.Complete = false
	}
	parts = append(parts, field{"deleted", res.Deleted}, field{"batches", res.Batches}, field{"complete", res.Complete},
		field{"d1_calls", s.set.calls()}, field{"budget_waits", s.waits}, field{"budget_waited_ms", s.waited.Milliseconds()},
		field{"elapsed_ms", time.Since(s.start).Milliseconds()})
	if s.set.one() {
		return parts
	}
	homes := make([]any, len(res.Homes))
	for i, h := range inOrder(s.set, res.Homes, func(h idem.HomeSweep) string { return h.Home }) {
		if dryRun {
			h.Complete = false
		}
		homes[i], _ = object(field{"database", s.set.label(h.Home)}, h)
	}
	return append(parts, field{"databases", homes})
}

// split says how many rows each database had, or gave: "a 20, b 25".
func (s *sweeper) split(res idem.SweepResult, backlog bool) string {
	var parts []string
	for _, h := range inOrder(s.set, res.Homes, func(h idem.HomeSweep) string { return h.Home }) {
		n := h.Deleted
		if backlog && h.Backlog != nil {
			n = *h.Backlog
		}
		parts = append(parts, fmt.Sprintf("%s %d", s.set.label(h.Home), n))
	}
	return strings.Join(parts, ", ")
}

func (s *sweeper) summary(res idem.SweepResult) string {
	from := ""
	if !s.set.one() {
		from = fmt.Sprintf(" from %d databases (%s)", len(s.set.conns), s.split(res, false))
	}
	line := fmt.Sprintf("Swept %s last updated more than %s ago%s in %s of at most %d (%s, %s)",
		human.Plural(res.Deleted, "row", "rows"), human.Duration(s.retention), from, human.Plural(res.Batches, "batch", "batches"), s.batch,
		human.Plural(s.set.calls(), "D1 call", "D1 calls"), human.Duration(time.Since(s.start)))
	if s.waits > 0 {
		line += fmt.Sprintf("; waited %s for the request budget", human.Duration(s.waited))
	}
	if res.Complete {
		return line + "; the backlog is clear."
	}
	return line + "; more remain: run again with --all."
}

// progress hears SweepAll: it announces a wait for the budget on stderr,
// and on a terminal redraws the progress line after each batch: deleted so
// far of the estimate, and the rate.
func (s *sweeper) progress(p idem.SweepProgress) {
	if p.Wait > 0 {
		s.reportWait(p)
		return
	}
	if !s.tty {
		return
	}
	rate := float64(p.Deleted) / max(time.Since(s.start).Seconds(), 1e-3)
	of := ""
	if s.estimate > 0 {
		pct := min(100, 100*p.Deleted/s.estimate)
		const width = 24
		filled := int(pct * width / 100)
		of = fmt.Sprintf(" [%s%s] of ~%d (%d%%)", strings.Repeat("#", filled), strings.Repeat(".", width-filled), s.estimate, pct)
	}
	fmt.Fprintf(s.c.App.Writer, "\r\033[Kswept %d%s rows, %s, %.0f rows/s", p.Deleted, of, human.Plural(p.Batches, "batch", "batches"), rate)
}

func (s *sweeper) reportWait(p idem.SweepProgress) {
	s.waits++
	s.waited += p.Wait
	if s.tty {
		fmt.Fprintln(s.c.App.Writer)
	}
	fmt.Fprintf(s.c.App.ErrWriter, "d1idem: sweep: waiting %s for the request budget (%s per %s, --max-calls) after %s\n",
		human.Duration(p.Wait), human.Plural(int64(s.maxCalls), "D1 call", "D1 calls"), human.Duration(s.per), human.Plural(p.Deleted, "row", "rows"))
}

// interrupted reports how far the sweep got before err.
func (s *sweeper) interrupted(res idem.SweepResult, err error) error {
	err = s.named(err)
	if errors.Is(err, context.Canceled) {
		return fmt.Errorf("sweep interrupted after deleting %s in %s", human.Plural(res.Deleted, "row", "rows"), human.Plural(res.Batches, "batch", "batches"))
	}
	if res.Batches > 0 {
		return fmt.Errorf("sweep stopped after deleting %s in %s: %w", human.Plural(res.Deleted, "row", "rows"), human.Plural(res.Batches, "batch", "batches"), err)
	}
	return fmt.Errorf("sweep: %w", err)
}

// terminal reports whether w is a terminal.
func (o *options) terminal(w io.Writer) bool {
	if o.isTerminal != nil {
		return o.isTerminal(w)
	}
	f, ok := w.(*os.File)
	return ok && (isatty.IsTerminal(f.Fd()) || isatty.IsCygwinTerminal(f.Fd()))
}
