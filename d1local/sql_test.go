package d1local

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
)

func TestRejections(t *testing.T) {
	h := newHarness(t, Config{})
	h.exec(t, "db", "CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)", "CREATE INDEX t_v ON t (v)")
	manyParams := make([]any, 101)
	for i := range manyParams {
		manyParams[i] = i
	}
	tests := []struct {
		name string
		body any
		want string // exact message, or a substring when prefixed with "~"
	}{
		{"BEGIN", q("BEGIN"), transactionMessage},
		{"BEGIN TRANSACTION", q("BEGIN TRANSACTION"), transactionMessage},
		{"BEGIN IMMEDIATE", q("begin immediate"), transactionMessage},
		{"COMMIT", q("COMMIT"), transactionMessage},
		{"END", q("END TRANSACTION"), transactionMessage},
		{"ROLLBACK", q("ROLLBACK"), transactionMessage},
		{"SAVEPOINT", q("SAVEPOINT sp1"), transactionMessage},
		{"RELEASE", q("RELEASE sp1"), transactionMessage},
		{"BEGIN inside a batch", batch(q("INSERT INTO t (v) VALUES ('x')"), q("BEGIN")), transactionMessage},
		{"ATTACH", q("ATTACH DATABASE ':memory:' AS other"), "not authorized: SQLITE_AUTH"},
		{"DETACH", q("DETACH DATABASE other"), "not authorized: SQLITE_AUTH"},
		{"create _cf_ table", q("CREATE TABLE _cf_x (a)"), "not authorized: SQLITE_AUTH"},
		{"create quoted _cf_ table", q(`CREATE TABLE "_cf_z" (a)`), "not authorized: SQLITE_AUTH"},
		{"create _cf_ index", q("CREATE INDEX _cf_idx ON t (v)"), "not authorized: SQLITE_AUTH"},
		{"create _cf_ view", q("CREATE VIEW _cf_view AS SELECT 1"), "not authorized: SQLITE_AUTH"},
		{"create _cf_ trigger", q("CREATE TRIGGER _cf_trg AFTER INSERT ON t BEGIN SELECT 1; END"), "not authorized: SQLITE_AUTH"},
		{"rename to _cf_", q("ALTER TABLE t RENAME TO _cf_t"), "not authorized: SQLITE_AUTH"},
		{"rename to _cf_ past comments", q("ALTER TABLE t RENAME/**/TO/* x */_cf_t"), "not authorized: SQLITE_AUTH"},
		{"rename to _cf_ past bare comments", q("ALTER TABLE t RENAME/**/TO/**/_cf_t"), "not authorized: SQLITE_AUTH"},
		{"rename to bracketed _cf_", q("ALTER TABLE t RENAME TO [_cf_t]"), "not authorized: SQLITE_AUTH"},
		{"rename to _cf_ past a line comment", q("ALTER TABLE t RENAME -- x\nTO\n\t\"_cf_t\""), "not authorized: SQLITE_AUTH"},
		{"TEMP table", q("CREATE TEMP TABLE tt (a)"), "not authorized: SQLITE_AUTH"},
		{"TEMPORARY table", q("CREATE TEMPORARY TABLE tt (a)"), "not authorized: SQLITE_AUTH"},
		{"temp schema table", q("CREATE TABLE temp.tt (a)"), "not authorized: SQLITE_AUTH"},
		{"TEMP view", q("CREATE TEMP VIEW tv AS SELECT 1"), "not authorized: SQLITE_AUTH"},
		{"TEMP trigger", q("CREATE TEMP TRIGGER ttr AFTER INSERT ON t BEGIN SELECT 1; END"), "not authorized: SQLITE_AUTH"},
		{"TEMP index", q("CREATE INDEX temp.ti ON t (v)"), "~"},
		{"temp table_list", q("PRAGMA temp.table_list"), "not authorized: SQLITE_AUTH"},
		{"PRAGMA journal_mode", q("PRAGMA journal_mode"), "not authorized: SQLITE_AUTH"},
		{"PRAGMA journal_mode = DELETE", q("PRAGMA journal_mode = DELETE"), "not authorized: SQLITE_AUTH"},
		{"PRAGMA compile_options", q("PRAGMA compile_options"), "not authorized: SQLITE_AUTH"},
		{"PRAGMA writable_schema", q("PRAGMA writable_schema = 1"), "not authorized: SQLITE_AUTH"},
		{"PRAGMA page_size write", q("PRAGMA page_size = 8192"), "not authorized: SQLITE_AUTH"},
		{"PRAGMA table_info without table", q("PRAGMA table_info"), "not authorized: SQLITE_AUTH"},
		{"PRAGMA table_info of _cf_", q("PRAGMA table_info(_cf_KV)"), "not authorized: SQLITE_AUTH"},
		{"pragma function", q("SELECT * FROM pragma_journal_mode"), "~not authorized"},
		{"sqlite_version()", q("SELECT sqlite_version()"), "not authorized to use function: sqlite_version at offset 7: SQLITE_ERROR"},
		{"sqlite_source_id()", q("SELECT sqlite_source_id()"), "~not authorized to use function: sqlite_source_id"},
		{"sqlite_compileoption_used()", q("SELECT sqlite_compileoption_used('THREADSAFE')"), "~not authorized to use function"},
		{"sqlite_compileoption_get()", q("SELECT sqlite_compileoption_get(0)"), "~not authorized to use function"},
		{"load_extension()", q("SELECT load_extension('x')"), "~not authorized to use function"},
		{"dbstat", q("SELECT * FROM dbstat"), "~SQLITE_AUTH"},
		{"sqlite_dbpage", q("SELECT * FROM sqlite_dbpage"), "~SQLITE_AUTH"},
		{"virtual table module", q("CREATE VIRTUAL TABLE g USING geopoly(a)"), "not authorized: SQLITE_AUTH"},
		{"empty sql", q(""), "No SQL statements detected."},
		{"blank sql", q("  \n\t "), "No SQL statements detected."},
		{"comment only", q("-- nothing here\n/* or here */"), "SQL code did not contain a statement."},
		{"empty statement after the last", q("SELECT 1;;"), "SQL code did not contain a statement."},
		{"comment after the last statement", q("SELECT 1; -- note"), "SQL code did not contain a statement."},
		{"empty statement after a write", q("INSERT INTO t (v) VALUES ('x');;"), "SQL code did not contain a statement."},
		{"empty statement in a batch entry", batch(q("INSERT INTO t (v) VALUES ('x')"), q("SELECT 1;;")), "SQL code did not contain a statement."},
		{"error before the empty statement wins", q("SELECT * FROM nope;;"), "no such table: nope: SQLITE_ERROR"},
		{"params with an empty statement", q("SELECT ?;;", 1), "~params cannot be bound to multiple statements"},
		{"empty batch", `{"batch":[]}`, "No SQL statements detected."},
		{"params with multiple statements", q("SELECT ?; SELECT ?", 1), "~params cannot be bound to multiple statements"},
		{"too few params", q("SELECT ?, ?", 1), "Wrong number of parameter bindings for SQL query."},
		{"too many params", q("SELECT ?", 1, 2), "Wrong number of parameter bindings for SQL query."},
		{"params without placeholders", q("SELECT 1", 1), "Wrong number of parameter bindings for SQL query."},
		{"numbered placeholder gap", q("SELECT ?2", "x"), "Wrong number of parameter bindings for SQL query."},
		{"more than 100 params", q("SELECT 1", manyParams...), "~too many SQL variables"},
		{"more than 100 placeholders", q("SELECT "+strings.TrimSuffix(strings.Repeat("?,", 101), ","), manyParams...), "~too many SQL variables"},
		{"statement over 100,000 bytes", q("SELECT '" + strings.Repeat("x", maxSQLLength) + "'"), "~statement too long"},
		{"object parameter", q("SELECT ?", map[string]any{"a": 1}), "D1_TYPE_ERROR: Type 'object' not supported for value '[object Object]'"},
		{"array of non-bytes", q("SELECT ?", []any{1, 300}), "D1_TYPE_ERROR: Type 'object' not supported for value '1,300'"},
		{"array of strings", q("SELECT ?", []any{"a", nil}), "D1_TYPE_ERROR: Type 'object' not supported for value 'a,'"},
		{"value over 2,000,000 bytes", q("SELECT ?", strings.Repeat("x", maxValueLength+1)), "string or blob too big: SQLITE_TOOBIG"},
		{"no such table", q("SELECT * FROM nope"), "no such table: nope: SQLITE_ERROR"},
		{"syntax error", q("SELEC 1"), `near "SELEC": syntax error at offset 0: SQLITE_ERROR`},
		{"DELETE ... LIMIT", q("DELETE FROM t WHERE v = 'x' LIMIT 1"), `~near "LIMIT": syntax error`},
		{"compound SELECT over 5 terms", q("SELECT 1 UNION SELECT 2 UNION SELECT 3 UNION SELECT 4 UNION SELECT 5 UNION SELECT 6"),
			"too many terms in compound SELECT: SQLITE_ERROR"},
		{"VACUUM", q("VACUUM"), "cannot VACUUM from within a transaction: SQLITE_ERROR"},
		{"unique", batch(q("INSERT INTO t (id, v) VALUES (1, 'a')"), q("INSERT INTO t (id, v) VALUES (1, 'b')")),
			"UNIQUE constraint failed: t.id: SQLITE_CONSTRAINT (extended: SQLITE_CONSTRAINT_PRIMARYKEY)"},
		{"datatype mismatch", q("INSERT INTO t (id) VALUES ('not an integer')"), "datatype mismatch: SQLITE_MISMATCH"},
		{"writing sqlite_master", q("DELETE FROM sqlite_master"), "~may not be modified"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			msg := h.sqlError(t, "db", tt.body)
			if sub, ok := strings.CutPrefix(tt.want, "~"); ok {
				if !strings.Contains(msg, sub) {
					t.Errorf("message %q lacks %q", msg, sub)
				}
			} else if msg != tt.want {
				t.Errorf("message %q\n          want %q", msg, tt.want)
			}
		})
	}
	// Nothing of the rejected requests stayed.
	if got := h.rows(t, "db", q("SELECT count(*) AS n FROM t")); got != `[{"n":0}]` {
		t.Errorf("rows left by rejected requests: %s", got)
	}
	if got := h.rows(t, "db", q("SELECT count(*) AS n FROM sqlite_master WHERE name LIKE '\\_cf\\_%' ESCAPE '\\'")); got != `[{"n":0}]` {
		t.Errorf("_cf_ objects created: %s", got)
	}
}

