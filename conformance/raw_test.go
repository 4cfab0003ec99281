package conformance

import (
	"encoding/json"
	"testing"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/internal/d1test"
)

// envelope is the Cloudflare v4 envelope, decoded loosely for comparisons.
type envelope struct {
	Result   json.RawMessage `json:"result"`
	Success  *bool           `json:"success"`
	Errors   json.RawMessage `json:"errors"`
	Messages json.RawMessage `json:"messages"`
}

func decodeEnvelope(t testing.TB, res *d1test.Response) envelope {
	t.Helper()
	var env envelope
	if err := json.Unmarshal(res.Body, &env); err != nil {
		t.Fatalf("HTTP %d body is not an envelope: %v\n%s", res.Status, err, res.Body)
	}
	if env.Success == nil {
		t.Fatalf("envelope without success: %s", res.Body)
	}
	return env
}

// wantEnvelopeError asserts the exact error envelope:
// {"result":R,"success":false,"errors":[{"code":C,"message":M}],"messages":[]}
// where R is [] for SQL errors (code 7500), as production D1 answers them,
// and null for other API errors (7404, ...), the Cloudflare API's usual
// shape.
func wantEnvelopeError(t testing.TB, res *d1test.Response, status, code int, message string) {
	t.Helper()
	if res.Status != status {
		t.Errorf("HTTP %d, want %d: %s", res.Status, status, res.Body)
	}
	var result any
	if code == 7500 {
		result = []any{}
	}
	want, _ := json.Marshal(map[string]any{
		"result": result, "success": false, "messages": []any{},
		"errors": []any{map[string]any{"code": code, "message": message}},
	})
	if !jsonEqual(t, res.Body, want) {
		t.Errorf("error envelope:\n got %s\nwant %s", res.Body, want)
	}
}

// rawEntry is one /raw result entry.
type rawEntry struct {
	Results struct {
		Columns []string          `json:"columns"`
		Rows    []json.RawMessage `json:"rows"`
	} `json:"results"`
	Success bool                       `json:"success"`
	Meta    map[string]json.RawMessage `json:"meta"`
}

// wantRawEntries decodes a successful /raw envelope and checks each entry's
// columns and rows (as JSON) and that meta carries the standard fields.
func wantRawEntries(t testing.TB, res *d1test.Response, want ...[2]string) {
	t.Helper()
	if res.Status != 200 {
		t.Fatalf("HTTP %d: %s", res.Status, res.Body)
	}
	env := decodeEnvelope(t, res)
	if !*env.Success || string(env.Errors) != "[]" || string(env.Messages) != "[]" {
		t.Errorf("envelope success/errors/messages: %s", res.Body)
	}
	var entries []rawEntry
	if err := json.Unmarshal(env.Result, &entries); err != nil {
		t.Fatalf("result is not an array of /raw entries: %v\n%s", err, res.Body)
	}
	if len(entries) != len(want) {
		t.Fatalf("%d result entries, want %d: %s", len(entries), len(want), res.Body)
	}
	for i, e := range entries {
		cols, _ := json.Marshal(e.Results.Columns)
		rows, _ := json.Marshal(e.Results.Rows)
		if e.Results.Rows == nil {
			rows = []byte("[]")
		}
		if !e.Success {
			t.Errorf("entry %d: success false", i)
		}
		if !jsonEqual(t, cols, []byte(want[i][0])) || !jsonEqual(t, rows, []byte(want[i][1])) {
			t.Errorf("entry %d: columns %s rows %s, want %s %s", i, cols, rows, want[i][0], want[i][1])
		}
		for _, k := range []string{"changes", "last_row_id", "changed_db", "duration", "size_after", "rows_read", "rows_written"} {
			if _, ok := e.Meta[k]; !ok {
				t.Errorf("entry %d: meta has no %q: %s", i, k, res.Body)
			}
		}
	}
}

