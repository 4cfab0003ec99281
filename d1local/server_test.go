package d1local

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestQueryAndRawShapes(t *testing.T) {
	h := newHarness(t, Config{})
	h.exec(t, "db", "CREATE TABLE users (id INTEGER PRIMARY KEY, email TEXT UNIQUE, score REAL, avatar BLOB)")

	tests := []struct {
		name     string
		endpoint string
		body     any
		want     []string // "results" of each entry, as JSON
	}{
		{"insert returning /query", "query",
			q("INSERT INTO users (email, score, avatar) VALUES (?, ?, ?) RETURNING id, email, score, avatar", "a@example.com", 1.5, []int{0, 255}),
			[]string{`[{"id":1,"email":"a@example.com","score":1.5,"avatar":[0,255]}]`}},
		{"insert returning /raw", "raw",
			q("INSERT INTO users (email, score) VALUES (?, ?) RETURNING id, email, score, avatar", "b@example.com", 2),
			[]string{`{"columns":["id","email","score","avatar"],"rows":[[2,"b@example.com",2,null]]}`}},
		{"no rows /query", "query", q("SELECT * FROM users WHERE id = ?", 99), []string{`[]`}},
		{"no rows /raw keeps columns", "raw", q("SELECT id, email FROM users WHERE id = ?", 99),
			[]string{`{"columns":["id","email"],"rows":[]}`}},
		{"statement without rows /raw", "raw", q("UPDATE users SET score = score WHERE id = 99"),
			[]string{`{"columns":[],"rows":[]}`}},
		{"duplicate columns /query collapse", "query", q("SELECT 1 AS a, 2 AS b, 3 AS a"),
			[]string{`[{"a":3,"b":2}]`}},
		{"duplicate columns /raw survive", "raw", q("SELECT 1 AS a, 2 AS b, 3 AS a"),
			[]string{`{"columns":["a","b","a"],"rows":[[1,2,3]]}`}},
		{"column order preserved", "query", q("SELECT 1 AS z, 2 AS a, 3 AS m"),
			[]string{`[{"z":1,"a":2,"m":3}]`}},
		{"array-index names first, like a JS object", "query", q(`SELECT 1 AS b, 2 AS "10", 3 AS "2", 4 AS "02"`),
			[]string{`[{"2":3,"10":2,"b":1,"02":4}]`}},
		{"batch /query", "query", batch(q("SELECT ? AS n", "x"), q("SELECT count(*) AS c FROM users")),
			[]string{`[{"n":"x"}]`, `[{"c":2}]`}},
		{"batch /raw", "raw", batch(q("SELECT 1 AS a, 2 AS a"), q("SELECT email FROM users ORDER BY id")),
			[]string{`{"columns":["a","a"],"rows":[[1,2]]}`, `{"columns":["email"],"rows":[["a@example.com"],["b@example.com"]]}`}},
		{"multi-statement sql", "query", q("SELECT 1 AS one; SELECT 2 AS two;\n SELECT 'a;b' AS s"),
			[]string{`[{"one":1}]`, `[{"two":2}]`, `[{"s":"a;b"}]`}},
		{"text escaping", "query", q("SELECT ? AS s", "quote\" backslash\\ nl\n tab\t <&> \u2028 é"),
			[]string{`[{"s":"quote\" backslash\\ nl\n tab\t <&> ` + "\u2028" + ` é"}]`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := h.post(t, "db", tt.endpoint, tt.body)
			if r.status != http.StatusOK {
				t.Fatalf("status %d: %s", r.status, r.body)
			}
			if len(r.results) != len(tt.want) {
				t.Fatalf("got %d results, want %d: %s", len(r.results), len(tt.want), r.body)
			}
			for i, want := range tt.want {
				if got := string(r.results[i].Results); got != want {
					t.Errorf("result %d = %s, want %s", i, got, want)
				}
				if !r.results[i].Success {
					t.Errorf("result %d: success false", i)
				}
			}
		})
	}
}

