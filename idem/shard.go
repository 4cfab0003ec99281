package idem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"

	"github.com/d1idem/d1idem/d1client"
)

// Home is one D1 database of a sharded ledger.
type Home struct {
	// ID names the database in the ring and is an input of the routing
	// hash (see Rendezvous), so every replica must give the same database
	// the same ID, forever. "" means DB.DatabaseID(). 1 to 255 bytes of
	// UTF-8 without control characters.
	ID string
	// DB reaches the database. Each home's client coalesces its own
	// calls (group commit per database) and keeps its own request budget.
	DB *d1client.Client
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
)

// maxReroutes bounds how many times one request is routed again after
// finding a newer ring, or its key moved, on the way.
const maxReroutes = 6

// errReroute asks for the request to be routed again, by the ring the
// ledger holds now.
var errReroute = errors.New("idem: route again")

// shards are the databases of a sharded ledger and the ring it routes by.
type shards struct {
	homes map[string]*home // every configured database, by ID
	ids   []string         // their IDs, sorted

	mu      sync.Mutex
	ring    *Ring         // the newest ring seen; nil until loaded
	loading chan struct{} // closed when a load in progress ends
}

// NewSharded returns a Ledger that spans several D1 databases, each
// principal's keys in the one the recorded ring routes it to (see Ring
// and docs/sharding.md). Every database must hold the ledger's schema, and
// the ring must have been recorded (Admin.InitRing) before the first
// request; the ledger reads it from the homes on first use and follows its
// changes (Admin.Grow, Admin.AdvanceRing) as it meets them. homes may
// include databases the ring does not name yet: give every replica a
// database before Grow adds it. One home is the N = 1 case: a ledger
// ready to grow.
//
// The Ledger's methods, the middleware and the administrative API work
// as they do on one database; a Reservation remembers its database.
func NewSharded(homes []Home, cfg Config) (*Ledger, error) {
	if len(homes) == 0 {
		return nil, errors.New("idem: NewSharded: no homes")
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &shards{homes: map[string]*home{}}
	for i, h := range homes {
		if h.DB == nil {
			return nil, fmt.Errorf("idem: NewSharded: homes[%d] has a nil D1 client", i)
		}
		id := h.ID
		if id == "" {
			id = h.DB.DatabaseID()
		}
		if err := checkHomeID(id); err != nil {
			return nil, fmt.Errorf("idem: NewSharded: homes[%d]: %w", i, err)
		}
		if s.homes[id] != nil {
			return nil, fmt.Errorf("idem: NewSharded: two homes have the ID %q", id)
		}
		s.homes[id] = &home{id: id, db: h.DB}
		s.ids = append(s.ids, id)
	}
	slices.Sort(s.ids)
	return &Ledger{cfg: cfg, sql: buildSQL(cfg.Clock != nil), shards: s, tel: newTelemetry(cfg.MeterProvider, cfg.TracerProvider)}, nil
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
func (l *Ledger) Ring(ctx context.Context) (Ring, error) {
	if l.shards == nil {
		return Ring{}, ErrNotSharded
	}
	return l.shards.current(ctx, l)
}

// RefreshRing reads the ring recorded in every home and adopts the newest
// if it is newer than the one the ledger routes by. A ledger learns a new
// ring by itself, from the first database that refuses a request routed by
// an older one; RefreshRing only makes it learn sooner.
func (l *Ledger) RefreshRing(ctx context.Context) (Ring, error) {
	if l.shards == nil {
		return Ring{}, ErrNotSharded
	}
	r, err := l.shards.load(ctx, l)
	if err != nil {
		return Ring{}, err
	}
	return l.shards.adopt(l, r), nil
}

// home returns the configured database with this ID.
func (s *shards) home(id string) (*home, error) {
	if h := s.homes[id]; h != nil {
		return h, nil
	}
	return nil, fmt.Errorf("%w: %q", ErrUnknownHome, id)
}

// current returns the ring the ledger routes by, loading it from the
// homes on first use (one load at a time; the others wait for it).
func (s *shards) current(ctx context.Context, l *Ledger) (Ring, error) {
	for {
		s.mu.Lock()
		if s.ring != nil {
			r := *s.ring
			s.mu.Unlock()
			return r, nil
		}
		if ch := s.loading; ch != nil {
			s.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return Ring{}, ctx.Err()
			}
		}
		ch := make(chan struct{})
		s.loading = ch
		s.mu.Unlock()
		r, err := s.load(ctx, l)
		s.mu.Lock()
		s.loading = nil
		s.mu.Unlock()
		close(ch)
		if err != nil {
			return Ring{}, err
		}
		return s.adopt(l, r), nil
	}
}

// load reads the ring of every home at once and returns the newest. Homes
// that cannot be read are passed over, unless none can be.
func (s *shards) load(ctx context.Context, l *Ledger) (Ring, error) {
	type answer struct {
		ring  *Ring
		epoch int64
		err   error
	}
	answers := make([]answer, len(s.ids))
	var wg sync.WaitGroup
	for i, id := range s.ids {
		wg.Go(func() {
			r, epoch, err := l.readRing(ctx, s.homes[id])
			answers[i] = answer{r, epoch, err}
		})
	}
	wg.Wait()
	var best *answer
	var errs []error
	for i := range answers {
		a := &answers[i]
		switch {
		case a.err != nil:
			errs = append(errs, a.err)
		case a.epoch > 0 && (best == nil || a.epoch > best.epoch):
			best = a
		}
	}
	switch {
	case best != nil:
		return *best.ring, nil
	case len(errs) > 0:
		return Ring{}, fmt.Errorf("idem: reading the ring: %w", errors.Join(errs...))
	}
	return Ring{}, ErrNoRing
}

// readRing reads the ring recorded at h: nil and epoch 0 when none.
func (l *Ledger) readRing(ctx context.Context, h *home) (*Ring, int64, error) {
	res, err := h.db.Exec(ctx, []d1client.Statement{l.sql.ringRead()}, d1client.Coalesce(), opRing)
	if err != nil {
		return nil, 0, fmt.Errorf("home %s: %w", h.id, err)
	}
	if len(res[0].Rows) == 0 {
		return nil, 0, nil
	}
	var epoch int64
	var body string
	if err := res[0].Rows[0].Scan(&epoch, &body); err != nil {
		return nil, 0, fmt.Errorf("home %s: %w: %v", h.id, errBadRing, err)
	}
	r, err := decodeRing(epoch, body)
	if err != nil {
		return nil, 0, fmt.Errorf("home %s: %w", h.id, err)
	}
	return &r, epoch, nil
}

// refresh reads the ring recorded at h and adopts it if it is newer.
func (s *shards) refresh(ctx context.Context, l *Ledger, h *home) error {
	r, _, err := l.readRing(ctx, h)
	if err != nil {
		return fmt.Errorf("idem: reading the ring: %w", err)
	}
	if r != nil {
		s.adopt(l, *r)
	}
	return nil
}

// adopt makes r the ring the ledger routes by, if it is newer than the
// one it has, and returns the ring it has then.
func (s *shards) adopt(l *Ledger, r Ring) Ring {
	s.mu.Lock()
	if s.ring != nil && (s.ring.Epoch() >= r.Epoch() || l.hooks.ignoreRing) {
		cur := *s.ring
		s.mu.Unlock()
		return cur
	}
	s.ring = &r
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
	return r
}

// beginSharded is Begin on a sharded ledger: round trip 1 where the ring
// routes the principal, routed again whenever a database shows a newer
// ring or the key moved on the way.
func (l *Ledger) beginSharded(ctx context.Context, principal, key, fingerprint string) (Decision, error) {
	for attempt := 1; ; attempt++ {
		r, err := l.shards.current(ctx, l)
		if err != nil {
			return Decision{}, err
		}
		d, err := l.beginRouted(ctx, r, principal, key, fingerprint)
		if !errors.Is(err, errReroute) {
			return d, err
		}
		if attempt == maxReroutes {
			return Decision{}, fmt.Errorf("idem: claim: %w", ErrRingUnsettled)
		}
	}
}

// beginRouted runs round trip 1 by ring r. It returns errReroute when the
// request must be routed again.
//
// An unmoved principal is claimed at its home behind the ring guard at r's
// epoch. A moved principal (r Moving, its home changed) is first read at
// its old home, which says whether it has recorded r yet:
//
//   - not yet: the key is claimed there, behind a guard that refuses the
//     claim once the old home records r (r's epoch - 1);
//   - yes, and the key is there: it is answered from there (replay, reuse,
//     in progress); a stale pending row of the same request is deleted
//     there (fenced) and the key claimed at the new home;
//   - yes, and the key is not there: it is claimed at the new home.
//
// Once the old home has recorded r, nothing claims a moved principal's
// key there any more (the guard refuses older rings; r's routing never
// claims there), so a key read as absent stays absent: see
// docs/sharding.md for the proof.
func (l *Ledger) beginRouted(ctx context.Context, r Ring, principal, key, fingerprint string) (Decision, error) {
	nh, err := l.shards.home(r.Home(principal))
	if err != nil {
		return Decision{}, err
	}
	if l.hooks.ignoreRing {
		return l.claimAt(ctx, nh, nil, principal, key, fingerprint)
	}
	oldID := r.PreviousHome(principal)
	if oldID == "" {
		return l.claimGuarded(ctx, nh, r.Epoch(), principal, key, fingerprint)
	}
	oh, err := l.shards.home(oldID)
	if err != nil {
		return Decision{}, err
	}
	res, err := oh.db.Exec(ctx, []d1client.Statement{l.sql.ringEpoch(), l.sql.movedLookup(principal, key, l.cfg.TTL, l.now())}, d1client.Coalesce(), opClaim)
	if err != nil {
		return Decision{}, fmt.Errorf("idem: claim: reading the old home: %w", err)
	}
	epoch, err := scanEpoch(res[0])
	if err != nil {
		return Decision{}, fmt.Errorf("idem: claim: reading the old home: %w", err)
	}
	switch {
	case epoch > r.Epoch():
		if err := l.shards.refresh(ctx, l, oh); err != nil {
			return Decision{}, err
		}
		return Decision{}, errReroute
	case epoch < r.Epoch():
		return l.claimGuarded(ctx, oh, r.Epoch()-1, principal, key, fingerprint)
	case len(res[1].Rows) == 0:
		return l.claimGuarded(ctx, nh, r.Epoch(), principal, key, fingerprint)
	}
	var row storedRow
	var stale int64
	rw := res[1].Rows[0]
	if err := row.scan(rw, &stale); err != nil {
		return Decision{}, fmt.Errorf("idem: lookup result: %w", err)
	}
	if row.fingerprint != fingerprint || row.status != StatusPending || stale == 0 {
		return l.decideRow(&row, fingerprint)
	}
	// A stale reservation of this request at the old home: delete it there,
	// as a takeover would supersede it, and claim the key at the new home.
	res, err = oh.db.Exec(ctx, []d1client.Statement{l.sql.ringGuard(r.Epoch()),
		l.sql.movedDelete(principal, key, row.generation, fingerprint, l.cfg.TTL, l.now())}, d1client.Idempotent(), opClaim)
	switch {
	case isRingViolation(err):
		if err := l.shards.refresh(ctx, l, oh); err != nil {
			return Decision{}, err
		}
		return Decision{}, errReroute
	case err != nil:
		return Decision{}, fmt.Errorf("idem: claim: moving a stale reservation: %w", err)
	case len(res[1].Rows) == 1:
		return l.claimGuarded(ctx, nh, r.Epoch(), principal, key, fingerprint)
	}
	return Decision{}, errReroute // the row changed meanwhile: read it again
}

// claimGuarded claims at h behind the ring guard at threshold; when the
// guard refuses, it adopts h's ring and asks for the request to be routed
// again.
func (l *Ledger) claimGuarded(ctx context.Context, h *home, threshold int64, principal, key, fingerprint string) (Decision, error) {
	g := l.sql.ringGuard(threshold)
	d, err := l.claimAt(ctx, h, &g, principal, key, fingerprint)
	if isRingViolation(err) {
		if err := l.shards.refresh(ctx, l, h); err != nil {
			return Decision{}, err
		}
		return Decision{}, errReroute
	}
	return d, err
}

// scanEpoch reads the ring epoch statement's result: 0 when no ring.
func scanEpoch(res d1client.Result) (int64, error) {
	if len(res.Rows) == 0 {
		return 0, nil
	}
	var epoch int64
	if err := res.Rows[0].Scan(&epoch); err != nil {
		return 0, fmt.Errorf("%w: %v", errBadRing, err)
	}
	return epoch, nil
}

// findRow runs stmts at the database holding principal's key, or where it
// would be: for a moved principal, its old home first, then its new one.
// It returns the results of stmts at the first home where their first
// statement returned a row, else at the last one tried. On a sharded ledger each batch also
// reads the home's ring epoch, and a newer ring is adopted and the search
// started again.
func (l *Ledger) findRow(ctx context.Context, principal string, stmts []d1client.Statement, opts ...d1client.ExecOption) ([]d1client.Result, error) {
	if l.single != nil {
		return l.single.db.Exec(ctx, stmts, opts...)
	}
	withEpoch := append([]d1client.Statement{l.sql.ringEpoch()}, stmts...)
retry:
	for attempt := 1; ; attempt++ {
		if attempt > maxReroutes {
			return nil, ErrRingUnsettled
		}
		r, err := l.shards.current(ctx, l)
		if err != nil {
			return nil, err
		}
		hs, err := l.principalHomesIn(r, principal)
		if err != nil {
			return nil, err
		}
		for i, h := range hs {
			res, err := h.db.Exec(ctx, withEpoch, opts...)
			if err != nil {
				return nil, err
			}
			epoch, err := scanEpoch(res[0])
			if err != nil {
				return nil, err
			}
			if epoch > r.Epoch() {
				if err := l.shards.refresh(ctx, l, h); err != nil {
					return nil, err
				}
				continue retry
			}
			if len(res[1].Rows) > 0 || i == len(hs)-1 {
				return res[1:], nil
			}
		}
	}
}

// ringHomes returns the databases of the ring the ledger routes by (every
// database of a Moving ring: its homes include the previous ones), or the
// one database of a ledger made by New.
func (l *Ledger) ringHomes(ctx context.Context) ([]*home, error) {
	if l.single != nil {
		return []*home{l.single}, nil
	}
	r, err := l.shards.current(ctx, l)
	if err != nil {
		return nil, err
	}
	return l.shards.resolve(r.Homes)
}

// principalHomes returns the databases that may hold principal's keys:
// its home, and while the ring is Moving its old home first.
func (l *Ledger) principalHomes(ctx context.Context, principal string) ([]*home, error) {
	if l.single != nil {
		return []*home{l.single}, nil
	}
	r, err := l.shards.current(ctx, l)
	if err != nil {
		return nil, err
	}
	return l.principalHomesIn(r, principal)
}

func (l *Ledger) principalHomesIn(r Ring, principal string) ([]*home, error) {
	ids := []string{r.Home(principal)}
	if old := r.PreviousHome(principal); old != "" {
		ids = []string{old, ids[0]}
	}
	return l.shards.resolve(ids)
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