func TestAllowedStatements(t *testing.T) {
	h := newHarness(t, Config{})
	h.exec(t, "db",
		"CREATE TABLE parent (id INTEGER PRIMARY KEY)",
		"CREATE TABLE child (id INTEGER PRIMARY KEY, parent_id INTEGER REFERENCES parent (id))",
		"CREATE INDEX child_parent ON child (parent_id)")
	tests := []struct {
		name string
		sql  string
		want string // first result's rows; "" to only require success
	}{
		{"table_info", "PRAGMA table_info(child)", `[{"cid":0,"name":"id","type":"INTEGER","notnull":0,"dflt_value":null,"pk":1},{"cid":1,"name":"parent_id","type":"INTEGER","notnull":0,"dflt_value":null,"pk":0}]`},
		{"table_info quoted", "PRAGMA table_info('child')", ""},
		{"main.table_info", "PRAGMA main.table_info(child)", ""},
		{"table_xinfo", "PRAGMA table_xinfo(child)", ""},
		{"index_list", "PRAGMA index_list(child)", `[{"seq":0,"name":"child_parent","unique":0,"origin":"c","partial":0}]`},
		{"index_info", "PRAGMA index_info(child_parent)", `[{"seqno":0,"cid":1,"name":"parent_id"}]`},
		{"index_xinfo", "PRAGMA index_xinfo(child_parent)", ""},
		{"table_list", "PRAGMA table_list", ""},
		{"table_list of a table", "PRAGMA table_list(child)", ""},
		{"foreign_key_list", "PRAGMA foreign_key_list(child)", ""},
		{"foreign_key_check", "PRAGMA foreign_key_check", `[]`},
		{"foreign_key_check(T)", "PRAGMA foreign_key_check(child)", `[]`},
		{"data_version", "PRAGMA data_version", ""},
		{"page_size read", "PRAGMA page_size", `[{"page_size":4096}]`},
		{"quick_check", "PRAGMA quick_check", `[{"quick_check":"ok"}]`},
		{"quick_check(N)", "PRAGMA quick_check(1)", ""},
		{"optimize", "PRAGMA optimize", ""},
		{"optimize(mask)", "PRAGMA optimize(0x10002)", ""},
		{"foreign_keys read", "PRAGMA foreign_keys", `[{"foreign_keys":1}]`},
		{"foreign_keys off (no-op)", "PRAGMA foreign_keys = OFF", ""},
		{"defer_foreign_keys", "PRAGMA defer_foreign_keys = ON", ""},
		{"case_sensitive_like", "PRAGMA case_sensitive_like = off", ""},
		{"ignore_check_constraints", "PRAGMA ignore_check_constraints = false", ""},
		{"legacy_alter_table", "PRAGMA legacy_alter_table = 0", ""},
		{"recursive_triggers", "PRAGMA recursive_triggers = no", ""},
		{"reverse_unordered_selects", "PRAGMA reverse_unordered_selects = 0", ""},
		{"pragma_table_info function", "SELECT name FROM pragma_table_info('parent')", `[{"name":"id"}]`},
		{"sqlite_master readable", "SELECT name FROM sqlite_master WHERE type = 'index'", `[{"name":"child_parent"}]`},
		{"recursive CTE", "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 3) SELECT group_concat(i) AS g FROM c", `[{"g":"1,2,3"}]`},
		{"json functions", `SELECT json_extract('{"a":[1,2]}', '$.a[1]') AS v`, `[{"v":2}]`},
		{"math functions", "SELECT floor(2.5) AS f", `[{"f":2}]`},
		{"fts5", "CREATE VIRTUAL TABLE docs USING fts5(body)", ""},
		{"five compound terms", "SELECT 1 AS n UNION SELECT 2 UNION SELECT 3 UNION SELECT 4 UNION SELECT 5", ""},
		{"rowid subquery delete", "DELETE FROM child WHERE rowid IN (SELECT rowid FROM child WHERE id > 0 LIMIT 2)", `[]`},
		{"alter add column", "ALTER TABLE parent ADD COLUMN name TEXT", ""},
		{"alter rename column", "ALTER TABLE parent RENAME COLUMN name TO title", ""},
		{"alter rename table", "CREATE TABLE old_name (a); ALTER TABLE old_name RENAME TO new_name", ""},
		// Words in a string are not the statement's.
		{"RENAME TO _cf_ in a string", "ALTER TABLE parent ADD COLUMN y DEFAULT 'RENAME TO _cf_'", ""},
		{"RENAME TO _cf_ in a quoted name", `ALTER TABLE parent ADD COLUMN "RENAME TO _cf_z"`, ""},
		{"temp schema readable", "SELECT count(*) AS n FROM temp.sqlite_master", `[{"n":0}]`},
		{"explain", "EXPLAIN QUERY PLAN SELECT * FROM child WHERE parent_id = 1", ""},
		{"100 params", "SELECT " + strings.TrimSuffix(strings.Repeat("?,", 100), ","), ""},
		// The _cf_ rule is case-sensitive, as on workerd.
		{"_CF_ table", `CREATE TABLE "_CF_y" (a)`, ""},
		{"_Cf_ table", "CREATE TABLE _Cf_w (a)", ""},
		{"_CF_ index", "CREATE INDEX _CF_i ON _CF_y (a)", ""},
		{"_CF_ insert", "INSERT INTO _CF_y VALUES (1) RETURNING a", `[{"a":1}]`},
		{"_CF_ table_info", "PRAGMA table_info(_CF_y)", `[{"cid":0,"name":"a","type":"","notnull":0,"dflt_value":null,"pk":0}]`},
		{"rename to _CF_", "ALTER TABLE _Cf_w RENAME TO _CF_q", ""},
		{"_CF_ drop", "DROP TABLE _CF_q", ""},
		// Empty statements are fine before a statement and whitespace after
		// the last one.
		{"trailing semicolon and newline", "SELECT 1 AS one;\r\n", `[{"one":1}]`},
		{"leading empty statements", ";; SELECT 1 AS one", `[{"one":1}]`},
		{"comment without a semicolon", "SELECT 1 AS one -- note", `[{"one":1}]`},
		// A comment left open at the end keeps its white space: "/*" alone
		// is an operator to SQLite.
		{"unterminated comment", "SELECT 1 AS one /* ", `[{"one":1}]`},
		// Several statements are split as the REST API splits them:
		// empty ones and trailing comments are dropped.
		{"several statements and empty ones", "SELECT 1 AS one;; SELECT 2; -- done", `[{"one":1}]`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := q(tt.sql)
			if n := strings.Count(tt.sql, "?"); n > 0 {
				params := make([]any, n)
				for i := range params {
					params[i] = i
				}
				body = q(tt.sql, params...)
			}
			got := h.rows(t, "db", body)
			if tt.want != "" && got != tt.want {
				t.Errorf("rows = %s\n  want %s", got, tt.want)
			}
		})
	}
}

