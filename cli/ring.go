package cli

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/idem"
)

const ringDescription = `A ledger across several D1 databases routes each principal to one of them by
the ring: the versioned list of its databases, recorded in every one of them
(docs/sharding.md). These commands show it and change it, with the same checks
as idem's Admin.RingStatus, InitRing, Grow and AdvanceRing. Name every database
of the ledger, as the application's replicas have them: --database (repeated),
--database-id (repeated) or --databases-prefix, with --local DIR for local ones.

Growing from 2 databases to 3:

   d1idem schema apply --databases-prefix ledger-      # the new one included
   (deploy every replica with a Home for each database)
   d1idem ring grow --databases-prefix ledger- --add ledger-c
   (two retention windows later)
   d1idem ring advance --databases-prefix ledger-

The moment the old route can be dropped depends on the retention and the TTL:
pass the application's (--retention, --ttl) to every ring command.`

func ringCommand(o *options) *cli.Command {
	return &cli.Command{
		Name:        "ring",
		Usage:       "show and change the set of databases a ledger spans (its ring): status, init, grow, advance",
		Description: ringDescription,
		Subcommands: []*cli.Command{
			ringStatusCommand(o),
			ringInitCommand(o),
			ringGrowCommand(o),
			ringAdvanceCommand(o),
		},
	}
}

// ringFlags are the flags of every ring command: the application's TTL and
// retention, on which the drop's time depends.
func ringFlags(extra ...cli.Flag) []cli.Flag {
	flags := append(extra,
		ttlFlag(),
		&cli.DurationFlag{Name: "retention", Value: idem.DefaultRetention, Usage: "the application's retention (idem.Config.Retention), the `DURATION` rows are kept: the old route is dropped two retention windows after a change"},
		jsonFlag())
	return append(flags, connFlags()...)
}

// ringCtx is a ring command at work: its administrative API, its
// databases, and the configuration the drop's time was computed with.
type ringCtx struct {
	c         *cli.Context
	a         *idem.Admin
	set       *dbSet
	ttl       time.Duration
	retention time.Duration
}

// withRing runs a ring command on a sharded ledger over the databases the
// flags name (one is a ring of one).
func (o *options) withRing(c *cli.Context, fn func(rc *ringCtx) error) error {
	ttl, retention, err := ledgerFlags(c)
	if err != nil {
		return err
	}
	return o.withSet(c, existing, func(s *dbSet) error {
		l, err := o.ledger(s, idem.Config{TTL: ttl, MaxLease: ttl, Retention: retention}, true)
		if err != nil {
			return err
		}
		return ringFix(c, fn(&ringCtx{c: c, a: l.Admin(), set: s, ttl: ttl, retention: retention}))
	})
}

// hint repeats the flags a ring command needs to be run again: the
// databases and the lease.
func (rc *ringCtx) hint() string {
	return connHint(rc.c) + setDurations(rc.c, "retention", "ttl")
}

// show prints a status: JSON under --json, else a line saying what was
// done (if any), then the status.
func (rc *ringCtx) show(action, done string, st idem.RingStatus) error {
	w := rc.c.App.Writer
	if rc.c.Bool(flagJSON) {
		return printJSON(w, ringResultJSON{Action: action, Done: done, ringStatusJSON: rc.statusJSON(st)})
	}
	if done != "" {
		fmt.Fprintln(w, done)
		fmt.Fprintln(w)
	}
	return rc.render(w, st)
}