func TestEnvelopeAndMeta(t *testing.T) {
	h := newHarness(t, Config{})
	r := h.post(t, "db", "query", q("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)"))
	if r.status != http.StatusOK {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/json; charset=UTF-8" {
		t.Errorf("Content-Type = %q", ct)
	}
	for _, want := range []string{`"success":true`, `"errors":[]`, `"messages":[]`} {
		if !strings.Contains(string(r.body), want) {
			t.Errorf("envelope lacks %s: %s", want, r.body)
		}
	}
	checkMeta := func(t *testing.T, m resultMeta, changes, lastRowID int64, changed bool) {
		t.Helper()
		if m.ServedBy != "d1local" || m.ServedByRegion == "" || m.ServedByPrimary == nil || !*m.ServedByPrimary {
			t.Errorf("served_by fields: %+v", m)
		}
		if m.Duration == nil || m.Timings.SQLDurationMs == nil || *m.Duration != *m.Timings.SQLDurationMs {
			t.Errorf("duration %v, timings.sql_duration_ms %v", m.Duration, m.Timings.SQLDurationMs)
		} else if d, err := m.Duration.Float64(); err != nil || d < 0 {
			t.Errorf("duration %v", m.Duration)
		}
		num := func(name string, n *json.Number) int64 {
			if n == nil {
				t.Fatalf("meta.%s missing", name)
			}
			v, err := n.Int64()
			if err != nil {
				t.Fatalf("meta.%s = %v: %v", name, n, err)
			}
			return v
		}
		if got := num("changes", m.Changes); got != changes {
			t.Errorf("changes = %d, want %d", got, changes)
		}
		if got := num("last_row_id", m.LastRowID); got != lastRowID {
			t.Errorf("last_row_id = %d, want %d", got, lastRowID)
		}
		if m.ChangedDB == nil || *m.ChangedDB != changed {
			t.Errorf("changed_db = %v, want %v", m.ChangedDB, changed)
		}
		if size := num("size_after", m.SizeAfter); size <= 0 || size%512 != 0 {
			t.Errorf("size_after = %d", size)
		}
		num("rows_read", m.RowsRead)
		num("rows_written", m.RowsWritten)
	}
	checkMeta(t, r.results[0].Meta, 0, 0, true)

	res := h.ok(t, "db", batch(
		q("INSERT INTO t (v) VALUES (?), (?)", "a", "b"),
		q("SELECT * FROM t"),
		q("UPDATE t SET v = 'z' WHERE id = 99"),
		q("DELETE FROM t WHERE id = 1"),
	))
	checkMeta(t, res[0].Meta, 2, 2, true)
	checkMeta(t, res[1].Meta, 0, 2, false) // last_row_id sticks, as in D1
	checkMeta(t, res[2].Meta, 0, 2, false)
	checkMeta(t, res[3].Meta, 1, 2, true)
	if n, _ := res[1].Meta.RowsRead.Int64(); n != 2 {
		t.Errorf("rows_read of a 2-row scan = %d, want 2", n)
	}
	if n, _ := res[0].Meta.RowsWritten.Int64(); n != 2 {
		t.Errorf("rows_written of a 2-row insert = %d, want 2", n)
	}

	// changes counts trigger changes too (total_changes delta).
	h.exec(t, "db", "CREATE TABLE log (msg TEXT)",
		"CREATE TRIGGER t_log AFTER INSERT ON t BEGIN INSERT INTO log VALUES ('one'); INSERT INTO log VALUES ('two'); END")
	res = h.ok(t, "db", q("INSERT INTO t (v) VALUES ('c')"))
	if n, _ := res[0].Meta.Changes.Int64(); n != 3 {
		t.Errorf("changes with a 2-insert trigger = %d, want 3", n)
	}
}

