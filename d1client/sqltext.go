package d1client

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// sqlClass is what the client needs to know about one SQL text before
// sending it.
type sqlClass struct {
	// statements is the number of SQL statements in the text. Empty
	// statements (";;") and comments do not count.
	statements int
	// readOnly is true only when the text is proven not to write: one
	// statement that is a SELECT, a VALUES, a WITH whose main statement is a
	// SELECT or VALUES, an EXPLAIN, or a PRAGMA that only reads.
	readOnly bool
}

// check refuses SQL that holds no statement or several: D1 refuses
// parameters with several statements, and its answer would not have one
// result per Statement.
func (c sqlClass) check(index int) error {
	switch {
	case c.statements == 0:
		return fmt.Errorf("statement %d holds no SQL statement, only comments", index)
	case c.statements > 1:
		return fmt.Errorf("statement %d holds %d SQL statements; pass each as its own Statement (the Statements of one Exec run as one transaction)", index, c.statements)
	}
	return nil
}

// classifySQL tokenizes sql as SQLite does and classifies it. Anything it
// cannot prove read-only counts as a write.
func classifySQL(sql string) sqlClass {
	var (
		stmts [][]sqlToken // the statements' significant tokens
		cur   []sqlToken
		state = splitStart
		// SQLite stops reading at a NUL byte, and JSON replaces bytes that
		// are not UTF-8: D1 would not see this text.
		suspect = strings.IndexByte(sql, 0) >= 0 || !utf8.ValidString(sql)
	)
	for rest := sql; rest != ""; {
		n, kind := nextSQLToken(rest)
		tok := sqlToken{kind: kind, text: rest[:n]}
		rest = rest[n:]
		if kind == tokSpace {
			continue
		}
		if kind == tokIllegal {
			suspect = true
		}
		var end bool
		state, end = state.next(tok)
		if end {
			if len(cur) > 0 {
				stmts = append(stmts, cur)
			}
			cur = nil
			continue
		}
		cur = append(cur, tok)
	}
	if len(cur) > 0 {
		stmts = append(stmts, cur)
	}
	c := sqlClass{statements: len(stmts)}
	c.readOnly = len(stmts) == 1 && !suspect && readsOnly(stmts[0])
	return c
}

