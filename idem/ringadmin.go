package idem

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/d1idem/d1idem"
	"github.com/d1idem/d1idem/d1client"
)

// Errors of the ring operations.
var (
	// ErrRingConflict is returned when a database holds a ring the
	// operation did not expect: another operator's change, a ring recorded
	// twice, or databases that disagree about one version.
	ErrRingConflict = errors.New("idem: ring conflict")
	// ErrRingIncomplete is returned by Grow while the current ring is not
	// recorded in every one of its databases: run AdvanceRing first.
	ErrRingIncomplete = errors.New("idem: the current ring is not recorded in every database: run AdvanceRing")
	// ErrDropNotDue is returned by AdvanceRing while a Moving ring's old
	// homes may still hold keys that must replay from there: see
	// RingStatus.DropAt.
	ErrDropNotDue = errors.New("idem: the moved principals' old homes may still hold replayable keys")
)

// ringFarFuture is the ring row's updated_at, 9999-12-31T23:59:59.999Z:
// no sweep ever deletes it.
const ringFarFuture = 253402300799999

// RingStatus is what each database of a sharded ledger has recorded.
type RingStatus struct {
	// Ring is the newest ring recorded in any database; its Version is 0
	// when there is none.
	Ring Ring
	// Homes are the ledger's databases (those given to NewSharded), by
	// ID.
	Homes []HomeRing
	// DropAt is, while Ring is Moving and every old home has recorded it,
	// the earliest time (by the old homes' clocks) at which AdvanceRing
	// can make it Stable; zero otherwise.
	DropAt time.Time
}

// HomeRing is what one database has recorded.
type HomeRing struct {
	ID string
	// Ring is the ring the database has recorded; nil when none.
	Ring *Ring
	// Identity is the home ID the database recorded when it joined a
	// ring (InitRing, Grow): written once, so that one database is never
	// used under two IDs. "" when none is recorded.
	Identity string
	// RecordedAt is when it recorded Ring's phase, and Now the time of the
	// read, both by the ledger's clock (D1's, by default).
	RecordedAt, Now time.Time
	// HasKeys reports whether it holds any key.
	HasKeys bool
	// Err is why it could not be read or written; the other fields are
	// then unset.
	Err error

	joined *Ring // the ring it joined under Identity
}

// dropDelay is how long after an old home recorded a Moving ring its old
// route may be dropped. A key claimed there just before has an owner who
// may write until its claim plus Retention - TTL - RetentionMargin/2 (see
// ErrReservationExpired), and the row must then replay for one Retention:
// 2 x Retention - TTL - RetentionMargin/2 in all.
func (c Config) dropDelay() time.Duration {
	return 2*c.Retention - c.TTL - RetentionMargin/2
}

// ringStatusStatements read a database's ring and identity rows, the
// clock, and whether it holds keys.
func (a *Admin) ringStatusStatements() []d1client.Statement {
	l := a.l
	rows := l.sql.query(l.now()).add("SELECT key, generation, fingerprint, response_body, created_at FROM " + d1idem.Table +
		" WHERE principal = '' AND key IN ('" + ringKey + "', '" + homeKey + "')")
	clock := l.sql.query(l.now()).add("SELECT ").clock().add(", EXISTS (SELECT 1 FROM " + d1idem.Table + " WHERE principal <> '')")
	return []d1client.Statement{rows.statement(), clock.statement()}
}

// scanRingStatus reads the results of ringStatusStatements.
func scanRingStatus(id string, res []d1client.Result) HomeRing {
	hr := HomeRing{ID: id}
	var now int64
	if err := res[1].Rows[0].Scan(&now, &hr.HasKeys); err != nil {
		hr.Err = err
		return hr
	}
	hr.Now = time.UnixMilli(now).UTC()
	var st homeState
	for _, row := range res[0].Rows {
		var key, fp, body string
		var gen, at int64
		if err := row.Scan(&key, &gen, &fp, &body, &at); err != nil {
			hr.Err = fmt.Errorf("%w: %v", errBadRing, err)
			return hr
		}
		if err := st.add(key, gen, fp, body); err != nil {
			hr.Err = err
			return hr
		}
		if key == ringKey {
			hr.RecordedAt = time.UnixMilli(at).UTC()
		}
	}
	hr.Ring = st.ring
	if st.ident != nil {
		hr.Identity, hr.joined = st.ident.ID, &st.ident.Joined
	}
	return hr
}

