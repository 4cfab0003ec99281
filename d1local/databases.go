package d1local

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strings"
	"sync"
)

// Databases returns the IDs of the server's databases, sorted: the
// "<id>.sqlite" files in Dir, or the databases held in memory. In d1local a
// database's name is its ID.
func (s *Server) Databases() ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errClosed
	}
	ids := make([]string, 0, len(s.dbs))
	for id := range s.dbs {
		ids = append(ids, id)
	}
	if s.cfg.Dir != "" {
		entries, err := os.ReadDir(s.cfg.Dir)
		if err != nil {
			return nil, fmt.Errorf("d1local: listing databases: %w", err)
		}
		for _, e := range entries {
			id, ok := strings.CutSuffix(e.Name(), ".sqlite")
			if ok && e.Type().IsRegular() && idPattern.MatchString(id) && s.dbs[id] == nil && s.deleting[id] == nil {
				ids = append(ids, id)
			}
		}
	}
	slices.Sort(ids)
	return ids, nil
}

// CreateDatabase creates the database id unless it exists (which is useful
// with Config.NoAutoCreate).
func (s *Server) CreateDatabase(id string) error {
	if !idPattern.MatchString(id) {
		return fmt.Errorf("d1local: invalid database ID %q", id)
	}
	_, err := s.database(id, true)
	return err
}

// DeleteDatabase deletes the database id and its file, after the request
// running on it, if any. Requests already waiting for it fail as for a
// missing database. A missing database is ErrNoDatabase.
//
// Only the wait for that request happens outside the server's lock: from
// the start of the deletion the database is absent (to list, get, a
// second delete and any call made with NoAutoCreate), while calls that
// would create it wait for its files to be gone and then create a new
// one. Other databases are not held up.
func (s *Server) DeleteDatabase(id string) error {
	if !idPattern.MatchString(id) {
		return fmt.Errorf("d1local: invalid database ID %q", id)
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return errClosed
	}
	if s.deleting[id] != nil {
		s.mu.Unlock()
		return ErrNoDatabase
	}
	d := s.dbs[id]
	path := s.path(id)
	if d == nil {
		missing := path == ""
		if !missing {
			_, err := os.Stat(path)
			missing = errors.Is(err, fs.ErrNotExist)
		}
		if missing {
			s.mu.Unlock()
			return ErrNoDatabase
		}
	}
	delete(s.dbs, id)
	done := make(chan struct{})
	if s.deleting == nil {
		s.deleting = make(map[string]chan struct{})
	}
	s.deleting[id] = done
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.deleting, id)
		s.mu.Unlock()
		close(done)
	}()

	if d != nil {
		// d leaves the map before its files: a request that took it
		// before fails with ErrNoDatabase once close marks it gone, and
		// acquire never reopens a database marked gone.
		if err := d.close(ErrNoDatabase); err != nil {
			return err
		}
	}
	if path == "" {
		return nil
	}
	var errs []error
	for _, suffix := range []string{"", "-wal", "-shm", "-journal"} {
		if err := os.Remove(path + suffix); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("d1local: deleting database %s: %w", id, err)
	}
	s.log.Debug("d1local: database deleted", "database", id)
	return nil
}

// databaseInfo is what the get endpoint reports about a database.
type databaseInfo struct {
	id     string
	tables int64
	size   int64
}

// describe opens the existing database id and reports on it.
func (s *Server) describe(ctx context.Context, id string) (databaseInfo, error) {
	d, err := s.database(id, false)
	if err != nil {
		return databaseInfo{}, err
	}
	tables, size, err := d.info(ctx)
	if err != nil {
		return databaseInfo{}, err
	}
	return databaseInfo{id: id, tables: tables, size: size}, nil
}

// How open treats a missing or existing database.
const (
	openExisting = iota // a missing one is ErrNoDatabase
	openOrCreate        // a missing one is created
	createNew           // a missing one is created, an existing one is errExists
)

// errExists is open's error for an existing database in mode
// createNew.
var errExists = errors.New("d1local: database exists")

// open returns the database id, opening or creating it as mode says. A
// database being deleted is missing to openExisting; the other modes wait
// until its files are gone, then create it anew.
//
// The file is opened outside s.mu, the new database listed and held
// meanwhile: calls to it wait for the opening, while calls to other
// databases do not (opening one may first close an idle one, which
// checkpoints its WAL). A failed opening unlists it again, and whoever
// waited for it gets the same error.
func (s *Server) open(id string, mode int) (*database, error) {
	s.mu.Lock()
	for {
		if s.closed {
			s.mu.Unlock()
			return nil, errClosed
		}
		done := s.deleting[id]
		if done == nil {
			break
		}
		s.mu.Unlock()
		if mode == openExisting {
			return nil, ErrNoDatabase
		}
		<-done
		s.mu.Lock()
	}
	d, fresh, err := s.entry(id, mode)
	s.mu.Unlock()
	if !fresh {
		return d, err
	}
	if err := d.connect(); err != nil {
		err = fmt.Errorf("d1local: %w", err)
		s.mu.Lock()
		if s.dbs[id] == d {
			delete(s.dbs, id)
		}
		s.mu.Unlock()
		d.gone = err
		<-d.lock
		return nil, err
	}
	d.release() // lists it among the open files
	s.log.Debug("d1local: database opened", "database", id, "path", d.path)
	return d, nil
}

