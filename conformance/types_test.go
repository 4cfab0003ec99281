package conformance

import (
	"encoding/json"
	"math"
	"strconv"
	"testing"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/internal/d1test"
)

// TestParamTyping: how d1client's parameters reach SQLite. D1's service is
// JavaScript: every JSON number binds as REAL, even 42, so typeof(?) says
// 'real' for Go ints and bools alike (d1client sends bools as 0/1). Strings
// bind as TEXT, nil as NULL.
func TestParamTyping(t *testing.T) {
	d1test.ForEach(t, func(t *testing.T, b *d1test.Backend) {
		c := b.NewClient(t)
		cases := []struct {
			name  string
			param any
			typ   string
			value string // JSON spelling of the value read back
		}{
			{"int", 42, "real", `42`},
			{"negative int", int64(-7), "real", `-7`},
			{"zero", 0, "real", `0`},
			{"string", "42", "text", `"42"`},
			{"empty string", "", "text", `""`},
			{"nil", nil, "null", `null`},
			{"float", 1.5, "real", `1.5`},
			{"integral float", 2.0, "real", `2`},
			{"bool true", true, "real", `1`},
			{"bool false", false, "real", `0`},
			{"unicode", "héllo ✓", "text", `"héllo ✓"`},
			// Above 2^53 d1client sends the decimal string, which arrives
			// exactly (as TEXT outside an INTEGER column).
			{"int64 above 2^53", int64(1<<53 + 1), "text", `"9007199254740993"`},
			// A JSON number above 2^53 is rounded to a double on the way in.
			{"json.Number above 2^53", json.Number("9007199254740993"), "real", `9007199254740992`},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				res := query(t, c, "SELECT typeof(?1), ?1", tc.param)
				wantTable(t, res, `["typeof(?1)","?1"]`, `[["`+tc.typ+`",`+tc.value+`]]`)
			})
		}
	})
}

// TestTextAffinity42: the consequence of REAL binding that bites. A Go int
// stored in a TEXT column becomes the string "42.0"; INTEGER and NUMERIC
// columns turn it back into an integer; REAL, BLOB and untyped columns keep
// a real. A string "42" follows ordinary affinity rules.
func TestTextAffinity42(t *testing.T) {
	d1test.ForEach(t, func(t *testing.T, b *d1test.Backend) {
		c := b.NewClient(t)
		exec(t, c,
			d1client.Statement{SQL: "CREATE TABLE aff (t TEXT, i INTEGER, n NUMERIC, r REAL, b BLOB, u)"},
			d1client.Statement{SQL: "INSERT INTO aff VALUES (?1, ?1, ?1, ?1, ?1, ?1)", Params: []any{42}},
			d1client.Statement{SQL: "INSERT INTO aff VALUES (?1, ?1, ?1, ?1, ?1, ?1)", Params: []any{"42"}},
			d1client.Statement{SQL: "INSERT INTO aff VALUES (?1, ?1, ?1, ?1, ?1, ?1)", Params: []any{1.5}},
		)
		res := query(t, c, "SELECT t, typeof(t), i, typeof(i), n, typeof(n), r, typeof(r), b, typeof(b), u, typeof(u) FROM aff ORDER BY rowid")
		wantTable(t, res,
			`["t","typeof(t)","i","typeof(i)","n","typeof(n)","r","typeof(r)","b","typeof(b)","u","typeof(u)"]`,
			`[["42.0","text",42,"integer",42,"integer",42,"real",42,"real",42,"real"],
			  ["42","text",42,"integer",42,"integer",42,"real","42","text","42","text"],
			  ["1.5","text",1.5,"real",1.5,"real",1.5,"real",1.5,"real",1.5,"real"]]`)

		// In comparisons the TEXT column's affinity turns the REAL 42 into
		// '42.0' as well, so an int finds the row an int stored, and the
		// string "42" finds only the row the string stored.
		res = query(t, c, "SELECT (SELECT group_concat(rowid) FROM aff WHERE t = ?1), (SELECT group_concat(rowid) FROM aff WHERE t = ?2)", 42, "42")
		wantTable(t, res, `["(SELECT group_concat(rowid) FROM aff WHERE t = ?1)","(SELECT group_concat(rowid) FROM aff WHERE t = ?2)"]`, `[["1","2"]]`)
		// CAST(? AS INTEGER) is how to get an integer from a number.
		res = query(t, c, "SELECT typeof(CAST(?1 AS INTEGER)), CAST(?1 AS INTEGER)", 42)
		wantTable(t, res, `["typeof(CAST(?1 AS INTEGER))","CAST(?1 AS INTEGER)"]`, `[["integer",42]]`)
	})
}

