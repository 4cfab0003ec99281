package cli

import (
	"errors"
	"fmt"
	"slices"

	"github.com/urfave/cli/v2"

	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/internal/human"
)

// flagAdd names the databases ring grow adds.
const flagAdd = "add"

func ringGrowCommand(o *options) *cli.Command {
	return &cli.Command{
		Name:  "grow",
		Usage: "start a change of the ring that adds databases (--add): their principals' new keys go there",
		Description: `Starts the next version of the ring, moving, with the databases --add names
added: about k in N + k of the principals move to them (rendezvous hashing moves
only the principals a new database wins). A moved principal's new keys go to its
new home at once; the keys it already has are still answered from its old home,
which is read first, until the old route is dropped. Nothing is copied.

Name every database of the ledger, the new ones included; --add says which are
new (a name or binding of the wrangler config, or a database ID). They must
hold the schema and no key, and every replica of the application must already
have a Home for them. The current ring must be stable and recorded in every
database.

Two retention windows later (DropAt, shown here and by 'd1idem ring status'),
'd1idem ring advance' makes the new version stable. Rings only grow: a
database, once added, stays.

   d1idem ring grow --databases-prefix ledger- --add ledger-c`,
		Flags:  ringFlags(&multiFlag{cli.GenericFlag{Name: flagAdd, Usage: "the database `NAME` (or ID) to add: one of those named, not yet in the ring; repeat it to add several (required)", Value: &multiValue{}}}),
		Action: o.ringGrow,
	}
}

func (o *options) ringGrow(c *cli.Context) error {
	return o.withRing(c, func(rc *ringCtx) error {
		before, err := rc.a.RingStatus(c.Context)
		if err != nil {
			return err
		}
		ids, err := rc.toAdd(before)
		if err != nil {
			return err
		}
		st, err := rc.a.Grow(c.Context, ids...)
		if err != nil {
			return rc.partial("ring grow", st, err)
		}
		done := fmt.Sprintf("Started version %d: %s %s the ring of %s, moving %s to %s.", st.Ring.Version, rc.set.labels(ids),
			pick(len(ids) == 1, "joins", "join"), rc.set.labels(st.Ring.Previous), ringShare(st.Ring), pick(len(ids) == 1, "it", "them"))
		return rc.show("grow", done, st)
	})
}

// pick is a if cond, else b.
func pick(cond bool, a, b string) string {
	if cond {
		return a
	}
	return b
}

// toAdd resolves --add to the IDs of databases named and not in the ring,
// after checking that the ring can grow.
func (rc *ringCtx) toAdd(st idem.RingStatus) ([]string, error) {
	r := st.Ring
	switch {
	case r.Version == 0:
		return nil, idem.ErrNoRing
	case r.Phase == idem.RingMoving:
		return nil, fmt.Errorf("ring grow: version %d is still moving: %s; grow once it is stable", r.Version, rc.dropText(st))
	}
	var candidates []string
	for _, cn := range rc.set.conns {
		if !slices.Contains(r.Homes, cn.databaseID) {
			candidates = append(candidates, cn.label())
		}
	}
	names, _ := multiValues(rc.c, flagAdd)
	if len(names) == 0 {
		return nil, usagef("ring grow: name the databases to add with --%s (named here and not in the ring: %s)", flagAdd, orNone(candidates))
	}
	var ids []string
	for _, name := range names {
		cn := rc.set.named(name)
		switch {
		case cn == nil:
			return nil, usagef("ring grow: --%s %s is not one of the databases named (%s): name it with --database or --database-id too", flagAdd, name, rc.set.labels(rc.set.ids()))
		case slices.Contains(r.Homes, cn.databaseID):
			return nil, usagef("ring grow: --%s %s is already in the ring (version %d: %s)", flagAdd, name, r.Version, rc.set.labels(r.Homes))
		case !slices.Contains(ids, cn.databaseID):
			ids = append(ids, cn.databaseID)
		}
	}
	return ids, nil
}

func ringAdvanceCommand(o *options) *cli.Command {
	return &cli.Command{
		Name:  "advance",
		Usage: "finish a change of the ring: record it where it is missing, and once DropAt has passed, make it stable",
		Description: `Records the newest ring in every database of it that lacks it (after a grow
that could not reach them all, or an operator's process that died), then, if the
ring is moving and its DropAt has passed, makes it stable: the moved
principals' old homes are no longer read. Before DropAt it changes only what is
missing and exits 1, saying when to run it again. On a stable ring recorded
everywhere it does nothing.

DropAt is two retention windows (2 x --retention - --ttl - 30s) after the old
homes recorded the change: pass the application's --retention and --ttl.

   d1idem ring advance --databases-prefix ledger-
   d1idem ring advance --databases-prefix ledger- --retention 72h`,
		Flags:  ringFlags(),
		Action: o.ringAdvance,
	}
}

