package idem

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/d1idem/d1idem/d1client"
)

// Home is one D1 database of a sharded ledger.
type Home struct {
	// ID names the database in the ring and is an input of the routing
	// hash (see Rendezvous), so every replica must give the same database
	// the same ID, forever. "" means the database ID of a
	// *d1client.Client. 1 to 255 bytes of UTF-8 without control
	// characters.
	ID string
	// DB reaches the database, usually a *d1client.Client: each home's
	// client coalesces its own calls (group commit per database) and
	// keeps its own request budget.
	DB d1client.Executor
}

// Errors of a sharded ledger.
var (
	// ErrNotSharded is returned by the ring operations of a ledger made
	// by New.
	ErrNotSharded = errors.New("idem: not a sharded ledger: make it with NewSharded")
	// ErrNoRing is returned when none of a sharded ledger's homes has a
	// ring recorded: record one with Admin.InitRing.
	ErrNoRing = errors.New("idem: no ring is recorded in any home: record one with Admin.InitRing")
	// ErrUnknownHome is returned when the ring routes a principal to a
	// database this ledger has no Home for: every replica must be given
	// every database of the ring (and those about to be added) before
	// the ring names them.
	ErrUnknownHome = errors.New("idem: the ring names a database this ledger has no Home for")
	// ErrRingUnsettled is returned when a request had to be routed again
	// too many times, the ring or the key changing under it each time.
	ErrRingUnsettled = errors.New("idem: the ring kept changing while the request was routed")
	// ErrHomeMismatch is returned when a database's recorded identity is
	// not the home ID the ledger was given for it: one database given
	// under two IDs, IDs swapped between replicas, or a database of
	// another ledger. Nothing is served until the Homes are fixed.
	ErrHomeMismatch = errors.New("idem: a database is not the home it is given as")
)

// maxReroutes bounds how many times one request is routed again after
// finding a newer ring, or its key moved, on the way.
const maxReroutes = 6

// reloadBackoff is how long a ledger that refused its databases' rings
// (a conflict, a mismatched home) waits before it reads them again.
const reloadBackoff = time.Second

// errReroute asks for the request to be routed again, by the ring the
// ledger holds now.
var errReroute = errors.New("idem: route again")

// shards are the databases of a sharded ledger and the ring it routes by.
type shards struct {
	homes map[string]*home // every configured database, by ID
	ids   []string         // their IDs, sorted

	mu       sync.Mutex
	route    *route        // the newest ring seen; nil until loaded or after a refusal
	refused  error         // why the rings were refused; nil when they were not
	refuseAt time.Time     // when (monotonic)
	loading  chan struct{} // closed when a load in progress ends
}

// route is a ring the ledger routes by, with what its guards compare: its
// own ring and digest, and while it is Moving its predecessor's.
type route struct {
	expect
	prev expect
}

// expect is a ring a batch is guarded by, and its digest.
type expect struct {
	Ring
	digest string
}

func expecting(r Ring) expect { return expect{r, r.digest()} }

func newRoute(r Ring) *route {
	rt := &route{expect: expecting(r)}
	if r.Phase == RingMoving {
		rt.prev = expecting(r.predecessor())
	}
	return rt
}

