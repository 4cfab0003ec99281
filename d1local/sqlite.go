package d1local

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"unsafe"

	"modernc.org/libc"
	sqlite3 "modernc.org/sqlite/lib"
)

// This file is a thin binding to the SQLite C API as modernc.org/sqlite
// transpiles it to Go (package modernc.org/sqlite/lib), used instead of
// database/sql. D1 fidelity needs things the database/sql driver hides or
// alters: the storage class of every value (the driver turns TEXT in DATE,
// DATETIME and TIMESTAMP columns into time.Time), sqlite3_errmsg,
// sqlite3_error_offset and the extended result code of a failure,
// sqlite3_total_changes64 and sqlite3_last_insert_rowid per statement,
// sqlite3_stmt_status counters, sqlite3_limit and an authorizer whose policy
// is a pure function (no registry keyed by connection: its on/off switch is
// a byte of the connection's own, passed as the callback's argument).
//
// A conn is not safe for concurrent use: the database that owns it
// serializes every call. Only interrupt may be called from another
// goroutine.

// ptrSize is the size of a C pointer.
const ptrSize = int(unsafe.Sizeof(uintptr(0)))

// sqliteTransient is SQLITE_TRANSIENT: SQLite copies a bound value before
// the bind call returns, so the caller may free its buffer at once.
const sqliteTransient = ^uintptr(0)

// sqliteError is a failed SQLite call: the extended result code, the
// sqlite3_errmsg text and the byte offset in the SQL that the error refers
// to (-1 when SQLite records none).
type sqliteError struct {
	code   int32
	msg    string
	offset int32
}

func (e *sqliteError) Error() string {
	return fmt.Sprintf("%s (%s)", e.msg, resultCodeName(e.code))
}

// primary returns the primary result code (the low byte of the extended one).
func (e *sqliteError) primary() int32 { return e.code & 0xff }

// conn is one SQLite database connection and the libc thread state it runs on.
type conn struct {
	tls *libc.TLS
	db  uintptr
	// authOn is one byte of C memory, the authorizer's argument: non-zero
	// while user SQL runs (see setAuthorizer).
	authOn uintptr
	// stmts are the user statements kept for reuse; they are finalized
	// before the connection closes.
	stmts stmtCache
}

// openConn opens (creating if needed) the database at path; ":memory:" opens
// a private in-memory database. Its error names the file by its base name:
// answers may quote it, and the directory is the server's business.
func openConn(path string) (*conn, error) {
	name := filepath.Base(path)
	tls := libc.NewTLS()
	cpath, err := libc.CString(path)
	if err != nil {
		tls.Close()
		return nil, fmt.Errorf("open %s: %w", name, err)
	}
	defer libc.Xfree(tls, cpath)

	pdb := tls.Alloc(ptrSize)
	// NOMUTEX: the database that owns the connection serializes every
	// call, so SQLite's own mutex would only cost each call a lock and an
	// unlock; sqlite3_interrupt, the one call made from another goroutine,
	// takes no mutex (it sets a flag atomically).
	flags := int32(sqlite3.SQLITE_OPEN_READWRITE | sqlite3.SQLITE_OPEN_CREATE |
		sqlite3.SQLITE_OPEN_NOMUTEX | sqlite3.SQLITE_OPEN_EXRESCODE)
	rc := sqlite3.Xsqlite3_open_v2(tls, cpath, pdb, flags, 0)
	db := readPtr(pdb)
	tls.Free(ptrSize)

	c := &conn{tls: tls, db: db}
	if rc != sqlite3.SQLITE_OK {
		err := c.errorFor(rc)
		if db != 0 {
			sqlite3.Xsqlite3_close_v2(tls, db)
		}
		tls.Close()
		return nil, fmt.Errorf("open %s: %w", name, err)
	}
	if err := c.installAuthorizer(); err != nil {
		c.close()
		return nil, fmt.Errorf("open %s: %w", name, err)
	}
	return c, nil
}

// close closes the connection and frees its thread state.
func (c *conn) close() error {
	if c.db == 0 {
		return nil
	}
	// A statement left unfinalized would keep the connection open as a
	// zombie, and its file with it.
	c.stmts.clear()
	rc := sqlite3.Xsqlite3_close_v2(c.tls, c.db)
	var err error
	if rc != sqlite3.SQLITE_OK {
		err = c.errorFor(rc)
	}
	c.db = 0
	if c.authOn != 0 {
		libc.Xfree(c.tls, c.authOn)
		c.authOn = 0
	}
	c.tls.Close()
	return err
}

