package d1local

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	sqlite3 "modernc.org/sqlite/lib"
)

// memoryDB opens a database in memory, closed when the test ends.
func memoryDB(t *testing.T) *database {
	t.Helper()
	d, err := openDatabase("db", memoryPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.close(errClosed) })
	return d
}

// stmtOf builds the statement of sql, with its keyword as a request gets it.
func stmtOf(sql string, params ...any) statement {
	pieces, _ := splitSQL(sql)
	return statement{sql: sql, keyword: pieces[0].keyword, params: params}
}

// runOne runs one statement as its own request and returns its result, or
// its error.
func runOne(d *database, sql string, params ...any) (result, error) {
	res, err := d.run(context.Background(), []statement{stmtOf(sql, params...)}, 0)
	if err != nil {
		return result{}, err
	}
	return res[0], nil
}

// mustRun is runOne for a statement that must succeed.
func mustRun(t *testing.T, d *database, sql string, params ...any) result {
	t.Helper()
	r, err := runOne(d, sql, params...)
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return r
}

// comparable returns r without what may differ between two runs of the
// same statement: the duration.
func comparable(r result) result {
	r.meta.duration = 0
	return r
}

// cachedCounter returns a sqlite3_stmt_status counter of the statement
// cached for sql, or -1 when none is.
func cachedCounter(t *testing.T, d *database, sql string, op int32) int64 {
	t.Helper()
	n := int64(-1)
	err := d.withConn(context.Background(), func(c *conn) error {
		if e := c.stmts.bySQL[sql]; e != nil {
			n = e.Value.(*cachedStmt).s.status(op)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestStmtCacheReuseGivesTheSameResults(t *testing.T) {
	d := memoryDB(t)
	mustRun(t, d, "CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT, n INTEGER)")
	for i := range 5 {
		mustRun(t, d, "INSERT INTO t (v, n) VALUES (?, ?)", fmt.Sprint("v", i), float64(i))
	}
	const scan = "SELECT v, n FROM t WHERE v <> ? ORDER BY id"
	first := comparable(mustRun(t, d, scan, "v1"))
	if first.meta.rowsRead != 5 || len(first.rows) != 4 || !reflect.DeepEqual(first.columns, []string{"v", "n"}) {
		t.Fatalf("first scan: %+v", first)
	}
	for i := range 3 {
		if got := comparable(mustRun(t, d, scan, "v1")); !reflect.DeepEqual(got, first) {
			t.Errorf("scan run %d = %+v, want %+v", i+2, got, first)
		}
	}
	// Twice in one request as well.
	res, err := d.run(context.Background(), []statement{stmtOf(scan, "v1"), stmtOf(scan, "v1")}, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if !reflect.DeepEqual(comparable(r), first) {
			t.Errorf("scan %d of the batch = %+v, want %+v", i, comparable(r), first)
		}
	}

	const insert = "INSERT INTO t (v, n) VALUES (?, ?) RETURNING id"
	for i := range 3 {
		r := mustRun(t, d, insert, "w", float64(i))
		want := int64(6 + i)
		if r.meta.changes != 1 || r.meta.lastRowID != want || r.meta.rowsWritten != 1 || !r.meta.changedDB ||
			!reflect.DeepEqual(r.rows, [][]any{{want}}) || !reflect.DeepEqual(r.columns, []string{"id"}) {
			t.Errorf("insert run %d: %+v", i+1, r)
		}
	}
	const update = "UPDATE t SET n = n + 1 WHERE v = ?"
	for i := range 2 {
		if r := mustRun(t, d, update, "w"); r.meta.changes != 3 || r.meta.rowsRead != 8 || len(r.rows) != 0 || len(r.columns) != 0 {
			t.Errorf("update run %d: %+v", i+1, r)
		}
	}

	// The statements were compiled once: reused, not prepared again.
	for _, sql := range []string{scan, insert, update} {
		if n := cachedCounter(t, d, sql, sqlite3.SQLITE_STMTSTATUS_REPREPARE); n != 0 {
			t.Errorf("%q: %d re-prepares (-1: not cached), want 0", sql, n)
		}
	}
	if n := cachedCounter(t, d, scan, sqlite3.SQLITE_STMTSTATUS_RUN); n != 6 {
		t.Errorf("scan ran %d times on its cached statement, want 6", n)
	}
}

func TestStmtCacheErrorsDoNotPoisonTheNextRun(t *testing.T) {
	d := memoryDB(t)
	mustRun(t, d, "CREATE TABLE u (id INTEGER PRIMARY KEY, k TEXT UNIQUE, j TEXT)")

	// A constraint error.
	const insert = "INSERT INTO u (k, j) VALUES (?, ?)"
	mustRun(t, d, insert, "a", "[1]")
	if _, err := runOne(d, insert, "a", "[2]"); err == nil || !strings.Contains(err.Error(), "UNIQUE constraint failed: u.k") {
		t.Fatalf("duplicate insert: %v", err)
	}
	if r := mustRun(t, d, insert, "b", "{"); r.meta.changes != 1 || r.meta.lastRowID != 2 {
		t.Errorf("insert after the constraint error: %+v", r.meta)
	}

	// A bind error, and a wrong number of parameters.
	const echo = "SELECT ? AS a, ? AS b"
	mustRun(t, d, echo, "x", "y")
	if _, err := runOne(d, echo, "x", strings.Repeat("z", maxValueLength+1)); err == nil || !strings.Contains(err.Error(), "SQLITE_TOOBIG") {
		t.Fatalf("oversized parameter: %v", err)
	}
	if _, err := runOne(d, echo, "x"); err == nil || err.Error() != wrongParamCount {
		t.Fatalf("one parameter of two: %v", err)
	}
	if r := mustRun(t, d, echo, "c", nil); !reflect.DeepEqual(r.rows, [][]any{{"c", nil}}) {
		t.Errorf("echo after the bind errors: %v", r.rows)
	}

	// An error in the middle of a scan: the next run counts its own rows.
	const parse = "SELECT json(j) FROM u WHERE id <= ? AND k IS NOT NULL"
	if _, err := runOne(d, parse, 10.0); err == nil || !strings.Contains(err.Error(), "malformed JSON") {
		t.Fatalf("scan reaching the malformed row: %v", err)
	}
	fresh, err := runOne(memoryDBWith(t, "CREATE TABLE u (id INTEGER PRIMARY KEY, k TEXT UNIQUE, j TEXT)",
		"INSERT INTO u (k, j) VALUES ('a', '[1]'), ('b', '{')"), parse, 1.0)
	if err != nil {
		t.Fatal(err)
	}
	if r := mustRun(t, d, parse, 1.0); !reflect.DeepEqual(comparable(r), comparable(fresh)) {
		t.Errorf("scan after the error = %+v, want %+v as on a fresh database", comparable(r), comparable(fresh))
	}

	// Nothing of the failed runs holds the table: it can be dropped.
	mustRun(t, d, "DROP TABLE u")
}

// memoryDBWith opens a database in memory and runs sqls on it.
func memoryDBWith(t *testing.T, sqls ...string) *database {
	t.Helper()
	d := memoryDB(t)
	for _, sql := range sqls {
		mustRun(t, d, sql)
	}
	return d
}

func TestStmtCacheFollowsSchemaChanges(t *testing.T) {
	d := memoryDBWith(t, "CREATE TABLE t (a)", "INSERT INTO t VALUES (1)")
	const all = "SELECT * FROM t"
	mustRun(t, d, all)

	mustRun(t, d, "ALTER TABLE t ADD COLUMN b DEFAULT 'x'")
	if r := mustRun(t, d, all); !reflect.DeepEqual(r.columns, []string{"a", "b"}) || !reflect.DeepEqual(r.rows, [][]any{{int64(1), "x"}}) {
		t.Errorf("after ADD COLUMN: %v %v", r.columns, r.rows)
	}

	// The same number of columns, named anew: the names are read again.
	mustRun(t, d, "ALTER TABLE t RENAME COLUMN b TO renamed")
	if r := mustRun(t, d, all); !reflect.DeepEqual(r.columns, []string{"a", "renamed"}) {
		t.Errorf("after RENAME COLUMN: %v", r.columns)
	}

	mustRun(t, d, "DROP TABLE t")
	mustRun(t, d, "CREATE TABLE t (c TEXT, d TEXT, e TEXT)")
	mustRun(t, d, "INSERT INTO t VALUES ('p', 'q', 'r')")
	if r := mustRun(t, d, all); !reflect.DeepEqual(r.columns, []string{"c", "d", "e"}) || !reflect.DeepEqual(r.rows, [][]any{{"p", "q", "r"}}) {
		t.Errorf("after DROP and CREATE: %v %v", r.columns, r.rows)
	}

	// In one request too.
	res, err := d.run(context.Background(), []statement{stmtOf(all), stmtOf("ALTER TABLE t DROP COLUMN e"), stmtOf(all)}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := res[2].columns; !reflect.DeepEqual(got, []string{"c", "d"}) {
		t.Errorf("after DROP COLUMN in the same request: %v", got)
	}

	// A cached statement whose table is gone fails as a new one would.
	mustRun(t, d, "DROP TABLE t")
	_, want := runOne(memoryDB(t), all)
	if _, err := runOne(d, all); err == nil || want == nil || err.Error() != want.Error() {
		t.Errorf("after DROP TABLE: %v, want %v", err, want)
	}
	mustRun(t, d, "CREATE TABLE t (z)")
	if r := mustRun(t, d, all); !reflect.DeepEqual(r.columns, []string{"z"}) || len(r.rows) != 0 {
		t.Errorf("after CREATE again: %v %v", r.columns, r.rows)
	}
}

func TestStmtCacheInUseIsNotHandedOutTwice(t *testing.T) {
	d := memoryDBWith(t, "CREATE TABLE t (a)")
	const sql = "SELECT a FROM t"
	mustRun(t, d, sql)
	err := d.withConn(context.Background(), func(c *conn) error {
		first := c.stmts.take(sql)
		if first == nil {
			t.Fatal("the statement run is not cached")
		}
		if again := c.stmts.take(sql); again != nil {
			t.Fatal("a statement in use was handed out again")
		}
		// A second compilation, made while the first is in use, is
		// finalized when put back; the first stays cached and free.
		second, _, err := c.prepare(sql)
		if err != nil {
			t.Fatal(err)
		}
		c.stmts.put(sql, second)
		c.stmts.put(sql, first)
		if got := c.stmts.take(sql); got != first {
			t.Errorf("took %p, want the first statement %p", got, first)
		}
		c.stmts.put(sql, first)
		live := 0
		for p := sqlite3.Xsqlite3_next_stmt(c.tls, c.db, 0); p != 0; p = sqlite3.Xsqlite3_next_stmt(c.tls, c.db, p) {
			live++
		}
		if live != 1 || c.stmts.len() != 1 {
			t.Errorf("%d statements live, %d cached; want 1 and 1", live, c.stmts.len())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestStmtCacheIsBounded(t *testing.T) {
	d := memoryDBWith(t, "CREATE TABLE t (a)")
	mustRun(t, d, "PRAGMA foreign_keys = ON")
	n := maxCachedStmts + 10
	for i := range n {
		mustRun(t, d, fmt.Sprintf("SELECT %d FROM t", i))
	}
	mustRun(t, d, "SELECT 0 FROM t") // evicted long ago: compiled again
	err := d.withConn(context.Background(), func(c *conn) error {
		if c.stmts.len() != maxCachedStmts {
			t.Errorf("%d statements cached, want %d", c.stmts.len(), maxCachedStmts)
		}
		for _, sql := range []string{"SELECT 0 FROM t", fmt.Sprintf("SELECT %d FROM t", n-1)} {
			if c.stmts.bySQL[sql] == nil {
				t.Errorf("%q is not cached", sql)
			}
		}
		for _, sql := range []string{"SELECT 1 FROM t", "CREATE TABLE t (a)", "PRAGMA foreign_keys = ON"} {
			if c.stmts.bySQL[sql] != nil {
				t.Errorf("%q is cached", sql)
			}
		}
		// Every statement the connection has is one of the cache's.
		live := 0
		for p := sqlite3.Xsqlite3_next_stmt(c.tls, c.db, 0); p != 0; p = sqlite3.Xsqlite3_next_stmt(c.tls, c.db, p) {
			live++
		}
		if live != maxCachedStmts {
			t.Errorf("%d statements are live, want the %d cached", live, maxCachedStmts)
		}
		c.stmts.clear()
		if p := sqlite3.Xsqlite3_next_stmt(c.tls, c.db, 0); p != 0 || c.stmts.len() != 0 {
			t.Errorf("statements left after clear: %d in the cache, live %v", c.stmts.len(), p != 0)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestStmtCacheInterruptedStatementRunsAgain(t *testing.T) {
	d := memoryDB(t)
	const count = "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < ?) SELECT count(*) AS n FROM c"
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := d.run(ctx, []statement{stmtOf(count, 1e9)}, 0); err == nil {
		t.Fatal("the long statement was not interrupted")
	}
	if r := mustRun(t, d, count, 10.0); !reflect.DeepEqual(r.rows, [][]any{{int64(10)}}) {
		t.Errorf("after the interrupt: %v", r.rows)
	}
}

// openFiles counts the process's open files at path, or skips the test
// where /proc/self/fd does not list them.
func openFiles(t *testing.T, path string) int {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("cannot list open files: %v", err)
	}
	n := 0
	for _, e := range entries {
		if target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err == nil && strings.HasPrefix(target, path) {
			n++
		}
	}
	return n
}

func TestStmtCacheDeleteAndImportLeaveNoZombie(t *testing.T) {
	dir := t.TempDir()
	h := newHarness(t, Config{Dir: dir})
	path := filepath.Join(dir, "db.sqlite")
	h.exec(t, "db", "CREATE TABLE t (a)")
	for i := range 3 {
		h.ok(t, "db", batch(q("INSERT INTO t VALUES (?)", i), q("SELECT * FROM t WHERE a = ?", i)))
	}
	if ans := h.importSQL(t, "db", "INSERT INTO t VALUES (7);\nINSERT INTO t VALUES (7);\nSELECT * FROM t;\n"); !ans.Success {
		t.Fatalf("import: %+v", ans)
	}
	if openFiles(t, path) == 0 {
		t.Fatal("the database file is not open: the test sees nothing")
	}
	if err := h.srv.DeleteDatabase("db"); err != nil {
		t.Fatal(err)
	}
	if n := openFiles(t, path); n != 0 {
		t.Errorf("%d files of the deleted database still open: a zombie connection", n)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("database file after delete: %v", err)
	}
	// The same ID again: a new, empty database, the same SQL text.
	h.exec(t, "db", "CREATE TABLE t (a)")
	if got := h.rows(t, "db", q("SELECT * FROM t WHERE a = ?", 1)); got != "[]" {
		t.Errorf("the new database has rows: %s", got)
	}
	h.ok(t, "db", q("INSERT INTO t VALUES (?)", 1))
	if got := h.rows(t, "db", q("SELECT * FROM t WHERE a = ?", 1)); got != `[{"a":1}]` {
		t.Errorf("the new database: %s", got)
	}
}