// entry, for open, returns the database id: one already listed, or, when
// fresh, one listed now, not yet open and held for the caller (its lock
// taken). s.mu is held.
func (s *Server) entry(id string, mode int) (d *database, fresh bool, err error) {
	if d, ok := s.dbs[id]; ok {
		if mode == createNew {
			return nil, false, errExists
		}
		return d, false, nil
	}
	path := s.path(id)
	if path != "" && mode != openOrCreate {
		_, err := os.Stat(path)
		switch {
		case err == nil && mode == createNew:
			return nil, false, errExists
		case errors.Is(err, fs.ErrNotExist) && mode == openExisting:
			return nil, false, ErrNoDatabase
		}
	}
	var h *handles
	if path == "" {
		if mode == openExisting {
			return nil, false, ErrNoDatabase
		}
		path = memoryPath
	} else {
		h = s.fileHandles()
	}
	d = newDatabase(id, path, h)
	d.lock <- struct{}{}
	s.dbs[id] = d
	return d, true, nil
}

// DefaultMaxOpenDatabases is the bound on open database files when
// Config.MaxOpenDatabases is 0: 768 file descriptors.
const DefaultMaxOpenDatabases = 256

// fileHandles returns the count of the server's open database files,
// creating it on first use. s.mu is held.
func (s *Server) fileHandles() *handles {
	if s.handles == nil {
		n := s.cfg.MaxOpenDatabases
		if n == 0 {
			n = DefaultMaxOpenDatabases
		}
		s.handles = &handles{max: max(n, 0)}
	}
	return s.handles
}

// handles counts the connections of a server's databases in files and
// keeps their number at most max (0: no bound) by closing, before another
// opens, the database used least recently among those that are idle. One
// in use (held: its lock taken) is never closed, so when every open one
// is in use the next opens past the bound, and closes when released (see
// database.release). A database closed so reopens on its next acquire,
// and reads what committed: closing the last connection to a file
// checkpoints its WAL.
//
// Neither s.mu nor h.mu is held while a connection opens or closes, nor
// is h.mu taken under s.mu; h.mu is never held while waiting for a
// database, only while trying to take an idle one.
type handles struct {
	max int

	mu   sync.Mutex
	open int       // connections open or opening
	lru  list.List // of *database with an open connection, most recently released first
}

// reserve counts a connection about to open, first closing idle ones
// while the bound is reached. A nil h counts nothing.
func (h *handles) reserve() {
	if h == nil {
		return
	}
	h.mu.Lock()
	for h.max > 0 && h.open >= h.max {
		v := h.takeIdle()
		if v == nil {
			break // every open one is in use
		}
		// Closing checkpoints the WAL: not under h.mu. v stays counted
		// until closed, so the files open never exceed the count.
		h.mu.Unlock()
		v.closeIdle()
		<-v.lock
		h.mu.Lock()
	}
	h.open++
	h.mu.Unlock()
}

// takeIdle takes the idle database used least recently off the list and
// holds it, or returns nil if every open one is held. h.mu is held.
func (h *handles) takeIdle() *database {
	for e := h.lru.Back(); e != nil; e = e.Prev() {
		v := e.Value.(*database)
		select {
		case v.lock <- struct{}{}:
			h.lru.Remove(e)
			v.elem = nil
			return v
		default: // in use
		}
	}
	return nil
}

// unreserve uncounts a connection that failed to open.
func (h *handles) unreserve() {
	if h == nil {
		return
	}
	h.mu.Lock()
	h.open--
	h.mu.Unlock()
}

// released lists d, held with its connection open and about to be
// released, as the most recently used; or, if more connections are open
// than the bound allows, unlists d and reports that the caller must close
// it. A nil h lists nothing.
func (h *handles) released(d *database) (close bool) {
	if h == nil {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.max > 0 && h.open > h.max {
		if d.elem != nil {
			h.lru.Remove(d.elem)
			d.elem = nil
		}
		return true
	}
	if d.elem == nil {
		d.elem = h.lru.PushFront(d)
	} else {
		h.lru.MoveToFront(d.elem)
	}
	return false
}

// closed uncounts d's connection, just closed, and unlists d.
func (h *handles) closed(d *database) {
	if h == nil {
		return
	}
	h.mu.Lock()
	if d.elem != nil {
		h.lru.Remove(d.elem)
		d.elem = nil
	}
	h.open--
	h.mu.Unlock()
}
