package d1local

import (
	"bytes"
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// transferAnswer is the result of an import or export call.
type transferAnswer struct {
	Success    bool     `json:"success"`
	Type       string   `json:"type"`
	Status     string   `json:"status"`
	Error      string   `json:"error"`
	AtBookmark string   `json:"at_bookmark"`
	Messages   []string `json:"messages"`
	Filename   string   `json:"filename"`
	UploadURL  string   `json:"upload_url"`
	Result     struct {
		NumQueries    int             `json:"num_queries"`
		FinalBookmark string          `json:"final_bookmark"`
		Meta          json.RawMessage `json:"meta"`
		Filename      string          `json:"filename"`
		SignedURL     string          `json:"signed_url"`
	} `json:"result"`
}

// rawHTTP sends a request without the API's headers.
func rawHTTP(t *testing.T, method, url string, body []byte) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, data
}

func md5Hex(s string) string {
	sum := md5.Sum([]byte(s))
	return hex.EncodeToString(sum[:])
}

// importSQL runs wrangler's import flow (init, upload, ingest) for sql.
func (h *harness) importSQL(t *testing.T, db, sql string, header ...string) transferAnswer {
	t.Helper()
	path := "/client/v4/accounts/acc/d1/database/" + db + "/import"
	etag := md5Hex(sql)
	var init transferAnswer
	h.do(t, "POST", path, map[string]any{"action": "init", "etag": etag}, header...).decode(t, &init)
	if !init.Success || init.Type != "import" || init.UploadURL == "" || init.Filename == "" {
		t.Fatalf("init answer: %+v", init)
	}
	status, hdr, body := rawHTTP(t, "PUT", init.UploadURL, []byte(sql))
	if status != 200 || hdr.Get("ETag") != strconv.Quote(etag) {
		t.Fatalf("upload: %d ETag %q, want 200 %q: %s", status, hdr.Get("ETag"), strconv.Quote(etag), body)
	}
	var ans transferAnswer
	h.do(t, "POST", path, map[string]any{"action": "ingest", "filename": init.Filename, "etag": etag}, header...).decode(t, &ans)
	return ans
}

// exportSQL runs wrangler's export flow and returns the dump.
func (h *harness) exportSQL(t *testing.T, db string, opts map[string]any, header ...string) string {
	t.Helper()
	var ans transferAnswer
	h.do(t, "POST", "/accounts/acc/d1/database/"+db+"/export",
		map[string]any{"output_format": "polling", "dump_options": opts}, header...).decode(t, &ans)
	if !ans.Success || ans.Status != "complete" || ans.Type != "export" || ans.Result.SignedURL == "" || ans.AtBookmark == "" {
		t.Fatalf("export answer: %+v", ans)
	}
	status, hdr, body := rawHTTP(t, "GET", ans.Result.SignedURL, nil)
	if status != 200 || !strings.HasPrefix(hdr.Get("Content-Type"), "application/sql") {
		t.Fatalf("download: %d %s: %s", status, hdr.Get("Content-Type"), body)
	}
	return string(body)
}

