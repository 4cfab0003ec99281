package d1local

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
)

// dumpOptions are an export's dump_options.
type dumpOptions struct {
	NoData   bool     `json:"no_data"`
	NoSchema bool     `json:"no_schema"`
	Tables   []string `json:"tables"`
}

// exportError is an export D1 refuses, such as one of a database with
// virtual tables.
type exportError struct{ msg string }

func (e *exportError) Error() string { return e.msg }

// quotedCreateTable matches the tables whose CREATE TABLE D1's dump turns
// into CREATE TABLE IF NOT EXISTS (those created with a quoted name).
var quotedCreateTable = regexp.MustCompile(`CREATE TABLE ['"]`)

// dump returns the database as SQL, as D1's export writes it (the dumpSql
// that Miniflare copied from D1): PRAGMA defer_foreign_keys=TRUE, then each
// table's CREATE TABLE and its rows as INSERT INTO "t" VALUES(...), then
// the indexes, triggers and views. _cf_ and sqlite_ tables are left out;
// virtual tables make the export fail. Unlike D1's, the values are exact:
// integers beyond 2^53 are not rounded, and REALs stay REAL.
func (d *database) dump(ctx context.Context, o dumpOptions) (string, error) {
	var b strings.Builder
	b.WriteString("PRAGMA defer_foreign_keys=TRUE;\n")
	only := make(map[string]bool, len(o.Tables))
	for _, t := range o.Tables {
		only[t] = true
	}
	keep := func(name string) bool { return len(only) == 0 || only[name] }
	err := d.withConn(ctx, func(c *conn) error {
		if err := c.exec("BEGIN"); err != nil {
			return err
		}
		// A read transaction: nothing to keep.
		defer func() { _ = c.exec("ROLLBACK") }()
		type table struct{ name, sql string }
		var tables []table
		err := c.each("SELECT name, sql FROM sqlite_schema WHERE type = 'table' AND sql NOT NULL "+
			"ORDER BY tbl_name = 'sqlite_sequence', rowid", func(row []any) error {
			tables = append(tables, table{name: row[0].(string), sql: row[1].(string)})
			return nil
		})
		if err != nil {
			return err
		}
		for _, t := range tables {
			if !keep(t.name) {
				continue
			}
			switch {
			case t.name == "sqlite_sequence":
				if !o.NoSchema {
					b.WriteString("DELETE FROM sqlite_sequence;\n")
				}
			case len(t.name) > len("sqlite_stat") && strings.HasPrefix(t.name, "sqlite_stat"):
				if !o.NoSchema {
					b.WriteString("ANALYZE sqlite_schema;\n")
				}
			default:
				if strings.HasPrefix(t.sql, "CREATE VIRTUAL TABLE") {
					return &exportError{"D1 Export error: cannot export databases with Virtual Tables (fts5)"}
				}
				if strings.HasPrefix(t.name, "_cf_") || strings.HasPrefix(t.name, "sqlite_") {
					continue
				}
				if !o.NoSchema {
					if quotedCreateTable.MatchString(t.sql) {
						b.WriteString("CREATE TABLE IF NOT EXISTS " + t.sql[len("CREATE TABLE "):] + ";\n")
					} else {
						b.WriteString(t.sql + ";\n")
					}
				}
			}
			if o.NoData {
				continue
			}
			if err := dumpRows(c, &b, t.name); err != nil {
				return err
			}
		}
		if o.NoSchema {
			return nil
		}
		return c.each("SELECT name, sql FROM sqlite_schema WHERE sql NOT NULL AND type IN ('index', 'trigger', 'view') "+
			"ORDER BY type COLLATE NOCASE", func(row []any) error {
			if keep(row[0].(string)) {
				b.WriteString(row[1].(string) + ";\n")
			}
			return nil
		})
	})
	if err != nil {
		return "", err
	}
	return b.String(), nil
}

// dumpRows writes a table's rows as INSERT statements.
func dumpRows(c *conn, b *strings.Builder, table string) error {
	var cols []string
	if err := c.each("PRAGMA table_info="+quoteID(table), func(row []any) error {
		cols = append(cols, quoteID(row[1].(string)))
		return nil
	}); err != nil {
		return err
	}
	if len(cols) == 0 {
		return nil
	}
	prefix := "INSERT INTO " + quoteID(table) + " VALUES("
	return c.each("SELECT "+strings.Join(cols, ", ")+" FROM "+quoteID(table), func(row []any) error {
		b.WriteString(prefix)
		for i, v := range row {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(sqlLiteral(v))
		}
		b.WriteString(");\n")
		return nil
	})
}

// quoteID quotes an SQL identifier.
func quoteID(id string) string {
	return `"` + strings.ReplaceAll(id, `"`, `""`) + `"`
}

// sqlLiteral writes a value as the SQL literal that reads back as the same
// value and storage class.
func sqlLiteral(v any) string {
	switch v := v.(type) {
	case nil:
		return "NULL"
	case int64:
		return strconv.FormatInt(v, 10)
	case float64:
		switch {
		case math.IsInf(v, 1):
			return "9e999"
		case math.IsInf(v, -1):
			return "-9e999"
		}
		s := strconv.FormatFloat(v, 'g', -1, 64)
		if !strings.ContainsAny(s, ".en") {
			s += ".0"
		}
		return s
	case string:
		return quoteText(v)
	case []byte:
		return "X'" + hex.EncodeToString(v) + "'"
	}
	panic(fmt.Sprintf("d1local: dump of a %T", v))
}

// quoteText quotes a string as D1's dump does: a quote doubled, and line
// breaks written as \n and \r inside replace(..., '\n', char(10)). Where
// that would be inexact (the text also holds a literal \n or \r), the line
// breaks are concatenated as char(10) and char(13) instead.
func quoteText(s string) string {
	lf, cr := strings.Contains(s, "\n"), strings.Contains(s, "\r")
	if (lf && strings.Contains(s, `\n`)) || (cr && strings.Contains(s, `\r`)) {
		var parts []string
		for {
			i := strings.IndexAny(s, "\r\n")
			if i < 0 {
				break
			}
			if i > 0 {
				parts = append(parts, "'"+strings.ReplaceAll(s[:i], "'", "''")+"'")
			}
			parts = append(parts, "char("+strconv.Itoa(int(s[i]))+")")
			s = s[i+1:]
		}
		if s != "" {
			parts = append(parts, "'"+strings.ReplaceAll(s, "'", "''")+"'")
		}
		return strings.Join(parts, "||")
	}
	out := "'" + strings.NewReplacer("'", "''", "\n", `\n`, "\r", `\r`).Replace(s) + "'"
	if cr {
		out = `replace(` + out + `,'\r',char(13))`
	}
	if lf {
		out = `replace(` + out + `,'\n',char(10))`
	}
	return out
}

// each runs a statement of the server's own and calls fn with each row.
func (c *conn) each(sql string, fn func(row []any) error) error {
	s, _, err := c.prepare(sql)
	if err != nil {
		return err
	}
	if s == nil {
		return errors.New("d1local: no statement in " + strconv.Quote(sql))
	}
	defer s.finalize()
	n := len(s.columns())
	for {
		more, err := s.step()
		if err != nil || !more {
			return err
		}
		if err := fn(s.row(n)); err != nil {
			return err
		}
	}
}
