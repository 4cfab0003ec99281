package idem

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/d1idem/d1idem"
	"github.com/d1idem/d1idem/d1client"
)

// Errors of the ring operations: a database holds a ring the operation did
// not expect (another operator's change, databases that disagree); Grow
// while the ring is not recorded everywhere; AdvanceRing before DropAt.
var (
	ErrRingConflict   = errors.New("idem: ring conflict")
	ErrRingIncomplete = errors.New("idem: the current ring is not recorded in every database: run AdvanceRing")
	ErrDropNotDue     = errors.New("idem: the moved principals' old homes may still hold replayable keys")
)

// ringFarFuture, 9999-12-31T23:59:59.999Z, is the reserved rows' updated_at: never swept.
const ringFarFuture = 253402300799999

// RingStatus is what each database of a sharded ledger has recorded.
type RingStatus struct {
	Ring  Ring       // the newest ring recorded in any database; Version 0 if none
	Homes []HomeRing // the ledger's databases, by ID
	// DropAt is, once every old home has recorded a Moving Ring, the earliest
	// time (by their clocks) AdvanceRing can make it Stable; zero otherwise.
	DropAt time.Time
}

// HomeRing is what one database has recorded.
type HomeRing struct {
	ID              string
	Ring            *Ring     // nil when none
	Identity        string    // the home ID it recorded, once, joining a ring; "" if none
	RecordedAt, Now time.Time // when it recorded Ring's phase; the read (ledger clock)
	HasKeys         bool      // whether it holds any key
	Err             error     // why it could not be read or written (the rest unset)

	joined *Ring // the ring it joined under Identity
}

// dropDelay is how long after an old home recorded a Moving ring it may be
// dropped: a key claimed there just before is written up to Retention - TTL -
// RetentionMargin/2 later, then replays a Retention.
func (c Config) dropDelay() time.Duration {
	return 2*c.Retention - c.TTL - RetentionMargin/2
}

// statusAt runs stmts at h, then reads its ring, identity, clock and whether it holds keys.
func (a *Admin) statusAt(ctx context.Context, h *home, stmts ...d1client.Statement) HomeRing {
	l := a.l
	rows := l.sql.query(l.now()).add("SELECT key, generation, fingerprint, response_body, created_at FROM " + d1idem.Table +
		" WHERE principal = '' AND key IN ('" + ringKey + "', '" + homeKey + "')")
	clock := l.sql.query(l.now()).add("SELECT ").clock().add(", EXISTS (SELECT 1 FROM " + d1idem.Table + " WHERE principal <> '')")
	res, err := h.db.Exec(ctx, append(stmts, rows.statement(), clock.statement()), d1client.Idempotent())
	var hr HomeRing
	var now int64
	if err == nil {
		hr, err = readState(h.id, res[len(stmts)], true)
	}
	if err == nil {
		err = res[len(stmts)+1].Rows[0].Scan(&now, &hr.HasKeys)
		hr.Now = time.UnixMilli(now).UTC()
	}
	if err != nil {
		return HomeRing{ID: h.id, Err: err}
	}
	return hr
}

// atEach sets st's HomeRing of each of these homes to fn's, at once, returning the errors.
func (a *Admin) atEach(ctx context.Context, st *RingStatus, ids []string, fn func(*home) HomeRing) []error {
	hs, _ := a.l.shards.resolve(ids) // ids checked by RingStatus.check
	out, _ := eachHome(ctx, hs, func(_ context.Context, h *home) (HomeRing, error) { return fn(h), nil })
	var errs []error
	for _, hr := range out {
		*st.Home(hr.ID) = hr
		if hr.Err != nil {
			errs = append(errs, fmt.Errorf("home %s: %w", hr.ID, hr.Err))
		}
	}
	return errs
}