func TestImport(t *testing.T) {
	var mu sync.Mutex
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	h := newHarness(t, Config{Now: clock})
	path := "/accounts/acc/d1/database/db/import"

	ans := h.importSQL(t, "db", "CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT);\n"+
		"INSERT INTO t (v) VALUES ('a;b'), ('c');\n-- a comment at the end\n")
	if !ans.Success || ans.Status != "complete" || ans.Type != "import" || ans.Result.NumQueries != 2 ||
		ans.AtBookmark == "" || ans.Result.FinalBookmark != ans.AtBookmark || ans.Messages == nil {
		t.Fatalf("ingest answer: %+v", ans)
	}
	var m struct {
		Duration    *float64 `json:"duration"`
		RowsRead    int      `json:"rows_read"`
		RowsWritten int      `json:"rows_written"`
		SizeAfter   int      `json:"size_after"`
		Changes     int      `json:"changes"`
	}
	if err := json.Unmarshal(ans.Result.Meta, &m); err != nil || m.Duration == nil || m.RowsWritten != 3 || m.Changes != 2 || m.SizeAfter <= 0 {
		t.Errorf("meta %s (%v)", ans.Result.Meta, err)
	}
	if got := h.rows(t, "db", q("SELECT v FROM t ORDER BY id")); got != `[{"v":"a;b"},{"v":"c"}]` {
		t.Errorf("rows = %s", got)
	}
	var poll transferAnswer
	h.do(t, "POST", path, `{"action":"poll","current_bookmark":"`+ans.AtBookmark+`"}`).decode(t, &poll)
	if poll.Status != "complete" || poll.Result.NumQueries != 2 {
		t.Errorf("poll answer: %+v", poll)
	}

	t.Run("an SQL error rolls everything back", func(t *testing.T) { importRollsBackOnError(t, h) })
	t.Run("a new database on import", func(t *testing.T) {
		ans := h.importSQL(t, "fresh", "CREATE TABLE f (x); INSERT INTO f VALUES (1)")
		if ans.Status != "complete" {
			t.Fatalf("answer: %+v", ans)
		}
		if got := h.rows(t, "fresh", q("SELECT x FROM f")); got != `[{"x":1}]` {
			t.Errorf("rows = %s", got)
		}
	})
	t.Run("flow errors", func(t *testing.T) { importFlowErrors(t, h, path) })
	t.Run("with a token", func(t *testing.T) { importWithToken(t) })
	t.Run("a second init replaces the first", func(t *testing.T) { importSecondInitReplaces(t, h, path) })
	t.Run("links expire after an hour", func(t *testing.T) {
		var init transferAnswer
		h.do(t, "POST", path, map[string]any{"action": "init", "etag": md5Hex("SELECT 1")}).decode(t, &init)
		advance(time.Hour)
		if status, _, _ := rawHTTP(t, "PUT", init.UploadURL, []byte("SELECT 1")); status != 404 {
			t.Errorf("PUT to an expired link: %d, want 404", status)
		}
	})
}

// importRollsBackOnError checks that an import whose SQL fails commits
// nothing, and that a dump with its own transaction is refused.
func importRollsBackOnError(t *testing.T, h *harness) {
	ans := h.importSQL(t, "db", "CREATE TABLE u (x);\nINSERT INTO nope VALUES (1);\n")
	if ans.Success || ans.Status != "error" || ans.Error != "no such table: nope: SQLITE_ERROR" {
		t.Errorf("answer: %+v", ans)
	}
	if got := h.rows(t, "db", q("SELECT count(*) AS n FROM sqlite_master WHERE name = 'u'")); got != `[{"n":0}]` {
		t.Errorf("table u committed by a failed import: %s", got)
	}
	ans = h.importSQL(t, "db", "BEGIN TRANSACTION;\nCREATE TABLE u (x);\nCOMMIT;\n")
	if ans.Success || !strings.Contains(ans.Error, "To execute a transaction") {
		t.Errorf("a dump with BEGIN TRANSACTION: %+v", ans)
	}
}

// importFlowErrors checks the import flow's refusals at path: an ingest
// before the upload, or whose MD5, etag or file name differs; a bad
// action or body; the wrong method or an unknown link for the upload.
func importFlowErrors(t *testing.T, h *harness, path string) {
	sql := "SELECT 1"
	etag := md5Hex(sql)
	var init transferAnswer
	h.do(t, "POST", path, map[string]any{"action": "init", "etag": etag}).decode(t, &init)
	ingest := map[string]any{"action": "ingest", "filename": init.Filename, "etag": etag}
	checkError(t, h.do(t, "POST", path, ingest), 400, 7400) // not uploaded yet
	if status, _, _ := rawHTTP(t, "GET", init.UploadURL, nil); status != 405 {
		t.Errorf("GET upload URL: %d, want 405", status)
	}
	if status, _, _ := rawHTTP(t, "PUT", init.UploadURL+"x", nil); status != 404 {
		t.Errorf("PUT to an unknown link: %d, want 404", status)
	}
	if status, _, _ := rawHTTP(t, "PUT", init.UploadURL, []byte("SELECT 2")); status != 200 {
		t.Errorf("upload: %d", status)
	}
	checkError(t, h.do(t, "POST", path, ingest), 400, 7400) // MD5 differs from the etag
	checkError(t, h.do(t, "POST", path, map[string]any{"action": "ingest", "filename": init.Filename, "etag": md5Hex("x")}), 400, 7400)
	checkError(t, h.do(t, "POST", path, map[string]any{"action": "ingest", "filename": "other.sql", "etag": etag}), 400, 7400)
	checkError(t, h.do(t, "POST", path, `{"action":"init"}`), 400, 7400)
	checkError(t, h.do(t, "POST", path, `{"action":"restore"}`), 400, 7400)
	checkError(t, h.do(t, "POST", path, `{"action":`), 400, 7400)
}

