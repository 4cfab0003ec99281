package d1client

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"
	"unsafe"

	"modernc.org/libc"
	sqlite3 "modernc.org/sqlite/lib"
)

func TestClassifySQL(t *testing.T) {
	tests := []struct {
		sql        string
		statements int
		readOnly   bool
	}{
		{"SELECT 1", 1, true},
		{"select * from t;", 1, true},
		{"SELECT 1;;", 1, true},
		{"  -- comment\n select * from t", 1, true},
		{"/* c */ VALUES (1)", 1, true},
		{"\ufeffSELECT 1", 1, true},
		{"EXPLAIN QUERY PLAN DELETE FROM t", 1, true}, // EXPLAIN never runs its statement
		{"WITH x AS (SELECT 1) SELECT * FROM x", 1, true},
		{"WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r LIMIT 3) SELECT n FROM r", 1, true},
		{`SELECT 'it''s; DELETE FROM t', "a;b", [c;d], ` + "`e;f`" + `, x'3b'`, 1, true},
		{"SELECT replace(b, 'a', 'b') FROM t", 1, true},
		{"SELECT 1 -- ; DELETE FROM t", 1, true},
		{"SELECT 1 /* ; DELETE FROM t */", 1, true},
		{"SELECT $a(x;y) FROM t", 1, true}, // a Tcl variable's parentheses hold the ";"
		{"PRAGMA table_info(t)", 1, true},
		{"PRAGMA main.index_list('t')", 1, true},
		{"PRAGMA foreign_keys", 1, true},

		// Writes, however spelled.
		{"WITH v AS (SELECT ? AS x)INSERT INTO t (a) SELECT x FROM v", 1, false},
		{"WITH v AS (SELECT 1)\nUPDATE t SET a = 1", 1, false},
		{"WITH v AS (SELECT 1) DELETE FROM t", 1, false},
		{"WITH v AS (SELECT 1) REPLACE INTO t VALUES (1)", 1, false},
		{"with x as (select 1) insert into t select 1", 1, false},
		{`WITH "select" AS (SELECT 1) INSERT INTO t SELECT * FROM "select"`, 1, false},
		{"INSERT/**/INTO t VALUES (1)", 1, false},
		{"INSERT INTO t VALUES (1)", 1, false},
		{"REPLACE INTO t VALUES (1)", 1, false},
		{"UPDATE t SET a = 1 RETURNING a", 1, false},
		{"DELETE FROM t", 1, false},
		{"CREATE TABLE t(a)", 1, false},
		{"PRAGMA foreign_keys = ON", 1, false},
		{"PRAGMA foreign_keys(1)", 1, false},
		{"PRAGMA optimize", 1, false},
		{"PRAGMA user_version", 1, false}, // not on D1's list
		{"BEGIN", 1, false},
		{"SELECT 1\x00; DELETE FROM t", 2, false},
		{"SELECT 'unterminated", 1, false},
		{"SELECT \xff", 1, false}, // not UTF-8: D1 would see other text

		// Several statements, or none.
		{"SELECT 1; INSERT INTO t VALUES (1)", 2, false},
		{"SELECT 1;INSERT INTO t VALUES (1);", 2, false},
		{"SELECT 1; SELECT 2", 2, false},
		{"SELECT (1; DELETE FROM t)", 2, false},
		{"CREATE TRIGGER tr AFTER INSERT ON t BEGIN INSERT INTO u VALUES (new.a); DELETE FROM v; END", 1, false},
		{"CREATE TEMP TRIGGER tr AFTER INSERT ON t BEGIN SELECT CASE WHEN 1 THEN 2 END; END; SELECT 1", 2, false},
		{"EXPLAIN CREATE TRIGGER tr AFTER INSERT ON t BEGIN SELECT 1; END", 1, true},
		{"", 0, false},
		{" ;; -- nothing\n /* at all */", 0, false},
	}
	for _, tc := range tests {
		got := classifySQL(tc.sql)
		if got.statements != tc.statements || got.readOnly != tc.readOnly {
			t.Errorf("classifySQL(%q) = %d statements, read-only %v; want %d, %v", tc.sql, got.statements, got.readOnly, tc.statements, tc.readOnly)
		}
	}
}

