package cli

import (
	"fmt"
	"io"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/d1idem/d1idem/d1client/budget"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/internal/human"
)

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
func (o *options) watchStats(c *cli.Context, a *idem.Admin, cn *conn, out statsJSON, interval time.Duration) error {
	tick, stop := o.newTicker(interval)
	defer stop()
	render := o.watchRenderer(c, out, interval)
	for first := true; ; first = false {
		st, err := a.Stats(c.Context)
		if c.Context.Err() != nil {
			return nil
		}
		if err != nil && first {
			return ledgerErr("stats", err)
		}
		if err := render(watchView{at: o.clock(), stats: st, budget: cn.db.Account().State(), seen: time.Now(), err: err}); err != nil {
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
func (o *options) watchRenderer(c *cli.Context, base statsJSON, interval time.Duration) func(watchView) error {
	w := c.App.Writer
	if c.Bool(flagJSON) {
		return func(v watchView) error { return writeJSON(w, watchJSONOf(v, base), "") }
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
		return renderWatch(w, v, base, interval, tty)
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

// watchJSON is one line of stats --watch --json: stats --json's fields, the
// time of the refresh, the API budget, and the error of a failed refresh.
type watchJSON struct {
	At string `json:"at"`
	*statsJSON
	Budget *budgetJSON `json:"budget"`
	Error  string      `json:"error,omitempty"`
}

// budgetJSON is the API budget as the last response's Ratelimit headers
// gave it; null when none did.
type budgetJSON struct {
	Seen      string      `json:"seen"`
	Remaining int         `json:"remaining"`
	Reset     string      `json:"reset"`
	ResetInMS int64       `json:"reset_in_ms"`
	Policy    *policyJSON `json:"policy"`
}

// policyJSON is the Ratelimit-Policy: calls per window.
type policyJSON struct {
	Quota    int   `json:"quota"`
	WindowMS int64 `json:"window_ms"`
}

func watchJSONOf(v watchView, base statsJSON) watchJSON {
	out := watchJSON{At: human.Time(v.at), Budget: budgetJSONOf(v.budget, v.seen)}
	if v.err != nil {
		out.Error = describe(ledgerErr("stats", v.err))
		return out
	}
	s := statsJSONOf(v.stats, base.Database, time.Duration(base.TTLMS)*time.Millisecond, time.Duration(base.RetentionMS)*time.Millisecond)
	out.statsJSON = &s
	return out
}

func budgetJSONOf(b budget.State, now time.Time) *budgetJSON {
	if b.Seen.IsZero() {
		return nil
	}
	out := &budgetJSON{Seen: human.Time(b.Seen), Remaining: b.Remaining, Reset: human.Time(b.Reset),
		ResetInMS: max(0, b.Reset.Sub(now).Milliseconds())}
	if b.Quota > 0 {
		out.Policy = &policyJSON{Quota: b.Quota, WindowMS: b.Window.Milliseconds()}
	}
	return out
}

// renderWatch writes one refresh for people: a heading, then the stats
// view and the budget, or the refresh's error.
func renderWatch(w io.Writer, v watchView, base statsJSON, interval time.Duration, tty bool) error {
	heading := fmt.Sprintf("%s, every %s", human.Time(v.at), human.Duration(interval))
	if tty {
		heading += "; Ctrl-C stops"
	}
	fmt.Fprintln(w, heading)
	if v.err != nil {
		_, err := fmt.Fprintf(w, "this refresh failed: %s\n", describe(ledgerErr("stats", v.err)))
		return err
	}
	out := statsJSONOf(v.stats, base.Database, time.Duration(base.TTLMS)*time.Millisecond, time.Duration(base.RetentionMS)*time.Millisecond)
	out.hints = base.hints
	return printFields(w, append(statsFields(v.stats, out), [2]string{"API budget", budgetText(v.budget, v.seen)}))
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