func (o *options) ringAdvance(c *cli.Context) error {
	return o.withRing(c, func(rc *ringCtx) error {
		before, err := rc.a.RingStatus(c.Context)
		if err != nil {
			return err
		}
		st, err := rc.a.AdvanceRing(c.Context)
		if errors.Is(err, idem.ErrDropNotDue) {
			if done := rc.recorded(before, st); done != "" && !c.Bool(flagJSON) {
				fmt.Fprintln(c.App.Writer, done)
			}
			return rc.notDue(st)
		} else if err != nil {
			return rc.partial("ring advance", st, err)
		}
		return rc.show("advance", rc.advanced(before, st), st)
	})
}

// notDue is ring advance's error before DropAt.
func (rc *ringCtx) notDue(st idem.RingStatus) error {
	if st.DropAt.IsZero() {
		return fmt.Errorf("ring advance: not yet: %s", rc.dropText(st))
	}
	return fmt.Errorf("ring advance: not yet: until %s (in %s, with the %s retention and %s TTL given) the moved principals' old homes may hold keys that must replay from there; run 'd1idem ring advance%s' again then",
		human.Time(st.DropAt), human.Duration(st.DropAt.Sub(clockOf(st))), human.Duration(rc.retention), human.Duration(rc.ttl), rc.hint())
}

// advanced says what ring advance did.
func (rc *ringCtx) advanced(before, after idem.RingStatus) string {
	r := after.Ring
	if before.Ring.Phase == idem.RingMoving && r.Phase == idem.RingStable {
		return fmt.Sprintf("Version %d is stable: the old route is dropped, and the moved principals' old homes are no longer read.", r.Version)
	}
	if done := rc.recorded(before, after); done != "" {
		return done
	}
	return fmt.Sprintf("Nothing to do: version %d, %s, is recorded in every database of it.", r.Version, r.Phase)
}

// recorded says in which databases the newest ring was recorded between
// two statuses; "" when in none.
func (rc *ringCtx) recorded(before, after idem.RingStatus) string {
	var ids []string
	for _, h := range after.Homes {
		b := homeOf(before, h.ID)
		if h.Ring != nil && (b == nil || b.Ring == nil || b.Ring.Epoch() < h.Ring.Epoch()) {
			ids = append(ids, h.ID)
		}
	}
	if len(ids) == 0 {
		return ""
	}
	return fmt.Sprintf("Recorded version %d, %s, in %s.", after.Ring.Version, after.Ring.Phase, rc.set.labels(ids))
}

// dropText says when the old route of a moving ring can be dropped.
func (rc *ringCtx) dropText(st idem.RingStatus) string {
	if st.DropAt.IsZero() {
		return fmt.Sprintf("the old route cannot be dropped before every old home has recorded version %d: 'd1idem ring advance%s' records it there", st.Ring.Version, rc.hint())
	}
	now := clockOf(st)
	if !now.Before(st.DropAt) {
		return fmt.Sprintf("the old route could be dropped from %s: 'd1idem ring advance%s' drops it", human.Time(st.DropAt), rc.hint())
	}
	return fmt.Sprintf("the old route can be dropped at %s (in %s, with the %s retention and %s TTL given): run 'd1idem ring advance%s' then",
		human.Time(st.DropAt), human.Duration(st.DropAt.Sub(now)), human.Duration(rc.retention), human.Duration(rc.ttl), rc.hint())
}

// describeRing is a ring for people: "version 2, moving from 2 databases
// (a, b) to 3 (a, b, c)".
func (s *dbSet) describeRing(r idem.Ring) string {
	if r.Phase == idem.RingMoving {
		return fmt.Sprintf("version %d, moving from %s (%s) to %d (%s)", r.Version, plural(int64(len(r.Previous)), "database", "databases"), s.labels(r.Previous), len(r.Homes), s.labels(r.Homes))
	}
	return fmt.Sprintf("version %d, %s, over %s (%s)", r.Version, r.Phase, plural(int64(len(r.Homes)), "database", "databases"), s.labels(r.Homes))
}