func TestMultiStatementSplitting(t *testing.T) {
	h := newHarness(t, Config{})
	res := h.ok(t, "db", q(`CREATE TABLE a (x INTEGER, note TEXT);
		CREATE TABLE audit (x INTEGER);
		-- a comment; with a semicolon
		CREATE TRIGGER a_audit AFTER INSERT ON a BEGIN
			INSERT INTO audit VALUES (new.x);
			INSERT INTO audit VALUES (new.x * 10);
		END;
		/* block; comment */ INSERT INTO a VALUES (1, 'semi;colon ''quoted''');
		SELECT x FROM audit ORDER BY x;`))
	if len(res) != 5 {
		t.Fatalf("got %d results, want 5", len(res))
	}
	if got := string(res[4].Results); got != `[{"x":1},{"x":10}]` {
		t.Errorf("audit rows = %s", got)
	}
	if got := h.rows(t, "db", q("SELECT note FROM a")); got != `[{"note":"semi;colon 'quoted'"}]` {
		t.Errorf("note = %s", got)
	}
}

func TestBatchAtomicity(t *testing.T) {
	h := newHarness(t, Config{})
	h.exec(t, "db", "CREATE TABLE k (id TEXT PRIMARY KEY)", "INSERT INTO k VALUES ('existing')")
	tests := []struct {
		name    string
		body    any
		message string
		check   string // must return [{"n":0}]
	}{
		{"constraint in second statement", batch(q("INSERT INTO k VALUES (?)", "new1"), q("INSERT INTO k VALUES (?)", "existing")),
			"UNIQUE constraint failed: k.id: SQLITE_CONSTRAINT", "SELECT count(*) AS n FROM k WHERE id = 'new1'"},
		{"syntax error in second statement", batch(q("INSERT INTO k VALUES (?)", "new2"), q("SELEC nonsense")),
			`near "SELEC": syntax error`, "SELECT count(*) AS n FROM k WHERE id = 'new2'"},
		{"DDL rolled back", batch(q("CREATE TABLE t_ddl (x)"), q("SELECT * FROM nope")),
			"no such table: nope: SQLITE_ERROR", "SELECT count(*) AS n FROM sqlite_master WHERE name = 't_ddl'"},
		{"multi-statement sql", q("INSERT INTO k VALUES ('new3'); INSERT INTO k VALUES ('existing')"),
			"UNIQUE constraint failed", "SELECT count(*) AS n FROM k WHERE id = 'new3'"},
		{"wrong params in later entry", batch(q("INSERT INTO k VALUES (?)", "new4"), q("SELECT ?")),
			"Wrong number of parameter bindings", "SELECT count(*) AS n FROM k WHERE id = 'new4'"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			msg := h.sqlError(t, "db", tt.body)
			if !strings.Contains(msg, tt.message) {
				t.Errorf("message %q lacks %q", msg, tt.message)
			}
			if got := h.rows(t, "db", q(tt.check)); got != `[{"n":0}]` {
				t.Errorf("%s = %s: the failed request left changes", tt.check, got)
			}
		})
	}
}