// A Tcl variable's parentheses hold a ';' that ends no statement, as SQLite
// tokenizes it.
func TestTclVariable(t *testing.T) {
	h := newHarness(t, Config{})
	if got := h.rows(t, "db", q("SELECT $a(x;y) AS v", "x")); got != `[{"v":"x"}]` {
		t.Errorf("rows = %s", got)
	}
}

func TestParameterTyping(t *testing.T) {
	h := newHarness(t, Config{})
	tests := []struct {
		name  string
		param any
		want  string
	}{
		{"integer number binds REAL", 42, `[{"t":"real","v":42}]`},
		{"string binds TEXT", "42", `[{"t":"text","v":"42"}]`},
		{"null binds NULL", nil, `[{"t":"null","v":null}]`},
		{"fraction binds REAL", 1.5, `[{"t":"real","v":1.5}]`},
		{"true binds REAL 1", true, `[{"t":"real","v":1}]`},
		{"false binds REAL 0", false, `[{"t":"real","v":0}]`},
		{"byte array binds BLOB", []int{1, 2, 255}, `[{"t":"blob","v":[1,2,255]}]`},
		{"empty array binds empty BLOB", []int{}, `[{"t":"blob","v":[]}]`},
		{"empty string", "", `[{"t":"text","v":""}]`},
		{"exponent", json.Number("1e3"), `[{"t":"real","v":1000}]`},
		{"beyond 2^53 rounds", json.Number("9007199254740993"), `[{"t":"real","v":9007199254740992}]`},
		{"out of range is Infinity", json.Number("1e400"), `[{"t":"real","v":null}]`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := h.rows(t, "db", q("SELECT typeof(?1) AS t, ?1 AS v", tt.param)); got != tt.want {
				t.Errorf("got %s, want %s", got, tt.want)
			}
		})
	}
	t.Run("all at once, as the workerd capture", func(t *testing.T) {
		got := h.rows(t, "db", q("SELECT typeof(?1) AS t1, ?1 AS v1, typeof(?2) AS t2, ?2 AS v2, typeof(?3) AS t3, ?3 AS v3, "+
			"typeof(?4) AS t4, ?4 AS v4, typeof(?5) AS t5, ?5 AS v5, typeof(?6) AS t6, hex(?6) AS v6",
			42, "42", nil, 1.5, true, []int{1, 2, 255}))
		want := `[{"t1":"real","v1":42,"t2":"text","v2":"42","t3":"null","v3":null,"t4":"real","v4":1.5,"t5":"real","v5":1,"t6":"blob","v6":"0102FF"}]`
		if got != want {
			t.Errorf("got  %s\nwant %s", got, want)
		}
	})
	t.Run("named and numbered placeholders bind by position", func(t *testing.T) {
		got := h.rows(t, "db", q("SELECT :a AS a, @b AS b, $c AS c, ?4 AS d", "x", "y", "z", "w"))
		if want := `[{"a":"x","b":"y","c":"z","d":"w"}]`; got != want {
			t.Errorf("got %s, want %s", got, want)
		}
	})
}