func ringStatusCommand(o *options) *cli.Command {
	return &cli.Command{
		Name:  "status",
		Usage: "show the ring each database has recorded, what is moving, and when the old route can be dropped",
		Description: `Reads the ring row of every database named (one D1 call each) and shows the
newest ring, its phase, what moves while it is moving, when the old route can be
dropped (DropAt), and what each database has recorded, and when. Exits 1 when a
database cannot be read, when the ring names one that was not given, or when one
it names lost its identity (replaced or wiped: restore it, docs/sharding.md).

   d1idem ring status --databases-prefix ledger-
   d1idem ring status --database ledger-a --database ledger-b --json`,
		Flags: ringFlags(),
		Action: func(c *cli.Context) error {
			return o.withRing(c, func(rc *ringCtx) error {
				st, err := rc.a.RingStatus(c.Context)
				if err != nil {
					return err
				}
				if err := rc.show("status", "", st); err != nil {
					return err
				}
				if err := cmp.Or(unreadable(c.Context, st, rc.set), rc.lostError(st)); err != nil {
					return err
				}
				if missing := notNamed(st); len(missing) > 0 {
					return fmt.Errorf("ring status: version %d names %s not given here (%s): name every database of the ring, as the application's replicas have them",
						st.Ring.Version, pick(len(missing) == 1, "a database", "databases"), rc.set.labels(missing))
				}
				return nil
			})
		},
	}
}

// notNamed are the databases of the newest ring (and, while it moves, of
// the one before) that the command was not given: their IDs.
func notNamed(st idem.RingStatus) []string {
	var out []string
	for _, id := range append(slices.Clone(st.Ring.Previous), st.Ring.Homes...) {
		given := slices.ContainsFunc(st.Homes, func(h idem.HomeRing) bool { return h.ID == id })
		if !given && !slices.Contains(out, id) {
			out = append(out, id)
		}
	}
	return out
}

// unreadable is an error naming the databases whose ring could not be read;
// a missing one is named with the databases there are.
func unreadable(ctx context.Context, st idem.RingStatus, s *dbSet) error {
	var bad []string
	for _, h := range st.Homes {
		err := h.Err
		if cn := s.byID(h.ID); cn != nil && errors.Is(err, d1client.ErrNoDatabase) {
			err = cn.missing(ctx, err)
		}
		if err != nil {
			bad = append(bad, s.label(h.ID)+": "+describe(err))
		}
	}
	return couldNotRead("ring status", bad)
}

func ringInitCommand(o *options) *cli.Command {
	return &cli.Command{
		Name:  "init",
		Usage: "record the first ring, version 1, over the databases named: once, before the first request",
		Description: `Records version 1 of the ring, stable, over every database named: from then
on the application's sharded ledger routes each principal to one of them. Each
database must hold the schema ('d1idem schema apply') and no ring; several
databases must also hold no key. An existing ledger on one database becomes a
ring of one, which grows with 'd1idem ring grow'.

   d1idem ring init --database ledger-a --database ledger-b
   d1idem ring init --database orders-db        # an existing ledger, ready to grow`,
		Flags: ringFlags(),
		Action: func(c *cli.Context) error {
			return o.withRing(c, func(rc *ringCtx) error {
				st, err := rc.a.InitRing(c.Context)
				if err != nil {
					return rc.partial("ring init", st, err)
				}
				done := fmt.Sprintf("Recorded version 1 of the ring, stable, over %s: %s.", plural(int64(len(st.Ring.Homes)), "database", "databases"), rc.set.labels(st.Ring.Homes))
				return rc.show("init", done, st)
			})
		},
	}
}

// partial reports a ring operation that failed after recording its ring in
// some databases (st.Ring is then the new ring, and the others have Err
// set): the status on stdout, and the error that says to advance. Other
// errors pass through.
func (rc *ringCtx) partial(cmd string, st idem.RingStatus, err error) error {
	var bad []string
	for _, id := range st.Ring.Homes {
		if h := homeOf(st, id); h != nil && h.Err != nil && h.Ring == nil {
			bad = append(bad, rc.set.label(id)+": "+describe(h.Err))
		}
	}
	recorded := st.Ring.Version > 0 && len(bad) > 0 && len(bad) < len(st.Ring.Homes) && !errors.Is(err, idem.ErrRingConflict) && !errors.Is(err, idem.ErrHomeLost)
	if !recorded {
		return fmt.Errorf("%s: %w", cmd, trimIdem(err))
	}
	if !rc.c.Bool(flagJSON) {
		_ = rc.render(rc.c.App.Writer, st)
	}
	return fmt.Errorf("%s: version %d is recorded in %d of its %d databases (%s): run 'd1idem ring advance%s' to record it in the others; the ledger stays exactly-once meanwhile",
		cmd, st.Ring.Version, len(st.Ring.Homes)-len(bad), len(st.Ring.Homes), strings.Join(bad, "; "), rc.hint())
}