// errorFor builds the error of a call that returned rc.
func (c *conn) errorFor(rc int32) *sqliteError {
	if c.db == 0 {
		return &sqliteError{code: rc, msg: libc.GoString(sqlite3.Xsqlite3_errstr(c.tls, rc)), offset: -1}
	}
	return &sqliteError{
		code:   rc,
		msg:    libc.GoString(sqlite3.Xsqlite3_errmsg(c.tls, c.db)),
		offset: sqlite3.Xsqlite3_error_offset(c.tls, c.db),
	}
}

// exec runs SQL that returns no rows the caller needs (several statements
// allowed), for the server's own statements: BEGIN, COMMIT, PRAGMAs.
func (c *conn) exec(sql string) error {
	csql, err := libc.CString(sql)
	if err != nil {
		return err
	}
	defer libc.Xfree(c.tls, csql)
	if rc := sqlite3.Xsqlite3_exec(c.tls, c.db, csql, 0, 0, 0); rc != sqlite3.SQLITE_OK {
		return c.errorFor(rc)
	}
	return nil
}

// queryInt runs a statement of the server's own that yields one integer.
func (c *conn) queryInt(sql string) (int64, error) {
	s, _, err := c.prepare(sql)
	if err != nil {
		return 0, err
	}
	if s == nil {
		return 0, fmt.Errorf("%q is not a statement", sql)
	}
	defer s.finalize()
	row, err := s.step()
	if err != nil {
		return 0, err
	}
	if !row {
		return 0, fmt.Errorf("%q returned no row", sql)
	}
	return sqlite3.Xsqlite3_column_int64(c.tls, s.p, 0), nil
}

// setLimit sets one sqlite3_limit category.
func (c *conn) setLimit(id, value int32) {
	sqlite3.Xsqlite3_limit(c.tls, c.db, id, value)
}

// setBusyTimeout sets how long a locked database is waited for.
func (c *conn) setBusyTimeout(ms int32) error {
	if rc := sqlite3.Xsqlite3_busy_timeout(c.tls, c.db, ms); rc != sqlite3.SQLITE_OK {
		return c.errorFor(rc)
	}
	return nil
}

// setDBConfig sets an integer sqlite3_db_config option.
func (c *conn) setDBConfig(op int32, on bool) error {
	v := int32(0)
	if on {
		v = 1
	}
	va := libc.NewVaList(v, uintptr(0))
	if va == 0 {
		return fmt.Errorf("sqlite3_db_config(%d): out of memory", op)
	}
	defer libc.Xfree(c.tls, va)
	if rc := sqlite3.Xsqlite3_db_config(c.tls, c.db, op, va); rc != sqlite3.SQLITE_OK {
		return c.errorFor(rc)
	}
	return nil
}

// installAuthorizer installs the D1 authorizer (authorize) once for the
// life of the connection, switched off until setAuthorizer switches it on.
// It is not installed and removed around each request because
// sqlite3_set_authorizer expires every prepared statement, which would
// make each cached statement compile again on its next use.
func (c *conn) installAuthorizer() error {
	c.authOn = libc.Xmalloc(c.tls, 1)
	if c.authOn == 0 {
		return errors.New("allocate the authorizer's switch: out of memory")
	}
	c.setAuthorizer(false)
	if rc := sqlite3.Xsqlite3_set_authorizer(c.tls, c.db, cFuncPointer(authorizerCallback), c.authOn); rc != sqlite3.SQLITE_OK {
		return c.errorFor(rc)
	}
	return nil
}

// setAuthorizer switches the D1 authorizer on for user SQL, or off for the
// server's own statements, which it then allows whatever they are.
// The switch expires no prepared statement: a statement of the user's is
// compiled, and recompiled after a schema change, only while it is on.
func (c *conn) setAuthorizer(on bool) {
	b := byte(0)
	if on {
		b = 1
	}
	libc.GoBytes(c.authOn, 1)[0] = b
}

// totalChanges is sqlite3_total_changes64.
func (c *conn) totalChanges() int64 { return sqlite3.Xsqlite3_total_changes64(c.tls, c.db) }

// lastInsertRowID is sqlite3_last_insert_rowid.
func (c *conn) lastInsertRowID() int64 { return sqlite3.Xsqlite3_last_insert_rowid(c.tls, c.db) }

