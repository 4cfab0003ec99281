package d1client

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/d1idem/d1idem/internal/sqlite"
)

// sqlClass is what the client needs to know about an SQL text.
type sqlClass struct {
	statements int  // SQL statements, not counting empty ones and comments
	readOnly   bool // one statement, proven not to write
}

// check refuses SQL holding no statement or several (D1 would refuse its
// parameters, or answer with more results than Statements).
func (c sqlClass) check(index int) error {
	switch {
	case c.statements == 0:
		return fmt.Errorf("statement %d holds no SQL statement, only comments", index)
	case c.statements > 1:
		return fmt.Errorf("statement %d holds %d SQL statements; pass each as its own Statement (the Statements of one Exec run as one transaction)", index, c.statements)
	}
	return nil
}

// classifySQL splits sql into statements as SQLite does and classifies it.
func classifySQL(sql string) sqlClass {
	stmts := sqlite.Split(sql)
	c := sqlClass{statements: len(stmts)}
	// SQLite stops at a NUL byte, JSON replaces bytes that are not UTF-8.
	if len(stmts) != 1 || strings.IndexByte(sql, 0) >= 0 || !utf8.ValidString(sql) {
		return c
	}
	var toks []sqlite.Token
	for t := range sqlite.Tokens(stmts[0].SQL) {
		if t.Kind == sqlite.Illegal {
			return c
		}
		toks = append(toks, t)
	}
	c.readOnly = readsOnly(toks)
	return c
}

// readsOnly reports whether a statement's tokens, not empty, cannot write:
// a SELECT, VALUES, EXPLAIN (which never runs its statement), a WITH whose
// main verb (no CTE can write) is SELECT or VALUES, or a reading PRAGMA.
func readsOnly(toks []sqlite.Token) bool {
	switch toks[0].Keyword() {
	case "SELECT", "VALUES", "EXPLAIN":
		return true
	case "WITH":
		// The main verb is the first outside the CTEs' parentheses.
		depth := 0
		for _, t := range toks[1:] {
			switch t.Kind {
			case sqlite.LParen:
				depth++
			case sqlite.RParen:
				depth--
			case sqlite.Word:
				if depth != 0 {
					continue
				}
				switch t.Keyword() {
				case "SELECT", "VALUES":
					return true
				case "INSERT", "UPDATE", "DELETE", "REPLACE":
					return false
				}
			}
		}
		return false
	case "PRAGMA":
		return pragmaReadsOnly(toks[1:])
	}
	return false
}

// pragmaReadsOnly reports whether "PRAGMA [schema.]name [(arg)]" is one
// of readPragma's and assigns nothing.
func pragmaReadsOnly(toks []sqlite.Token) bool {
	if len(toks) >= 3 && toks[0].Kind == sqlite.Word && toks[1].Text == "." {
		toks = toks[2:] // schema.name
	}
	if len(toks) == 0 || toks[0].Kind != sqlite.Word {
		return false
	}
	name, args := strings.ToLower(toks[0].Text), toks[1:]
	switch {
	case len(args) == 0:
		return readPragma(name, false)
	case args[0].Kind == sqlite.LParen && args[len(args)-1].Kind == sqlite.RParen:
		inner := args[1 : len(args)-1]
		if len(inner) == 2 && (inner[0].Text == "-" || inner[0].Text == "+") {
			inner = inner[1:]
		}
		return len(inner) == 1 && inner[0].Kind != sqlite.LParen && inner[0].Kind != sqlite.RParen && readPragma(name, true)
	}
	return false // "PRAGMA name = value" assigns
}

// readPragma reports whether the pragma, with or without an argument, only
// reads; it knows only those D1 allows.
func readPragma(name string, withArg bool) bool {
	switch name {
	case "table_info", "table_xinfo", "index_info", "index_xinfo", "index_list", "foreign_key_list":
		return withArg
	case "table_list", "foreign_key_check", "quick_check":
		return true
	case "data_version", "page_size", "foreign_keys", "defer_foreign_keys", "case_sensitive_like",
		"ignore_check_constraints", "legacy_alter_table", "recursive_triggers", "reverse_unordered_selects":
		return !withArg
	}
	return false
}

// Bounds of a client's cache of classifications.
const (
	classCacheEntries = 512  // texts remembered
	classCacheMaxSQL  = 4096 // longer texts are classified every time
)
