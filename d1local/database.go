package d1local

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	sqlite3 "modernc.org/sqlite/lib"
)

// D1's per-statement limits, as workerd sets them with sqlite3_limit
// (SqliteDatabase::setupSecurity) and the D1 documentation lists them.
const (
	maxParams       = 100
	maxSQLLength    = 100_000
	maxValueLength  = 2_000_000
	busyTimeoutMsec = 5_000
)

// connLimits are applied to every connection.
var connLimits = []struct{ id, value int32 }{
	{sqlite3.SQLITE_LIMIT_LENGTH, maxValueLength},
	{sqlite3.SQLITE_LIMIT_SQL_LENGTH, maxSQLLength},
	{sqlite3.SQLITE_LIMIT_COLUMN, 100},
	{sqlite3.SQLITE_LIMIT_EXPR_DEPTH, 100},
	{sqlite3.SQLITE_LIMIT_COMPOUND_SELECT, 5},
	{sqlite3.SQLITE_LIMIT_VDBE_OP, 25_000},
	{sqlite3.SQLITE_LIMIT_FUNCTION_ARG, 127},
	{sqlite3.SQLITE_LIMIT_ATTACHED, 0},
	{sqlite3.SQLITE_LIMIT_LIKE_PATTERN_LENGTH, 50},
	{sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, maxParams},
	{sqlite3.SQLITE_LIMIT_TRIGGER_DEPTH, 10},
}

// statement is one SQL statement of a request, ready to run.
type statement struct {
	sql     string
	keyword string // first keyword, upper-cased
	params  []any  // nil, float64, string or []byte
}

// result is what one statement produced.
type result struct {
	columns []string
	rows    [][]any
	meta    meta
}

// meta is a result's "meta" object.
type meta struct {
	duration    float64 // milliseconds
	changes     int64
	lastRowID   int64
	changedDB   bool
	sizeAfter   int64
	rowsRead    int64
	rowsWritten int64
}

// sqlError is a request D1 refuses as an SQL error: HTTP 400, code 7500.
// Nothing of the request was committed.
type sqlError struct {
	msg string
}

func (e *sqlError) Error() string { return e.msg }

// errClosed is returned once the server, and so the database, is closed.
var errClosed = errors.New("d1local: server closed")

// database is one D1 database: one SQLite connection, used by one request
// at a time, as D1 runs each database single-threaded.
type database struct {
	id       string
	path     string        // its file, or memoryPath
	lock     chan struct{} // holds a token while a request runs
	conn     *conn         // nil while closed
	gone     error         // why conn is nil for good: errClosed, ErrNoDatabase, or the failure of its first opening
	pageSize int64

	// h, for a database in a file, counts its connection among the
	// server's open files, and may close it while the database is idle;
	// acquire opens it again. nil in memory: the connection stays open
	// until close.
	h    *handles
	elem *list.Element // d's place in h.lru while conn is open, from its first release; guarded by h.mu
}

// newDatabase returns the database stored at path (":memory:" for one
// that lives in memory), not yet open. Its connection is counted in h
// (nil: not counted, and never closed while idle).
func newDatabase(id, path string, h *handles) *database {
	return &database{id: id, path: path, lock: make(chan struct{}, 1), h: h}
}

// connect opens d's connection and prepares it: limits, foreign keys,
// WAL, a busy timeout and defensive mode. It counts the connection in
// d.h, which may first close the idle database used least recently. d is
// held, or not yet shared.
func (d *database) connect() error {
	d.h.reserve()
	c, err := openConn(d.path)
	if err != nil {
		d.h.unreserve()
		return err
	}
	d.conn = c
	if err := d.setup(d.path != memoryPath); err != nil {
		c.close()
		d.conn = nil
		d.h.unreserve()
		return fmt.Errorf("set up database %s: %w", d.id, badFile(d.path, err))
	}
	return nil
}

