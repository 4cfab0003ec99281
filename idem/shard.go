package idem

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/d1idem/d1idem/d1client"
)

// Home is one D1 database of a sharded ledger.
type Home struct {
	// ID names the database in the ring and routes principals, the same in every replica, forever:
	// 1 to 255 bytes of UTF-8 without control characters; "" for a *d1client.Client's database ID.
	ID string
	DB d1client.Executor
}

// Errors of a sharded ledger, as their texts say. On ErrHomeMismatch nothing
// is served until the Homes are fixed. On ErrHomeLost the principals of
// that database are refused, and the ring operations refuse to change the
// ring, until it is restored (docs/sharding.md#a-database-replaced-or-wiped).
var (
	ErrNotSharded    = errors.New("idem: not a sharded ledger: make it with NewSharded")
	ErrNoRing        = errors.New("idem: no ring is recorded in any home: record one with Admin.InitRing")
	ErrUnknownHome   = errors.New("idem: the ring names a database this ledger has no Home for")
	ErrRingUnsettled = errors.New("idem: the ring kept changing while the request was routed")
	ErrHomeMismatch  = errors.New("idem: a database is not the home it is given as")
	ErrHomeLost      = errors.New("idem: a database of the ring lost its identity: it was replaced or wiped")
)

const (
	maxReroutes   = 6           // how many times one request may be routed
	reloadBackoff = time.Second // how long after a refusal the rings are read again
)

// errReroute asks for the request to be routed again by the current ring.
var errReroute = errors.New("idem: route again")

// shards are the databases of a sharded ledger and the ring it routes by.
type shards struct {
	homes   map[string]*home // every configured database, by ID
	ids     []string         // their IDs, sorted
	loading chan struct{}    // one slot, held by the load in progress

	mu       sync.Mutex
	route    *route    // the newest ring seen; nil until loaded or after a refusal
	refused  error     // why the rings were refused
	refuseAt time.Time // when (monotonic)
}

// route is the ring the ledger routes by and, while Moving, its predecessor.
type route struct {
	expect
	prev expect
}

// expect is a ring a batch is guarded by, and its digest.
type expect struct {
	Ring
	digest string
}