func TestRouting(t *testing.T) {
	h := newHarness(t, Config{})
	tests := []struct {
		name   string
		method string
		path   string
		body   any
		status int
		code   int
	}{
		{"unknown route", "POST", "/accounts/acc/d1/database/db/backup", q("SELECT 1"), 404, 7000},
		{"unknown top-level route", "GET", "/zones", nil, 404, 7000},
		{"empty database ID", "GET", "/accounts/acc/d1/database/", nil, 404, 7000},
		{"empty path segment", "POST", "/accounts/acc/d1/database//query", q("SELECT 1"), 404, 7000},
		{"DELETE query", "DELETE", "/accounts/acc/d1/database/db/query", nil, 405, 10405},
		{"PUT database", "PUT", "/accounts/acc/d1/database/db", nil, 405, 10405},
		{"root", "GET", "/", nil, 404, 7000},
		{"GET query", "GET", "/accounts/acc/d1/database/db/query", nil, 405, 10405},
		{"PUT raw", "PUT", "/accounts/acc/d1/database/db/raw", q("SELECT 1"), 405, 10405},
		{"invalid database id", "POST", "/accounts/acc/d1/database/-bad/query", q("SELECT 1"), 400, 7003},
		{"invalid account id", "POST", "/accounts/a%20b/d1/database/db/query", q("SELECT 1"), 400, 7003},
		{"malformed JSON", "POST", "/accounts/acc/d1/database/db/query", `{"sql":`, 400, 7400},
		{"trailing data", "POST", "/accounts/acc/d1/database/db/query", `{"sql":"SELECT 1"} {}`, 400, 7400},
		{"sql not a string", "POST", "/accounts/acc/d1/database/db/query", `{"sql":1}`, 400, 7400},
		{"neither sql nor batch", "POST", "/accounts/acc/d1/database/db/query", `{"params":[]}`, 400, 7400},
		{"both sql and batch", "POST", "/accounts/acc/d1/database/db/query", `{"sql":"SELECT 1","batch":[]}`, 400, 7400},
		{"batch entry without sql", "POST", "/accounts/acc/d1/database/db/query", `{"batch":[{"params":[]}]}`, 400, 7400},
		{"body over 10 MiB", "POST", "/accounts/acc/d1/database/db/query",
			`{"sql":"SELECT 1","x":"` + strings.Repeat("x", maxBodyBytes) + `"}`, 413, 7400},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := h.do(t, tt.method, tt.path, tt.body)
			checkError(t, r, tt.status, tt.code)
			if string(r.env.Result) != "null" {
				t.Errorf("result = %s, want null", r.env.Result)
			}
		})
	}
	t.Run("client/v4 prefix", func(t *testing.T) {
		r := h.do(t, "POST", "/client/v4/accounts/acc/d1/database/db/raw", q("SELECT 1 AS one"))
		if r.status != 200 || string(r.results[0].Results) != `{"columns":["one"],"rows":[[1]]}` {
			t.Errorf("status %d: %s", r.status, r.body)
		}
	})
	t.Run("7003 message", func(t *testing.T) {
		r := h.do(t, "POST", "/accounts/acc/d1/database/.x/query", q("SELECT 1"))
		want := "Could not route to /client/v4/accounts/acc/d1/database/.x/query, perhaps your object identifier is invalid?"
		if r.env.Errors[0].Message != want {
			t.Errorf("message %q, want %q", r.env.Errors[0].Message, want)
		}
	})
}

func TestAuthentication(t *testing.T) {
	h := newHarness(t, Config{Token: "s3cret-token"})
	tests := []struct {
		name   string
		header []string
		status int
		code   int
	}{
		{"no header", nil, 403, 10000},
		{"wrong token", []string{"Authorization", "Bearer nope"}, 403, 10000},
		{"basic scheme", []string{"Authorization", "Basic dXNlcjpwYXNz"}, 400, 6003},
		{"bearer without token", []string{"Authorization", "Bearer"}, 400, 6003},
		{"token with spaces", []string{"Authorization", "Bearer a b"}, 400, 6003},
		{"bare token", []string{"Authorization", "s3cret-token"}, 400, 6003},
		{"right token", []string{"Authorization", "Bearer s3cret-token"}, 200, 0},
		{"scheme case-insensitive", []string{"Authorization", "bearer s3cret-token"}, 200, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := h.post(t, "db", "query", q("SELECT 1"), tt.header...)
			if tt.status == 200 {
				if r.status != 200 {
					t.Fatalf("status %d: %s", r.status, r.body)
				}
				return
			}
			checkError(t, r, tt.status, tt.code)
			e := r.env.Errors[0]
			switch tt.code {
			case 10000:
				if e.Message != "Authentication error" {
					t.Errorf("message %q", e.Message)
				}
			case 6003:
				if e.Message != "Invalid request headers" || len(e.ErrorChain) != 1 || e.ErrorChain[0].Code != 6111 ||
					e.ErrorChain[0].Message != "Invalid format for Authorization header" {
					t.Errorf("error = %+v", e)
				}
			}
		})
	}
	if got := h.srv.Calls(); got != int64(len(tests)) {
		t.Errorf("Calls() = %d, want %d (rejected calls count too)", got, len(tests))
	}
}

