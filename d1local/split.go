package d1local

import (
	"strings"

	"github.com/d1idem/d1idem/internal/sqlite"
)

// piece is one statement of a multi-statement SQL string.
type piece struct {
	sql     string // the statement, trimmed, without its terminating ';'
	keyword string // its first keyword, upper-cased ("SELECT", "CREATE", ...)
}

// splitSQL splits sql into statements the way SQLite's own tokenizer
// delimits them (sqlite.Split). Pieces holding only whitespace and comments
// are dropped. A trailing statement without ';' is kept even when
// incomplete (SQLite reports the error when it is compiled).
//
// emptyTail reports what workerd refuses with "SQL code did not contain a
// statement." when it gets the SQL as it is: after the ';' that ends the
// last statement, something other than whitespace (a comment, another ';')
// but no statement. workerd compiles one statement at a time, skips the
// whitespace after it and compiles the rest; only a rest with no statement
// in it fails. So "SELECT 1;;", "SELECT 1; -- note" and "SELECT 1; /* */"
// fail, while ";SELECT 1", "SELECT 1;;SELECT 2", "SELECT 1 -- note" and
// "SELECT 1;\n" do not.
func splitSQL(sql string) (pieces []piece, emptyTail bool) {
	stmts := sqlite.Split(sql)
	if len(stmts) == 0 {
		return nil, false
	}
	pieces = make([]piece, len(stmts))
	for i, s := range stmts {
		pieces[i].sql = s.SQL
		for t := range sqlite.Tokens(s.SQL) {
			pieces[i].keyword = t.Keyword()
			break
		}
	}
	return pieces, strings.TrimLeft(sql[stmts[len(stmts)-1].End:], " \t\n\v\f\r") != ""
}

// renamesToReserved reports whether sql, an ALTER TABLE statement, renames
// a table to a name starting with "_cf_" (quoted or not): RENAME TO
// _cf_..., with any whitespace and comments between the words. SQLite's
// authorizer sees only the old name of a renamed table. Words inside
// strings and quoted identifiers do not count.
func renamesToReserved(sql string) bool {
	var last [2]string // the two tokens before: keywords, or ""
	for t := range sqlite.Tokens(sql) {
		if last == [2]string{"RENAME", "TO"} && strings.HasPrefix(t.Unquoted(), "_cf_") {
			return true
		}
		last = [2]string{last[1], t.Keyword()}
	}
	return false
}
