package schema

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/d1idem/d1idem"
	"github.com/d1idem/d1idem/d1client"
)

// Column is one row of PRAGMA table_info.
type Column struct {
	Name    string
	Type    string
	NotNull bool
	Default string // dflt_value as SQL text; "" when there is none
	PK      int64  // position in the primary key, 0 when not part of it
}

// String formats the column as Diff's lines show it.
func (c Column) String() string {
	s := fmt.Sprintf("column %s %s", c.Name, c.Type)
	if c.NotNull {
		s += " NOT NULL"
	}
	if c.Default != "" {
		s += " DEFAULT " + c.Default
	}
	if c.PK > 0 {
		s += fmt.Sprintf(" (primary key #%d)", c.PK)
	}
	return s
}

// Index is one row of PRAGMA index_list, with its columns from index_info.
type Index struct {
	Name    string
	Unique  bool
	Origin  string // "c" (CREATE INDEX), "pk" or "u"
	Partial bool
	Columns []string
}

// String formats the index as Diff's lines show it. Automatic indexes
// (of a primary key or a UNIQUE constraint) are named by their origin,
// since SQLite names them.
func (i Index) String() string {
	kind := "index"
	if i.Unique {
		kind = "unique index"
	}
	name := i.Name
	if i.Origin != "c" {
		name = "(" + i.Origin + ")" // automatic indexes are named by SQLite; compare them by origin
	}
	s := fmt.Sprintf("%s %s on (%s)", kind, name, strings.Join(i.Columns, ", "))
	if i.Partial {
		s += " WHERE ..."
	}
	return s
}

// Shape is a table's columns and indexes, as PRAGMAs report them.
type Shape struct {
	Exists  bool
	Columns []Column
	Indexes []Index
}

// Inspect reads the ledger table's shape with PRAGMA table_info, index_list
// and index_info (all on D1's PRAGMA allowlist): two D1 calls.
func Inspect(ctx context.Context, db *d1client.Client) (Shape, error) {
	res, err := db.Exec(ctx, []d1client.Statement{
		{SQL: "PRAGMA table_info(" + d1idem.Table + ")"},
		{SQL: "PRAGMA index_list(" + d1idem.Table + ")"},
	})
	if err != nil {
		return Shape{}, fmt.Errorf("schema: inspecting %s: %w", d1idem.Table, err)
	}
	var sh Shape
	ti, il := res[0], res[1]
	for i := range ti.Rows {
		m := ti.Map(i)
		c := Column{Name: text(m["name"]), Type: strings.ToUpper(text(m["type"])), Default: text(m["dflt_value"])}
		c.NotNull = integer(m["notnull"]) == 1
		c.PK = integer(m["pk"])
		sh.Columns = append(sh.Columns, c)
	}
	sh.Exists = len(sh.Columns) > 0
	var infos []d1client.Statement
	for i := range il.Rows {
		m := il.Map(i)
		ix := Index{Name: text(m["name"]), Unique: integer(m["unique"]) == 1, Origin: text(m["origin"]), Partial: integer(m["partial"]) == 1}
		sh.Indexes = append(sh.Indexes, ix)
		infos = append(infos, d1client.Statement{SQL: `PRAGMA index_info("` + strings.ReplaceAll(ix.Name, `"`, `""`) + `")`})
	}
	if len(infos) > 0 {
		res, err := db.Exec(ctx, infos)
		if err != nil {
			return Shape{}, fmt.Errorf("schema: inspecting the indexes of %s: %w", d1idem.Table, err)
		}
		for i, r := range res {
			rows := make([]struct {
				seq  int64
				name string
			}, len(r.Rows))
			for j := range r.Rows {
				m := r.Map(j)
				rows[j].seq, rows[j].name = integer(m["seqno"]), text(m["name"])
			}
			sort.Slice(rows, func(a, b int) bool { return rows[a].seq < rows[b].seq })
			for _, row := range rows {
				sh.Indexes[i].Columns = append(sh.Indexes[i].Columns, row.name)
			}
		}
	}
	sort.Slice(sh.Indexes, func(a, b int) bool { return sh.Indexes[a].String() < sh.Indexes[b].String() })
	return sh, nil
}

func text(v d1client.Value) string {
	if v.IsNull() {
		return ""
	}
	if s, ok := v.Text(); ok {
		return s
	}
	return v.String()
}

func integer(v d1client.Value) int64 {
	i, _ := v.Int64()
	return i
}

// Diff lists the differences between the shape schema.sql gives (want) and
// a live one (got), one per line: "- " for what is expected but missing or
// different, "+ " for what the live table has instead. No lines means no
// drift.
func Diff(want, got Shape) []string {
	if !got.Exists {
		return []string{"- table " + d1idem.Table + " (missing)"}
	}
	var out []string
	wantCols := map[string]Column{}
	for _, c := range want.Columns {
		wantCols[c.Name] = c
	}
	gotCols := map[string]Column{}
	for _, c := range got.Columns {
		gotCols[c.Name] = c
	}
	for _, w := range want.Columns {
		g, ok := gotCols[w.Name]
		switch {
		case !ok:
			out = append(out, "- "+w.String())
		case g != w:
			out = append(out, "- "+w.String(), "+ "+g.String())
		}
	}
	for _, g := range got.Columns {
		if _, ok := wantCols[g.Name]; !ok {
			out = append(out, "+ "+g.String())
		}
	}
	wantIx, gotIx := indexSet(want.Indexes), indexSet(got.Indexes)
	for _, w := range want.Indexes {
		if !gotIx[w.String()] {
			out = append(out, "- "+w.String())
		}
	}
	for _, g := range got.Indexes {
		if !wantIx[g.String()] {
			out = append(out, "+ "+g.String())
		}
	}
	return out
}

func indexSet(ix []Index) map[string]bool {
	m := map[string]bool{}
	for _, i := range ix {
		m[i.String()] = true
	}
	return m
}

// Expected returns the shape schema.sql gives the ledger table, as SQLite
// reports it: what Verify and Apply compare a live table with. It is
// generated from schema.sql by go generate and needs no database.
func Expected() Shape { return expected() }

// ErrDrift is matched (with errors.Is) by every *DriftError.
var ErrDrift = errors.New("schema: the ledger table differs from schema.sql")

// DriftError reports how a live ledger table differs from schema.sql.
type DriftError struct {
	// Missing is true when the table does not exist.
	Missing bool
	// Diff lists the differences as Diff returns them.
	Diff []string
	// Recorded, in an error of Apply, reports that the schema's migration
	// is recorded already: the table changed after it was applied. When
	// false, Apply did not record it.
	Recorded bool
}

// Error lists the differences on one line.
func (e *DriftError) Error() string {
	if e.Missing {
		return "schema: table " + d1idem.Table + " does not exist"
	}
	return fmt.Sprintf("schema: %s differs from schema.sql (- schema.sql, + live table): %s", d1idem.Table, strings.Join(e.Diff, "; "))
}

// Is reports whether target is ErrDrift.
func (e *DriftError) Is(target error) bool { return target == ErrDrift }

// Verify compares the live ledger table and its indexes (read with Inspect,
// two D1 calls) with Expected. It returns nil when they match, a
// *DriftError when they differ or the table is missing, and another error
// when the database cannot be read.
func Verify(ctx context.Context, db *d1client.Client) error {
	got, err := Inspect(ctx, db)
	if err != nil {
		return err
	}
	return check(got)
}

// check returns a *DriftError when got differs from Expected.
func check(got Shape) error {
	if d := Diff(Expected(), got); len(d) > 0 {
		return &DriftError{Missing: !got.Exists, Diff: d}
	}
	return nil
}