// RingStatus reads the ring recorded in each of the ledger's databases (an
// unreadable one has HomeRing.Err set); ErrNotSharded for New's ledger.
func (a *Admin) RingStatus(ctx context.Context) (RingStatus, error) {
	if a.l.shards == nil {
		return RingStatus{}, ErrNotSharded
	}
	hs, _ := a.l.shards.resolve(a.l.shards.ids)
	homes, _ := eachHome(ctx, hs, func(ctx context.Context, h *home) (HomeRing, error) { return a.statusAt(ctx, h), nil })
	st := RingStatus{Ring: newest(homes), Homes: homes}
	st.DropAt = a.dropAt(st)
	return st, nil
}

// dropAt computes RingStatus.DropAt.
func (a *Admin) dropAt(st RingStatus) time.Time {
	if st.Ring.Phase != RingMoving {
		return time.Time{}
	}
	var at time.Time
	for _, id := range st.Ring.Previous {
		h := st.Home(id)
		if h == nil || h.Ring == nil || !h.Ring.equal(st.Ring) {
			return time.Time{}
		}
		if t := h.RecordedAt.Add(a.l.cfg.dropDelay()); t.After(at) {
			at = t
		}
	}
	return at
}

// Home is what the database with this ID recorded; nil if the status has
// none.
func (st *RingStatus) Home(id string) *HomeRing {
	if i := slices.IndexFunc(st.Homes, func(h HomeRing) bool { return h.ID == id }); i >= 0 {
		return &st.Homes[i]
	}
	return nil
}

// check refuses unknown and mismatched homes among ids, conflicting rings,
// and, if readable, unreadable homes.
func (st *RingStatus) check(ids []string, readable bool) error {
	var errs []error
	for _, id := range ids {
		h := st.Home(id)
		switch {
		case h == nil:
			return fmt.Errorf("%w: %q", ErrUnknownHome, id)
		case h.Err != nil && readable:
			errs = append(errs, fmt.Errorf("home %s: %w", id, h.Err))
		case h.Identity != "" && h.Identity != id:
			return mismatch(id, h.Identity)
		}
	}
	if err := consistent(st.Homes); err != nil {
		return err
	}
	return errors.Join(errs...)
}

// lostHome returns an ErrHomeLost error for the first database of the
// newest ring that was read and holds no identity. Every database records
// its identity before any ring naming it is recorded anywhere (InitRing and
// Grow join them all first, and the ring is only ever written beside an
// identity), so a database the ring names without one is another database,
// or the same one wiped: never one that a failed operation missed.
func (st *RingStatus) lostHome() error {
	r := newest(st.Homes)
	for _, id := range r.Homes {
		if h := st.Home(id); h != nil && h.Err == nil && h.Identity == "" {
			return lost(id, r)
		}
	}
	return nil
}

// reservedRow inserts the reserved row key; params are its fingerprint, a
// generation if genSQL is "?", and its body.
func (a *Admin) reservedRow(key, genSQL, onConflict string, params ...any) d1client.Statement {
	return a.l.sql.query(a.l.now()).add(`INSERT INTO `+d1idem.Table+` (principal, key, fingerprint, status, generation, response_status, response_body, response_headers, created_at, updated_at)
VALUES ('', '`+key+`', ?, 'completed', `+genSQL+`, 200, ?, '{"content-type":"application/json"}', `, params...).
		clock().add(`, ?)
ON CONFLICT (principal, key) `+onConflict, int64(ringFarFuture)).statement()
}

// ringRow records ring r at the database of home id unless it holds a newer
// ring, or no identity row naming it home id: only a database that joined is
// given the ring, so a wiped one is never taken back in.
func (a *Admin) ringRow(id string, r Ring) d1client.Statement {
	return a.l.sql.query(a.l.now()).add(`INSERT INTO `+d1idem.Table+` (principal, key, fingerprint, status, generation, response_status, response_body, response_headers, created_at, updated_at)
SELECT '', '`+ringKey+`', ?, 'completed', ?, 200, ?, '{"content-type":"application/json"}', `, r.digest(), r.Epoch(), r.encode()).
		clock().add(`, ?
WHERE EXISTS (SELECT 1 FROM `+d1idem.Table+` WHERE principal = '' AND key = '`+homeKey+`' AND fingerprint = ?)
ON CONFLICT (principal, key) DO UPDATE SET generation = excluded.generation, fingerprint = excluded.fingerprint,
  response_body = excluded.response_body, created_at = excluded.created_at
WHERE generation < excluded.generation`, int64(ringFarFuture), id).statement()
}