// badFile turns err, a failure to set up the database file at path, into
// a *sqlError when SQLite found the file is not a database (SQLITE_NOTADB)
// or is corrupt (SQLITE_CORRUPT): no retry can cure that, so it is
// answered as D1 answers an SQLite error (HTTP 400, code 7500, "<message>:
// SQLITE_<CODE>"), not as an internal error, which clients retry. The
// message names the file by its base name, the directory being the
// server's business. SQLite reads the header and the schema before
// anything could write, so the file is left as it was. (Opening reads
// nothing: the first statement does.) Other errors pass through.
func badFile(path string, err error) error {
	var se *sqliteError
	if path == memoryPath || !errors.As(err, &se) {
		return err
	}
	name := filepath.Base(path)
	switch se.primary() {
	case sqlite3.SQLITE_NOTADB:
		name += " is not a SQLite database"
	case sqlite3.SQLITE_CORRUPT:
		name += " is corrupt (" + se.msg + ")"
	default:
		return err
	}
	return &sqlError{msg: d1Message(&sqliteError{code: se.code, msg: name, offset: -1})}
}

const memoryPath = ":memory:"

func (d *database) setup(file bool) error {
	c := d.conn
	for _, l := range connLimits {
		c.setLimit(l.id, l.value)
	}
	if err := c.setBusyTimeout(busyTimeoutMsec); err != nil {
		return err
	}
	pragmas := "PRAGMA foreign_keys = ON;"
	if file {
		pragmas += "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;"
	}
	if err := c.exec(pragmas); err != nil {
		return err
	}
	if err := c.setDBConfig(sqlite3.SQLITE_DBCONFIG_DEFENSIVE, true); err != nil {
		return err
	}
	size, err := c.queryInt("PRAGMA page_size")
	if err != nil {
		return err
	}
	d.pageSize = size
	return nil
}

// acquire waits until the database is free, or ctx is done, and opens its
// connection again if it was closed while idle (see handles). A database
// closed for good is held with conn nil: callers report d.gone.
func (d *database) acquire(ctx context.Context) error {
	select {
	case d.lock <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	if d.conn == nil && d.gone == nil && d.h != nil {
		if err := d.connect(); err != nil {
			<-d.lock
			return err
		}
	}
	return nil
}

// release frees the database, recording it as the most recently used. If
// more files are open than the server's bound allows (every one was in
// use when another had to open), its connection is closed now that it is
// idle.
func (d *database) release() {
	if d.conn != nil && d.h.released(d) {
		d.closeIdle()
	}
	<-d.lock
}

// closeIdle closes the connection of a database that is held and idle,
// already taken off its handles' list; the next acquire opens it again.
// Closing the last connection checkpoints the WAL into the file. An error
// is dropped: the connection is gone either way (sqlite3_close_v2 keeps
// one with unfinalized statements as a zombie, and conn.close finalizes
// the cached ones first), and the next connection reads what committed.
func (d *database) closeIdle() {
	c := d.conn
	d.conn = nil
	_ = c.close()
	d.h.closed(d)
}

// close waits for the running request, if any, and closes the connection.
// Later requests fail with reason: errClosed once the server is closed,
// ErrNoDatabase once the database is deleted; its file is never opened
// again through d.
func (d *database) close(reason error) error {
	d.lock <- struct{}{}
	defer func() { <-d.lock }()
	if d.gone != nil {
		return nil
	}
	d.gone = reason
	if d.conn == nil {
		return nil // closed while idle
	}
	err := d.conn.close()
	d.conn = nil
	d.h.closed(d)
	if err != nil {
		return fmt.Errorf("close database %s: %w", d.id, err)
	}
	return nil
}

// withConn runs fn on the connection once the database is free, outside
// any transaction of a request and without the authorizer: for the
// server's own statements.
func (d *database) withConn(ctx context.Context, fn func(c *conn) error) error {
	if err := d.acquire(ctx); err != nil {
		return err
	}
	defer d.release()
	if d.conn == nil {
		return d.gone
	}
	return fn(d.conn)
}

// info reports the number of tables (not counting SQLite's and D1's
// internal ones) and the size in bytes.
func (d *database) info(ctx context.Context) (tables, size int64, err error) {
	err = d.withConn(ctx, func(c *conn) error {
		if tables, err = c.queryInt("SELECT count(*) FROM sqlite_schema WHERE type = 'table' " +
			"AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' AND substr(name, 1, 4) <> '_cf_'"); err != nil {
			return err
		}
		pages, err := c.queryInt("PRAGMA page_count")
		size = pages * d.pageSize
		return err
	})
	return tables, size, err
}

// run executes the statements as one transaction: it commits when every
// statement succeeds and rolls everything back otherwise. A failed
// statement gives a *sqlError. When ctx is done first, the running
// statement is interrupted, nothing is committed, and ctx's error is
// returned. busy is slept once the database is held, before anything
// runs (Fault.Busy).
func (d *database) run(ctx context.Context, stmts []statement, busy time.Duration) ([]result, error) {
	if err := d.acquire(ctx); err != nil {
		return nil, err
	}
	defer d.release()
	if err := sleep(ctx, busy); err != nil {
		return nil, err
	}
	c := d.conn
	if c == nil {
		return nil, d.gone
	}
	if err := c.exec("BEGIN IMMEDIATE"); err != nil {
		return nil, fmt.Errorf("begin transaction: %w", err)
	}
	committed := false
	defer func() {
		if !committed && c.inTransaction() {
			// A rollback cannot fail short of a broken database; the next
			// BEGIN would then fail and report it.
			_ = c.exec("ROLLBACK")
		}
	}()

	results, err := d.runUser(ctx, stmts)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	pages, err := c.queryInt("PRAGMA page_count")
	if err != nil {
		return nil, fmt.Errorf("page count: %w", err)
	}
	for i := range results {
		results[i].meta.sizeAfter = pages * d.pageSize
	}
	if err := c.exec("COMMIT"); err != nil {
		var se *sqliteError
		if errors.As(err, &se) && se.primary() != sqlite3.SQLITE_BUSY && se.primary() != sqlite3.SQLITE_IOERR {
			// A deferred foreign key violation fails the COMMIT.
			return nil, &sqlError{msg: d1Message(se)}
		}
		return nil, fmt.Errorf("commit: %w", err)
	}
	committed = true
	return results, nil
}

// runUser runs the user's statements under the D1 authorizer, with the
// running statement interrupted if ctx is done.
func (d *database) runUser(ctx context.Context, stmts []statement) ([]result, error) {
	c := d.conn
	c.setAuthorizer(true)
	defer c.setAuthorizer(false)
	stop := c.interruptOnDone(ctx)
	defer stop()

	results := make([]result, 0, len(stmts))
	left := maxResultBytes
	for _, st := range stmts {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		r, err := d.runStatement(st, &left)
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, err
		}
		results = append(results, r)
	}
	return results, nil
}

