package cli

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/internal/human"
	"github.com/d1idem/d1idem/internal/textsafe"
)

func ringCommand(o *options) *cli.Command {
	return &cli.Command{
		Name:        "ring",
		Usage:       "show and change the set of databases a ledger spans (its ring): status, init, grow, advance",
		Description: help("ring"),
		Subcommands: []*cli.Command{ringStatusCommand(o), ringInitCommand(o), ringGrowCommand(o), ringAdvanceCommand(o)},
	}
}

// ringFlags are every ring command's flags: the TTL and retention set the drop's time.
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

// withRing runs a ring command on a sharded ledger over the databases named.
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

// hint repeats the flags a ring command needs to be run again.
func (rc *ringCtx) hint() string {
	return connHint(rc.c) + setDurations(rc.c, "retention", "ttl")
}

// show prints what was done (if anything), then the status; or their JSON.
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
		Name:        "status",
		Usage:       "show the ring each database has recorded, what is moving, and when the old route can be dropped",
		Description: help("ring status"),
		Flags:       ringFlags(),
		Action: func(c *cli.Context) error {
			return o.withRing(c, func(rc *ringCtx) error {
				st, err := rc.a.RingStatus(c.Context)
				if err != nil {
					return err
				}
				if err := rc.show("status", "", st); err != nil {
					return err
				}
				if err := cmp.Or(rc.set.couldNotRead(c, "ring status", func(id string) error { return st.Home(id).Err }), rc.lostError(st)); err != nil {
					return err
				}
				if missing := st.NotGiven(); len(missing) > 0 {
					return fmt.Errorf("ring status: version %d names %s not given here (%s): name every database of the ring, as the application's replicas have them",
						st.Ring.Version, pick(len(missing) == 1, "a database", "databases"), rc.set.labels(missing))
				}
				return nil
			})
		},
	}
}

func ringInitCommand(o *options) *cli.Command {
	return &cli.Command{
		Name:        "init",
		Usage:       "record the first ring, version 1, over the databases named: once, before the first request",
		Description: help("ring init"),
		Flags:       ringFlags(),
		Action: func(c *cli.Context) error {
			return o.withRing(c, func(rc *ringCtx) error {
				st, err := rc.a.InitRing(c.Context)
				if err != nil {
					return rc.partial("ring init", st, err)
				}
				done := fmt.Sprintf("Recorded version 1 of the ring, stable, over %s: %s.", human.Plural(int64(len(st.Ring.Homes)), "database", "databases"), rc.set.labels(st.Ring.Homes))
				return rc.show("init", done, st)
			})
		},
	}
}