// statusAt runs stmts at h, then reads what h holds (ringStatusStatements).
func (a *Admin) statusAt(ctx context.Context, h *home, stmts ...d1client.Statement) HomeRing {
	res, err := h.db.Exec(ctx, append(stmts, a.ringStatusStatements()...), d1client.Idempotent())
	if err != nil {
		return HomeRing{ID: h.id, Err: err}
	}
	return scanRingStatus(h.id, res[len(stmts):])
}

// atEach sets, at once for each of the homes with these IDs, its HomeRing
// in st to what fn returns for it, and returns their errors.
func (a *Admin) atEach(st *RingStatus, ids []string, fn func(h *home) HomeRing) []error {
	dsts := make([]*HomeRing, len(ids)) // found before the goroutines write st.Homes
	for i, id := range ids {
		dsts[i] = st.home(id)
	}
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Go(func() { *dsts[i] = fn(a.l.shards.homes[id]) })
	}
	wg.Wait()
	var errs []error
	for i, id := range ids {
		if dsts[i].Err != nil {
			errs = append(errs, fmt.Errorf("home %s: %w", id, dsts[i].Err))
		}
	}
	return errs
}

// RingStatus reads the ring recorded in each of the ledger's databases; one
// that cannot be read has its HomeRing.Err set. New's ledger: ErrNotSharded.
func (a *Admin) RingStatus(ctx context.Context) (RingStatus, error) {
	if a.l.shards == nil {
		return RingStatus{}, ErrNotSharded
	}
	ids := a.l.shards.ids
	st := RingStatus{Homes: make([]HomeRing, len(ids))}
	for i, id := range ids {
		st.Homes[i].ID = id
	}
	a.atEach(&st, ids, func(h *home) HomeRing { return a.statusAt(ctx, h) })
	for _, h := range st.Homes {
		if h.Ring != nil && h.Ring.Epoch() > st.Ring.Epoch() {
			st.Ring = *h.Ring
		}
	}
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
		h := st.home(id)
		if h == nil || h.Ring == nil || !h.Ring.equal(st.Ring) {
			return time.Time{}
		}
		if t := h.RecordedAt.Add(a.l.cfg.dropDelay()); t.After(at) {
			at = t
		}
	}
	return at
}

func (st *RingStatus) home(id string) *HomeRing {
	for i := range st.Homes {
		if st.Homes[i].ID == id {
			return &st.Homes[i]
		}
	}
	return nil
}

// check returns an error when one of the databases with these IDs is not
// the ledger's or is recorded as another home, when the databases' rings
// conflict, and, if readable is set, when one could not be read.
func (st *RingStatus) check(ids []string, readable bool) error {
	var errs []error
	for _, id := range ids {
		h := st.home(id)
		switch {
		case h == nil:
			return fmt.Errorf("%w: %q", ErrUnknownHome, id)
		case h.Err != nil:
			if readable {
				errs = append(errs, fmt.Errorf("home %s: %w", id, h.Err))
			}
		case h.Identity != "" && h.Identity != id:
			return mismatch(id, h.Identity)
		}
	}
	rings := map[string]Ring{}
	for _, h := range st.Homes {
		if h.Ring != nil {
			rings[h.ID] = *h.Ring
		}
	}
	if err := consistent(rings); err != nil {
		return err
	}
	return errors.Join(errs...)
}