func TestColumnAffinityGotcha(t *testing.T) {
	h := newHarness(t, Config{})
	h.exec(t, "db", "CREATE TABLE aff (t TEXT, i INTEGER, n NUMERIC, r REAL, b BLOB, u)")
	h.ok(t, "db", q("INSERT INTO aff VALUES (?1, ?1, ?1, ?1, ?1, ?1)", 42))
	got := h.rows(t, "db", q("SELECT t, typeof(t) AS tt, i, typeof(i) AS ti, n, typeof(n) AS tn, r, typeof(r) AS tr, b, typeof(b) AS tb, u, typeof(u) AS tu FROM aff"))
	want := `[{"t":"42.0","tt":"text","i":42,"ti":"integer","n":42,"tn":"integer","r":42,"tr":"real","b":42,"tb":"real","u":42,"tu":"real"}]`
	if got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	// The string "1234" in an INTEGER column is stored as an integer.
	h.ok(t, "db", q("INSERT INTO aff (i) VALUES (?)", "1234"))
	if got := h.rows(t, "db", q("SELECT typeof(i) AS t FROM aff WHERE i = 1234")); got != `[{"t":"integer"}]` {
		t.Errorf("got %s", got)
	}
}

func TestResultNumberFormatting(t *testing.T) {
	h := newHarness(t, Config{})
	tests := []struct {
		expr string
		want string
	}{
		{"9007199254740992", "9007199254740992"},
		{"9007199254740993", "9007199254740992"},
		{"-9007199254740993", "-9007199254740992"},
		{"9223372036854775807", "9223372036854776000"},
		{"-9223372036854775808", "-9223372036854776000"},
		{"12345678901234567", "12345678901234568"},
		{"1.0", "1"},
		{"0.1 + 0.2", "0.30000000000000004"},
		{"1e21", "1e+21"},
		{"1e20", "100000000000000000000"},
		{"1e-7", "1e-7"},
		{"0.000001", "0.000001"},
		{"-0.0", "0"},
		{"1e300 * 1e300", "null"},
		{"-1e300 * 1e300", "null"},
		{"CAST(9007199254740993 AS TEXT)", `"9007199254740993"`},
		{"x'00ff10'", "[0,255,16]"},
		{"x''", "[]"},
		{"NULL", "null"},
	}
	for _, tt := range tests {
		t.Run(tt.expr, func(t *testing.T) {
			got := h.rows(t, "db", q("SELECT "+tt.expr+" AS v"))
			if want := `[{"v":` + tt.want + `}]`; got != want {
				t.Errorf("got %s, want %s", got, want)
			}
		})
	}
	t.Run("stored big integer", func(t *testing.T) {
		h.exec(t, "db", "CREATE TABLE big (v INTEGER)", "INSERT INTO big VALUES (9007199254740993)")
		got := h.rows(t, "db", q("SELECT v, typeof(v) AS t, CAST(v AS TEXT) AS s FROM big"))
		if want := `[{"v":9007199254740992,"t":"integer","s":"9007199254740993"}]`; got != want {
			t.Errorf("got %s, want %s", got, want)
		}
	})
}

