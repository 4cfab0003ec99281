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

	"github.com/d1idem/d1idem"
	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/idem"
)

const (
	maxSweepBatch   = 1000
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
			&cli.DurationFlag{Name: "retention", Value: idem.DefaultRetention, Usage: "delete rows last updated more than `DURATION` ago; never less than the retention your API promises clients"},
			&cli.IntFlag{Name: "batch", Value: idem.DefaultSweepBatch, Usage: fmt.Sprintf("delete at most `N` rows per DELETE (1 to %d)", maxSweepBatch)},
			&cli.BoolFlag{Name: "all", Usage: "repeat until a batch comes back short (the backlog is clear)", DisableDefaultText: true},
			&cli.BoolFlag{Name: "dry-run", Usage: "count the rows that would be deleted (one COUNT query); delete nothing", DisableDefaultText: true},
			&cli.IntFlag{Name: "max-calls", Value: defaultMaxCalls, Usage: "at most `N` D1 calls per 5 minutes, leaving the rest of the account's 1200 to the application; 0 (unlimited) only with --local", DefaultText: "200, unlimited with --local"},
			jsonFlag(),
		}, connFlags()...),
		Action: func(c *cli.Context) error {
			if err := noArgs(c); err != nil {
				return err
			}
			retention := c.Duration("retention")
			if retention <= idem.DefaultTTL {
				return usagef("--retention %s is too short: it must exceed the pending TTL (%s), or the sweep would delete reservations still in flight", retention, idem.DefaultTTL)
			}
			batch := c.Int("batch")
			if batch < 1 || batch > maxSweepBatch {
				return usagef("--batch %d is out of range: use 1 to %d", batch, maxSweepBatch)
			}
			maxCalls := c.Int("max-calls")
			local := c.String(flagLocal) != ""
			switch {
			case maxCalls < 0:
				return usagef("--max-calls %d must not be negative", maxCalls)
			case maxCalls == 0 && !local:
				return usagef("--max-calls 0 (unlimited) is only allowed with --local: against Cloudflare, leave the application room within the account's 1200 calls per 5 minutes")
			case local && !c.IsSet("max-calls"):
				maxCalls = 0 // d1local has no API limit
			}
			window := o.budgetWindow
			if window == 0 {
				window = apiLimitWindow
			}
			s := &sweeper{c: c, o: o, retention: retention, batch: batch, budget: d1client.UnlimitedBudget()}
			var mods []func(*d1client.Config)
			if maxCalls > 0 {
				// No reserve: a sweep has no completions to keep calls for.
				s.budget = d1client.NewBudget(maxCalls, window).WithReserve(0)
				mods = append(mods, func(cfg *d1client.Config) { cfg.Budget = s.budget })
			}
			return withConn(c, o, s.run, mods...)
		},
	}
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

func (s *sweeper) countQuery() *query {
	return newQuery(s.o).add("SELECT count(*) FROM "+d1idem.Table+" WHERE updated_at < ").now().add(" - ?", s.retention.Milliseconds())
}

func (s *sweeper) count(ctx context.Context, db *d1client.Client) (int64, error) {
	res, err := db.Exec(ctx, []d1client.Statement{s.countQuery().statement()})
	if err != nil {
		return 0, err
	}
	var n int64
	err = res[0].Rows[0].Scan(&n)
	return n, err
}

func (s *sweeper) run(cn *conn) error {
	c, w := s.c, s.c.App.Writer
	ctx := c.Context
	s.start = time.Now()
	s.estimate = -1
	if c.Bool("dry-run") {
		n, err := s.count(ctx, cn.db)
		if err != nil {
			return fmt.Errorf("sweep --dry-run: %w", err)
		}
		if c.Bool(flagJSON) {
			return printJSON(w, sweepJSON{DryRun: true, RetentionMS: s.retention.Milliseconds(), BatchSize: s.batch, WouldDelete: &n,
				D1Calls: cn.db.Stats().Calls, ElapsedMS: time.Since(s.start).Milliseconds()})
		}
		batches := (n + int64(s.batch) - 1) / int64(s.batch)
		fmt.Fprintf(w, "Dry run: %s last updated more than %s ago would be deleted (%s of %d with --all; one sweep without --all deletes %d). Nothing was deleted.\n",
			plural(n, "row", "rows"), formatDuration(s.retention), plural(batches, "batch", "batches"), s.batch, min(n, int64(s.batch)))
		return nil
	}

	ledger, err := idem.New(cn.db, idem.Config{Retention: s.retention, SweepBatch: s.batch, Clock: s.o.now})
	if err != nil {
		return err
	}
	s.tty = !c.Bool(flagJSON) && s.o.terminal(w)
	if s.tty && c.Bool("all") {
		if s.estimate, err = s.count(ctx, cn.db); err != nil {
			return fmt.Errorf("sweep: counting the backlog: %w", err)
		}
	}
	complete := false
	for {
		if d := cn.db.BudgetWait(); d > 0 {
			s.reportWait(d)
			s.waits++
			s.waited += d
		}
		n, err := ledger.Sweep(ctx)
		if err != nil {
			return s.interrupted(err)
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
		fmt.Fprintln(w)
	}
	if c.Bool(flagJSON) {
		return printJSON(w, sweepJSON{RetentionMS: s.retention.Milliseconds(), BatchSize: s.batch, Deleted: s.deleted, Batches: s.batches,
			Complete: complete, D1Calls: cn.db.Stats().Calls, BudgetWaits: s.waits, BudgetWaitedMS: s.waited.Milliseconds(),
			ElapsedMS: time.Since(s.start).Milliseconds()})
	}
	fmt.Fprintln(w, s.summary(complete, cn.db.Stats().Calls))
	return nil
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