// identityStatement records, once, that the database is home id and
// joined ring r.
func (a *Admin) identityStatement(id string, r Ring) d1client.Statement {
	l := a.l
	return l.sql.query(l.now()).add(`INSERT INTO `+d1idem.Table+` (principal, key, fingerprint, status, generation, response_status, response_body, response_headers, created_at, updated_at)
VALUES ('', '`+homeKey+`', ?, 'completed', 1, 200, ?, '{"content-type":"application/json"}', `, id, encodeHome(id, r)).
		clock().add(`, ?)
ON CONFLICT (principal, key) DO NOTHING`, int64(ringFarFuture)).statement()
}

// join records, once, that h is home h.id and joined r, and returns what
// h holds then: ErrHomeMismatch if it was recorded as another home, and
// ErrRingConflict if it joined another ring.
func (a *Admin) join(ctx context.Context, h *home, r Ring) HomeRing {
	hr := a.statusAt(ctx, h, a.identityStatement(h.id, r))
	switch {
	case hr.Err != nil:
	case hr.Identity != h.id:
		hr.Err = mismatch(h.id, hr.Identity)
	case !hr.joined.equal(r):
		hr.Err = fmt.Errorf("%w: home %s joined %s in an earlier ring operation, not %s", ErrRingConflict, h.id, hr.joined.describe(), r.describe())
	}
	return hr
}

// joinAll runs join at each of the homes with these IDs, updating st.
func (a *Admin) joinAll(ctx context.Context, st *RingStatus, ids []string, r Ring) error {
	return errors.Join(a.atEach(st, ids, func(h *home) HomeRing { return a.join(ctx, h, r) })...)
}

// writeRing records r at h, unless h holds a newer ring, with h's identity
// if it has none, and returns what h holds then: ErrRingConflict if that
// is not r, ErrHomeMismatch if h is recorded as another home.
func (a *Admin) writeRing(ctx context.Context, h *home, r Ring) HomeRing {
	l := a.l
	q := l.sql.query(l.now()).add(`INSERT INTO `+d1idem.Table+` (principal, key, fingerprint, status, generation, response_status, response_body, response_headers, created_at, updated_at)
VALUES ('', '`+ringKey+`', ?, 'completed', ?, 200, ?, '{"content-type":"application/json"}', `, r.digest(), r.Epoch(), r.encode()).
		clock().add(`, ?)
ON CONFLICT (principal, key) DO UPDATE SET generation = excluded.generation, fingerprint = excluded.fingerprint,
  response_body = excluded.response_body, created_at = excluded.created_at
WHERE generation < excluded.generation`, int64(ringFarFuture))
	hr := a.statusAt(ctx, h, a.identityStatement(h.id, r), q.statement())
	switch {
	case hr.Err != nil:
	case hr.Identity != h.id:
		hr.Err = mismatch(h.id, hr.Identity)
	case hr.Ring == nil || !hr.Ring.equal(r):
		hr.Err = fmt.Errorf("%w: recording %s, the database holds %v", ErrRingConflict, r, hr.Ring)
	}
	return hr
}

// record writes r first at coordinator, the database that decides between
// operators racing to record different rings of one epoch, and, once it
// holds r, at every other database of r that lacks it (or lacks its
// identity). It updates st.
func (a *Admin) record(ctx context.Context, st *RingStatus, coordinator string, r Ring) error {
	first := a.writeRing(ctx, a.l.shards.homes[coordinator], r)
	*st.home(coordinator) = first
	if first.Err != nil {
		return fmt.Errorf("idem: recording %s at the coordinating home %s: %w", r, coordinator, first.Err)
	}
	var rest []string
	for _, id := range r.Homes {
		if h := st.home(id); id != coordinator && (h.Ring == nil || h.Ring.Epoch() < r.Epoch() || h.Err != nil || h.Identity == "") {
			rest = append(rest, id)
		}
	}
	errs := a.atEach(st, rest, func(h *home) HomeRing { return a.writeRing(ctx, h, r) })
	st.Ring = r
	st.DropAt = a.dropAt(*st)
	if len(errs) > 0 {
		return fmt.Errorf("idem: %s is recorded at %d of its %d databases; run AdvanceRing to record it at the others: %w",
			r, len(r.Homes)-len(errs), len(r.Homes), errors.Join(errs...))
	}
	_, err := a.l.shards.adopt(a.l, r)
	return err
}