// readsOnly reports whether one statement's tokens make a statement that
// cannot write. SQLite's grammar has no data-changing statement inside a
// SELECT or a common table expression, so the statement's main verb
// decides.
func readsOnly(toks []sqlToken) bool {
	for len(toks) > 0 && toks[len(toks)-1].kind == tokSemi {
		toks = toks[:len(toks)-1] // a trigger body's own ";" never gets here
	}
	if len(toks) == 0 {
		return false
	}
	switch toks[0].keyword() {
	case "SELECT", "VALUES":
		return true
	case "EXPLAIN":
		// EXPLAIN compiles its statement but never runs it.
		return true
	case "WITH":
		// The main statement's verb is the first one outside the
		// parentheses of the common table expressions.
		depth := 0
		for _, t := range toks[1:] {
			switch t.kind {
			case tokLParen:
				depth++
			case tokRParen:
				depth--
			case tokWord:
				if depth != 0 {
					continue
				}
				switch t.keyword() {
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

// pragmaReadsOnly reports whether "PRAGMA [schema.]name [(arg)]" only
// reads: its name is one of readPragma's and it assigns nothing.
func pragmaReadsOnly(toks []sqlToken) bool {
	if len(toks) >= 3 && toks[0].kind == tokWord && toks[1].text == "." {
		toks = toks[2:] // schema.name
	}
	if len(toks) == 0 || toks[0].kind != tokWord {
		return false
	}
	name, args := strings.ToLower(toks[0].text), toks[1:]
	switch {
	case len(args) == 0:
		return readPragma(name, false)
	case args[0].kind == tokLParen && args[len(args)-1].kind == tokRParen:
		inner := args[1 : len(args)-1]
		if len(inner) == 2 && (inner[0].text == "-" || inner[0].text == "+") {
			inner = inner[1:]
		}
		return len(inner) == 1 && inner[0].kind != tokLParen && inner[0].kind != tokRParen && readPragma(name, true)
	}
	return false // "PRAGMA name = value" assigns
}

// readPragma reports whether the pragma only reads, called with or without
// an argument. It lists the pragmas D1 allows that read, and no others.
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

// splitState tracks statement boundaries the way SQLite's sqlite3_complete
// does: a ";" ends a statement, except inside the BEGIN ... END body of a
// CREATE TRIGGER, which ends at "; END ;".
type splitState uint8

const (
	splitStart   splitState = iota // at the start of a statement
	splitNormal                    // inside an ordinary statement
	splitExplain                   // after EXPLAIN at the start
	splitCreate                    // after CREATE [TEMP] at the start
	splitTrigger                   // inside CREATE TRIGGER
	splitSemi                      // after a ";" inside CREATE TRIGGER
	splitEnd                       // after "; END" inside CREATE TRIGGER
)

// next returns the state after tok, and whether tok ends a statement.
func (s splitState) next(tok sqlToken) (splitState, bool) {
	if tok.kind == tokSemi {
		switch s {
		case splitTrigger, splitSemi:
			return splitSemi, false
		}
		return splitStart, true
	}
	kw := ""
	if tok.kind == tokWord {
		kw = tok.keyword()
	}
	switch s {
	case splitStart, splitExplain:
		switch kw {
		case "CREATE":
			return splitCreate, false
		case "EXPLAIN":
			if s == splitStart {
				return splitExplain, false
			}
		case "TEMP", "TEMPORARY", "TRIGGER", "END":
		default:
			if s == splitExplain {
				return splitExplain, false
			}
		}
		return splitNormal, false
	case splitCreate:
		switch kw {
		case "TEMP", "TEMPORARY":
			return splitCreate, false
		case "TRIGGER":
			return splitTrigger, false
		}
		return splitNormal, false
	case splitTrigger:
		return splitTrigger, false
	case splitSemi:
		if kw == "END" {
			return splitEnd, false
		}
		return splitTrigger, false
	case splitEnd:
		return splitTrigger, false
	}
	return splitNormal, false
}

// sqlToken is one token of SQL text.
type sqlToken struct {
	kind tokenKind
	text string
}

// keyword returns a bare word's text in upper case.
func (t sqlToken) keyword() string {
	if t.kind != tokWord {
		return ""
	}
	return strings.ToUpper(t.text)
}

type tokenKind uint8

const (
	tokSpace    tokenKind = iota // whitespace and comments
	tokWord                      // a keyword or a bare identifier
	tokQuoted                    // a string, a blob, or a quoted identifier
	tokVariable                  // ?NNN, :name, @name, $name
	tokSemi                      // ;
	tokLParen                    // (
	tokRParen                    // )
	tokOther                     // a number or an operator
	tokIllegal                   // anything SQLite refuses
)

// nextSQLToken returns the length and kind of the token at the start of s,
// which is not empty. It follows SQLite's tokenizer (sqlite3GetToken in
// tokenize.c) in every way that decides where strings, identifiers,
// comments and statements begin and end.
func nextSQLToken(s string) (int, tokenKind) {
	at := func(i int) byte { // s[i], or 0 past the end, as in C
		if i < len(s) {
			return s[i]
		}
		return 0
	}
	c := s[0]
	switch {
	case c == ' ' || c == '\t' || c == '\n' || c == '\f' || c == '\r':
		i := 1
		for isSQLSpace(at(i)) {
			i++
		}
		return i, tokSpace
	case c == '-':
		switch at(1) {
		case '-':
			i := 2
			for i < len(s) && s[i] != '\n' {
				i++
			}
			return i, tokSpace
		case '>':
			if at(2) == '>' {
				return 3, tokOther
			}
			return 2, tokOther
		}
		return 1, tokOther
	case c == '(':
		return 1, tokLParen
	case c == ')':
		return 1, tokRParen
	case c == ';':
		return 1, tokSemi
	case c == '/':
		if at(1) != '*' || at(2) == 0 {
			return 1, tokOther
		}
		i, prev := 3, s[2]
		for i < len(s) && !(prev == '*' && s[i] == '/') {
			prev = s[i]
			i++
		}
		if i < len(s) {
			i++ // the closing '/'
		}
		return i, tokSpace
	case c == '=':
		if at(1) == '=' {
			return 2, tokOther
		}
		return 1, tokOther
	case c == '<':
		switch at(1) {
		case '=', '>', '<':
			return 2, tokOther
		}
		return 1, tokOther
	case c == '>':
		switch at(1) {
		case '=', '>':
			return 2, tokOther
		}
		return 1, tokOther
	case c == '!':
		if at(1) == '=' {
			return 2, tokOther
		}
		return 1, tokIllegal
	case c == '|':
		if at(1) == '|' {
			return 2, tokOther
		}
		return 1, tokOther
	case c == '%' || c == ',' || c == '&' || c == '~' || c == '+' || c == '*':
		return 1, tokOther
	case c == '\'' || c == '"' || c == '`':
		for i := 1; i < len(s); i++ {
			if s[i] == c {
				if at(i+1) == c {
					i++ // a doubled delimiter stands for itself
					continue
				}
				return i + 1, tokQuoted
			}
		}
		return len(s), tokIllegal
	case c == '[':
		if i := strings.IndexByte(s, ']'); i > 0 {
			return i + 1, tokQuoted
		}
		return len(s), tokIllegal
	case c == '.' && !isSQLDigit(at(1)):
		return 1, tokOther
	case c == '.' || isSQLDigit(c):
		return sqlNumber(s)
	case c == '?':
		i := 1
		for isSQLDigit(at(i)) {
			i++
		}
		return i, tokVariable
	case c == '$' || c == '@' || c == ':' || c == '#':
		return sqlVariable(s)
	case (c == 'x' || c == 'X') && at(1) == '\'':
		i := 2
		for isSQLHexDigit(at(i)) {
			i++
		}
		kind := tokQuoted
		if at(i) != '\'' || i%2 != 0 {
			kind = tokIllegal
			for i < len(s) && s[i] != '\'' {
				i++
			}
		}
		if i < len(s) {
			i++
		}
		return i, kind
	case c == 0xEF && at(1) == 0xBB && at(2) == 0xBF:
		return 3, tokSpace // a byte order mark
	case isSQLIDChar(c) && c != '$' && !isSQLDigit(c):
		i := 1
		for isSQLIDChar(at(i)) {
			i++
		}
		return i, tokWord
	}
	return 1, tokIllegal
}

// sqlNumber scans a numeric literal: decimal, with an optional fraction
// and exponent, or hexadecimal. Identifier characters run on into one
// illegal token ("1abc").
func sqlNumber(s string) (int, tokenKind) {
	at := func(i int) byte {
		if i < len(s) {
			return s[i]
		}
		return 0
	}
	digits := func(i int, ok func(byte) bool) int {
		for ok(at(i)) || at(i) == '_' {
			i++
		}
		return i
	}
	var i int
	if s[0] == '0' && (at(1) == 'x' || at(1) == 'X') && isSQLHexDigit(at(2)) {
		i = digits(3, isSQLHexDigit)
	} else {
		i = digits(0, isSQLDigit)
		if at(i) == '.' {
			i = digits(i+1, isSQLDigit)
		}
		if (at(i) == 'e' || at(i) == 'E') &&
			(isSQLDigit(at(i+1)) || (at(i+1) == '+' || at(i+1) == '-') && isSQLDigit(at(i+2))) {
			i = digits(i+2, isSQLDigit)
		}
	}
	kind := tokOther
	for isSQLIDChar(at(i)) {
		kind = tokIllegal
		i++
	}
	return i, kind
}

// sqlVariable scans a named parameter: $name, @name, :name or #name, with
// SQLite's Tcl forms ("$a::b", "$a(x)").
func sqlVariable(s string) (int, tokenKind) {
	n, i := 0, 1
	for i < len(s) {
		c := s[i]
		switch {
		case isSQLIDChar(c):
			n++
			i++
			continue
		case c == '(' && n > 0:
			i++
			for i < len(s) && !isSQLSpace(s[i]) && s[i] != ')' {
				i++
			}
			if i < len(s) && s[i] == ')' {
				return i + 1, tokVariable
			}
			return i, tokIllegal
		case c == ':' && i+1 < len(s) && s[i+1] == ':':
			i += 2
			continue
		}
		break
	}
	if n == 0 {
		return i, tokIllegal
	}
	return i, tokVariable
}

// isSQLSpace is SQLite's sqlite3Isspace.
func isSQLSpace(c byte) bool { return c == ' ' || c >= '\t' && c <= '\r' }

func isSQLDigit(c byte) bool { return c >= '0' && c <= '9' }

func isSQLHexDigit(c byte) bool {
	return isSQLDigit(c) || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

// isSQLIDChar is SQLite's IdChar: a character that may appear in an
// identifier. Every byte from 0x80 up counts, so UTF-8 names work.
func isSQLIDChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || isSQLDigit(c) || c == '_' || c == '$' || c >= 0x80
}

// Bounds of a client's cache of classifications.
const (
	classCacheEntries = 512  // texts remembered
	classCacheMaxSQL  = 4096 // longer texts are classified every time
)
