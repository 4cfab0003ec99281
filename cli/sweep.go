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

With several databases (--database or --database-id repeated, or
--databases-prefix) it sweeps a batch of each in turn, all within the one
--max-calls budget (databases on one account share its API limit), and says how
many rows each gave.

   d1idem sweep --dry-run          # count what would be deleted; delete nothing
   d1idem sweep --all
   d1idem sweep --all --batch 500 --max-calls 100
   d1idem sweep --all --databases-prefix ledger-`,
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
		window := o.budgetWindow
		if window == 0 {
			window = d1local.CloudflareBudget().Window
		}
		s.maxCalls, s.per = maxCalls, window
		mods = append(mods, func(cfg *d1client.Config) { cfg.Budget = sweepBudget(maxCalls, window) })
	}
	err = withSet(c, o, existing, s.runSet, mods...)
	if errors.Is(err, d1client.ErrRateLimited) {
		err = hintedError{err, "use a lower --max-calls"}
	}
	return err
}

// sweepBudget is the request budget in which the sweep, work without
// d1client.Priority, gets maxCalls calls per window: d1client keeps a few
// calls of every window for Priority work (Budget.Kept), which the sweep
// never does, so the budget is that much larger. The least reserve keeps
// the sweep's pace that of the whole budget, within 1 %.
func sweepBudget(maxCalls int, window time.Duration) budget.Budget {
	calls := maxCalls + 1
	for {
		b := budget.New(calls, window).WithReserve(budget.MinReserve)
		if calls-b.Kept() >= maxCalls {
			return b
		}
		calls++
	}
}

// maxCalls reads --max-calls: 0 (unlimited) only with --local or through
// a bridge, where it is the default.
func maxCalls(c *cli.Context) (int, error) {
	n := c.Int("max-calls")
	_, bridge, _ := bridgeURL(c) // a bad combination is reported by openConn
	unmetered := c.String(flagLocal) != "" || bridge
	limit := d1local.CloudflareBudget().Limit
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
	maxCalls  int // --max-calls, per window per: the client's budget; waits are announced before Exec waits
	per       time.Duration

	waits  int           // budget waits announced
	waited time.Duration // their total

	deleted, batches int64
	start            time.Time
	estimate         int64 // rows to delete, counted first on a terminal; -1 unknown
	tty              bool

	set     *dbSet
	targets []*sweepTarget
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
	// Databases are each database's share, with several.
	Databases []sweptJSON `json:"databases,omitempty"`
}

// sweepTarget is one database being swept.
type sweepTarget struct {
	cn               *conn
	a                *idem.Admin
	deleted, batches int64
	done             bool // its last batch came back short
	backlog          int64
}

// runSet sweeps the databases of set, one batch of each in turn, all
// within the one budget of their shared account.
func (s *sweeper) runSet(set *dbSet) error {
	s.start, s.estimate, s.set = time.Now(), -1, set
	for _, cn := range set.conns {
		// The application's TTL and lease are assumed to be the defaults:
		// the retention must outlast them (see idem.Config.Retention).
		a, err := admin(s.o, cn, idem.Config{Retention: s.retention, SweepBatch: s.batch})
		if err != nil {
			return err
		}
		s.targets = append(s.targets, &sweepTarget{cn: cn, a: a})
	}
	if s.c.Bool("dry-run") {
		return s.dryRun()
	}
	complete, err := s.loop()
	if err != nil {
		return err
	}
	w := s.c.App.Writer
	if s.c.Bool(flagJSON) {
		return printJSON(w, sweepJSON{RetentionMS: s.retention.Milliseconds(), BatchSize: s.batch, Deleted: s.deleted, Batches: s.batches,
			Complete: complete, D1Calls: set.calls(), BudgetWaits: s.waits, BudgetWaitedMS: s.waited.Milliseconds(),
			ElapsedMS: time.Since(s.start).Milliseconds(), Databases: s.perDatabase(false)})
	}
	_, err = fmt.Fprintln(w, s.summary(complete, set.calls()))
	return err
}

// dryRun counts the backlog and deletes nothing.
func (s *sweeper) dryRun() error {
	n, err := s.backlog()
	if err != nil {
		return ledgerErr("sweep --dry-run", err)
	}
	w := s.c.App.Writer
	if s.c.Bool(flagJSON) {
		return printJSON(w, sweepJSON{DryRun: true, RetentionMS: s.retention.Milliseconds(), BatchSize: s.batch, WouldDelete: &n,
			D1Calls: s.set.calls(), ElapsedMS: time.Since(s.start).Milliseconds(), Databases: s.perDatabase(true)})
	}
	batches := (n + int64(s.batch) - 1) / int64(s.batch)
	if len(s.targets) > 1 {
		_, err = fmt.Fprintf(w, "Dry run: %s last updated more than %s ago would be deleted from %d databases (%s), in batches of %d. Nothing was deleted.\n",
			plural(n, "row", "rows"), human.Duration(s.retention), len(s.targets), s.split(true), s.batch)
		return err
	}
	_, err = fmt.Fprintf(w, "Dry run: %s last updated more than %s ago would be deleted (%s of %d with --all; one sweep without --all deletes %d). Nothing was deleted.\n",
		plural(n, "row", "rows"), human.Duration(s.retention), plural(batches, "batch", "batches"), s.batch, min(n, int64(s.batch)))
	return err
}

// backlog counts the rows to delete in every database.
func (s *sweeper) backlog() (int64, error) {
	var total int64
	for _, t := range s.targets {
		n, err := t.a.SweepBacklog(s.c.Context)
		if err != nil {
			return 0, s.named(t, err)
		}
		t.backlog, total = n, total+n
	}
	return total, nil
}

// named prefixes err with the database, when there are several.
func (s *sweeper) named(t *sweepTarget, err error) error {
	if len(s.targets) > 1 {
		return fmt.Errorf("%s: %w", t.cn.label(), err)
	}
	return err
}

// loop sweeps one batch of each database, or with --all until each one's
// batch comes back short, announcing budget waits and drawing progress on
// a terminal. complete reports that every backlog is clear.
func (s *sweeper) loop() (complete bool, err error) {
	c := s.c
	s.tty = !c.Bool(flagJSON) && s.o.terminal(c.App.Writer)
	if s.tty && c.Bool("all") {
		if s.estimate, err = s.backlog(); err != nil {
			return false, ledgerErr("sweep: counting the backlog", err)
		}
	}
	for {
		complete = true
		for _, t := range s.targets {
			if t.done {
				continue
			}
			if err := s.sweepOne(t); err != nil {
				return false, s.interrupted(s.named(t, err))
			}
			complete = complete && t.done
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

// sweepOne sweeps one batch of one database.
func (s *sweeper) sweepOne(t *sweepTarget) error {
	if d := t.cn.db.BudgetWait(); d > 0 {
		s.reportWait(d)
		s.waits++
		s.waited += d
	}
	n, err := t.a.Sweep(s.c.Context)
	if err != nil {
		return err
	}
	s.deleted, s.batches, t.deleted, t.batches = s.deleted+n, s.batches+1, t.deleted+n, t.batches+1
	t.done = n < int64(s.batch)
	if s.tty {
		s.progress()
	}
	return nil
}

// sweptJSON is one database of sweep --json over several.
type sweptJSON struct {
	Database    string `json:"database"`
	ID          string `json:"id"`
	WouldDelete *int64 `json:"would_delete,omitempty"`
	Deleted     int64  `json:"deleted"`
	Batches     int64  `json:"batches"`
	Complete    bool   `json:"complete"`
}

// perDatabase is each database's share, when there are several.
func (s *sweeper) perDatabase(dryRun bool) []sweptJSON {
	if len(s.targets) < 2 {
		return nil
	}
	out := make([]sweptJSON, 0, len(s.targets))
	for _, t := range s.targets {
		j := sweptJSON{Database: t.cn.label(), ID: t.cn.databaseID, Deleted: t.deleted, Batches: t.batches, Complete: t.done}
		if dryRun {
			j.WouldDelete = &t.backlog
		}
		out = append(out, j)
	}
	return out
}

// split says how many rows each database had, or gave: "a 20, b 25".
func (s *sweeper) split(backlog bool) string {
	parts := make([]string, len(s.targets))
	for i, t := range s.targets {
		n := t.deleted
		if backlog {
			n = t.backlog
		}
		parts[i] = fmt.Sprintf("%s %d", t.cn.label(), n)
	}
	return strings.Join(parts, ", ")
}

func (s *sweeper) summary(complete bool, calls int64) string {
	from := ""
	if len(s.targets) > 1 {
		from = fmt.Sprintf(" from %d databases (%s)", len(s.targets), s.split(false))
	}
	line := fmt.Sprintf("Swept %s last updated more than %s ago%s in %s of at most %d (%s, %s)",
		plural(s.deleted, "row", "rows"), human.Duration(s.retention), from, plural(s.batches, "batch", "batches"), s.batch,
		plural(calls, "D1 call", "D1 calls"), human.Duration(time.Since(s.start)))
	if s.waits > 0 {
		line += fmt.Sprintf("; waited %s for the request budget", human.Duration(s.waited))
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
		human.Duration(d), plural(int64(s.maxCalls), "D1 call", "D1 calls"), human.Duration(s.per), plural(s.deleted, "row", "rows"))
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