// The classification is computed once per SQL text, and the cache stays
// bounded however many texts pass through it.
func TestClassCache(t *testing.T) {
	c, _ := mockClient(t, ok1(t))
	for i := 0; i < 3; i++ {
		if _, err := c.Exec(t.Context(), readStmt); err != nil {
			t.Fatal(err)
		}
	}
	if n := c.classes.Len(); n != 1 {
		t.Fatalf("%d classifications cached, want the statement's alone", n)
	}
	if allocs := testing.AllocsPerRun(100, func() { c.classes.Get(readStmt[0].SQL, classifySQL) }); allocs != 0 {
		t.Errorf("a cached classification allocates %v times", allocs)
	}
	for i := 0; i < 3*classCacheEntries; i++ {
		c.classes.Get(fmt.Sprintf("SELECT %d", i), classifySQL)
		if n := c.classes.Len(); n > classCacheEntries {
			t.Fatalf("%d cached texts, over the bound of %d", n, classCacheEntries)
		}
	}
	if cl := c.classes.Get("SELECT '"+strings.Repeat("x", classCacheMaxSQL)+"'", classifySQL); !cl.readOnly {
		t.Error("a long text was misclassified")
	}
}

// TestClassifierAgreesWithSQLite runs the generator's whole space through
// the oracle: every prefix, statement and trailer, with each separator in
// turn.
func TestClassifierAgreesWithSQLite(t *testing.T) {
	o := newSQLOracle(t)
	n := 0
	for pi, prefix := range genPrefixes {
		for bi, body := range genBodies {
			for ti, trailer := range genTrailers {
				sep := genSeps[(pi+bi+ti)%len(genSeps)]
				checkClassification(t, o, prefix+sep+body+genSeps[(bi+ti)%len(genSeps)]+trailer)
				n++
			}
		}
	}
	t.Logf("%d generated texts agree with SQLite", n)
}

// FuzzClassifySQL checks the classifier against SQLite itself, on the text
// sql and on a text the generator builds from recipe: whatever the client
// classifies as read-only compiles to statements in which SQLite's
// authorizer sees no write, and a text SQLite compiles completely holds
// exactly as many statements as the classifier counts.
func FuzzClassifySQL(f *testing.F) {
	f.Add("WITH v AS (SELECT ? AS x)INSERT INTO t (a) SELECT x FROM v", []byte{})
	f.Add("SELECT 1; INSERT INTO u VALUES (1, 2)", []byte{1, 2, 3, 4, 5, 6})
	f.Add("SELECT 'a;b' FROM t /* ; */ -- ;", []byte{0, 1, 9, 0, 2, 7})
	o := newSQLOracle(f)
	f.Fuzz(func(t *testing.T, sql string, recipe []byte) {
		if len(sql) > 4096 || len(recipe) > 64 {
			return
		}
		checkClassification(t, o, sql)
		checkClassification(t, o, generateSQL(recipe))
	})
}

func checkClassification(t *testing.T, o *sqlOracle, sql string) {
	t.Helper()
	cl := classifySQL(sql)
	if strings.IndexByte(sql, 0) >= 0 {
		if cl.readOnly {
			t.Fatalf("%q has a NUL byte and is classified read-only", sql)
		}
		return // SQLite would stop reading at the NUL
	}
	// What D1 compiles is the text after its trip through JSON.
	wire, _ := json.Marshal(sql)
	var seen string
	_ = json.Unmarshal(wire, &seen)
	got := o.compile(seen)
	if cl.readOnly {
		for _, w := range got.writes {
			t.Errorf("%q is classified read-only, but SQLite's authorizer saw %s", sql, w)
		}
		if got.statements > 1 {
			t.Errorf("%q is classified read-only, but SQLite compiled %d statements", sql, got.statements)
		}
	}
	if got.err == nil && utf8.ValidString(sql) && got.statements != cl.statements {
		t.Errorf("%q: SQLite compiled %d statements, the classifier counts %d", sql, got.statements, cl.statements)
	}
}

