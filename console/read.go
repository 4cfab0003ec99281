package console

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/d1idem/d1idem/idem"
)

// calls are the D1 calls one read made, in all and on each database.
type calls struct {
	Total int64
	Each  []int64 // by the order of server.dbs
}

// measure runs fn, alone among the console's reads, and counts the D1
// calls the databases' clients made meanwhile: fn's own, unless the
// application shares the clients with other work. It waits for the read
// in progress, or for ctx to end.
func (s *server) measure(ctx context.Context, fn func(ctx context.Context) error) (calls, error) {
	select {
	case s.d1 <- struct{}{}:
	case <-ctx.Done():
		return calls{}, ctx.Err()
	}
	defer func() { <-s.d1 }()
	before := s.counts()
	err := fn(ctx)
	out := calls{Each: s.counts()}
	for i := range out.Each {
		out.Each[i] -= before[i]
		out.Total += out.Each[i]
	}
	return out, err
}

// counts are the calls each database's client has made so far.
func (s *server) counts() []int64 {
	out := make([]int64, len(s.dbs))
	for i, db := range s.dbs {
		out[i] = db.Client.Stats().Calls
	}
	return out
}

// stuckShown is how many of the keys whose owner has gone quiet the
// overview shows: one page of Admin.List (one D1 call per database).
const stuckShown = 20

// reading is one read of the overview.
type reading struct {
	At       time.Time // when it ended, by the local clock
	Overview idem.Overview
	// Stuck are the oldest pending keys with no update for longer than
	// QuietAfter (owner quiet, or awaiting retry), and StuckErr why they
	// could not be read.
	Stuck    idem.KeyPage
	StuckErr error
	// Ring is the ring each database has recorded; nil for a ledger on one
	// database (idem.New's).
	Ring  *idem.RingStatus
	Calls calls
}

// read reads the overview: each database's stats (the counts read the
// whole table: one D1 call each), the keys whose owner has gone quiet (a
// page of Admin.List: one D1 call each), and for a sharded ledger the ring
// (one D1 call each).
func (s *server) read(ctx context.Context) (*reading, error) {
	out := &reading{}
	var err error
	out.Calls, err = s.measure(ctx, func(ctx context.Context) error {
		if out.Overview, err = s.admin.Overview(ctx); err != nil {
			return err
		}
		out.Stuck, out.StuckErr = s.admin.List(ctx, idem.ListOptions{Status: idem.StatusPending, OlderThan: s.admin.QuietAfter(), Limit: stuckShown})
		switch st, err := s.admin.RingStatus(ctx); {
		case err == nil:
			out.Ring = &st
		case !errors.Is(err, idem.ErrNotSharded):
			return err
		}
		return ctx.Err()
	})
	out.At = time.Now()
	return out, err
}

// snapshots keeps the last reading of the overview, which serves every
// page opened within the refresh interval: however many browsers have the
// console open, it reads the overview at most once an interval, and never
// twice at once.
type snapshots struct {
	mu      sync.Mutex
	last    *reading
	pending chan struct{} // closed when the read in progress ends; nil when none is
}

// overviewNow returns a reading of the overview no older than the refresh
// interval (a new one when the refresh is off), and whether it is shared:
// read for another page, at no D1 call for this one.
func (s *server) overviewNow(ctx context.Context) (rd *reading, shared bool, err error) {
	for {
		s.overview.mu.Lock()
		if last := s.overview.last; last != nil && time.Since(last.At) < s.refresh {
			s.overview.mu.Unlock()
			return last, true, nil
		}
		if wait := s.overview.pending; wait != nil {
			s.overview.mu.Unlock()
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				return nil, false, ctx.Err()
			}
		}
		done := make(chan struct{})
		s.overview.pending = done
		s.overview.mu.Unlock()

		rd, err := s.read(ctx)
		s.overview.mu.Lock()
		s.overview.pending = nil
		if err == nil {
			s.overview.last = rd
		}
		s.overview.mu.Unlock()
		close(done)
		return rd, false, err
	}
}

// forget drops the last reading: a release changed what it says.
func (s *server) forget() {
	s.overview.mu.Lock()
	s.overview.last = nil
	s.overview.mu.Unlock()
}
