package cli

import (
	"encoding/json"
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

// watchJSON writes one refresh as a line of JSON: the time of the refresh,
// stats --json's members (or the error of a failed refresh), and the API
// budget the last response's Ratelimit headers gave (null when none did).
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

// budgetObject is the API budget under --json, with how long until its window
// resets from now; nil when no response carried Ratelimit headers.
func budgetObject(b budget.State, now time.Time) json.RawMessage {
	if b.Seen.IsZero() {
		return nil
	}
	v, _ := object(b, field{"reset_in_ms", max(0, b.Reset.Sub(now).Milliseconds())})
	return v
}

// watch writes one refresh for people: a heading, then the stats view and
// the budget, or the refresh's error.
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
