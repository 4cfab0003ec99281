package d1local

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strings"
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
			if ok && e.Type().IsRegular() && idPattern.MatchString(id) && s.dbs[id] == nil {
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
func (s *Server) DeleteDatabase(id string) error {
	if !idPattern.MatchString(id) {
		return fmt.Errorf("d1local: invalid database ID %q", id)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errClosed
	}
	d := s.dbs[id]
	path := s.path(id)
	if d == nil {
		if path == "" {
			return ErrNoDatabase
		}
		if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
			return ErrNoDatabase
		}
	}
	if d != nil {
		delete(s.dbs, id)
		// No request takes s.mu while it holds the database, so waiting
		// here for the running one cannot deadlock.
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
