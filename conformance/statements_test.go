package conformance

import (
	"encoding/json"
	"testing"

	"github.com/d1idem/d1idem/internal/d1test"
)

// TestEmptyStatements: workerd compiles one statement at a time, skips the
// whitespace after it and compiles the rest, and a rest that holds no
// statement (a second ';', a comment, a byte order mark) fails the call with
// "SQL code did not contain a statement." and rolls it back. Empty
// statements before a statement, whitespace after the last, and a comment
// left open at the end are fine.
//
// Each SQL string here holds one statement, so the workerd shim passes it to
// the binding unsplit (see worker.js on several statements in one "sql").
func TestEmptyStatements(t *testing.T) {
	d1test.ForEach(t, func(t *testing.T, b *d1test.Backend) {
		db := b.NewDatabase(t)
		wantRawEntries(t, db.Post(t, "raw", `{"sql":"CREATE TABLE t (x INTEGER)"}`), [2]string{`[]`, `[]`})

		for _, sql := range []string{
			"SELECT 1;;",
			"SELECT 1; ;",
			"SELECT 1; -- a note",
			"SELECT 1;\n-- a note\n",
			"SELECT 1; /* a note */",
			"INSERT INTO t VALUES (1);;",
			"SELECT 1;\ufeff",
		} {
			for _, body := range []map[string]any{
				{"sql": sql},
				{"batch": []any{map[string]any{"sql": "INSERT INTO t VALUES (2)"}, map[string]any{"sql": sql}}},
			} {
				res := db.Post(t, "raw", body)
				wantEnvelopeError(t, res, 400, 7500, "SQL code did not contain a statement.")
			}
		}
		// Nothing of the failed calls stayed.
		wantRawEntries(t, db.Post(t, "raw", `{"sql":"SELECT count(*) AS n FROM t"}`), [2]string{`["n"]`, `[[0]]`})

		for _, sql := range []string{
			"SELECT 1 AS one;",
			"SELECT 1 AS one;\r\n\t ",
			";; SELECT 1 AS one",
			"/* a note */; SELECT 1 AS one",
			"SELECT 1 AS one -- a note",
			"SELECT 1 AS one /* a note */;",
			"SELECT 1 AS one /* ",
			"\ufeffSELECT 1 AS one",
		} {
			body, _ := json.Marshal(map[string]any{"sql": sql})
			wantRawEntries(t, db.Post(t, "raw", body), [2]string{`["one"]`, `[[1]]`})
		}
	})
}

// TestReservedNames: the D1 authorizer reserves names starting with "_cf_"
// in lower case only; "_CF_y" and "_Cf_w" are ordinary names. Tables can be
// renamed (SQLite reads and rewrites the temp schema table to do it, which
// the authorizer allows), but no TEMP object can be created.
func TestReservedNames(t *testing.T) {
	d1test.ForEach(t, func(t *testing.T, b *d1test.Backend) {
		db := b.NewDatabase(t)
		for _, sql := range []string{"CREATE TABLE _cf_x (a)", `CREATE TABLE "_cf_x" (a)`, "CREATE VIEW _cf_v AS SELECT 1"} {
			body, _ := json.Marshal(map[string]any{"sql": sql})
			wantEnvelopeError(t, db.Post(t, "raw", body), 400, 7500, "not authorized: SQLITE_AUTH")
		}
		for _, sql := range []string{
			`CREATE TABLE "_CF_y" (a)`,
			"CREATE TABLE _Cf_w (a)",
			"CREATE INDEX _CF_i ON _CF_y (a)",
			"INSERT INTO _CF_y VALUES (1)",
			"ALTER TABLE _Cf_w RENAME TO renamed",
			"ALTER TABLE renamed RENAME COLUMN a TO b",
		} {
			body, _ := json.Marshal(map[string]any{"sql": sql})
			wantRawEntries(t, db.Post(t, "raw", body), [2]string{`[]`, `[]`})
		}
		wantRawEntries(t, db.Post(t, "raw", `{"sql":"SELECT a FROM _CF_y"}`), [2]string{`["a"]`, `[[1]]`})
		wantRawEntries(t, db.Post(t, "raw", `{"sql":"SELECT name FROM pragma_table_info('renamed')"}`), [2]string{`["name"]`, `[["b"]]`})
		wantRawEntries(t, db.Post(t, "raw", `{"sql":"SELECT count(*) AS n FROM temp.sqlite_master"}`), [2]string{`["n"]`, `[[0]]`})
		wantEnvelopeError(t, db.Post(t, "raw", `{"sql":"CREATE TEMP TABLE tt (a)"}`), 400, 7500, "not authorized: SQLITE_AUTH")
	})
}