// TestRawShapes: /raw keeps every column name, for zero-row results and
// duplicate names, in single statements and batches alike; /query collapses
// duplicates (the last one wins) and gives objects.
func TestRawShapes(t *testing.T) {
	d1test.ForEach(t, func(t *testing.T, b *d1test.Backend) {
		db := b.NewDatabase(t)
		c := db.Client(t)
		exec(t, c, d1client.Statement{SQL: "CREATE TABLE t (a INTEGER, b TEXT)"})

		t.Run("single zero rows", func(t *testing.T) {
			res := db.Post(t, "raw", `{"sql":"SELECT a, b, a AS a FROM t"}`)
			wantRawEntries(t, res, [2]string{`["a","b","a"]`, `[]`})
			// And through d1client.
			r := query(t, c, "SELECT b, a FROM t WHERE a = ?", 1)
			wantTable(t, r, `["b","a"]`, `[]`)
		})

		t.Run("single duplicates", func(t *testing.T) {
			res := db.Post(t, "raw", `{"sql":"SELECT 1 AS a, 2 AS a, ?, ?","params":["x",null]}`)
			wantRawEntries(t, res, [2]string{`["a","a","?","?"]`, `[[1,2,"x",null]]`})
		})

		t.Run("batch", func(t *testing.T) {
			res := db.Post(t, "raw", `{"batch":[
				{"sql":"INSERT INTO t (a, b) VALUES (?, ?) RETURNING *","params":[1,"x"]},
				{"sql":"SELECT 1 AS a, 2 AS a"},
				{"sql":"SELECT a, b FROM t WHERE a = 99"},
				{"sql":"UPDATE t SET b = 'y'"}]}`)
			wantRawEntries(t, res,
				[2]string{`["a","b"]`, `[[1,"x"]]`},
				[2]string{`["a","a"]`, `[[1,2]]`},
				[2]string{`["a","b"]`, `[]`},
				[2]string{`[]`, `[]`})
			// And through d1client, which always uses /raw.
			r := exec(t, c,
				d1client.Statement{SQL: "SELECT a AS x, b AS x FROM t"},
				d1client.Statement{SQL: "SELECT a, b FROM t WHERE 0"})
			wantTable(t, &r[0], `["x","x"]`, `[[1,"y"]]`)
			wantTable(t, &r[1], `["a","b"]`, `[]`)
		})

		t.Run("query objects", func(t *testing.T) {
			res := db.Post(t, "query", `{"batch":[{"sql":"SELECT 1 AS a, 2 AS a, 'z' AS b"},{"sql":"SELECT a FROM t WHERE 0"}]}`)
			if res.Status != 200 {
				t.Fatalf("HTTP %d: %s", res.Status, res.Body)
			}
			var entries []struct {
				Results json.RawMessage `json:"results"`
				Success bool            `json:"success"`
			}
			if err := json.Unmarshal(decodeEnvelope(t, res).Result, &entries); err != nil || len(entries) != 2 {
				t.Fatalf("bad /query result: %v %s", err, res.Body)
			}
			if !jsonEqual(t, entries[0].Results, []byte(`[{"a":2,"b":"z"}]`)) {
				t.Errorf("/query duplicates: %s, want [{\"a\":2,\"b\":\"z\"}]", entries[0].Results)
			}
			if !jsonEqual(t, entries[1].Results, []byte(`[]`)) {
				t.Errorf("/query zero rows: %s, want []", entries[1].Results)
			}
		})

		t.Run("error envelope", func(t *testing.T) {
			for _, ep := range []string{"raw", "query"} {
				res := db.Post(t, ep, `{"sql":"SELECT * FROM nope"}`)
				wantEnvelopeError(t, res, 400, 7500, "no such table: nope: SQLITE_ERROR")
				res = db.Post(t, ep, `{"batch":[{"sql":"SELECT 1"},{"sql":"SELEC"}]}`)
				wantEnvelopeError(t, res, 400, 7500, `near "SELEC": syntax error at offset 0: SQLITE_ERROR`)
			}
		})
	})
}

// TestMultiStatementSQL: several statements in one "sql" string without
// parameters run as one batch and give one result per statement, as the
// Cloudflare REST API does (local workerd's binding alone would return only
// the last one; the bridge splits the string to match REST).
func TestMultiStatementSQL(t *testing.T) {
	d1test.ForEach(t, func(t *testing.T, b *d1test.Backend) {
		db := b.NewDatabase(t)
		res := db.Post(t, "raw", `{"sql":"CREATE TABLE m (x INTEGER, s TEXT);\nINSERT INTO m VALUES (1, 'a;b'), (2, '--');\n-- a comment; with a semicolon\nSELECT x, s FROM m ORDER BY x; /* trailing */"}`)
		wantRawEntries(t, res,
			[2]string{`[]`, `[]`},
			[2]string{`[]`, `[]`},
			[2]string{`["x","s"]`, `[[1,"a;b"],[2,"--"]]`})

		// A trigger body's semicolons do not split the statement.
		res = db.Post(t, "raw", `{"sql":"CREATE TABLE log (v INTEGER); CREATE TRIGGER m_ins AFTER INSERT ON m BEGIN INSERT INTO log VALUES (CASE WHEN new.x > 1 THEN new.x ELSE 0 END); INSERT INTO log VALUES (-1); END; INSERT INTO m VALUES (5, 'e'); SELECT v FROM log ORDER BY v"}`)
		wantRawEntries(t, res,
			[2]string{`[]`, `[]`},
			[2]string{`[]`, `[]`},
			[2]string{`[]`, `[]`},
			[2]string{`["v"]`, `[[-1],[5]]`})

		// A failing statement rolls the whole string back.
		res = db.Post(t, "raw", `{"sql":"INSERT INTO m VALUES (9, 'z'); SELECT * FROM nope"}`)
		wantEnvelopeError(t, res, 400, 7500, "no such table: nope: SQLITE_ERROR")
		res = db.Post(t, "raw", `{"sql":"SELECT count(*) FROM m WHERE x = 9"}`)
		wantRawEntries(t, res, [2]string{`["count(*)"]`, `[[0]]`})
	})
}