func TestTextIsReturnedVerbatim(t *testing.T) {
	// The database/sql driver would turn these into time.Time.
	h := newHarness(t, Config{})
	h.exec(t, "db", "CREATE TABLE ev (d DATE, dt DATETIME, ts TIMESTAMP)",
		"INSERT INTO ev VALUES ('2024-01-02', '2024-01-02 03:04:05', '2024-01-02T03:04:05.500+02:00')")
	got := h.rows(t, "db", q("SELECT d, dt, ts FROM ev"))
	if want := `[{"d":"2024-01-02","dt":"2024-01-02 03:04:05","ts":"2024-01-02T03:04:05.500+02:00"}]`; got != want {
		t.Errorf("got %s, want %s", got, want)
	}
}

func TestForeignKeys(t *testing.T) {
	h := newHarness(t, Config{})
	h.exec(t, "db",
		"CREATE TABLE parent (id INTEGER PRIMARY KEY)",
		"CREATE TABLE child (id INTEGER PRIMARY KEY, parent_id INTEGER NOT NULL REFERENCES parent (id) ON DELETE CASCADE)",
		"INSERT INTO parent VALUES (1)")
	tests := []struct {
		name string
		body any
		want string // "" for success
	}{
		{"orphan insert", q("INSERT INTO child VALUES (1, 2)"),
			"FOREIGN KEY constraint failed: SQLITE_CONSTRAINT (extended: SQLITE_CONSTRAINT_FOREIGNKEY)"},
		{"foreign_keys = OFF is a no-op", batch(q("PRAGMA foreign_keys = OFF"), q("INSERT INTO child VALUES (1, 2)")),
			"FOREIGN KEY constraint failed: SQLITE_CONSTRAINT (extended: SQLITE_CONSTRAINT_FOREIGNKEY)"},
		{"deferred violation fails at commit", batch(q("PRAGMA defer_foreign_keys = ON"), q("INSERT INTO child VALUES (1, 2)")),
			"FOREIGN KEY constraint failed: SQLITE_CONSTRAINT (extended: SQLITE_CONSTRAINT_FOREIGNKEY)"},
		{"deferred violation fixed in the batch", batch(q("PRAGMA defer_foreign_keys = ON"),
			q("INSERT INTO child VALUES (1, 2)"), q("INSERT INTO parent VALUES (2)")), ""},
		{"cascade", q("DELETE FROM parent WHERE id = 2"), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.want == "" {
				h.ok(t, "db", tt.body)
				return
			}
			if msg := h.sqlError(t, "db", tt.body); msg != tt.want {
				t.Errorf("message %q, want %q", msg, tt.want)
			}
		})
	}
	if got := h.rows(t, "db", q("SELECT count(*) AS n FROM child")); got != `[{"n":0}]` {
		t.Errorf("child rows = %s, want none (cascade)", got)
	}
}

