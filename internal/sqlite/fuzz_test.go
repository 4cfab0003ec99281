package sqlite

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"modernc.org/libc"
	sqlite3 "modernc.org/sqlite/lib"
)

// FuzzSplit checks Split against SQLite itself, on the text sql and on a
// text the generator builds from recipe: Split's guarantees hold
// (checkSplit), and every statement SQLite compiles ends where Split ends
// it and compiles alone from Split's text of it.
func FuzzSplit(f *testing.F) {
	for _, tc := range splitTests {
		f.Add(tc.sql, []byte{})
	}
	for _, sql := range classifierInputs {
		f.Add(sql, []byte{})
	}
	ledger, err := os.ReadFile(filepath.Join("..", "..", "schema.sql"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(string(ledger), []byte{0, 16, 1, 2, 3, 20, 5, 6, 7, 8})
	o := newOracle(f)
	f.Fuzz(func(t *testing.T, sql string, recipe []byte) {
		if len(sql) > 4096 || len(recipe) > 64 {
			return
		}
		for _, sql := range []string{sql, generate(recipe)} {
			checkSplit(t, sql)
			checkAgainstSQLite(t, o, sql)
		}
	})
}

// TestSplitAgreesWithSQLite runs the generator's statements through the
// oracle, each with every trailer and separator in turn, and asks that
// SQLite compile all of them: the fuzz target's generator makes texts
// SQLite accepts.
func TestSplitAgreesWithSQLite(t *testing.T) {
	o := newOracle(t)
	n := 0
	for si, stmt := range genStatements {
		for ti, trailer := range genTrailers {
			sep := func(k int) string { return genSeps[(si+ti+k)%len(genSeps)] }
			sql := sep(0) + stmt + sep(1) + trailer + ";" + sep(2) + genStatements[(si+ti)%len(genStatements)]
			checkSplit(t, sql)
			if ends, all, msg := o.ends(sql); !all {
				t.Errorf("%q: SQLite compiles %d statements, then says %q: the generator makes texts it refuses", sql, len(ends), msg)
			}
			checkAgainstSQLite(t, o, sql)
			n++
		}
	}
	t.Logf("%d generated texts split as SQLite splits them", n)
}

// checkAgainstSQLite checks Split's statements against SQLite's, as far as
// SQLite compiles the text.
func checkAgainstSQLite(t *testing.T, o *oracle, sql string) {
	t.Helper()
	if strings.IndexByte(sql, 0) >= 0 {
		return // SQLite stops reading at a NUL byte
	}
	ends, all, _ := o.ends(sql)
	stmts := Split(sql)
	for i, end := range ends {
		if i >= len(stmts) || stmts[i].End != end {
			t.Fatalf("%q: SQLite ends statement %d at %d; Split: %+v", sql, i, end, stmts)
		}
		alone, ok, msg := o.ends(stmts[i].SQL)
		if !ok || len(alone) != 1 || alone[0] != len(stmts[i].SQL) {
			t.Fatalf("%q: statement %q alone does not compile as one statement: %v, %q", sql, stmts[i].SQL, alone, msg)
		}
	}
	if all && len(stmts) != len(ends) {
		t.Fatalf("%q: SQLite compiles %d statements; Split: %+v", sql, len(ends), stmts)
	}
}

// classifierInputs are d1client's classification tests' texts (its fuzz
// corpus is in testdata/fuzz/FuzzSplit too).
var classifierInputs = []string{
	"select * from t;", "  -- comment\n select * from t", "/* c */ VALUES (1)", "\ufeffSELECT 1",
	"WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r LIMIT 3) SELECT n FROM r",
	"SELECT 1 -- ; DELETE FROM t", "PRAGMA main.index_list('t')", "INSERT/**/INTO t VALUES (1)", "UPDATE t SET a = 1 RETURNING a", "SELECT 'unterminated", "SELECT \xff",
	"SELECT (1; DELETE FROM t)", "CREATE TEMP TRIGGER tr AFTER INSERT ON t BEGIN SELECT CASE WHEN 1 THEN 2 END; END; SELECT 1",
}

// The generator: a recipe's bytes choose, in turn, a separator, a
// statement, a separator and a trailer, and after a ';' again while bytes
// remain. Every statement compiles on the oracle's database, alone and with
// every separator and trailer.
var (
	genSeps       = []string{" ", "", "\n", "/**/", "/* ; */", "-- ; END\n", "\t", "\r\n", " \ufeff", " \v", "\f"}
	genStatements = []string{
		"SELECT 1", `select 'a;b''c' AS "x;y""z", 'END' AS [CREATE], 1 AS ` + "`TRIGGER`",
		"SELECT [a;b] FROM (SELECT 1 AS [a;b])", "SELECT `c;d` FROM (SELECT 1 AS `c;d`)", "SELECT x'3b3B', X''",
		"SELECT 1e3, .5, 1.5E-3, 0x1F, 1_000, 0xff_ff, 1.", "SELECT ?1, ?, :a, @b, $c, $d::e, $f(g;h), #i",
		"SELECT a->>'$.x', b->'y', a || b, a <> b, a != b, a == b, a <= b, a >= b, a << 1, a >> 1, ~a, -a, a % 2, a & 1, a | 1 FROM t",
		"SELECT/* ; */2", "SELECT 1 -- ; END\n+ 1", "VALUES (1), (2)", "WITH x(a) AS (SELECT 1) SELECT a FROM x",
		"INSERT INTO t (b) VALUES ('x;y')", "UPDATE t SET b = ';' WHERE a = 1", "DELETE FROM u WHERE x = 'END'",
		"SELECT é FROM (SELECT 1 AS é)",
		"CREATE TRIGGER tr AFTER INSERT ON u BEGIN INSERT INTO t (b) VALUES (new.x); DELETE FROM u; END",
		"CREATE TEMP TRIGGER tr BEFORE DELETE ON t BEGIN SELECT CASE WHEN 1 THEN 2 END; UPDATE u SET x = 'END;'; END",
		"CREATE TEMPORARY TRIGGER IF NOT EXISTS tr AFTER UPDATE ON t WHEN new.a > 0 BEGIN SELECT 1;END",
		"create trigger tr after insert on t begin select 1 ; end",
		"CREATE TRIGGER tr INSTEAD OF INSERT ON v BEGIN INSERT INTO u VALUES (new.x, new.y); END",
		"CREATE /* ; */ TRIGGER tr AFTER INSERT ON t BEGIN SELECT 'END;' -- ; END\n; END",
		"EXPLAIN CREATE TRIGGER tr AFTER INSERT ON t BEGIN SELECT 1; END", "EXPLAIN QUERY PLAN SELECT * FROM t", "EXPLAIN SELECT 1",
		`CREATE TABLE "trigger" ("end", [begin], ` + "`create`)", "CREATE TEMP TABLE temp_t (a)",
		"CREATE VIEW end_v AS SELECT 1 AS [end]", "CREATE INDEX ix ON t (b)", "DROP TABLE u", "PRAGMA table_info(t)",
		"BEGIN", "COMMIT", "END", "SAVEPOINT s",
	}
	genTrailers = []string{"", ";", "; ", ";;", " -- end;\n", "; -- end\n", "/* ; */", ";/**/ ;", ";\n;\t"}
)

func generate(recipe []byte) string {
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
		if !first {
			b.WriteString(";")
		}
		for _, list := range [][]string{genSeps, genStatements, genSeps, genTrailers} {
			b.WriteString(pick(list))
		}
	}
	return b.String()
}

// oracle prepares SQL with SQLite itself (modernc.org/sqlite, in tests
// only) on a database with the tables the generator's statements name.
// Nothing is run.
type oracle struct {
	mu  sync.Mutex
	tls *libc.TLS
	db  uintptr
}

func newOracle(tb testing.TB) *oracle {
	tb.Helper()
	o := &oracle{tls: libc.NewTLS()}
	name, _ := libc.CString(":memory:")
	defer libc.Xfree(o.tls, name)
	pdb := o.tls.Alloc(8)
	rc := sqlite3.Xsqlite3_open_v2(o.tls, name, pdb, sqlite3.SQLITE_OPEN_READWRITE|sqlite3.SQLITE_OPEN_CREATE, 0)
	o.db = readPtr(pdb)
	o.tls.Free(8)
	if rc != sqlite3.SQLITE_OK {
		tb.Fatalf("sqlite3_open_v2: %d", rc)
	}
	tb.Cleanup(func() {
		sqlite3.Xsqlite3_close_v2(o.tls, o.db)
		o.tls.Close()
	})
	schema, _ := libc.CString(`CREATE TABLE t (a INTEGER PRIMARY KEY, b TEXT, c);
		CREATE TABLE u (x, y);
		CREATE VIEW v AS SELECT a AS x, b AS y FROM t;`)
	defer libc.Xfree(o.tls, schema)
	if rc := sqlite3.Xsqlite3_exec(o.tls, o.db, schema, 0, 0, 0); rc != sqlite3.SQLITE_OK {
		tb.Fatalf("schema: %s", libc.GoString(sqlite3.Xsqlite3_errmsg(o.tls, o.db)))
	}
	return o
}

// ends prepares the statements of sql one at a time, each from where the
// one before ended (sqlite3_prepare_v3's tail), as D1 does, and returns
// where each ended. all reports whether SQLite compiled the whole text;
// when it did not, ends holds the statements before the one it refused,
// and msg says why. sql holds no NUL byte.
func (o *oracle) ends(sql string) (ends []int, all bool, msg string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	csql, _ := libc.CString(sql)
	defer libc.Xfree(o.tls, csql)
	slots := o.tls.Alloc(16) // sqlite3_stmt **ppStmt, const char **pzTail
	defer o.tls.Free(16)
	for off := 0; off < len(sql); {
		rc := sqlite3.Xsqlite3_prepare_v3(o.tls, o.db, csql+uintptr(off), int32(len(sql)-off), 0, slots, slots+8)
		if rc != sqlite3.SQLITE_OK {
			return ends, false, libc.GoString(sqlite3.Xsqlite3_errmsg(o.tls, o.db))
		}
		stmt := readPtr(slots)
		if stmt == 0 { // only whitespace, comments and ';' were left
			break
		}
		sqlite3.Xsqlite3_finalize(o.tls, stmt)
		off = int(readPtr(slots+8) - csql)
		ends = append(ends, off)
	}
	return ends, true, ""
}

// readPtr reads the C pointer at p (a 64-bit platform's).
func readPtr(p uintptr) uintptr {
	return uintptr(binary.NativeEndian.Uint64(libc.GoBytes(p, 8)))
}