// importWithToken checks that the API calls need the token, and the
// upload link none (its secret is the credential, as in an R2 presigned
// URL).
func importWithToken(t *testing.T) {
	h := newHarness(t, Config{Token: "tok"})
	ans := h.importSQL(t, "db", "CREATE TABLE t (x)", "Authorization", "Bearer tok")
	if ans.Status != "complete" {
		t.Errorf("answer: %+v", ans)
	}
	checkError(t, h.do(t, "POST", "/accounts/acc/d1/database/db/import", `{"action":"init","etag":"00"}`), 403, 10000)
	checkError(t, h.do(t, "POST", "/accounts/acc/d1/database/db/export", `{"output_format":"polling"}`), 403, 10000)
	if dump := h.exportSQL(t, "db", nil, "Authorization", "Bearer tok"); !strings.Contains(dump, "CREATE TABLE t (x);") {
		t.Errorf("dump: %s", dump)
	}
}

// importSecondInitReplaces checks that a second init at path voids the
// first's upload link, and that the flow completes on the second's.
func importSecondInitReplaces(t *testing.T, h *harness, path string) {
	sql := "CREATE TABLE again (x)"
	etag := md5Hex(sql)
	var first, second transferAnswer
	h.do(t, "POST", path, map[string]any{"action": "init", "etag": etag}).decode(t, &first)
	h.do(t, "POST", path, map[string]any{"action": "init", "etag": etag}).decode(t, &second)
	if status, _, _ := rawHTTP(t, "PUT", first.UploadURL, []byte(sql)); status != 404 {
		t.Errorf("PUT to the replaced link: %d, want 404", status)
	}
	if status, _, _ := rawHTTP(t, "PUT", second.UploadURL, []byte(sql)); status != 200 {
		t.Errorf("PUT to the new link: %d", status)
	}
	var ans transferAnswer
	h.do(t, "POST", path, map[string]any{"action": "ingest", "filename": second.Filename, "etag": etag}).decode(t, &ans)
	if ans.Status != "complete" {
		t.Errorf("ingest: %+v", ans)
	}
}

