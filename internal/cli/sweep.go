package cli

import (
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
	"github.com/d1idem/d1idem/idem"
)

const (
	defaultMaxCalls = 200
	apiLimitWindow  = 5 * time.Minute
)

func sweepCommand(o *options) *cli.Command {
	return &cli.Command{
		Name:  "sweep",
		Usage: "delete rows past the retention window, in bounded batches, within an API budget",
		Description: `Deletes ledger rows last updated more than --retention ago, completed and pending
alike, with the spec's bounded DELETE (a rowid subquery with LIMIT --batch). The
application sweeps a batch now and then on its own; use this command to clear a
backlog (see 'd1idem stats'). Without --all it deletes one batch; with --all it
repeats until a batch comes back short.

It keeps within --max-calls D1 calls per 5 minutes, and says so when it waits:
Cloudflare allows 1200 API calls per 5 minutes for the whole account, and going
over blocks every call, the application's included, for 5 minutes.

On a terminal it shows progress; otherwise it prints one summary line.

   d1idem sweep --dry-run          # count what would be deleted; delete nothing
   d1idem sweep --all
   d1idem sweep --all --batch 500 --max-calls 100`,
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
	s := &sweeper{c: c, o: o, retention: c.Duration("retention"), batch: batch, budget: d1client.UnlimitedBudget()}
	var mods []func(*d1client.Config)
	if maxCalls > 0 {
		window := o.budgetWindow
		if window == 0 {
			window = apiLimitWindow
		}
		s.budget = d1client.NewBudget(maxCalls, window).WithReserve(0) // the sweep is all the work there is: no reserve
		mods = append(mods, func(cfg *d1client.Config) { cfg.Budget = s.budget })
	}
	return withConn(c, o, existing, s.run, mods...)
}

// maxCalls reads --max-calls: 0 (unlimited) only with --local or through
// a bridge, where it is the default.
func maxCalls(c *cli.Context) (int, error) {
	n := c.Int("max-calls")
	_, bridge, _ := bridgeURL(c) // a bad combination is reported by openConn
	unmetered := c.String(flagLocal) != "" || bridge
	switch {
	case n < 0:
		return 0, usagef("--max-calls %d must not be negative", n)
	case n == 0 && !unmetered:
		return 0, usagef("--max-calls 0 (unlimited) is only allowed with --local or a bridge: against Cloudflare's API, leave the application room within the account's 1200 calls per 5 minutes")
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
	budget    d1client.Budget // the client's; waits are announced before Exec waits

	waits  int           // budget waits announced
	waited time.Duration // their total

	deleted, batches int64
	start            time.Time
	estimate         int64 // rows to delete, counted first on a terminal; -1 unknown
	tty              bool
}

// sweepJSON is sweep --json.
type sweepJSON struct {
	DryRun         bool   `json:"dry_run"`
	RetentionMS    int64  `json:"retention_ms"`
	BatchSize      int    `json:"batch_size"`
	WouldDelete    *int64 `json:"would_delete,omitempty"`
	Deleted        int64  `json:"deleted"`
	Batches        int64  `json:"batches"`
	Complete       bool   `json:"complete"`
	D1Calls        int64  `json:"d1_calls"`
	BudgetWaits    int    `json:"budget_waits"`
	BudgetWaitedMS int64  `json:"budget_waited_ms"`
	ElapsedMS      int64  `json:"elapsed_ms"`
}

func (s *sweeper) run(cn *conn) error {
	s.start, s.estimate = time.Now(), -1
	// The application's TTL and lease are assumed to be the defaults: the
	// retention must outlast them (see idem.Config.Retention).
	a, err := admin(s.o, cn, idem.Config{Retention: s.retention, SweepBatch: s.batch})
	if err != nil {
		return err
	}
	if s.c.Bool("dry-run") {
		return s.dryRun(cn, a)
	}
	complete, err := s.loop(cn, a)
	if err != nil {
		return err
	}
	w := s.c.App.Writer
	if s.c.Bool(flagJSON) {
		return printJSON(w, sweepJSON{RetentionMS: s.retention.Milliseconds(), BatchSize: s.batch, Deleted: s.deleted, Batches: s.batches,
			Complete: complete, D1Calls: cn.db.Stats().Calls, BudgetWaits: s.waits, BudgetWaitedMS: s.waited.Milliseconds(),
			ElapsedMS: time.Since(s.start).Milliseconds()})
	}
	_, err = fmt.Fprintln(w, s.summary(complete, cn.db.Stats().Calls))
	return err
}

// dryRun counts the backlog and deletes nothing.
func (s *sweeper) dryRun(cn *conn, a *idem.Admin) error {
	n, err := a.SweepBacklog(s.c.Context)
	if err != nil {
		return ledgerErr("sweep --dry-run", err)
	}
	w := s.c.App.Writer
	if s.c.Bool(flagJSON) {
		return printJSON(w, sweepJSON{DryRun: true, RetentionMS: s.retention.Milliseconds(), BatchSize: s.batch, WouldDelete: &n,
			D1Calls: cn.db.Stats().Calls, ElapsedMS: time.Since(s.start).Milliseconds()})
	}
	batches := (n + int64(s.batch) - 1) / int64(s.batch)
	_, err = fmt.Fprintf(w, "Dry run: %s last updated more than %s ago would be deleted (%s of %d with --all; one sweep without --all deletes %d). Nothing was deleted.\n",
		plural(n, "row", "rows"), formatDuration(s.retention), plural(batches, "batch", "batches"), s.batch, min(n, int64(s.batch)))
	return err
}

// loop sweeps one batch, or with --all until a batch comes back short,
// announcing budget waits and drawing progress on a terminal. complete
// reports a short batch: the backlog is clear.
func (s *sweeper) loop(cn *conn, a *idem.Admin) (complete bool, err error) {
	c := s.c
	s.tty = !c.Bool(flagJSON) && s.o.terminal(c.App.Writer)
	if s.tty && c.Bool("all") {
		if s.estimate, err = a.SweepBacklog(c.Context); err != nil {
			return false, ledgerErr("sweep: counting the backlog", err)
		}
	}
	for {
		if d := cn.db.BudgetWait(); d > 0 {
			s.reportWait(d)
			s.waits++
			s.waited += d
		}
		n, err := a.Sweep(c.Context)
		if err != nil {
			return false, s.interrupted(err)
		}
		s.deleted += n
		s.batches++
		complete = n < int64(s.batch)
		if s.tty {
			s.progress()
		}
		if complete || !c.Bool("all") {
			break
		}
	}
	if s.tty {
		fmt.Fprintln(c.App.Writer)
	}
	return complete, nil
}

func (s *sweeper) summary(complete bool, calls int64) string {
	line := fmt.Sprintf("Swept %s last updated more than %s ago in %s of at most %d (%s, %s)",
		plural(s.deleted, "row", "rows"), formatDuration(s.retention), plural(s.batches, "batch", "batches"), s.batch,
		plural(calls, "D1 call", "D1 calls"), formatDuration(time.Since(s.start)))
	if s.waits > 0 {
		line += fmt.Sprintf("; waited %s for the request budget", formatDuration(s.waited))
	}
	if complete {
		return line + "; the backlog is clear."
	}
	return line + "; more remain: run again with --all."
}

// progress redraws the progress line: deleted so far of the estimate, and
// the rate.
func (s *sweeper) progress() {
	rate := float64(s.deleted) / max(time.Since(s.start).Seconds(), 1e-3)
	of := ""
	if s.estimate > 0 {
		pct := min(100, 100*s.deleted/s.estimate)
		of = fmt.Sprintf(" of ~%d (%d%%)", s.estimate, pct)
		const width = 24
		filled := int(pct * width / 100)
		of = " [" + strings.Repeat("#", filled) + strings.Repeat(".", width-filled) + "]" + of
	}
	fmt.Fprintf(s.c.App.Writer, "\r\033[Kswept %d%s rows, %s, %.0f rows/s", s.deleted, of, plural(s.batches, "batch", "batches"), rate)
}

func (s *sweeper) reportWait(d time.Duration) {
	if s.tty {
		fmt.Fprintln(s.c.App.Writer)
	}
	fmt.Fprintf(s.c.App.ErrWriter, "d1idem: sweep: waiting %s for the request budget (%s per %s, --max-calls) after %s\n",
		formatDuration(d), plural(int64(s.budget.Calls()), "D1 call", "D1 calls"), formatDuration(s.budget.Per()), plural(s.deleted, "row", "rows"))
}

// interrupted reports how far the sweep got before err.
func (s *sweeper) interrupted(err error) error {
	var de *d1client.Error
	if errors.As(err, &de) {
		err = de // without the ledger's "idem: sweep:" prefix
	}
	if s.tty && s.batches > 0 {
		fmt.Fprintln(s.c.App.Writer)
	}
	if errors.Is(err, context.Canceled) {
		return fmt.Errorf("sweep interrupted after deleting %s in %s", plural(s.deleted, "row", "rows"), plural(s.batches, "batch", "batches"))
	}
	if s.batches > 0 {
		return fmt.Errorf("sweep stopped after deleting %s in %s: %w", plural(s.deleted, "row", "rows"), plural(s.batches, "batch", "batches"), err)
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