// The generator: a recipe's bytes choose, in turn, a separator, a prefix,
// a separator, a statement, a separator and a trailer, and again while
// bytes remain.
var (
	genPrefixes = []string{
		"", "WITH v AS (SELECT ? AS x)", "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r LIMIT 3)",
		"WITH w(x) AS MATERIALIZED (VALUES (1))", "WITH \"insert\" AS (SELECT 1 AS x)", "WITH replace AS (SELECT 1 AS x)",
		"EXPLAIN", "EXPLAIN QUERY PLAN",
	}
	genSeps   = []string{" ", "", "\n", "/**/", "/* ; INSERT */", "-- ; DELETE\n", "\t", "\r\n", "\ufeff"}
	genBodies = []string{
		"SELECT * FROM t", "SELECT x FROM v", `SELECT 'a;b''c' AS "x;y", [d;e], ` + "`f;g`", "SELECT x'00ff', X'41'",
		"SELECT replace(b, 'a', 'b') FROM t", "VALUES (1), (2)", "SELECT count(*) FROM t WHERE b = ?1 AND c = :c",
		"SELECT $a(x;y) FROM t", "SELECT 1e3, .5, 0x1F, 1_000", "SELECT a->>'$.x' FROM t", "SELECT*FROM(SELECT 1)",
		"INSERT INTO t (b) VALUES (1)", "INSERT INTO u SELECT a, b FROM t", "INSERT/**/INTO u VALUES (1, 2)",
		"REPLACE INTO t (a, b) VALUES (1, 'x')", "INSERT OR REPLACE INTO t (a) VALUES (2)", "INSERT INTO u (x) SELECT x FROM v",
		"UPDATE t SET b = 'x'", "UPDATE u SET x = (SELECT 1)", "DELETE FROM u", "DELETE FROM t WHERE a IN (SELECT 1)",
		"INSERT INTO idempotency_keys (principal, key, fingerprint, status, generation, created_at, updated_at) VALUES (?, ?, ?, 'pending', 1, ?, ?) ON CONFLICT (principal, key) DO NOTHING",
		"SELECT status, generation FROM idempotency_keys WHERE principal = ? AND key = ?",
		"PRAGMA table_info(t)", "PRAGMA main.index_list('t')", "PRAGMA foreign_keys", "PRAGMA foreign_keys = ON",
		"PRAGMA foreign_keys(1)", "PRAGMA user_version = 3", "PRAGMA optimize", "PRAGMA quick_check(-1)", "PRAGMA data_version",
		"CREATE TABLE z (a)", "CREATE TEMP TABLE z (a)", "DROP TABLE u", "ALTER TABLE u ADD COLUMN z", "CREATE INDEX ux ON u (x)",
		"CREATE VIEW z AS SELECT 1", "CREATE TRIGGER tr AFTER INSERT ON u BEGIN INSERT INTO t (b) VALUES (new.x); END",
		"CREATE TRIGGER tr2 AFTER DELETE ON u BEGIN SELECT CASE WHEN 1 THEN 2 END; UPDATE t SET b = 1; END",
		"BEGIN", "COMMIT", "SAVEPOINT s", "ANALYZE", "VACUUM", "REINDEX", "ATTACH ':memory:' AS aux", "DETACH aux",
	}
	genTrailers = []string{"", ";", "; ", ";;", " -- end", "; -- end", "; SELECT 1", "; INSERT INTO u VALUES (3, 4)", ";\nDELETE FROM u", "/* ; */", ";/**/ ;"}
)

func generateSQL(recipe []byte) string {
	pick := func(list []string) string {
		if len(recipe) == 0 {
			return list[0]
		}
		s := list[int(recipe[0])%len(list)]
		recipe = recipe[1:]
		return s
	}
	var b strings.Builder
	for first := true; first || len(recipe) > 0; first = false {
		for _, list := range [][]string{genSeps, genPrefixes, genSeps, genBodies, genSeps, genTrailers} {
			b.WriteString(pick(list))
		}
	}
	return b.String()
}

// sqlOracle compiles SQL with SQLite (modernc.org/sqlite, in tests only)
// under an authorizer that records every action, as d1local does with its
// D1 authorizer (d1local/sqlite.go). Nothing is run.
type sqlOracle struct {
	mu  sync.Mutex
	tls *libc.TLS
	db  uintptr
}

// compiled is what SQLite made of a text.
type compiled struct {
	statements int      // statements compiled, up to the first error
	writes     []string // the actions that write, in compiled statements other than EXPLAINs
	err        error    // the first compile error
}

// oracleActions collects the authorizer's actions during one compile; the
// oracle's mutex guards it.
var oracleActions []authAction

type authAction struct {
	code       int32
	arg1, arg2 string
}

func oracleAuthorizer(_ *libc.TLS, _ uintptr, action int32, arg1, arg2, _, _ uintptr) int32 {
	str := func(p uintptr) string {
		if p == 0 {
			return ""
		}
		return libc.GoString(p)
	}
	oracleActions = append(oracleActions, authAction{action, str(arg1), str(arg2)})
	return sqlite3.SQLITE_OK
}

// reads reports whether SQLite's action only reads. PRAGMA actions are
// judged by the client's own list of reading pragmas, readPragma.
func (a authAction) reads() bool {
	switch a.code {
	case sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE:
		return true
	case sqlite3.SQLITE_PRAGMA:
		return readPragma(strings.ToLower(a.arg1), a.arg2 != "")
	}
	return false
}