// maxResultBytes bounds the rows one call may return, counted as their
// text and blob bytes plus 8 per cell. D1 holds a call's results in its
// isolate's memory (128 MB in all) and fails a larger one; so does d1local,
// rather than run out of memory itself.
const maxResultBytes = 128 << 20

// errMemoryLimit fails a call whose results do not fit D1's isolate; it is
// answered memoryLimitMessage, D1's words.
var errMemoryLimit = errors.New("d1local: the call's results exceed D1's memory limit")

const memoryLimitMessage = "D1 DB's isolate exceeded its memory limit and was reset."

// cellBytes is what a row counts against maxResultBytes.
func cellBytes(row []any) int {
	n := 0
	for _, v := range row {
		switch v := v.(type) {
		case string:
			n += len(v)
		case []byte:
			n += len(v)
		}
		n += 8
	}
	return n
}

// runStatement prepares (or takes from the cache), binds and steps one
// statement. Its rows count against left (see maxResultBytes).
func (d *database) runStatement(st statement, left *int) (result, error) {
	c := d.conn
	start := time.Now()
	if st.keyword == "ALTER" && renamesToReserved(st.sql) {
		return result{}, &sqlError{msg: "not authorized: SQLITE_AUTH"}
	}
	s, err := d.prepareStmt(st)
	if err != nil {
		return result{}, err
	}
	defer d.releaseStmt(st, s)
	if s.paramCount() != len(st.params) {
		return result{}, &sqlError{msg: wrongParamCount}
	}
	for i, p := range st.params {
		if err := s.bind(i+1, p); err != nil {
			return result{}, sqlErrorFrom(err)
		}
	}

	before := c.totalChanges()
	var columns []string
	rows := [][]any{}
	for {
		more, err := s.step()
		if err != nil {
			return result{}, sqlErrorFrom(err)
		}
		if columns == nil {
			// Only now: a cached statement whose table changed is compiled
			// again by its first step, and "*" may have grown.
			columns = s.columns()
		}
		if !more {
			break
		}
		row := s.row(len(columns))
		if *left -= cellBytes(row); *left < 0 {
			return result{}, errMemoryLimit
		}
		rows = append(rows, row)
	}
	changes := c.totalChanges() - before
	ddl := st.keyword == "CREATE" || st.keyword == "DROP" || st.keyword == "ALTER"
	m := meta{
		duration:    float64(time.Since(start).Nanoseconds()) / 1e6,
		changes:     changes,
		lastRowID:   c.lastInsertRowID(),
		changedDB:   changes > 0 || ddl,
		rowsRead:    rowsRead(s.status(sqlite3.SQLITE_STMTSTATUS_FULLSCAN_STEP), int64(len(rows)), changes),
		rowsWritten: changes,
	}
	if ddl {
		m.rowsWritten = max(changes, 1)
	}
	m.duration = math.Round(m.duration*1e4) / 1e4
	return result{columns: columns, rows: rows, meta: m}, nil
}