// TestBrowserGuard: without a token, a request from a web page (an Origin
// that is not loopback: a simple POST needs no preflight) or addressed to a
// name that is not loopback (DNS rebinding) is refused before anything runs;
// API clients, and loopback pages, are served. With a token the token is
// the guard.
func TestBrowserGuard(t *testing.T) {
	h := newHarness(t, Config{})
	create := q("CREATE TABLE IF NOT EXISTS pwned (x)")
	for _, tc := range []struct {
		name   string
		header []string
	}{
		{"a page's origin", []string{"Origin", "http://evil.example"}},
		{"an opaque origin", []string{"Origin", "null"}},
		{"a rebound name", []string{"Host", "evil.example:8787"}},
		{"a LAN address", []string{"Host", "192.168.1.20:8787"}},
	} {
		r := h.post(t, "db", "query", create, append(tc.header, "Content-Type", "text/plain;charset=UTF-8")...)
		checkError(t, r, http.StatusForbidden, 10000)
		if msg := r.env.Errors[0].Message; !strings.HasPrefix(msg, "d1local without a token ") {
			t.Errorf("%s: %q", tc.name, msg)
		}
	}
	if rows := h.rows(t, "db", q("SELECT count(*) AS n FROM sqlite_master WHERE name = 'pwned'")); rows != `[{"n":0}]` {
		t.Fatalf("a refused request ran: %s", rows)
	}
	for _, header := range [][]string{
		nil,
		{"Host", "localhost:8787"},
		{"Host", "[::1]:8787"},
		{"Origin", "http://localhost:3000"},
		{"Origin", "http://127.0.0.1:5173"},
	} {
		if r := h.post(t, "db", "query", q("SELECT 1"), header...); r.status != http.StatusOK {
			t.Errorf("%v: %d %s", header, r.status, r.body)
		}
	}
	// With a token, the token decides.
	ht := newHarness(t, Config{Token: "s3cret-token"})
	if r := ht.post(t, "db", "query", q("SELECT 1"), "Host", "d1.internal:8787", "Authorization", "Bearer s3cret-token"); r.status != http.StatusOK {
		t.Errorf("with the token: %d %s", r.status, r.body)
	}
}

func TestNoAutoCreate(t *testing.T) {
	for _, dir := range []string{"", t.TempDir()} {
		t.Run(fmt.Sprintf("dir=%q", dir), func(t *testing.T) {
			h := newHarness(t, Config{Dir: dir, NoAutoCreate: true})
			r := h.post(t, "missing-db", "query", q("SELECT 1"))
			checkError(t, r, 404, 7404)
			if want := "The database missing-db could not be found"; r.env.Errors[0].Message != want {
				t.Errorf("message %q, want %q", r.env.Errors[0].Message, want)
			}
			if dir != "" {
				if _, err := os.Stat(filepath.Join(dir, "missing-db.sqlite")); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("a file was created for the unknown database: %v", err)
				}
			}
			if err := h.srv.CreateDatabase("made"); err != nil {
				t.Fatal(err)
			}
			if err := h.srv.CreateDatabase("made"); err != nil {
				t.Fatalf("CreateDatabase twice: %v", err)
			}
			h.ok(t, "made", q("CREATE TABLE t (x)"))
			if err := h.srv.CreateDatabase("../escape"); err == nil {
				t.Error("CreateDatabase accepted an invalid ID")
			}
		})
	}
	t.Run("existing file counts", func(t *testing.T) {
		dir := t.TempDir()
		h1 := newHarness(t, Config{Dir: dir})
		h1.exec(t, "old", "CREATE TABLE t (x)", "INSERT INTO t VALUES (7)")
		if err := h1.srv.Close(); err != nil {
			t.Fatal(err)
		}
		h2 := newHarness(t, Config{Dir: dir, NoAutoCreate: true})
		if got := h2.rows(t, "old", q("SELECT x FROM t")); got != `[{"x":7}]` {
			t.Errorf("rows = %s", got)
		}
	})
}

