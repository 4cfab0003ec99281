package conformance

import (
	"context"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/d1idem/d1idem"
	"github.com/d1idem/d1idem/internal/d1test"
	"github.com/d1idem/d1idem/schema"
)

// TestSchemaExpectedShape: the shape checked in as schema.Expected
// (generated from schema.sql on d1local) is what each backend reports for
// schema.sql's table, so schema.Verify and schema.Apply hold on both.
func TestSchemaExpectedShape(t *testing.T) {
	ctx := context.Background()
	d1test.ForEach(t, func(t *testing.T, b *d1test.Backend) {
		got, err := schema.Inspect(ctx, b.NewClientSchema(t))
		if err != nil {
			t.Fatal(err)
		}
		if want := schema.Expected(); !reflect.DeepEqual(got, want) {
			t.Fatalf("live shape differs from schema.Expected: %q\ngot  %+v\nwant %+v", schema.Diff(want, got), got, want)
		}
		c := b.NewClient(t)
		if res, err := schema.Apply(ctx, c, schema.Options{}); err != nil || res.Action != schema.CreateAndRecord {
			t.Fatalf("apply: %+v, %v", res, err)
		}
		if err := schema.Verify(ctx, c); err != nil {
			t.Fatalf("verify after apply: %v", err)
		}
	})
}

// TestSchemaPragmas: the ledger schema as SQLite reports it, identical on
// both backends.
func TestSchemaPragmas(t *testing.T) {
	d1test.ForEach(t, func(t *testing.T, b *d1test.Backend) {
		c := b.NewClientSchema(t)

		res := query(t, c, "PRAGMA table_info("+d1idem.Table+")")
		wantTable(t, res, `["cid","name","type","notnull","dflt_value","pk"]`, `[
			[0,"principal","TEXT",1,null,1],
			[1,"key","TEXT",1,null,2],
			[2,"fingerprint","TEXT",1,null,0],
			[3,"status","TEXT",1,"'pending'",0],
			[4,"generation","INTEGER",1,"1",0],
			[5,"response_status","INTEGER",0,null,0],
			[6,"response_body","TEXT",0,null,0],
			[7,"response_headers","TEXT",0,null,0],
			[8,"created_at","INTEGER",1,null,0],
			[9,"updated_at","INTEGER",1,null,0]]`)

		res = query(t, c, "PRAGMA index_list("+d1idem.Table+")")
		wantTable(t, res, `["seq","name","unique","origin","partial"]`, `[
			[0,"`+d1idem.UpdatedAtIndex+`",0,"c",0],
			[1,"sqlite_autoindex_idempotency_keys_1",1,"pk",0]]`)

		res = query(t, c, "PRAGMA index_info("+d1idem.UpdatedAtIndex+")")
		wantTable(t, res, `["seqno","cid","name"]`, `[[0,9,"updated_at"]]`)

		// Foreign keys are on by default in D1.
		res = query(t, c, "PRAGMA foreign_keys")
		wantTable(t, res, `["foreign_keys"]`, `[[1]]`)

		// The table is a rowid table (the sweep's rowid subquery needs one).
		res = query(t, c, "SELECT type, name, tbl_name FROM sqlite_master WHERE tbl_name = ? ORDER BY name", d1idem.Table)
		wantTable(t, res, `["type","name","tbl_name"]`, `[
			["table","idempotency_keys","idempotency_keys"],
			["index","idx_idempotency_keys_updated_at","idempotency_keys"],
			["index","sqlite_autoindex_idempotency_keys_1","idempotency_keys"]]`)
	})
}

// TestSweepUsesIndex: the sweep's subquery and the takeover are planned
// through the indexes on both backends. Only the lines naming the index are
// asserted: the rest of a plan (a bloom filter, say) may legitimately vary
// between SQLite versions (workerd embeds 3.47.0).
func TestSweepUsesIndex(t *testing.T) {
	d1test.ForEach(t, func(t *testing.T, b *d1test.Backend) {
		c := b.NewClientSchema(t)
		plan := func(sql string, params ...any) string {
			res := query(t, c, "EXPLAIN QUERY PLAN "+sql, params...)
			i := slices.Index(res.Columns, "detail")
			if i < 0 {
				t.Fatalf("EXPLAIN QUERY PLAN columns %v have no detail", res.Columns)
			}
			out := ""
			for _, r := range res.Rows {
				s, _ := r[i].Text()
				out += s + "\n"
			}
			return out
		}
		for _, tc := range []struct {
			name, plan string
			want       []string
		}{
			{"sweep", plan(sqlSweep, 1, 2), []string{
				"SEARCH idempotency_keys USING INTEGER PRIMARY KEY (rowid=?)\n",
				"SEARCH idempotency_keys USING COVERING INDEX idx_idempotency_keys_updated_at (updated_at<?)\n",
			}},
			{"takeover", plan(sqlTakeover, 2, "p", "k", 1), []string{
				"SEARCH idempotency_keys USING INDEX sqlite_autoindex_idempotency_keys_1 (principal=? AND key=?)\n",
			}},
			{"lookup", plan(sqlLookup, "p", "k"), []string{
				"SEARCH idempotency_keys USING INDEX sqlite_autoindex_idempotency_keys_1 (principal=? AND key=?)\n",
			}},
		} {
			for _, line := range tc.want {
				if !strings.Contains(tc.plan, line) {
					t.Errorf("%s plan lacks %q:\n%s", tc.name, line, tc.plan)
				}
			}
		}
	})
}