// write records, once, that h is home h.id and joined r or, with ring, r,
// unless h holds a newer ring or never joined; it returns what h holds, with
// an error if h is another home, joined another ring, or (with ring) holds no
// identity or does not hold r.
func (a *Admin) write(ctx context.Context, h *home, r Ring, ring bool) HomeRing {
	stmt := a.reservedRow(homeKey, "1", "DO NOTHING", h.id, encodeHome(h.id, r))
	if ring {
		stmt = a.ringRow(h.id, r)
	}
	hr := a.statusAt(ctx, h, stmt)
	switch {
	case hr.Err != nil:
	case ring && hr.Identity == "":
		hr.Err = lost(h.id, r)
	case hr.Identity != h.id:
		hr.Err = mismatch(h.id, hr.Identity)
	case ring && (hr.Ring == nil || !hr.Ring.equal(r)):
		hr.Err = fmt.Errorf("%w: recording %s, the database holds %v", ErrRingConflict, r, hr.Ring)
	case !ring && !hr.joined.equal(r):
		hr.Err = fmt.Errorf("%w: home %s joined %s in an earlier ring operation, not %s", ErrRingConflict, h.id, hr.joined.describe(), r.describe())
	}
	return hr
}

// joinAll records at each of the homes with these IDs that it joined r.
func (a *Admin) joinAll(ctx context.Context, st *RingStatus, ids []string, r Ring) error {
	return errors.Join(a.atEach(ctx, st, ids, func(h *home) HomeRing { return a.write(ctx, h, r, false) })...)
}

// record writes r first at coordinator, which decides between racing operators, then at every
// other database of r that lacks it, updating st. Every database of r has joined it, or an
// earlier ring, before.
func (a *Admin) record(ctx context.Context, st *RingStatus, coordinator string, r Ring) error {
	first := a.write(ctx, a.l.shards.homes[coordinator], r, true)
	*st.Home(coordinator) = first
	if first.Err != nil {
		return fmt.Errorf("idem: recording %s at the coordinating home %s: %w", r, coordinator, first.Err)
	}
	var rest []string
	for _, id := range r.Homes {
		if h := st.Home(id); id != coordinator && (h.Ring == nil || h.Ring.Epoch() < r.Epoch() || h.Err != nil) {
			rest = append(rest, id)
		}
	}
	errs := a.atEach(ctx, st, rest, func(h *home) HomeRing { return a.write(ctx, h, r, true) })
	st.Ring = r
	st.DropAt = a.dropAt(*st)
	if err := errors.Join(errs...); errors.Is(err, ErrHomeLost) {
		return fmt.Errorf("idem: %s is recorded at %d of its %d databases: %w", r, len(r.Homes)-len(errs), len(r.Homes), err)
	} else if err != nil {
		return fmt.Errorf("idem: %s is recorded at %d of its %d databases; run AdvanceRing to record it at the others: %w",
			r, len(r.Homes)-len(errs), len(r.Homes), err)
	}
	_, err := a.l.shards.adopt(a.l, r)
	return err
}

// InitRing records the first ring, version 1 Stable, over every database given to NewSharded
// (each with the schema, no ring and, if several, no key); AdvanceRing finishes a failed one.
func (a *Admin) InitRing(ctx context.Context) (RingStatus, error) {
	st, err := a.RingStatus(ctx)
	if err != nil {
		return st, err
	}
	ids := a.l.shards.ids
	if err := cmp.Or(st.check(ids, true), st.lostHome()); err != nil {
		return st, fmt.Errorf("idem: init ring: %w", err)
	}
	for _, h := range st.Homes {
		switch {
		case h.Ring != nil:
			return st, fmt.Errorf("idem: init ring: %w: home %s already holds %s", ErrRingConflict, h.ID, h.Ring)
		case h.HasKeys && len(ids) > 1:
			return st, fmt.Errorf("idem: init ring: home %s holds keys: a ring over several databases starts with empty ones (start with the one holding keys, then Grow)", h.ID)
		}
	}
	r := Ring{Version: 1, Phase: RingStable, Homes: slices.Clone(ids)}
	if err := a.joinAll(ctx, &st, ids, r); err != nil {
		return st, fmt.Errorf("idem: init ring: no ring was recorded: %w", err)
	}
	return st, a.record(ctx, &st, ids[0], r)
}