// inTransaction reports whether a transaction is open (autocommit is off).
func (c *conn) inTransaction() bool { return sqlite3.Xsqlite3_get_autocommit(c.tls, c.db) == 0 }

// interruptOnDone arranges for the running statement to be interrupted
// when ctx is done. The returned stop function must be called before the
// connection runs anything the interrupt must not reach; once it returns,
// no interrupt is delivered any more.
func (c *conn) interruptOnDone(ctx context.Context) (stop func()) {
	if ctx.Done() == nil {
		return func() {}
	}
	var mu sync.Mutex
	stopped := false
	db := c.db
	stopAfter := context.AfterFunc(ctx, func() {
		mu.Lock()
		defer mu.Unlock()
		if stopped {
			return
		}
		// A fresh TLS: c.tls belongs to the goroutine running the query.
		tls := libc.NewTLS()
		sqlite3.Xsqlite3_interrupt(tls, db)
		tls.Close()
	})
	return func() {
		stopAfter()
		mu.Lock()
		stopped = true
		mu.Unlock()
	}
}

// stmt is one prepared statement.
type stmt struct {
	c      *conn
	p      uintptr
	cols   []string // the column names columns last returned, shared: never changed
	colsAt int64    // the statement's compilations (SQLITE_STMTSTATUS_REPREPARE) when cols was read
}

// prepare compiles the first statement of sql. It returns a nil stmt when
// sql holds only whitespace and comments, and the text after the statement.
func (c *conn) prepare(sql string) (*stmt, string, error) {
	csql, err := libc.CString(sql)
	if err != nil {
		return nil, "", err
	}
	defer libc.Xfree(c.tls, csql)
	out := c.tls.Alloc(2 * ptrSize) // sqlite3_stmt **ppStmt, const char **pzTail
	defer c.tls.Free(2 * ptrSize)
	rc := sqlite3.Xsqlite3_prepare_v3(c.tls, c.db, csql, int32(len(sql)), 0, out, out+uintptr(ptrSize))
	if rc != sqlite3.SQLITE_OK {
		return nil, "", c.errorFor(rc)
	}
	p, tailPtr := readPtr(out), readPtr(out+uintptr(ptrSize))
	tail := ""
	if tailPtr >= csql && tailPtr < csql+uintptr(len(sql)) {
		tail = sql[tailPtr-csql:]
	}
	if p == 0 {
		return nil, tail, nil
	}
	return &stmt{c: c, p: p}, tail, nil
}

// finalize frees the statement.
func (s *stmt) finalize() {
	sqlite3.Xsqlite3_finalize(s.c.tls, s.p)
}

// reset makes the statement ready to run again, as if just prepared:
// sqlite3_reset (which also releases what it holds of the database),
// sqlite3_clear_bindings and its full-scan counter back to zero.
func (s *stmt) reset() {
	sqlite3.Xsqlite3_reset(s.c.tls, s.p)
	sqlite3.Xsqlite3_clear_bindings(s.c.tls, s.p)
	sqlite3.Xsqlite3_stmt_status(s.c.tls, s.p, sqlite3.SQLITE_STMTSTATUS_FULLSCAN_STEP, 1)
}

// paramCount is sqlite3_bind_parameter_count: the largest parameter index.
func (s *stmt) paramCount() int {
	return int(sqlite3.Xsqlite3_bind_parameter_count(s.c.tls, s.p))
}

// bind binds v (nil, float64, string or []byte) to the 1-based parameter i.
func (s *stmt) bind(i int, v any) error {
	tls, p, idx := s.c.tls, s.p, int32(i)
	var rc int32
	switch v := v.(type) {
	case nil:
		rc = sqlite3.Xsqlite3_bind_null(tls, p, idx)
	case float64:
		rc = sqlite3.Xsqlite3_bind_double(tls, p, idx, v)
	case string:
		cs, err := libc.CString(v)
		if err != nil {
			return err
		}
		rc = sqlite3.Xsqlite3_bind_text64(tls, p, idx, cs, uint64(len(v)), sqliteTransient, sqlite3.SQLITE_UTF8)
		libc.Xfree(tls, cs)
	case []byte:
		if len(v) == 0 {
			// A nil pointer would bind NULL; an empty BLOB is a zeroblob.
			rc = sqlite3.Xsqlite3_bind_zeroblob(tls, p, idx, 0)
			break
		}
		cb, err := libc.CString(string(v))
		if err != nil {
			return err
		}
		rc = sqlite3.Xsqlite3_bind_blob64(tls, p, idx, cb, uint64(len(v)), sqliteTransient)
		libc.Xfree(tls, cb)
	default:
		return fmt.Errorf("cannot bind %T", v)
	}
	if rc != sqlite3.SQLITE_OK {
		return s.c.errorFor(rc)
	}
	return nil
}