func newSQLOracle(tb testing.TB) *sqlOracle {
	tb.Helper()
	o := &sqlOracle{tls: libc.NewTLS()}
	name, _ := libc.CString(":memory:")
	defer libc.Xfree(o.tls, name)
	pdb := o.tls.Alloc(int(unsafe.Sizeof(uintptr(0))))
	rc := sqlite3.Xsqlite3_open_v2(o.tls, name, pdb, sqlite3.SQLITE_OPEN_READWRITE|sqlite3.SQLITE_OPEN_CREATE, 0)
	o.db = readPtr(pdb)
	o.tls.Free(int(unsafe.Sizeof(uintptr(0))))
	if rc != sqlite3.SQLITE_OK {
		tb.Fatalf("sqlite3_open_v2: %d", rc)
	}
	tb.Cleanup(func() {
		sqlite3.Xsqlite3_close_v2(o.tls, o.db)
		o.tls.Close()
	})
	ledger, err := os.ReadFile(filepath.Join("..", "schema.sql"))
	if err != nil {
		tb.Fatal(err)
	}
	schema := string(ledger) + `;
		CREATE TABLE t (a INTEGER PRIMARY KEY, b TEXT, c);
		CREATE TABLE u (x, y);
		CREATE VIEW v AS SELECT a AS x, b AS y FROM t;
		CREATE INDEX t_b ON t (b);`
	csql, _ := libc.CString(schema)
	defer libc.Xfree(o.tls, csql)
	if rc := sqlite3.Xsqlite3_exec(o.tls, o.db, csql, 0, 0, 0); rc != sqlite3.SQLITE_OK {
		tb.Fatalf("schema: %s", libc.GoString(sqlite3.Xsqlite3_errmsg(o.tls, o.db)))
	}
	if rc := sqlite3.Xsqlite3_set_authorizer(o.tls, o.db, cFuncPointer(oracleAuthorizer), 0); rc != sqlite3.SQLITE_OK {
		tb.Fatalf("sqlite3_set_authorizer: %d", rc)
	}
	return o
}

// compile prepares each statement of sql in turn, as D1 would before
// running it, and finalizes it unrun.
func (o *sqlOracle) compile(sql string) compiled {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out compiled
	csql, err := libc.CString(sql)
	if err != nil {
		return compiled{err: err}
	}
	defer libc.Xfree(o.tls, csql)
	ptr := int(unsafe.Sizeof(uintptr(0)))
	slots := o.tls.Alloc(2 * ptr) // sqlite3_stmt **ppStmt, const char **pzTail
	defer o.tls.Free(2 * ptr)
	for off := 0; off < len(sql); {
		oracleActions = oracleActions[:0]
		rc := sqlite3.Xsqlite3_prepare_v3(o.tls, o.db, csql+uintptr(off), int32(len(sql)-off), 0, slots, slots+uintptr(ptr))
		stmt, tail := readPtr(slots), readPtr(slots+uintptr(ptr))
		if rc != sqlite3.SQLITE_OK {
			// A statement that does not compile never runs: its actions
			// are no writes.
			out.err = fmt.Errorf("%s", libc.GoString(sqlite3.Xsqlite3_errmsg(o.tls, o.db)))
			return out
		}
		if stmt == 0 { // only whitespace and comments were left
			return out
		}
		if sqlite3.Xsqlite3_stmt_isexplain(o.tls, stmt) == 0 {
			for _, a := range oracleActions {
				if !a.reads() {
					out.writes = append(out.writes, fmt.Sprintf("action %d (%q, %q)", a.code, a.arg1, a.arg2))
				}
			}
		}
		out.statements++
		sqlite3.Xsqlite3_finalize(o.tls, stmt)
		next := int(tail - csql)
		if next <= off {
			break
		}
		off = next
	}
	return out
}

// readPtr reads a C pointer at p (as d1local does).
func readPtr(p uintptr) uintptr {
	b := libc.GoBytes(p, int(unsafe.Sizeof(uintptr(0))))
	if len(b) == 8 {
		return uintptr(binary.NativeEndian.Uint64(b))
	}
	return uintptr(binary.NativeEndian.Uint32(b))
}

// cFuncPointer converts a top-level Go function to the function pointer the
// transpiled SQLite calls (as d1local and modernc.org/sqlite do).
func cFuncPointer[T any](f T) uintptr {
	return *(*uintptr)(unsafe.Pointer(&struct{ f T }{f}))
}