// TestServerHeader: every JSON answer, a success, an SQL error, a missing
// database, an unknown route and a refused token, says it is d1local's, so
// that a client can tell d1local from D1.
func TestServerHeader(t *testing.T) {
	h := newHarness(t, Config{NoAutoCreate: true, Token: "s3cret"})
	if err := h.srv.CreateDatabase("db"); err != nil {
		t.Fatal(err)
	}
	auth := []string{"Authorization", "Bearer s3cret"}
	for name, r := range map[string]response{
		"query":         h.post(t, "db", "query", q("SELECT 1"), auth...),
		"SQL error":     h.post(t, "db", "query", q("SELECT nope"), auth...),
		"no database":   h.post(t, "missing", "query", q("SELECT 1"), auth...),
		"list":          h.do(t, http.MethodGet, "/accounts/acc/d1/database", nil, auth...),
		"no route":      h.do(t, http.MethodGet, "/nowhere", nil, auth...),
		"a wrong token": h.post(t, "db", "query", q("SELECT 1"), "Authorization", "Bearer wrong"),
	} {
		if got := r.header.Get("Server"); got != ServerName {
			t.Errorf("%s (HTTP %d): Server %q, want %q", name, r.status, got, ServerName)
		}
	}
}

func TestPersistence(t *testing.T) {
	dir := t.TempDir()
	h1 := newHarness(t, Config{Dir: dir})
	h1.exec(t, "persist", "CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)")
	h1.ok(t, "persist", q("INSERT INTO t (v) VALUES (?)", "kept"))
	h1.ok(t, "other", q("CREATE TABLE o (x)"))
	if _, err := os.Stat(filepath.Join(dir, "persist.sqlite-wal")); err != nil {
		t.Errorf("no WAL file while open: %v", err)
	}
	if err := h1.srv.Close(); err != nil {
		t.Fatal(err)
	}
	if err := h1.srv.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	r := h1.post(t, "persist", "query", q("SELECT 1"))
	checkError(t, r, 500, 7500)

	h2 := newHarness(t, Config{Dir: dir})
	if got := h2.rows(t, "persist", q("SELECT id, v FROM t")); got != `[{"id":1,"v":"kept"}]` {
		t.Errorf("after reopen: %s", got)
	}
	if got := h2.rows(t, "other", q("SELECT count(*) AS n FROM sqlite_master WHERE name = 't'")); got != `[{"n":0}]` {
		t.Errorf("databases are not separate: %s", got)
	}
}

func TestInMemoryDatabasesAreSeparate(t *testing.T) {
	h := newHarness(t, Config{})
	h.exec(t, "one", "CREATE TABLE t (x)")
	if msg := h.sqlError(t, "two", q("SELECT * FROM t")); msg != "no such table: t: SQLITE_ERROR" {
		t.Errorf("message %q", msg)
	}
}

func TestConcurrentRequestsAreSerialized(t *testing.T) {
	for _, dir := range []string{"", t.TempDir()} {
		t.Run(fmt.Sprintf("dir=%q", dir), func(t *testing.T) {
			h := newHarness(t, Config{Dir: dir})
			h.exec(t, "db", "CREATE TABLE counter (n INTEGER)", "INSERT INTO counter VALUES (0)",
				"CREATE TABLE items (g INTEGER, i INTEGER, PRIMARY KEY (g, i))")
			const goroutines, perGoroutine = 24, 15
			raceCalls(t, goroutines, perGoroutine, func(g, i int) string {
				_, failure := h.postNoFatal("db", "query", batch(
					q("UPDATE counter SET n = n + 1"),
					q("INSERT INTO items VALUES (?, ?)", g, i),
					q("SELECT n FROM counter")))
				return failure
			})
			want := fmt.Sprintf(`[{"n":%d,"c":%d}]`, goroutines*perGoroutine, goroutines*perGoroutine)
			if got := h.rows(t, "db", q("SELECT (SELECT n FROM counter) AS n, (SELECT count(*) FROM items) AS c")); got != want {
				t.Errorf("got %s, want %s", got, want)
			}
		})
	}
}