// step advances the statement: true when a row is ready, false when done.
func (s *stmt) step() (bool, error) {
	switch rc := sqlite3.Xsqlite3_step(s.c.tls, s.p); rc {
	case sqlite3.SQLITE_ROW:
		return true, nil
	case sqlite3.SQLITE_DONE:
		return false, nil
	default:
		return false, s.c.errorFor(rc)
	}
}

// columns returns the names of the result columns (none for a statement
// that returns no rows). The slice is kept for the next run of the
// statement, and shared: it is not to be changed. It is read again only
// after SQLite compiled the statement again (a cached statement whose
// table changed is, and may name its columns anew).
func (s *stmt) columns() []string {
	compiled := s.status(sqlite3.SQLITE_STMTSTATUS_REPREPARE)
	if s.cols != nil && compiled == s.colsAt {
		return s.cols
	}
	cols := make([]string, int(sqlite3.Xsqlite3_column_count(s.c.tls, s.p)))
	for i := range cols {
		cols[i] = libc.GoString(sqlite3.Xsqlite3_column_name(s.c.tls, s.p, int32(i)))
	}
	s.cols, s.colsAt = cols, compiled
	return cols
}

// row returns the n values of the current row, each as its SQLite storage
// class: int64 (INTEGER), float64 (REAL), string (TEXT), []byte (BLOB) or
// nil (NULL).
func (s *stmt) row(n int) []any {
	tls, p := s.c.tls, s.p
	vals := make([]any, n)
	for i := range vals {
		col := int32(i)
		switch sqlite3.Xsqlite3_column_type(tls, p, col) {
		case sqlite3.SQLITE_INTEGER:
			vals[i] = sqlite3.Xsqlite3_column_int64(tls, p, col)
		case sqlite3.SQLITE_FLOAT:
			vals[i] = sqlite3.Xsqlite3_column_double(tls, p, col)
		case sqlite3.SQLITE_TEXT:
			text := sqlite3.Xsqlite3_column_text(tls, p, col)
			size := int(sqlite3.Xsqlite3_column_bytes(tls, p, col))
			vals[i] = string(libc.GoBytes(text, size))
		case sqlite3.SQLITE_BLOB:
			blob := sqlite3.Xsqlite3_column_blob(tls, p, col)
			size := int(sqlite3.Xsqlite3_column_bytes(tls, p, col))
			b := make([]byte, size) // never nil: a BLOB is not a NULL
			if size > 0 {
				copy(b, libc.GoBytes(blob, size))
			}
			vals[i] = b
		default:
			vals[i] = nil
		}
	}
	return vals
}

// status reads a sqlite3_stmt_status counter.
func (s *stmt) status(op int32) int64 {
	return int64(sqlite3.Xsqlite3_stmt_status(s.c.tls, s.p, op, 0))
}

// readPtr reads a C pointer stored at p.
func readPtr(p uintptr) uintptr {
	b := libc.GoBytes(p, ptrSize)
	if ptrSize == 8 {
		return uintptr(binary.NativeEndian.Uint64(b))
	}
	return uintptr(binary.NativeEndian.Uint32(b))
}

// cFuncPointer converts a top-level Go function to the function pointer the
// transpiled SQLite calls, the same conversion modernc.org/sqlite uses for
// its own callbacks (https://golang.org/s/go11func). It must not be used on
// closures.
func cFuncPointer[T any](f T) uintptr {
	return *(*uintptr)(unsafe.Pointer(&struct{ f T }{f}))
}

// authorizerCallback is the C authorizer: while the switch at on is set
// (setAuthorizer), it hands the action to authorize; otherwise it allows it.
func authorizerCallback(_ *libc.TLS, on uintptr, action int32, arg1, arg2, dbName, trigger uintptr) int32 {
	if libc.GoBytes(on, 1)[0] == 0 {
		return authOK
	}
	return authorize(action, libc.GoString(arg1), libc.GoString(arg2), libc.GoString(dbName), libc.GoString(trigger))
}