func TestExport(t *testing.T) {
	h := newHarness(t, Config{})
	h.exec(t, "src",
		"CREATE TABLE plain (id INTEGER PRIMARY KEY AUTOINCREMENT, i INTEGER, r REAL, s TEXT, b BLOB, u)",
		`CREATE TABLE "quoted name" (x TEXT)`,
		"CREATE INDEX plain_s ON plain (s)",
		"CREATE VIEW v AS SELECT id FROM plain",
		"CREATE TRIGGER tr AFTER DELETE ON plain BEGIN DELETE FROM \"quoted name\"; END",
	)
	h.ok(t, "src", batch(
		q("INSERT INTO plain (i, r, s, b, u) VALUES (9007199254740993, 1.0, 'it''s', x'00ff', NULL)"),
		q("INSERT INTO plain (i, r, s, b, u) VALUES (-5, 1.5, 'two\nlines\r\n', x'', 1e300)"),
		q("INSERT INTO plain (i, r, s, b, u) VALUES (0, 9e999, 'literal \\n and\na newline', NULL, 'text')"),
		q(`INSERT INTO "quoted name" VALUES ('q')`),
	))
	dump := h.exportSQL(t, "src", nil)
	want := `PRAGMA defer_foreign_keys=TRUE;
CREATE TABLE plain (id INTEGER PRIMARY KEY AUTOINCREMENT, i INTEGER, r REAL, s TEXT, b BLOB, u);
INSERT INTO "plain" VALUES(1,9007199254740993,1.0,'it''s',X'00ff',NULL);
INSERT INTO "plain" VALUES(2,-5,1.5,replace(replace('two\nlines\r\n','\r',char(13)),'\n',char(10)),X'',1e+300);
INSERT INTO "plain" VALUES(3,0,9e999,'literal \n and'||char(10)||'a newline',NULL,'text');
CREATE TABLE IF NOT EXISTS "quoted name" (x TEXT);
INSERT INTO "quoted name" VALUES('q');
DELETE FROM sqlite_sequence;
INSERT INTO "sqlite_sequence" VALUES('plain',3);
CREATE INDEX plain_s ON plain (s);
CREATE TRIGGER tr AFTER DELETE ON plain BEGIN DELETE FROM "quoted name"; END;
CREATE VIEW v AS SELECT id FROM plain;
`
	if dump != want {
		t.Errorf("dump:\n%s\nwant:\n%s", dump, want)
	}

	t.Run("round trip through import", func(t *testing.T) {
		ans := h.importSQL(t, "copy", dump)
		if ans.Status != "complete" {
			t.Fatalf("import of the dump: %+v", ans)
		}
		for _, sql := range []string{
			"SELECT id, i, typeof(i) AS ti, r, typeof(r) AS tr, s, hex(b) AS b, typeof(b) AS tb, u, typeof(u) AS tu FROM plain ORDER BY id",
			`SELECT * FROM "quoted name"`,
			"SELECT * FROM sqlite_sequence",
			"SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY name",
		} {
			if a, b := h.rows(t, "src", q(sql)), h.rows(t, "copy", q(sql)); a != b {
				t.Errorf("%s:\n src %s\ncopy %s", sql, a, b)
			}
		}
		if again := h.exportSQL(t, "copy", nil); again != dump {
			t.Errorf("export of the copy differs:\n%s", again)
		}
	})
	t.Run("options", func(t *testing.T) {
		got := h.exportSQL(t, "src", map[string]any{"tables": []string{"quoted name"}})
		if want := "PRAGMA defer_foreign_keys=TRUE;\nCREATE TABLE IF NOT EXISTS \"quoted name\" (x TEXT);\nINSERT INTO \"quoted name\" VALUES('q');\n"; got != want {
			t.Errorf("tables filter:\n%s", got)
		}
		got = h.exportSQL(t, "src", map[string]any{"no_data": true})
		if strings.Contains(got, "INSERT") || !strings.Contains(got, "CREATE INDEX plain_s") {
			t.Errorf("no_data:\n%s", got)
		}
		got = h.exportSQL(t, "src", map[string]any{"no_schema": true})
		if strings.Contains(got, "CREATE") || strings.Contains(got, "DELETE FROM sqlite_sequence") || !strings.Contains(got, `INSERT INTO "quoted name"`) {
			t.Errorf("no_schema:\n%s", got)
		}
	})
	t.Run("virtual tables cannot be exported", func(t *testing.T) {
		h.exec(t, "fts", "CREATE VIRTUAL TABLE docs USING fts5(body)")
		var ans transferAnswer
		h.do(t, "POST", "/accounts/acc/d1/database/fts/export", `{"output_format":"polling"}`).decode(t, &ans)
		if ans.Success || ans.Status != "error" || ans.Error != "D1 Export error: cannot export databases with Virtual Tables (fts5)" {
			t.Errorf("answer: %+v", ans)
		}
	})
	t.Run("request errors", func(t *testing.T) {
		checkError(t, h.do(t, "POST", "/accounts/acc/d1/database/src/export", `{}`), 400, 7400)
		checkError(t, h.do(t, "POST", "/accounts/acc/d1/database/src/export", `{"output_format":"polling","dump_options":{"tables":"x"}}`), 400, 7400)
	})
}