// Answers are built in spare buffers that later answers reuse: concurrent
// calls on separate databases (which run in parallel), with answers of
// every size from a few bytes to over 100 KB in turn, each get exactly
// their own answer, on /query and /raw.
func TestConcurrentAnswersAreTheirOwn(t *testing.T) {
	h := newHarness(t, Config{})
	raceCalls(t, 2*spareAnswers, 12, func(g, i int) string {
		v := fmt.Sprintf("%d-%d-", g, i) + strings.Repeat("x", (g*7+i*131)%12*10_000)
		endpoint, want := "query", fmt.Sprintf(`[{"v":%q}]`, v)
		if i%2 == 1 {
			endpoint, want = "raw", fmt.Sprintf(`{"columns":["v"],"rows":[[%q]]}`, v)
		}
		results, failure := h.postNoFatal(fmt.Sprintf("db%d", g), endpoint, batch(q("SELECT ? AS v", v), q("SELECT 1 AS one")))
		switch {
		case failure != "":
			return fmt.Sprintf("%d-%d: %s", g, i, failure)
		case len(results) != 2:
			return fmt.Sprintf("%d-%d: %s answered %d results, want 2", g, i, endpoint, len(results))
		case string(results[0].Results) != want:
			return fmt.Sprintf("%d-%d: %s answered %.200s, want %.200s", g, i, endpoint, results[0].Results, want)
		}
		return ""
	})
}

// A successful answer's buffer is kept for the next answer, which reuses
// it, unless it grew beyond maxSpareAnswer: a large answer is not held on
// to after it was sent.
func TestAnswerBuffersAreReusedWithinBounds(t *testing.T) {
	h := newHarness(t, Config{})
	spares := func() int { return len(h.srv.answers) }
	h.rows(t, "db", q("SELECT 1 AS one"))
	h.rows(t, "db", q("SELECT 2 AS two"))
	if n := spares(); n != 1 {
		t.Fatalf("%d spare buffers after two answers one after the other, want 1 (reused)", n)
	}
	big := strings.Repeat("x", maxSpareAnswer)
	if got := h.rows(t, "db", q("SELECT ? AS v", big)); len(got) <= maxSpareAnswer {
		t.Fatalf("answer of %d bytes, want over %d", len(got), maxSpareAnswer)
	}
	if n := spares(); n != 0 {
		t.Fatalf("%d spare buffers after an answer over %d bytes, want 0", n, maxSpareAnswer)
	}
	h.rows(t, "db", q("SELECT 3 AS three"))
	if n := spares(); n != 1 {
		t.Fatalf("%d spare buffers after a small answer, want 1", n)
	}
}