// TestLargeIntegers: SQLite stores 64-bit integers exactly, but D1 spells
// every result number through a JavaScript double. An int64 above 2^53 goes
// in exactly through d1client (as a string, converted by INTEGER affinity),
// and comes out exactly only as CAST(x AS TEXT); read as a number it is
// rounded. Values beyond int64's JSON range decode as Real.
func TestLargeIntegers(t *testing.T) {
	d1test.ForEach(t, func(t *testing.T, b *d1test.Backend) {
		c := b.NewClient(t)
		const big = int64(1<<53 + 1) // 9007199254740993
		exec(t, c,
			d1client.Statement{SQL: "CREATE TABLE big (id INTEGER PRIMARY KEY, x INTEGER NOT NULL)"},
			d1client.Statement{SQL: "INSERT INTO big (id, x) VALUES (1, ?), (2, ?), (3, ?)", Params: []any{big, int64(math.MaxInt64), int64(math.MinInt64)}},
		)
		res := query(t, c, "SELECT x, typeof(x), CAST(x AS TEXT) FROM big ORDER BY id")
		wantTable(t, res, `["x","typeof(x)","CAST(x AS TEXT)"]`,
			`[[9007199254740992,"integer","9007199254740993"],
			  [9223372036854776000,"integer","9223372036854775807"],
			  [-9223372036854776000,"integer","-9223372036854775808"]]`)

		// The exact text scans into an int64.
		var text string
		if err := res.Rows[0][2:].Scan(&text); err != nil {
			t.Fatal(err)
		}
		if got, err := strconv.ParseInt(text, 10, 64); err != nil || got != big {
			t.Errorf("CAST(x AS TEXT) = %q parses as %d, %v; want %d", text, got, err, big)
		}
		// The rounded number decodes as an exact Integer (its JSON text fits
		// int64) of the wrong value; the int64 extremes do not fit and decode
		// as Real.
		if v := res.Rows[0][0]; v.Type() != d1client.Integer {
			t.Errorf("x = %s decodes as %s, want integer", v, v.Type())
		} else if i, _ := v.Int64(); i != 1<<53 {
			t.Errorf("x = %d, want the rounded %d", i, int64(1<<53))
		}
		if v := res.Rows[1][0]; v.Type() != d1client.Real {
			t.Errorf("MaxInt64 decodes as %s %s, want real", v.Type(), v)
		}

		// Comparisons with the string parameter are exact in SQLite.
		if n := count(t, c, "SELECT count(*) FROM big WHERE x = ?", big); n != 1 {
			t.Errorf("x = %d matched %d rows, want 1", big, n)
		}
		if n := count(t, c, "SELECT count(*) FROM big WHERE x = ?", int64(1<<53)); n != 0 {
			t.Errorf("x = 2^53 matched %d rows, want 0", n)
		}

		// A literal in the SQL text: the same rounding on the way out.
		res = query(t, c, "SELECT 9007199254740993 AS a, typeof(9007199254740993) AS ta, CAST(9007199254740993 AS TEXT) AS a_text, 12345678901234567 AS b")
		wantTable(t, res, `["a","ta","a_text","b"]`, `[[9007199254740992,"integer","9007199254740993",12345678901234568]]`)
		if f, _ := res.Rows[0][0].Float64(); f != 9007199254740992 {
			t.Errorf("SELECT 9007199254740993 = %v, want 9007199254740992", f)
		}
	})
}

// TestFloatSpelling: results are spelled as JavaScript would: the shortest
// round-trip form, integral reals without ".0", infinity as null.
func TestFloatSpelling(t *testing.T) {
	d1test.ForEach(t, func(t *testing.T, b *d1test.Backend) {
		c := b.NewClient(t)
		res := query(t, c, "SELECT 0.1 + 0.2, 1.0, -0.0, 1e300 * 1e300, 1.5e-7, 123456789012.5")
		wantTable(t, res, `["0.1 + 0.2","1.0","-0.0","1e300 * 1e300","1.5e-7","123456789012.5"]`,
			`[[0.30000000000000004,1,0,null,1.5e-7,123456789012.5]]`)
	})
}
