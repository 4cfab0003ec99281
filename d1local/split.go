package d1local

import "strings"

// piece is one statement of a multi-statement SQL string.
type piece struct {
	sql     string // the statement, trimmed, without its terminating ';'
	keyword string // its first keyword, upper-cased ("SELECT", "CREATE", ...)
}

// Tokens and states of SQLite's sqlite3_complete (complete.c), which decides
// where a statement ends: at a ';' outside quotes, identifiers and comments,
// except inside the BEGIN ... END body of a CREATE TRIGGER.
const (
	tkSemi = iota
	tkWS
	tkOther
	tkExplain
	tkCreate
	tkTemp
	tkTrigger
	tkEnd
)

// completeTrans is sqlite3_complete's transition table. State 1 (START)
// after a ';' means a statement has just ended.
var completeTrans = [8][8]uint8{
	//          SEMI WS OTHER EXPLAIN CREATE TEMP TRIGGER END
	/* 0 INVALID */ {1, 0, 2, 3, 4, 2, 2, 2},
	/* 1 START   */ {1, 1, 2, 3, 4, 2, 2, 2},
	/* 2 NORMAL  */ {1, 2, 2, 2, 2, 2, 2, 2},
	/* 3 EXPLAIN */ {1, 3, 3, 2, 4, 2, 2, 2},
	/* 4 CREATE  */ {1, 4, 2, 2, 2, 4, 5, 2},
	/* 5 TRIGGER */ {6, 5, 5, 5, 5, 5, 5, 5},
	/* 6 SEMI    */ {6, 6, 5, 5, 5, 5, 5, 7},
	/* 7 END     */ {1, 7, 5, 5, 5, 5, 5, 5},
}

// splitSQL splits sql into statements the way SQLite's own tokenizer
// delimits them. Pieces holding only whitespace and comments are dropped.
// A trailing statement without ';' is kept even when incomplete (SQLite
// reports the error when it is compiled).
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
	state := uint8(0)
	start := 0
	content := false
	keyword := ""
	tail := -1 // where the text after the last statement's ';' starts
	for i := 0; i < len(sql); {
		kind, end := scanToken(sql, i)
		tok := tkOther
		switch kind {
		case tokSemi:
			tok = tkSemi
		case tokSpace:
			tok = tkWS
		case tokWord:
			word := sql[i:end]
			tok = keywordToken(word)
			if !content {
				keyword = strings.ToUpper(word)
			}
		}
		i = end
		if tok != tkWS && tok != tkSemi {
			content = true
		}
		state = completeTrans[state][tok]
		if tok == tkSemi && state == 1 {
			if content {
				pieces = append(pieces, piece{sql: trimSQLSpace(sql[start : i-1]), keyword: keyword})
				tail = i
			}
			start, content, keyword = i, false, ""
		}
	}
	if content {
		return append(pieces, piece{sql: trimSQLSpace(sql[start:]), keyword: keyword}), false
	}
	return pieces, tail >= 0 && trimSQLSpace(sql[tail:]) != ""
}

// The kinds of token scanToken tells apart.
const (
	tokSpace  = iota // whitespace or a comment
	tokSemi          // ';'
	tokWord          // an identifier or keyword, unquoted
	tokQuoted        // a string, or an identifier in "", ``, or []
	tokOther         // any other byte
)

// scanToken reads the token of sql that starts at i, as SQLite's tokenizer
// delimits it where that matters to splitSQL and renamesToReserved: runs
// of whitespace and comments, quoted text (an unterminated one runs to the
// end), words, and single bytes. It returns the token's kind and where it
// ends.
func scanToken(sql string, i int) (kind, end int) {
	c := sql[i]
	next := byte(0)
	if i+1 < len(sql) {
		next = sql[i+1]
	}
	switch {
	case c == ';':
		return tokSemi, i + 1
	case isSQLSpace(c):
		return tokSpace, i + 1
	case c == '/' && next == '*':
		if end := strings.Index(sql[i+2:], "*/"); end >= 0 {
			return tokSpace, i + 2 + end + 2
		}
		return tokSpace, len(sql)
	case c == '-' && next == '-':
		if nl := strings.IndexByte(sql[i:], '\n'); nl >= 0 {
			return tokSpace, i + nl + 1
		}
		return tokSpace, len(sql)
	case c == '[':
		if end := strings.IndexByte(sql[i+1:], ']'); end >= 0 {
			return tokQuoted, i + 1 + end + 1
		}
		return tokQuoted, len(sql)
	case c == '`' || c == '"' || c == '\'':
		// A doubled quote inside closes one quoted run and opens the
		// next, which tokenizes the same.
		if end := strings.IndexByte(sql[i+1:], c); end >= 0 {
			return tokQuoted, i + 1 + end + 1
		}
		return tokQuoted, len(sql)
	case isIDChar(c):
		j := i
		for j < len(sql) && isIDChar(sql[j]) {
			j++
		}
		return tokWord, j
	}
	return tokOther, i + 1
}

// renamesToReserved reports whether sql, an ALTER TABLE statement, renames
// a table to a name starting with "_cf_" (quoted or not): RENAME TO
// _cf_..., with any whitespace and comments between the words. SQLite's
// authorizer sees only the old name of a renamed table. Words inside
// strings and quoted identifiers do not count.
func renamesToReserved(sql string) bool {
	var last [2]string // the two tokens before, words upper-cased
	for i := 0; i < len(sql); {
		kind, end := scanToken(sql, i)
		tok := sql[i:end]
		i = end
		switch kind {
		case tokSpace:
			continue
		case tokWord:
			if last == [2]string{"RENAME", "TO"} && strings.HasPrefix(tok, "_cf_") {
				return true
			}
			tok = strings.ToUpper(tok)
		case tokQuoted:
			if last == [2]string{"RENAME", "TO"} && strings.HasPrefix(tok[1:], "_cf_") {
				return true
			}
			tok = "" // not a keyword
		}
		last = [2]string{last[1], tok}
	}
	return false
}

// trimSQLSpace trims the whitespace SQLite's tokenizer skips (not every
// Unicode space: U+00A0 is part of an identifier to SQLite).
func trimSQLSpace(s string) string {
	return strings.TrimFunc(s, func(r rune) bool { return r < 0x80 && isSQLSpace(byte(r)) })
}

// keywordToken classifies an identifier for sqlite3_complete.
func keywordToken(word string) int {
	switch strings.ToLower(word) {
	case "create":
		return tkCreate
	case "trigger":
		return tkTrigger
	case "temp", "temporary":
		return tkTemp
	case "end":
		return tkEnd
	case "explain":
		return tkExplain
	}
	return tkOther
}

// isSQLSpace matches SQLite's sqlite3Isspace.
func isSQLSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\f' || c == '\r' || c == '\v'
}

// isIDChar matches SQLite's IdChar: letters, digits, '_', '$' and every
// byte of a multi-byte UTF-8 character.
func isIDChar(c byte) bool {
	return c >= 0x80 || c == '_' || c == '$' ||
		(c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
}