// prepareStmt returns st compiled: the connection's cached statement for its
// SQL text, or a new one. A failure is a *sqlError.
func (d *database) prepareStmt(st statement) (*stmt, error) {
	c := d.conn
	if cacheable(st.keyword) {
		if s := c.stmts.take(st.sql); s != nil {
			return s, nil
		}
	}
	s, tail, err := c.prepare(st.sql)
	if err != nil {
		var se *sqliteError
		if !errors.As(err, &se) {
			return nil, err
		}
		if se.primary() == sqlite3.SQLITE_AUTH && isTransactionKeyword(st.keyword) {
			return nil, &sqlError{msg: transactionMessage}
		}
		return nil, &sqlError{msg: d1Message(se)}
	}
	if s == nil {
		return nil, &sqlError{msg: "SQL code did not contain a statement."}
	}
	if rest, _ := splitSQL(tail); len(rest) > 0 {
		s.finalize()
		// splitSQL and SQLite disagree on where the statement ends.
		return nil, &sqlError{msg: fmt.Sprintf("could not split the SQL into statements near %q", truncate(tail, 40))}
	}
	return s, nil
}

// releaseStmt is called once s, compiled for st, has run, whether it
// succeeded or not: a data statement is reset, which leaves it holding no
// lock and no binding, and cached for the next run of the same SQL; any
// other is finalized.
func (d *database) releaseStmt(st statement, s *stmt) {
	if !cacheable(st.keyword) {
		s.finalize()
		return
	}
	s.reset()
	d.conn.stmts.put(st.sql, s)
}

// rowsRead approximates D1's rows_read, for which SQLite has no counter:
// the larger of the rows a full scan visited (a scan of n rows steps
// forward n-1 times), the rows returned and the rows changed. Rows found
// through an index and not returned are not counted.
func rowsRead(fullScanSteps, returned, changed int64) int64 {
	scanned := int64(0)
	if fullScanSteps > 0 {
		scanned = fullScanSteps + 1
	}
	return max(scanned, returned, changed)
}

// wrongParamCount is D1's message when the parameters do not match the
// statement's placeholders.
const wrongParamCount = "Wrong number of parameter bindings for SQL query."

// sqlErrorFrom turns an SQLite failure into a D1 SQL error; other errors
// pass through.
func sqlErrorFrom(err error) error {
	var se *sqliteError
	if errors.As(err, &se) {
		return &sqlError{msg: d1Message(se)}
	}
	return err
}

// d1Message formats an SQLite error as D1 does (workerd's SqliteDatabase):
// the sqlite3_errmsg text, " at offset N" when SQLite locates the error in
// the SQL (sqlite3_error_offset), the primary result code, and the extended
// code where it differs:
//
//	near "SELEC": syntax error at offset 0: SQLITE_ERROR
//	UNIQUE constraint failed: t.k: SQLITE_CONSTRAINT (extended: SQLITE_CONSTRAINT_UNIQUE)
func d1Message(e *sqliteError) string {
	var b strings.Builder
	b.WriteString(e.msg)
	if e.offset >= 0 {
		b.WriteString(" at offset ")
		b.WriteString(strconv.Itoa(int(e.offset)))
	}
	b.WriteString(": ")
	b.WriteString(resultCodeName(e.primary()))
	if e.code != e.primary() {
		b.WriteString(" (extended: ")
		b.WriteString(resultCodeName(e.code))
		b.WriteString(")")
	}
	return b.String()
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