// homeOf is what the database with this ID has recorded; nil if it is not
// one of the status's.
func homeOf(st idem.RingStatus, id string) *idem.HomeRing {
	for i := range st.Homes {
		if st.Homes[i].ID == id {
			return &st.Homes[i]
		}
	}
	return nil
}

// trimIdem leaves out the idem package's prefixes of an error of the
// ring operations ("idem: grow: ").
func trimIdem(err error) error {
	msg := err.Error()
	for _, p := range []string{"idem: init ring: ", "idem: grow: ", "idem: advance ring: ", "idem: "} {
		msg = strings.TrimPrefix(msg, p)
	}
	return &wrapped{msg: msg, err: err}
}

// wrapped is an error with another message that still unwraps to err.
type wrapped struct {
	msg string
	err error
}

func (w *wrapped) Error() string { return w.msg }
func (w *wrapped) Unwrap() error { return w.err }

// ringFix turns the ring errors of idem into one line that says what to
// do, with the command that does it.
func ringFix(c *cli.Context, err error) error {
	if err == nil {
		return nil
	}
	path, hint := commandPath(c), connHint(c)
	switch {
	case errors.Is(err, idem.ErrNoRing):
		return fmt.Errorf("%s: no ring is recorded in these databases: run 'd1idem ring init%s' once, before the first request", path, hint)
	case errors.Is(err, idem.ErrUnknownHome):
		return fmt.Errorf("%s: the ring names a database not given here (%s): name every database of the ring ('d1idem ring status' lists them)", path, after(err, idem.ErrUnknownHome))
	case errors.Is(err, idem.ErrRingUnsettled):
		return fmt.Errorf("%s: the ring changed while the command ran (an operator is changing it): see 'd1idem ring status%s', then run it again", path, hint)
	case errors.Is(err, idem.ErrRingIncomplete):
		return fmt.Errorf("%s: the current ring is not recorded in every database yet: run 'd1idem ring advance%s' to record it there, then grow again", path, hint)
	case errors.Is(err, idem.ErrHomeLost):
		return fmt.Errorf("%s: %s: %s; with wrangler: 'wrangler d1 time-travel restore DATABASE --timestamp=TIME', TIME before the loss",
			path, strings.TrimPrefix(idem.ErrHomeLost.Error(), "idem: "), after(err, idem.ErrHomeLost))
	case errors.Is(err, idem.ErrRingConflict):
		return fmt.Errorf("%s: the databases hold a ring this command did not expect (%s): another operator changed it first, or the databases disagree; see 'd1idem ring status%s'",
			path, after(err, idem.ErrRingConflict), hint)
	}
	return err
}

// after is what err's message says after the sentinel's text: the details
// idem adds.
func after(err, sentinel error) string {
	s := sentinel.Error()
	for e := err; e != nil; e = errors.Unwrap(e) {
		if msg := e.Error(); strings.Contains(msg, s) {
			return strings.TrimLeft(msg[strings.Index(msg, s)+len(s):], ": ")
		}
	}
	return err.Error()
}

// ringShare says how many of the principals a change moves: those the
// added databases win, k of N + k.
func ringShare(r idem.Ring) string {
	k, n := len(r.Homes)-len(r.Previous), len(r.Homes)
	return fmt.Sprintf("about %d in %d of the principals (%.0f%%)", k, n, 100*float64(k)/float64(n))
}

// added are the databases a moving ring adds.
func added(r idem.Ring) []string {
	var out []string
	for _, id := range r.Homes {
		if !slices.Contains(r.Previous, id) {
			out = append(out, id)
		}
	}
	return out
}