// NewSharded returns a Ledger that spans several D1 databases, each
// principal's keys in the one the recorded ring routes it to (see Ring and
// docs/sharding.md). Every database must hold the ledger's schema, and the
// ring must be recorded (Admin.InitRing) before the first request; the
// ledger reads it on first use and follows its changes (Admin.Grow,
// Admin.AdvanceRing) as it meets them. homes may include databases the ring
// does not name yet: give every replica a database before Grow adds it. One
// home is a ledger ready to grow.
//
// A ledger whose Homes disagree with the home IDs the databases recorded
// serves nothing and says why (ErrHomeMismatch); two homes naming the same
// database are refused here.
func NewSharded(homes []Home, cfg Config) (*Ledger, error) {
	if len(homes) == 0 {
		return nil, errors.New("idem: NewSharded: no homes")
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &shards{homes: map[string]*home{}}
	where := map[string]string{} // database address -> home ID
	for i, h := range homes {
		if h.DB == nil {
			return nil, fmt.Errorf("idem: NewSharded: homes[%d] has a nil D1 client", i)
		}
		id := cmp.Or(h.ID, databaseID(h.DB))
		if err := checkHomeID(id); err != nil {
			return nil, fmt.Errorf("idem: NewSharded: homes[%d]: %w", i, err)
		}
		if s.homes[id] != nil {
			return nil, fmt.Errorf("idem: NewSharded: two homes have the ID %q", id)
		}
		if c, ok := h.DB.(*d1client.Client); ok {
			addr := c.BaseURL() + "accounts/" + c.AccountID() + "/d1/database/" + c.DatabaseID()
			if other, dup := where[addr]; dup {
				return nil, fmt.Errorf("idem: NewSharded: %w: homes %q and %q are the same database (%s)", ErrHomeMismatch, other, id, c.DatabaseID())
			}
			where[addr] = id
		}
		s.homes[id] = &home{id: id, db: h.DB}
		s.ids = append(s.ids, id)
	}
	slices.Sort(s.ids)
	return &Ledger{cfg: cfg, sql: buildSQL(cfg.Clock != nil), shards: s, tel: newTelemetry(cfg.MeterProvider)}, nil
}

// Homes returns the ledger's databases: the one of New (its ID is the
// database ID), or those given to NewSharded, sorted by ID.
func (l *Ledger) Homes() []Home {
	if l.single != nil {
		return []Home{{ID: l.single.id, DB: l.single.db}}
	}
	out := make([]Home, 0, len(l.shards.ids))
	for _, id := range l.shards.ids {
		out = append(out, Home{ID: id, DB: l.shards.homes[id].db})
	}
	return out
}

// Ring returns the ring the ledger routes by, reading it from the homes if
// it has not yet. A ledger made by New has none: ErrNotSharded.
func (l *Ledger) Ring(ctx context.Context) (Ring, error) { return l.ringBy(ctx, (*shards).current) }

// RefreshRing reads the ring recorded in every home and adopts the newest if
// it is newer than the one the ledger routes by, as the ledger does by
// itself when a database refuses a request routed by an older one. Rings
// that conflict, or a home that is not the database it is given as, are
// refused: the ledger serves nothing until they are fixed.
func (l *Ledger) RefreshRing(ctx context.Context) (Ring, error) { return l.ringBy(ctx, (*shards).load) }

// ringBy returns the ring of the route that get (current or load) returns.
func (l *Ledger) ringBy(ctx context.Context, get func(*shards, context.Context, *Ledger) (*route, error)) (Ring, error) {
	if l.shards == nil {
		return Ring{}, ErrNotSharded
	}
	rt, err := get(l.shards, ctx, l)
	if err != nil {
		return Ring{}, err
	}
	return rt.Ring, nil
}

// home returns the configured database with this ID.
func (s *shards) home(id string) (*home, error) {
	if h := s.homes[id]; h != nil {
		return h, nil
	}
	return nil, fmt.Errorf("%w: %q", ErrUnknownHome, id)
}

// current returns the route the ledger routes by, loading it (one load at a
// time) on first use and, after a refusal, once reloadBackoff has passed.
func (s *shards) current(ctx context.Context, l *Ledger) (*route, error) {
	for {
		s.mu.Lock()
		if rt := s.route; rt != nil {
			s.mu.Unlock()
			return rt, nil
		}
		if s.refused != nil && time.Since(s.refuseAt) < reloadBackoff {
			err := s.refused
			s.mu.Unlock()
			return nil, err
		}
		if ch := s.loading; ch != nil {
			s.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		ch := make(chan struct{})
		s.loading = ch
		s.mu.Unlock()
		rt, err := s.load(ctx, l)
		s.mu.Lock()
		s.loading = nil
		s.mu.Unlock()
		close(ch)
		return rt, err
	}
}

// homeState is what one database has recorded of the ring.
type homeState struct {
	ring   *Ring     // nil when none
	digest string    // the ring row's fingerprint
	ident  *identity // nil when none
}

// readState reads the ring and identity rows of the ringRead statement.
func readState(h *home, res d1client.Result) (homeState, error) {
	var st homeState
	for _, row := range res.Rows {
		var key, fp, body string
		var epoch int64
		if err := row.Scan(&key, &epoch, &fp, &body); err != nil {
			return st, fmt.Errorf("home %s: %w: %v", h.id, errBadRing, err)
		}
		if err := st.add(key, epoch, fp, body); err != nil {
			return st, fmt.Errorf("home %s: %w", h.id, err)
		}
	}
	return st, nil
}

// add reads one ring or identity row into st: its key, generation,
// fingerprint and response_body.
func (st *homeState) add(key string, epoch int64, fp, body string) error {
	switch key {
	case ringKey:
		r, err := decodeRing(epoch, fp, body)
		if err != nil {
			return err
		}
		st.ring, st.digest = &r, fp
	case homeKey:
		id, err := decodeHome(fp, body)
		if err != nil {
			return err
		}
		st.ident = &id
	}
	return nil
}

// readHome reads what h has recorded.
func (l *Ledger) readHome(ctx context.Context, h *home) (homeState, error) {
	res, err := h.db.Exec(ctx, []d1client.Statement{l.sql.ringRead()}, d1client.Coalesce(), opRing)
	if err != nil {
		return homeState{}, fmt.Errorf("home %s: %w", h.id, err)
	}
	return readState(h, res[0])
}

// checkIdentity refuses a database whose identity row names another home.
func checkIdentity(h *home, st homeState) error {
	if st.ident != nil && st.ident.ID != h.id {
		return mismatch(h.id, st.ident.ID)
	}
	return nil
}

// mismatch is the error of the database given as home id that recorded
// that it is home recorded.
func mismatch(id, recorded string) error {
	return fmt.Errorf("%w: the database given as home %q recorded that it is home %q (one database given under two IDs, or IDs that differ between replicas)", ErrHomeMismatch, id, recorded)
}

// consistent checks rings recorded by different databases against each
// other: one ring per epoch, and rings only grow.
func consistent(rings map[string]Ring) error {
	ids := slices.Sorted(maps.Keys(rings))
	for i, a := range ids {
		for _, b := range ids[i+1:] {
			ra, rb := rings[a], rings[b]
			if rb.Epoch() < ra.Epoch() {
				a, b, ra, rb = b, a, rb, ra
			}
			switch {
			case ra.Epoch() == rb.Epoch() && !ra.equal(rb):
				return fmt.Errorf("%w: home %s holds %s and home %s holds %s, both at epoch %d", ErrRingConflict, a, ra.describe(), b, rb.describe(), ra.Epoch())
			case len(ra.drops(rb)) > 0:
				return fmt.Errorf("%w: home %s holds %s, which drops %v of %s held by home %s (rings only grow)", ErrRingConflict, b, rb.describe(), ra.drops(rb), ra.describe(), a)
			}
		}
	}
	return nil
}

// load reads every home at once and adopts the newest ring, passing over
// homes it cannot read unless none can be; it refuses conflicting rings and
// mismatched homes.
func (s *shards) load(ctx context.Context, l *Ledger) (*route, error) {
	type answer struct {
		st  homeState
		err error
	}
	hs, _ := s.resolve(s.ids) // every ID is configured
	answers, _ := eachHome(ctx, hs, func(ctx context.Context, h *home) (answer, error) {
		st, err := l.readHome(ctx, h)
		return answer{st, err}, nil
	})
	rings := map[string]Ring{}
	var newest *Ring
	var errs []error
	for i, a := range answers {
		h := hs[i]
		switch {
		case a.err != nil:
			errs = append(errs, a.err)
			continue
		case checkIdentity(h, a.st) != nil:
			return nil, s.refuse(l, checkIdentity(h, a.st))
		case a.st.ring == nil:
			continue
		}
		rings[h.id] = *a.st.ring
		if newest == nil || a.st.ring.Epoch() > newest.Epoch() {
			newest = a.st.ring
		}
	}
	if err := consistent(rings); err != nil {
		return nil, s.refuse(l, err)
	}
	switch {
	case newest != nil:
		return s.adopt(l, *newest)
	case len(errs) > 0:
		return nil, fmt.Errorf("idem: reading the ring: %w", errors.Join(errs...))
	}
	return nil, ErrNoRing
}

// refuse stops the ledger from routing: it logs err and returns it to every
// request until a load, reloadBackoff later, finds the rings consistent.
func (s *shards) refuse(l *Ledger, err error) error {
	s.mu.Lock()
	s.route, s.refused, s.refuseAt = nil, err, time.Now()
	s.mu.Unlock()
	l.log().LogAttrs(context.Background(), slog.LevelError, "idem: the databases' rings or identities conflict; the sharded ledger serves nothing until they are fixed",
		slog.String("error", err.Error()))
	return err
}

// adopt makes r the ring the ledger routes by if it is newer than the one
// it has, and returns the route it has then. A ring of the same epoch with
// another content, or a newer one that drops a home, is refused.
func (s *shards) adopt(l *Ledger, r Ring) (*route, error) {
	s.mu.Lock()
	cur := s.route
	switch {
	case cur != nil && cur.Epoch() == r.Epoch() && !cur.equal(r):
		s.mu.Unlock()
		return nil, s.refuse(l, fmt.Errorf("%w: this ledger routes by %s, a database holds %s at the same epoch", ErrRingConflict, cur.describe(), r.describe()))
	case cur != nil && cur.Epoch() > r.Epoch() && len(r.drops(cur.Ring)) > 0,
		cur != nil && cur.Epoch() < r.Epoch() && len(cur.drops(r)) > 0:
		s.mu.Unlock()
		old, next := cur.Ring, r
		if old.Epoch() > next.Epoch() {
			old, next = next, old
		}
		return nil, s.refuse(l, fmt.Errorf("%w: %s drops %v of %s (rings only grow)", ErrRingConflict, next.describe(), old.drops(next), old.describe()))
	case cur != nil && cur.Epoch() >= r.Epoch():
		s.mu.Unlock()
		return cur, nil
	}
	rt := newRoute(r)
	s.route, s.refused = rt, nil
	s.mu.Unlock()
	var unknown []string
	for _, id := range r.Homes {
		if s.homes[id] == nil {
			unknown = append(unknown, id)
		}
	}
	log := l.log()
	log.LogAttrs(context.Background(), slog.LevelInfo, "idem: routing by a new ring",
		slog.Int64("version", r.Version), slog.String("phase", string(r.Phase)), slog.Any("homes", r.Homes))
	if len(unknown) > 0 {
		log.LogAttrs(context.Background(), slog.LevelError, "idem: the ring names databases this ledger has no Home for; the principals they hold are refused (503) until it is given them",
			slog.Any("unknown", unknown))
	}
	return rt, nil
}

// judge decides, from what h has recorded, whether a batch sent to h by
// ring want stands: nil when it does; errReroute when h holds a newer ring
// (adopted first); an error when h is not the home it is given as, holds
// another ring of the epoch, or a newer ring that cannot be adopted. Guards
// are recognised by what the database holds, never by an error's text.
func (s *shards) judge(l *Ledger, h *home, st homeState, want expect) error {
	if err := checkIdentity(h, st); err != nil {
		return s.refuse(l, err)
	}
	if st.ident == nil {
		return s.refuse(l, fmt.Errorf("%w: the database given as home %q has no identity recorded: finish the ring's recording with Admin.AdvanceRing (d1idem ring advance)", ErrHomeMismatch, h.id))
	}
	switch {
	case st.ring == nil || st.ring.Epoch() < want.Epoch():
		return nil
	case st.ring.Epoch() == want.Epoch() && st.digest != want.digest:
		return s.refuse(l, fmt.Errorf("%w: home %s holds %s, this ledger routes by %s of the same epoch", ErrRingConflict, h.id, st.ring.describe(), want.describe()))
	case st.ring.Epoch() == want.Epoch():
		return nil
	}
	if _, err := s.adopt(l, *st.ring); err != nil {
		return err
	}
	return errReroute
}

// recheck reads and judges h after a guarded batch failed with err: the
// guard aborted it exactly when h does not stand. When it stands, the
// failure was the batch's own, and err is returned.
func (s *shards) recheck(ctx context.Context, l *Ledger, h *home, want expect, err error) error {
	if !errors.Is(err, d1client.ErrSQL) {
		return err
	}
	st, rerr := l.readHome(ctx, h)
	if rerr != nil {
		return fmt.Errorf("%w (and reading the ring after it: %v)", err, rerr)
	}
	if j := s.judge(l, h, st, want); j != nil {
		return j
	}
	return err
}

// beginSharded is Begin on a sharded ledger: round trip 1 where the ring
// routes the principal, routed again as beginRouted asks.
func (l *Ledger) beginSharded(ctx context.Context, principal, key, fingerprint string) (Decision, error) {
	for attempt := 1; ; attempt++ {
		rt, err := l.shards.current(ctx, l)
		if err != nil {
			return Decision{}, err
		}
		d, err := l.beginRouted(ctx, rt, principal, key, fingerprint)
		if !errors.Is(err, errReroute) {
			return d, err
		}
		if attempt == maxReroutes {
			return Decision{}, fmt.Errorf("idem: claim: %w", ErrRingUnsettled)
		}
	}
}

// beginRouted runs round trip 1 by route rt; errReroute asks for the
// request to be routed again. An unmoved principal is claimed at its home
// behind rt's ring guard. A moved principal's old home is read first, and
// says whether it has recorded rt yet:
//
//   - not yet: the key is claimed there, behind the guard of rt's
//     predecessor, which refuses the claim once the old home records rt;
//   - yes, and the key is there: it is answered from there, or, a stale
//     pending row of the same request, deleted there (fenced) and claimed
//     at the new home;
//   - yes, and the key is not there: it is claimed at the new home.
//
// Once the old home has recorded rt nothing claims a moved principal's key
// there, so a key read as absent stays absent (docs/sharding.md).
func (l *Ledger) beginRouted(ctx context.Context, rt *route, principal, key, fingerprint string) (Decision, error) {
	nh, err := l.shards.home(rt.Home(principal))
	if err != nil {
		return Decision{}, err
	}
	oldID := rt.PreviousHome(principal)
	if oldID == "" {
		return l.claimGuarded(ctx, nh, rt.expect, principal, key, fingerprint)
	}
	oh, err := l.shards.home(oldID)
	if err != nil {
		return Decision{}, err
	}
	res, err := oh.db.Exec(ctx, []d1client.Statement{l.sql.ringRead(), l.sql.lookupRow(principal, key, l.now())}, d1client.Coalesce(), opClaim)
	if err != nil {
		return Decision{}, fmt.Errorf("idem: claim: reading the old home: %w", err)
	}
	st, err := readState(oh, res[0])
	if err != nil {
		return Decision{}, fmt.Errorf("idem: claim: reading the old home: %w", err)
	}
	if st.ring != nil && st.ring.Epoch() < rt.Epoch() {
		// The old home has not recorded rt: it must hold rt's predecessor,
		// and the key is claimed there, behind its guard.
		if err := l.shards.judge(l, oh, st, rt.prev); err != nil {
			return Decision{}, err
		}
		return l.claimGuarded(ctx, oh, rt.prev, principal, key, fingerprint)
	}
	if err := l.shards.judge(l, oh, st, rt.expect); err != nil {
		return Decision{}, err
	}
	if st.ring == nil {
		return Decision{}, fmt.Errorf("idem: claim: %w: home %s, the old home of a moved principal, holds no ring", ErrRingConflict, oh.id)
	}
	if len(res[1].Rows) == 0 {
		return l.claimGuarded(ctx, nh, rt.expect, principal, key, fingerprint)
	}
	var row storedRow
	if err := row.scan(res[1].Rows[0]); err != nil {
		return Decision{}, fmt.Errorf("idem: lookup result: %w", err)
	}
	if row.fingerprint != fingerprint || row.status != StatusPending || !row.stale(l.cfg.TTL) {
		return l.decideRow(&row, fingerprint)
	}
	// A stale reservation of this request at the old home: delete it there,
	// as a takeover would supersede it, and claim the key at the new home.
	res, err = oh.db.Exec(ctx, []d1client.Statement{l.sql.ringGuard(rt.expect, oh.id),
		l.sql.movedDelete(principal, key, row.generation, fingerprint, l.cfg.TTL, l.now())}, d1client.Idempotent(), opClaim)
	switch {
	case err != nil:
		return Decision{}, fmt.Errorf("idem: claim: moving a stale reservation: %w", l.shards.recheck(ctx, l, oh, rt.expect, err))
	case len(res[1].Rows) == 1:
		return l.claimGuarded(ctx, nh, rt.expect, principal, key, fingerprint)
	}
	return Decision{}, errReroute // the row changed meanwhile: read it again
}

// claimGuarded claims at h behind the guard of ring want; when the guard
// refuses, recheck says why.
func (l *Ledger) claimGuarded(ctx context.Context, h *home, want expect, principal, key, fingerprint string) (Decision, error) {
	g := l.sql.ringGuard(want, h.id)
	d, err := l.claimAt(ctx, h, &g, principal, key, fingerprint)
	if err != nil {
		return Decision{}, l.shards.recheck(ctx, l, h, want, err)
	}
	return d, nil
}

// findRow runs stmts where principal's key is or would be (a moved
// principal's old home first) and returns their results at the first home
// where the first statement returned a row, else at the last one. On a
// sharded ledger each batch reads the home's ring too, and is judged.
func (l *Ledger) findRow(ctx context.Context, principal string, stmts []d1client.Statement, opts ...d1client.ExecOption) ([]d1client.Result, error) {
	if l.single != nil {
		return l.single.db.Exec(ctx, stmts, opts...)
	}
	withRing := append([]d1client.Statement{l.sql.ringRead()}, stmts...)
retry:
	for attempt := 1; ; attempt++ {
		if attempt > maxReroutes {
			return nil, ErrRingUnsettled
		}
		rt, err := l.shards.current(ctx, l)
		if err != nil {
			return nil, err
		}
		hs, err := l.shards.resolve(principalIDs(rt.Ring, principal))
		if err != nil {
			return nil, err
		}
		for i, h := range hs {
			res, err := h.db.Exec(ctx, withRing, opts...)
			if err != nil {
				return nil, err
			}
			st, err := readState(h, res[0])
			if err != nil {
				return nil, err
			}
			want := rt.expect
			if st.ring != nil && st.ring.Epoch() < want.Epoch() && rt.Phase == RingMoving {
				want = rt.prev
			}
			switch err := l.shards.judge(l, h, st, want); {
			case errors.Is(err, errReroute):
				continue retry
			case err != nil:
				return nil, err
			}
			if len(res[1].Rows) > 0 || i == len(hs)-1 {
				return res[1:], nil
			}
		}
	}
}

// ringHomes returns the databases of the ring the ledger routes by (every
// database of a Moving ring), or the one database of a ledger made by New.
func (l *Ledger) ringHomes(ctx context.Context) ([]*home, error) {
	return l.homesOf(ctx, func(r Ring) []string { return r.Homes })
}

// principalHomes returns the databases that may hold principal's keys (see
// principalIDs).
func (l *Ledger) principalHomes(ctx context.Context, principal string) ([]*home, error) {
	return l.homesOf(ctx, func(r Ring) []string { return principalIDs(r, principal) })
}

// homesOf returns the databases whose IDs ids picks from the ring the
// ledger routes by, or the one database of a ledger made by New.
func (l *Ledger) homesOf(ctx context.Context, ids func(Ring) []string) ([]*home, error) {
	if l.single != nil {
		return []*home{l.single}, nil
	}
	rt, err := l.shards.current(ctx, l)
	if err != nil {
		return nil, err
	}
	return l.shards.resolve(ids(rt.Ring))
}

// principalIDs returns the IDs of the databases that may hold principal's
// keys: its home, and while r is Moving its old home first.
func principalIDs(r Ring, principal string) []string {
	if old := r.PreviousHome(principal); old != "" {
		return []string{old, r.Home(principal)}
	}
	return []string{r.Home(principal)}
}

func (s *shards) resolve(ids []string) ([]*home, error) {
	out := make([]*home, 0, len(ids))
	for _, id := range ids {
		h, err := s.home(id)
		if err != nil {
			return nil, err
		}
		out = append(out, h)
	}
	return out, nil
}