// NewSharded returns a Ledger spanning several D1 databases, each principal's keys in the one
// the recorded ring routes it to (docs/sharding.md). Each must hold the schema, and a ring be
// recorded (Admin.InitRing) before the first request; homes may hold databases the ring lacks.
func NewSharded(homes []Home, cfg Config) (*Ledger, error) {
	if len(homes) == 0 {
		return nil, errors.New("idem: NewSharded: no homes")
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &shards{homes: map[string]*home{}, loading: make(chan struct{}, 1)}
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
	return &Ledger{cfg: cfg, sql: buildSQL(cfg.Clock != nil), shards: s, tel: newTelemetry(cfg.MeterProvider), cache: newReplayCache(cfg.ReplayCache)}, nil
}

// Ring returns the ring the ledger routes by (ErrNotSharded for a ledger made by New).
func (l *Ledger) Ring(ctx context.Context) (Ring, error) { return l.ringBy(ctx, (*shards).current) }

// RefreshRing reads every home's ring and adopts the newest, as a refused
// request does; conflicting rings or mismatched homes stop all service.
func (l *Ledger) RefreshRing(ctx context.Context) (Ring, error) { return l.ringBy(ctx, (*shards).load) }

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

// current returns the route, loading it (one load at a time) if absent or reloadBackoff after a refusal.
func (s *shards) current(ctx context.Context, l *Ledger) (*route, error) {
	if rt, err := s.cached(); rt != nil || err != nil {
		return rt, err
	}
	select {
	case s.loading <- struct{}{}:
		defer func() { <-s.loading }()
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if rt, err := s.cached(); rt != nil || err != nil {
		return rt, err // loaded while this request waited
	}
	return s.load(ctx, l)
}

// cached returns the route, or the refusal until reloadBackoff has passed.
func (s *shards) cached() (*route, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.refused != nil && time.Since(s.refuseAt) < reloadBackoff {
		return nil, s.refused
	}
	return s.route, nil
}

// readState reads the reserved rows of ringReadSQL or, withAt, statusAt (which adds created_at).
func readState(id string, res d1client.Result, withAt bool) (HomeRing, error) {
	hr := HomeRing{ID: id}
	for _, row := range res.Rows {
		var key, fp, body string
		var epoch, at int64
		dst := []any{&key, &epoch, &fp, &body}
		if withAt {
			dst = append(dst, &at)
		}
		if err := row.Scan(dst...); err != nil {
			return HomeRing{ID: id}, fmt.Errorf("%w: %v", errBadRing, err)
		}
		switch key {
		case ringKey:
			r, err := decodeRing(epoch, fp, body)
			if err != nil {
				return HomeRing{ID: id}, err
			}
			hr.Ring, hr.RecordedAt = &r, time.UnixMilli(at).UTC()
		case homeKey:
			joined, err := decodeHome(fp, body)
			if err != nil {
				return HomeRing{ID: id}, err
			}
			hr.Identity, hr.joined = fp, &joined
		}
	}
	return hr, nil
}

// newest returns the newest ring the homes hold; Version 0 if none.
func newest(homes []HomeRing) (r Ring) {
	for _, h := range homes {
		if h.Ring != nil && h.Ring.Epoch() > r.Epoch() {
			r = *h.Ring
		}
	}
	return r
}

// readAt runs ringRead then stmts at h in one call.
func (l *Ledger) readAt(ctx context.Context, h *home, stmts []d1client.Statement, opts ...d1client.ExecOption) (HomeRing, []d1client.Result, error) {
	res, err := h.db.Exec(ctx, append([]d1client.Statement{{SQL: l.sql.ringReadSQL}}, stmts...), opts...)
	hr := HomeRing{ID: h.id}
	if err == nil {
		hr, err = readState(h.id, res[0], false)
	}
	if err != nil {
		return hr, nil, fmt.Errorf("home %s: %w", h.id, err)
	}
	return hr, res[1:], nil
}

// lost is the error of home id, a database of ring r, that holds no
// identity: every database records one before any ring naming it is
// recorded, so this one was replaced or wiped, and the keys it held are gone.
func lost(id string, r Ring) error {
	return fmt.Errorf("%w: home %q, a database of %s, holds no identity, which every database records when it joins: the keys it held are gone, "+
		"and recording the ring there again would execute them a second time; restore it to a moment before the loss (D1 Time Travel), "+
		"or give home %q its own database again (docs/sharding.md#a-database-replaced-or-wiped)", ErrHomeLost, id, r, id)
}

func mismatch(id, recorded string) error {
	return fmt.Errorf("%w: the database given as home %q recorded that it is home %q (one database given under two IDs, or IDs that differ between replicas)", ErrHomeMismatch, id, recorded)
}

// conflict returns an ErrRingConflict error when rings a (held by whoA) and
// b differ at one epoch or the newer drops a home of the older.
func conflict(a, b Ring, whoA, whoB string) error {
	if b.Epoch() < a.Epoch() {
		a, b, whoA, whoB = b, a, whoB, whoA
	}
	switch {
	case a.Epoch() == b.Epoch() && !a.equal(b):
		return fmt.Errorf("%w: %s holds %s and %s holds %s, both at epoch %d", ErrRingConflict, whoA, a.describe(), whoB, b.describe(), a.Epoch())
	case len(a.drops(b)) > 0:
		return fmt.Errorf("%w: %s holds %s, which drops %v of %s held by %s (rings only grow)", ErrRingConflict, whoB, b.describe(), a.drops(b), a.describe(), whoA)
	}
	return nil
}

// consistent checks the rings of different homes against each other.
func consistent(homes []HomeRing) error {
	for i, a := range homes {
		for _, b := range homes[i+1:] {
			if a.Ring != nil && b.Ring != nil {
				if err := conflict(*a.Ring, *b.Ring, "home "+a.ID, "home "+b.ID); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// load reads every home and adopts the newest ring, passing over unreadable homes unless all are.
func (s *shards) load(ctx context.Context, l *Ledger) (*route, error) {
	hs, _ := s.resolve(s.ids)
	homes, _ := eachHome(ctx, hs, func(ctx context.Context, h *home) (HomeRing, error) {
		hr, _, err := l.readAt(ctx, h, nil, d1client.Coalesce(), opRing)
		hr.Err = err
		return hr, nil
	})
	st := RingStatus{Homes: homes}
	if err := st.check(s.ids, false); err != nil {
		return nil, s.refuse(l, err)
	}
	if r := newest(homes); r.Version > 0 {
		return s.adopt(l, r)
	}
	var errs []error
	for _, h := range homes {
		errs = append(errs, h.Err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("idem: reading the ring: %w", err)
	}
	return nil, ErrNoRing
}

// refuse logs err and returns it to every request until a later load finds the rings consistent.
func (s *shards) refuse(l *Ledger, err error) error {
	s.mu.Lock()
	s.route, s.refused, s.refuseAt = nil, err, time.Now()
	s.mu.Unlock()
	l.log().LogAttrs(context.Background(), slog.LevelError, "idem: the databases' rings or identities conflict; the sharded ledger serves nothing until they are fixed",
		ErrorAttrs(err)...)
	return err
}

// adopt routes by r if newer and returns the route; a conflicting ring is refused.
func (s *shards) adopt(l *Ledger, r Ring) (*route, error) {
	s.mu.Lock()
	if cur := s.route; cur != nil {
		if err := conflict(cur.Ring, r, "this ledger", "a database"); err != nil {
			s.mu.Unlock()
			return nil, s.refuse(l, err)
		}
		if cur.Epoch() >= r.Epoch() {
			s.mu.Unlock()
			return cur, nil
		}
	}
	p := r.predecessor() // used only while r is Moving
	rt := &route{expect{r, r.digest()}, expect{p, p.digest()}}
	s.route, s.refused = rt, nil
	s.mu.Unlock()
	log := l.log()
	log.LogAttrs(context.Background(), slog.LevelInfo, "idem: routing by a new ring",
		slog.Int64("version", r.Version), slog.String("phase", string(r.Phase)), slog.Any("homes", r.Homes))
	unknown := slices.DeleteFunc(slices.Clone(r.Homes), func(id string) bool { return s.homes[id] != nil })
	if len(unknown) > 0 {
		log.LogAttrs(context.Background(), slog.LevelError, "idem: the ring names databases this ledger has no Home for; the principals they hold are refused (503) until it is given them",
			slog.Any("unknown", unknown))
	}
	return rt, nil
}

// judge decides from what h recorded whether a batch sent to h by ring want
// stands (nil), must be routed again by h's newer ring (errReroute), or is
// refused.
func (s *shards) judge(l *Ledger, h *home, st HomeRing, want expect) error {
	var err error
	switch {
	case st.Identity == "":
		return lost(h.id, want.Ring) // only the principals it holds are refused
	case st.Identity != h.id:
		err = mismatch(h.id, st.Identity)
	case st.Ring == nil || st.Ring.Epoch() < want.Epoch():
		return nil
	case st.Ring.Epoch() == want.Epoch():
		if err = conflict(want.Ring, *st.Ring, "this ledger", "home "+h.id); err == nil {
			return nil
		}
	default:
		if _, err := s.adopt(l, *st.Ring); err != nil {
			return err
		}
		return errReroute
	}
	return s.refuse(l, err)
}

// recheck judges h after a guarded batch failed with err: if h stands, the
// guard did not abort the batch, and err is returned.
func (s *shards) recheck(ctx context.Context, l *Ledger, h *home, want expect, err error) error {
	if !errors.Is(err, d1client.ErrSQL) {
		return err
	}
	st, _, rerr := l.readAt(ctx, h, nil, d1client.Coalesce(), opRing)
	if rerr != nil {
		return fmt.Errorf("%w (and reading the ring after it: %v)", err, rerr)
	}
	return cmp.Or(s.judge(l, h, st, want), err)
}

// beginSharded is Begin on a sharded ledger.
func (l *Ledger) beginSharded(ctx context.Context, principal, key, fingerprint string, ttl time.Duration) (Decision, error) {
	for range maxReroutes {
		hs, rt, err := l.homesFor(ctx, principal)
		if err != nil {
			return Decision{}, err
		}
		d, err := l.beginRouted(ctx, rt, hs, principal, key, fingerprint, ttl)
		if !errors.Is(err, errReroute) {
			return d, err
		}
	}
	return Decision{}, fmt.Errorf("idem: claim: %w", ErrRingUnsettled)
}

// beginRouted runs round trip 1 by route rt at hs (homesFor). A moved principal's old home is read
// first: if it lacks rt, the key is claimed there behind the predecessor's guard; else answered
// from there or, absent or a stale reservation of this request (deleted, fenced), claimed at the
// new home. Once the old home records rt nothing claims a moved key there (docs/sharding.md).
func (l *Ledger) beginRouted(ctx context.Context, rt *route, hs []*home, principal, key, fingerprint string, ttl time.Duration) (Decision, error) {
	oh, nh := hs[0], hs[len(hs)-1]
	if len(hs) == 1 {
		return l.claimGuarded(ctx, nh, rt.expect, principal, key, fingerprint, ttl)
	}
	st, res, err := l.readAt(ctx, oh, []d1client.Statement{l.sql.lookupRow(principal, key, l.now())}, d1client.Coalesce(), opClaim)
	if err != nil {
		return Decision{}, fmt.Errorf("idem: claim: reading the old home: %w", err)
	}
	if st.Ring != nil && st.Ring.Epoch() < rt.Epoch() { // rt not recorded there yet
		if err := l.shards.judge(l, oh, st, rt.prev); err != nil {
			return Decision{}, err
		}
		return l.claimGuarded(ctx, oh, rt.prev, principal, key, fingerprint, ttl)
	}
	if err := l.shards.judge(l, oh, st, rt.expect); err != nil {
		return Decision{}, err
	}
	if st.Ring == nil {
		return Decision{}, fmt.Errorf("idem: claim: %w: home %s, the old home of a moved principal, holds no ring", ErrRingConflict, oh.id)
	}
	if len(res[0].Rows) == 0 {
		return l.claimGuarded(ctx, nh, rt.expect, principal, key, fingerprint, ttl)
	}
	var row storedRow
	if err := row.scan(res[0].Rows[0]); err != nil {
		return Decision{}, fmt.Errorf("idem: lookup result: %w", err)
	}
	if row.fingerprint != fingerprint || row.status != StatusPending || row.updatedAt >= row.now-ttl.Milliseconds() {
		return l.decideRow(&row, fingerprint, ttl)
	}
	// A stale reservation of this request: delete it, as a takeover would.
	res, err = oh.db.Exec(ctx, []d1client.Statement{l.sql.ringGuard(rt.expect, oh.id),
		l.sql.movedDelete(principal, key, row.generation, fingerprint, ttl, l.now())}, d1client.Idempotent(), opClaim)
	switch {
	case err != nil:
		return Decision{}, fmt.Errorf("idem: claim: moving a stale reservation: %w", l.shards.recheck(ctx, l, oh, rt.expect, err))
	case len(res[1].Rows) == 1:
		return l.claimGuarded(ctx, nh, rt.expect, principal, key, fingerprint, ttl)
	}
	return Decision{}, errReroute // the row changed meanwhile: read it again
}

// claimGuarded claims at h behind the guard of ring want.
func (l *Ledger) claimGuarded(ctx context.Context, h *home, want expect, principal, key, fingerprint string, ttl time.Duration) (Decision, error) {
	d, err := l.claimAt(ctx, h, []d1client.Statement{l.sql.ringGuard(want, h.id)}, principal, key, fingerprint, ttl)
	if err != nil {
		return Decision{}, l.shards.recheck(ctx, l, h, want, err)
	}
	return d, nil
}

// findRow runs stmts at the homes of principal's key, in order, until the
// first returns a row; each batch reads the home's ring too, and is judged.
// It returns the results and, on a sharded ledger, the home that gave them.
func (l *Ledger) findRow(ctx context.Context, principal string, stmts []d1client.Statement, opts ...d1client.ExecOption) ([]d1client.Result, string, error) {
	if l.single != nil {
		res, err := l.single.db.Exec(ctx, stmts, opts...)
		return res, "", err
	}
retry:
	for range maxReroutes {
		hs, rt, err := l.homesFor(ctx, principal)
		if err != nil {
			return nil, "", err
		}
		for i, h := range hs {
			st, res, err := l.readAt(ctx, h, stmts, opts...)
			if err != nil {
				return nil, "", err
			}
			want := rt.expect
			if st.Ring != nil && st.Ring.Epoch() < want.Epoch() && rt.Phase == RingMoving {
				want = rt.prev
			}
			switch err := l.shards.judge(l, h, st, want); {
			case errors.Is(err, errReroute):
				continue retry
			case err != nil:
				return nil, "", err
			}
			if len(res[0].Rows) > 0 || i == len(hs)-1 {
				return res, h.id, nil
			}
		}
	}
	return nil, "", ErrRingUnsettled
}

// homesFor returns the databases that may hold principal's keys (a moved
// principal's old home first), or for "" all the ring's, and the route.
func (l *Ledger) homesFor(ctx context.Context, principal string) ([]*home, *route, error) {
	if l.single != nil {
		return []*home{l.single}, nil, nil
	}
	rt, err := l.shards.current(ctx, l)
	if err != nil {
		return nil, nil, err
	}
	ids := rt.Homes
	if principal != "" {
		ids = []string{rt.Home(principal)}
		if old := rt.PreviousHome(principal); old != "" {
			ids = []string{old, ids[0]}
		}
	}
	hs, err := l.shards.resolve(ids)
	return hs, rt, err
}

// resolve returns the databases with these IDs.
func (s *shards) resolve(ids []string) ([]*home, error) {
	hs := make([]*home, len(ids))
	for i, id := range ids {
		if hs[i] = s.homes[id]; hs[i] == nil {
			return nil, fmt.Errorf("%w: %q", ErrUnknownHome, id)
		}
	}
	return hs, nil
}