// raceCalls runs call(g, i) for i below perGoroutine in each of goroutines
// goroutines at once, and reports every failure it describes ("" is none).
func raceCalls(t *testing.T, goroutines, perGoroutine int, call func(g, i int) string) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan string, goroutines*perGoroutine)
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perGoroutine {
				if e := call(g, i); e != "" {
					errs <- e
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

// postNoFatal posts body to the endpoint of database db from any goroutine
// and returns the answer's results, or describes a failure.
func (h *harness) postNoFatal(db, endpoint string, body any) ([]queryResult, string) {
	data, _ := json.Marshal(body)
	resp, err := http.Post(h.url+"/accounts/acc/d1/database/"+db+"/"+endpoint, "application/json", bytes.NewReader(data))
	if err != nil {
		return nil, err.Error()
	}
	defer resp.Body.Close()
	var env envelope
	if err := json.NewDecoder(resp.Body).Decode(&env); err != nil {
		return nil, err.Error()
	}
	if resp.StatusCode != 200 || env.Success == nil || !*env.Success {
		return nil, fmt.Sprintf("status %d: %+v", resp.StatusCode, env.Errors)
	}
	var results []queryResult
	if err := json.Unmarshal(env.Result, &results); err != nil {
		return nil, fmt.Sprintf("result %.200s: %v", env.Result, err)
	}
	return results, ""
}

func TestClientDisconnectInterruptsAndRollsBack(t *testing.T) {
	h := newHarness(t, Config{})
	h.exec(t, "db", "CREATE TABLE t (x)")
	// A statement that would run for minutes, after a write in the same
	// request.
	body, _ := json.Marshal(batch(
		q("INSERT INTO t VALUES (1)"),
		q("WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 1000000000) SELECT count(*) FROM c")))
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", h.url+"/accounts/acc/d1/database/db/query", strings.NewReader(string(body)))
	start := time.Now()
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("the long request answered %d", resp.StatusCode)
	}
	// The database is free again soon, and the insert was rolled back.
	if got := h.rows(t, "db", q("SELECT count(*) AS n FROM t")); got != `[{"n":0}]` {
		t.Errorf("rows after interrupted request: %s", got)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("the interrupted request held the database for %v", d)
	}
}

func BenchmarkInsertAndSelect(b *testing.B) {
	srv, err := New(Config{})
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Close()
	ts := httptest.NewServer(srv)
	defer ts.Close()
	post := func(body string) {
		resp, err := http.Post(ts.URL+"/accounts/acc/d1/database/bench/raw", "application/json", strings.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			b.Fatalf("status %d", resp.StatusCode)
		}
	}
	post(`{"sql":"CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)"}`)
	for i := 0; b.Loop(); i++ {
		post(fmt.Sprintf(`{"batch":[{"sql":"INSERT INTO t (v) VALUES (?)","params":["v%d"]},{"sql":"SELECT v FROM t WHERE id = ?","params":[%d]}]}`, i, i+1))
	}
}

// BenchmarkRun measures database.run alone, without HTTP and JSON: the
// ledger's pattern of the same few SQL texts sent over and over.
func BenchmarkRun(b *testing.B) {
	d, err := openDatabase("bench", memoryPath, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer d.close(errClosed)
	ctx := context.Background()
	if _, err := d.run(ctx, []statement{{sql: "CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)", keyword: "CREATE"}}, 0); err != nil {
		b.Fatal(err)
	}
	for i := 0; b.Loop(); i++ {
		stmts := []statement{
			{sql: "INSERT INTO t (v) VALUES (?)", keyword: "INSERT", params: []any{fmt.Sprint("v", i)}},
			{sql: "SELECT v FROM t WHERE id = ?", keyword: "SELECT", params: []any{float64(i + 1)}},
		}
		if _, err := d.run(ctx, stmts, 0); err != nil {
			b.Fatal(err)
		}
	}
}

// TestResultMemoryLimit: a call whose rows exceed D1's isolate memory
// (maxResultBytes, across its statements) gets D1's answer, 500/7500
// "isolate exceeded its memory limit", instead of d1local growing without
// bound; nothing of it is committed, and the database goes on.
func TestResultMemoryLimit(t *testing.T) {
	h := newHarness(t, Config{})
	h.exec(t, "db", "CREATE TABLE t (x)")
	half := q("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c LIMIT 70) SELECT hex(zeroblob(500000)) AS b FROM c")
	if r := h.post(t, "db", "raw", half); r.status != http.StatusOK {
		t.Fatalf("70 MB: %d %.200s", r.status, r.body)
	}
	r := h.post(t, "db", "raw", batch(q("INSERT INTO t VALUES (1)"), half, half))
	checkError(t, r, http.StatusInternalServerError, 7500)
	if msg := r.env.Errors[0].Message; msg != "D1 DB's isolate exceeded its memory limit and was reset." {
		t.Errorf("message %q", msg)
	}
	if rows := h.rows(t, "db", q("SELECT count(*) AS n FROM t")); rows != `[{"n":0}]` {
		t.Errorf("the failed call committed: %s", rows)
	}
}