func TestReservedTablesInExistingFile(t *testing.T) {
	dir := t.TempDir()
	// A database file with D1's internal tables, as a copied Miniflare or
	// exported production database has.
	c, err := openConn(filepath.Join(dir, "copied.sqlite"))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.exec("CREATE TABLE _cf_KV (key TEXT PRIMARY KEY, value BLOB) WITHOUT ROWID; " +
		"INSERT INTO _cf_KV VALUES ('k', x'01'); CREATE TABLE visible (x)"); err != nil {
		t.Fatal(err)
	}
	if err := c.close(); err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, Config{Dir: dir, NoAutoCreate: true})
	for _, sql := range []string{
		"SELECT * FROM _cf_KV",
		"SELECT count(*) FROM _cf_kv",
		"INSERT INTO _cf_KV VALUES ('a', x'02')",
		"UPDATE _cf_KV SET value = NULL",
		"DELETE FROM _cf_KV",
		"DROP TABLE _cf_KV",
		"ALTER TABLE _cf_KV ADD COLUMN y",
		"CREATE INDEX i ON _cf_KV (value)",
		"PRAGMA table_info(_cf_KV)",
	} {
		if msg := h.sqlError(t, "copied", q(sql)); !strings.Contains(msg, "SQLITE_AUTH") {
			t.Errorf("%s: message %q, want an SQLITE_AUTH refusal", sql, msg)
		}
	}
	got := h.rows(t, "copied", q("SELECT name FROM pragma_table_list WHERE schema = 'main' AND name NOT LIKE 'sqlite%' ORDER BY name"))
	if got != `[{"name":"_cf_KV"},{"name":"visible"}]` {
		t.Errorf("table_list = %s", got)
	}
}