// Grow records the next version of the Stable, fully recorded ring, Moving, adding the databases
// with these IDs (empty, given to every replica): the principals they win have their new keys
// there, their old ones at their old homes until AdvanceRing after DropAt (docs/sharding.md).
func (a *Admin) Grow(ctx context.Context, ids ...string) (RingStatus, error) {
	st, err := a.RingStatus(ctx)
	if err != nil {
		return st, err
	}
	cur := st.Ring
	switch {
	case len(ids) == 0:
		return st, errors.New("idem: grow: no database to add")
	case cur.Version == 0:
		return st, fmt.Errorf("idem: grow: %w", ErrNoRing)
	case cur.Phase != RingStable:
		return st, fmt.Errorf("idem: grow: %s is still moving: wait for RingStatus.DropAt and run AdvanceRing", cur)
	}
	if err := cmp.Or(st.check(slices.Concat(cur.Homes, ids), true), st.lostHome()); err != nil {
		return st, fmt.Errorf("idem: grow: %w", err)
	}
	for _, id := range cur.Homes {
		if h := st.Home(id); h.Ring == nil || !h.Ring.equal(cur) {
			return st, fmt.Errorf("idem: grow: %w (home %s holds %v)", ErrRingIncomplete, id, h.Ring)
		}
	}
	homes := slices.Clone(cur.Homes)
	for _, id := range ids {
		h := st.Home(id)
		switch {
		case slices.Contains(homes, id):
			return st, fmt.Errorf("idem: grow: home %s is already in the ring", id)
		case h.Ring != nil:
			return st, fmt.Errorf("idem: grow: %w: home %s already holds %s", ErrRingConflict, id, h.Ring)
		case h.HasKeys:
			return st, fmt.Errorf("idem: grow: home %s holds keys: add only empty databases", id)
		}
		homes = append(homes, id)
	}
	slices.Sort(homes)
	next := Ring{Version: cur.Version + 1, Phase: RingMoving, Homes: homes, Previous: cur.Homes}
	if err := a.joinAll(ctx, &st, ids, next); err != nil {
		return st, fmt.Errorf("idem: grow: no ring was recorded: %w", err)
	}
	return st, a.record(ctx, &st, cur.Homes[0], next)
}

// AdvanceRing records the newest ring in every database of it that lacks it,
// then, if Moving, makes it Stable once DropAt has passed (else ErrDropNotDue).
func (a *Admin) AdvanceRing(ctx context.Context) (RingStatus, error) {
	st, err := a.RingStatus(ctx)
	if err != nil {
		return st, err
	}
	cur := st.Ring
	if cur.Version == 0 {
		return st, fmt.Errorf("idem: advance ring: %w", ErrNoRing)
	}
	if err := cmp.Or(st.check(cur.Homes, false), st.lostHome()); err != nil {
		return st, fmt.Errorf("idem: advance ring: %w", err)
	}
	coordinator := slices.Concat(cur.Previous, cur.Homes)[0] // while Moving, an old home
	if err := a.record(ctx, &st, coordinator, cur); err != nil {
		return st, err
	}
	if cur.Phase == RingStable {
		return st, nil
	}
	for _, id := range cur.Previous {
		h := st.Home(id)
		if due := h.RecordedAt.Add(a.l.cfg.dropDelay()); h.Now.Before(due) {
			return st, fmt.Errorf("%w: home %s until %s", ErrDropNotDue, id, due.Format(time.RFC3339))
		}
	}
	return st, a.record(ctx, &st, coordinator, Ring{Version: cur.Version, Phase: RingStable, Homes: cur.Homes})
}