// partial reports a ring operation that recorded its ring in some
// databases only: the status, and the error that says to advance.
func (rc *ringCtx) partial(cmd string, st idem.RingStatus, err error) error {
	var bad []string
	for _, id := range st.Ring.Homes {
		if h := st.Home(id); h != nil && h.Err != nil && h.Ring == nil {
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

// trimIdem leaves out idem's prefixes of a ring operation's error ("idem: grow: ").
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

// ringFix turns idem's ring errors into a line that says which command to run.
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

// after is what err's message says after the sentinel's text.
func after(err, sentinel error) string {
	s := sentinel.Error()
	for e := err; e != nil; e = errors.Unwrap(e) {
		if msg := e.Error(); strings.Contains(msg, s) {
			return strings.TrimLeft(msg[strings.Index(msg, s)+len(s):], ": ")
		}
	}
	return err.Error()
}

// ringShare says how many principals a change moves: those the added databases win.
func ringShare(r idem.Ring) string {
	k, n := len(r.Homes)-len(r.Previous), len(r.Homes)
	return fmt.Sprintf("about %d in %d of the principals (%.0f%%)", k, n, 100*float64(k)/float64(n))
}

// flagAdd names the databases ring grow adds.
const flagAdd = "add"

func ringGrowCommand(o *options) *cli.Command {
	return &cli.Command{
		Name:        "grow",
		Usage:       "start a change of the ring that adds databases (--add): their principals' new keys go there",
		Description: help("ring grow"),
		Flags:       ringFlags(&multiFlag{cli.GenericFlag{Name: flagAdd, Usage: "the database `NAME` (or ID) to add: one of those named, not yet in the ring; repeat it to add several (required)", Value: &multiValue{}}}),
		Action:      o.ringGrow,
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
		Name:        "advance",
		Usage:       "finish a change of the ring: record it where it is missing, and once DropAt has passed, make it stable",
		Description: help("ring advance"),
		Flags:       ringFlags(),
		Action:      o.ringAdvance,
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
		human.Time(st.DropAt), human.Duration(st.DropAt.Sub(cmp.Or(st.Now(), time.Now()))), human.Duration(rc.retention), human.Duration(rc.ttl), rc.hint())
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

// recorded says where the newest ring was recorded between two statuses; "" if nowhere.
func (rc *ringCtx) recorded(before, after idem.RingStatus) string {
	ids := after.RecordedSince(before)
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
	now := cmp.Or(st.Now(), time.Now())
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
		return fmt.Sprintf("version %d, moving from %s (%s) to %d (%s)", r.Version, human.Plural(int64(len(r.Previous)), "database", "databases"), s.labels(r.Previous), len(r.Homes), s.labels(r.Homes))
	}
	return fmt.Sprintf("version %d, %s, over %s (%s)", r.Version, r.Phase, human.Plural(int64(len(r.Homes)), "database", "databases"), s.labels(r.Homes))
}

// ringOrNil is a ring under --json: null for none.
func ringOrNil(r *idem.Ring) *idem.Ring {
	if r == nil || r.Version == 0 {
		return nil
	}
	return r
}

// ringStatusJSON is ring status --json.
type ringStatusJSON struct {
	// Ring is the newest ring recorded in any database; null when none.
	Ring *idem.Ring `json:"ring"`
	// Adds are, while the ring is moving, the databases the change adds.
	Adds        []string       `json:"adds"`
	DropAt      *string        `json:"drop_at"`
	DropAtMS    *int64         `json:"drop_at_ms"`
	TTLMS       int64          `json:"ttl_ms"`
	RetentionMS int64          `json:"retention_ms"`
	Databases   []homeRingJSON `json:"databases"`
}

// homeRingJSON is what one database has recorded.
type homeRingJSON struct {
	Database     string     `json:"database"`
	ID           string     `json:"id"`
	Ring         *idem.Ring `json:"ring"`
	RecordedAt   *string    `json:"recorded_at"`
	RecordedAtMS *int64     `json:"recorded_at_ms"`
	HasKeys      bool       `json:"has_keys"`
	// Identity is the home ID the database recorded when it joined; null if none.
	Identity *string `json:"identity"`
	// Lost says that the ring names the database but it holds no identity:
	// it was replaced or wiped.
	Lost  bool    `json:"lost"`
	Error *string `json:"error"`
}

// ringResultJSON is ring init, grow and advance --json: what was done, and
// the status after it.
type ringResultJSON struct {
	Action string `json:"action"`
	Done   string `json:"done"`
	ringStatusJSON
}

func (rc *ringCtx) statusJSON(st idem.RingStatus) ringStatusJSON {
	out := ringStatusJSON{Ring: ringOrNil(&st.Ring), Adds: []string{}, TTLMS: rc.ttl.Milliseconds(), RetentionMS: rc.retention.Milliseconds(),
		Databases: make([]homeRingJSON, 0, len(st.Homes))}
	if st.Ring.Phase == idem.RingMoving {
		out.Adds = st.Ring.Added()
	}
	if !st.DropAt.IsZero() {
		at, ms := human.Time(st.DropAt), st.DropAt.UnixMilli()
		out.DropAt, out.DropAtMS = &at, &ms
	}
	for _, h := range st.Homes {
		j := homeRingJSON{Database: rc.set.label(h.ID), ID: h.ID, Ring: ringOrNil(h.Ring), HasKeys: h.HasKeys, Lost: st.Lost(h)}
		if h.Identity != "" {
			j.Identity = &h.Identity
		}
		if h.Err != nil {
			msg := describe(h.Err)
			j.Error = &msg
		}
		if h.Ring != nil {
			at, ms := human.Time(h.RecordedAt), h.RecordedAt.UnixMilli()
			j.RecordedAt, j.RecordedAtMS = &at, &ms
		}
		out.Databases = append(out.Databases, j)
	}
	for _, id := range st.NotGiven() {
		msg := notNamedText
		out.Databases = append(out.Databases, homeRingJSON{Database: id, ID: id, Error: &msg})
	}
	return out
}

// notNamedText is the status of a database of the ring not given here.
const notNamedText = "not given here: name it too"

// render writes a ring status for people: the newest ring, what moves and
// when the old route can be dropped, then what each database has recorded.
func (rc *ringCtx) render(w io.Writer, st idem.RingStatus) error {
	r := st.Ring
	var fields [][2]string
	switch {
	case r.Version == 0 && slices.ContainsFunc(st.Homes, func(h idem.HomeRing) bool { return h.Err != nil }):
		fields = append(fields, [2]string{"ring", "none found in the databases that could be read"})
	case r.Version == 0:
		fields = append(fields, [2]string{"ring", fmt.Sprintf("none recorded: 'd1idem ring init%s' records version 1 over the databases named", rc.hint())})
	case r.Phase == idem.RingMoving:
		fields = append(fields, [2]string{"ring", rc.set.describeRing(r)},
			[2]string{"moving", fmt.Sprintf("%s: those %s %s by rendezvous hashing. Their new keys go there;\nthe keys they have stay at their old homes, which are read first, until the drop.",
				ringShare(r), rc.set.labels(r.Added()), pick(len(r.Added()) == 1, "wins", "win"))},
			[2]string{"drop", rc.dropText(st)})
	default:
		fields = append(fields, [2]string{"ring", rc.set.describeRing(r)})
	}
	if err := printFields(w, fields); err != nil {
		return err
	}
	fmt.Fprintln(w)
	rows := make([][]string, 0, len(st.Homes))
	for _, h := range st.Homes {
		rows = append(rows, rc.homeRow(st, h))
	}
	for _, id := range st.NotGiven() {
		rows = append(rows, []string{textsafe.Display(id), notNamedText, "-", "-"})
	}
	return printTable(w, []string{"DATABASE", "RECORDED", "SINCE", "KEYS"}, rows)
}

// homeRow is one database's row of the status table.
func (rc *ringCtx) homeRow(st idem.RingStatus, h idem.HomeRing) []string {
	rec, since := "", "-"
	switch inRing := slices.Contains(st.Ring.Homes, h.ID); {
	case h.Err != nil:
		return []string{rc.set.label(h.ID), "error: " + describe(h.Err), "-", "-"}
	case st.Lost(h):
		rec = fmt.Sprintf("no identity, but version %d names it: the database was replaced or wiped; restore it (below)", st.Ring.Version)
	case h.Identity != "" && h.Identity != h.ID:
		rec = fmt.Sprintf("it recorded that it is home %s, not this one", h.Identity)
	case h.Ring == nil && inRing:
		rec = fmt.Sprintf("none, but version %d names it: 'd1idem ring advance' records it", st.Ring.Version)
	case h.Ring == nil:
		rec = pick(st.Ring.Version > 0, "none: not in the ring", "none")
	default:
		rec = fmt.Sprintf("version %d, %s", h.Ring.Version, h.Ring.Phase)
		if h.Ring.Epoch() < st.Ring.Epoch() {
			rec += fmt.Sprintf(" (behind version %d, %s: 'd1idem ring advance' records it)", st.Ring.Version, st.Ring.Phase)
		}
		since = fmt.Sprintf("%s (%s)", human.Time(h.RecordedAt), human.Age(h.Now.Sub(h.RecordedAt)))
	}
	return []string{rc.set.label(h.ID), rec, since, pick(h.HasKeys, "yes", "no")}
}

// lostError is ring status's error for the databases of the ring that lost
// their identity, or that recorded another; nil when there are none.
func (rc *ringCtx) lostError(st idem.RingStatus) error {
	var lost, other []string
	for _, h := range st.Homes {
		switch {
		case st.Lost(h):
			lost = append(lost, rc.set.label(h.ID))
		case h.Err == nil && h.Identity != "" && h.Identity != h.ID:
			other = append(other, fmt.Sprintf("%s recorded that it is home %s", rc.set.label(h.ID), h.Identity))
		}
	}
	switch {
	case len(lost) > 0:
		return fmt.Errorf("ring status: %s lost %s identity: replaced or wiped, with the keys %s held; restore %s to a moment before the loss with D1 Time Travel "+
			"('wrangler d1 time-travel restore %s --timestamp=TIME'), or name the home's own database again; no ring command records the ring there again, "+
			"which would execute those keys a second time (docs/sharding.md)",
			strings.Join(lost, ", "), pick(len(lost) == 1, "its", "their"), pick(len(lost) == 1, "it", "they"), pick(len(lost) == 1, "it", "them"), lost[0])
	case len(other) > 0:
		return fmt.Errorf("ring status: %s: give each home its own database, the same in every replica (docs/sharding.md)", strings.Join(other, "; "))
	}
	return nil
}