// InitRing records the first ring, version 1, Stable, over every database
// of the ledger (those given to NewSharded), which must hold the schema and
// no ring; several databases must also hold no key (an existing ledger on
// one database becomes a ring of one, and grows with Grow). Run it once,
// before the first request of a sharded ledger.
//
// It records the ring only once every database has recorded its home ID and
// the ring it joins: a database that joined another ring or is recorded as
// another home is refused, so two rings never share a database. If InitRing
// fails once the ring is recorded somewhere, AdvanceRing finishes it.
func (a *Admin) InitRing(ctx context.Context) (RingStatus, error) {
	st, err := a.RingStatus(ctx)
	if err != nil {
		return st, err
	}
	ids := a.l.shards.ids
	if err := st.check(ids, true); err != nil {
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

// Grow starts a change of the ring that adds the databases with these IDs
// (each given to NewSharded, holding the schema, and empty): it records in
// each new database its home ID and the ring it joins, then the next
// version, Moving, in the current homes' first database (which decides
// between racing operators), then in every other one. From then on about
// len(ids)/(len(homes)+len(ids)) of the principals have their new keys in
// the new databases, their old ones still answered from their old homes,
// until AdvanceRing ends the change after DropAt (docs/sharding.md).
//
// The current ring must be Stable and recorded in all of its databases, and
// every replica must already have a Home for each new database. If some
// database cannot be written, AdvanceRing finishes the recording; the
// ledger stays exactly-once meanwhile.
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
	if err := st.check(cur.Homes, true); err != nil {
		return st, fmt.Errorf("idem: grow: %w", err)
	}
	for _, id := range cur.Homes {
		if h := st.home(id); h.Ring == nil || !h.Ring.equal(cur) || h.Identity == "" {
			return st, fmt.Errorf("idem: grow: %w (home %s holds %v)", ErrRingIncomplete, id, h.Ring)
		}
	}
	homes := slices.Clone(cur.Homes)
	for _, id := range ids {
		h := st.home(id)
		switch {
		case h == nil:
			return st, fmt.Errorf("idem: grow: %w: %q", ErrUnknownHome, id)
		case slices.Contains(homes, id):
			return st, fmt.Errorf("idem: grow: home %s is already in the ring", id)
		case h.Err != nil:
			return st, fmt.Errorf("idem: grow: home %s: %w", id, h.Err)
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

// AdvanceRing moves a change of the ring on: it records the newest ring in
// every database of it that lacks it, then, if that ring is Moving, makes it
// Stable once DropAt has passed, and the old homes are no longer read.
// Before DropAt it returns ErrDropNotDue with the status.
func (a *Admin) AdvanceRing(ctx context.Context) (RingStatus, error) {
	st, err := a.RingStatus(ctx)
	if err != nil {
		return st, err
	}
	cur := st.Ring
	if cur.Version == 0 {
		return st, fmt.Errorf("idem: advance ring: %w", ErrNoRing)
	}
	if err := st.check(cur.Homes, false); err != nil {
		return st, fmt.Errorf("idem: advance ring: %w", err)
	}
	coordinator := cur.Homes[0]
	if cur.Phase == RingMoving {
		coordinator = cur.Previous[0]
	}
	if err := a.record(ctx, &st, coordinator, cur); err != nil {
		return st, err
	}
	if cur.Phase == RingStable {
		return st, nil
	}
	for _, id := range cur.Previous {
		h := st.home(id)
		if due := h.RecordedAt.Add(a.l.cfg.dropDelay()); h.Now.Before(due) {
			return st, fmt.Errorf("%w: home %s until %s", ErrDropNotDue, id, due.Format(time.RFC3339))
		}
	}
	stable := Ring{Version: cur.Version, Phase: RingStable, Homes: cur.Homes}
	return st, a.record(ctx, &st, coordinator, stable)
}
