// Package sqlite is d1idem's one SQL lexer: SQLite's tokenizer (Next,
// Tokens) and the statement boundaries SQLite's parser finds (Split). It
// does not link SQLite, which the library packages that use it must never
// do; its tests check it against SQLite itself.
package sqlite

import (
	"iter"
	"strings"
)

// Kind is the kind of a Token.
type Kind uint8

// The kinds of token.
const (
	Space     Kind = iota // a run of whitespace
	Comment               // a -- or /* */ comment, or a byte order mark
	Word                  // a keyword or a bare identifier
	String                // a string literal: 'it''s'
	QuotedID              // a quoted identifier: "a", `a` or [a]
	Blob                  // a blob literal: x'00ff'
	Number                // an integer or a real, decimal or hexadecimal
	Variable              // a parameter: ?, ?NNN, :name, @name, #name, $name
	Semicolon             // ;
	LParen                // (
	RParen                // )
	Operator              // any other operator or punctuation: . , + - -> || <= ...
	Illegal               // what SQLite refuses: an unterminated quote, a stray byte, 1abc
)

// Token is one token of SQL text.
type Token struct {
	Kind Kind
	Text string // the token's bytes, quotes and all
}

// Keyword returns a Word's text in upper case, and "" for any other token.
func (t Token) Keyword() string {
	if t.Kind != Word {
		return ""
	}
	return strings.ToUpper(t.Text)
}

// Unquoted returns what a String or a QuotedID stands for: its text
// between the quotes, a doubled quote standing for one ([name] has no
// escape). It returns any other token's text as it is.
func (t Token) Unquoted() string {
	if t.Kind != String && t.Kind != QuotedID {
		return t.Text
	}
	q, s := t.Text[0], t.Text[1:len(t.Text)-1]
	if q == '[' {
		return s
	}
	return strings.ReplaceAll(s, string([]byte{q, q}), string(q))
}

// Tokens yields the tokens of sql other than whitespace and comments.
func Tokens(sql string) iter.Seq[Token] {
	return func(yield func(Token) bool) {
		for sql != "" {
			t := Next(sql)
			sql = sql[len(t.Text):]
			if t.Kind > Comment && !yield(t) {
				return
			}
		}
	}
}

// Statement is one statement of an SQL text.
type Statement struct {
	// SQL is the statement's text without the ';' that ends it, and
	// without the whitespace around it; comments stay.
	SQL string
	// End is where the statement ends in the text: just past its ';', or
	// the text's length for a last statement without one.
	End int
}

// Split splits sql into its statements where SQLite's parser ends them:
// at a ';' outside strings, quoted identifiers and comments, except inside
// the BEGIN ... END body of a CREATE TRIGGER, which ends at "; END ;".
// Statements of nothing but whitespace and comments are dropped: each
// statement holds a token other than those and ';'. A last statement
// without ';' is kept even when incomplete: SQLite reports the error when
// it compiles it.
func Split(sql string) []Statement {
	var (
		out     []Statement
		state   uint8
		from    = -1 // where the statement's text starts, once it has a token
		to      int  // where it ends so far
		content bool // it holds a token other than a comment
	)
	for i := 0; i < len(sql); {
		start, t := i, Next(sql[i:])
		i += len(t.Text)
		switch t.Kind {
		case Space:
			continue
		case Comment:
		default:
			state = completeStates[state][completeClass(t)]
			if t.Kind == Semicolon && state == 0 {
				if content {
					out = append(out, Statement{SQL: sql[from:to], End: i})
				}
				from, content = -1, false
				continue
			}
			content = true
		}
		if from < 0 {
			from = start
		}
		to = i
	}
	if content {
		out = append(out, Statement{SQL: sql[from:to], End: len(sql)})
	}
	return out
}

// completeStates is the state machine of SQLite's sqlite3_complete
// (complete.c), which the parser's grammar agrees with: states START (a
// statement has just ended), NORMAL, EXPLAIN, CREATE, TRIGGER, SEMI (";"
// in a trigger) and END ("; END" in a trigger), by the class of the next
// token other than whitespace and comments.
var completeStates = [7][7]uint8{
	//           ;  other EXPLAIN CREATE TEMP TRIGGER END
	/* START   */ {0, 1, 2, 3, 1, 1, 1},
	/* NORMAL  */ {0, 1, 1, 1, 1, 1, 1},
	/* EXPLAIN */ {0, 2, 1, 3, 1, 1, 1},
	/* CREATE  */ {0, 1, 1, 1, 3, 4, 1},
	/* TRIGGER */ {5, 4, 4, 4, 4, 4, 4},
	/* SEMI    */ {5, 4, 4, 4, 4, 4, 6},
	/* END     */ {0, 4, 4, 4, 4, 4, 4},
}

// completeClass is the column of completeStates for t.
func completeClass(t Token) int {
	if t.Kind == Semicolon {
		return 0
	}
	if t.Kind == Word {
		for _, k := range completeKeywords {
			if strings.EqualFold(t.Text, k.word) {
				return k.class
			}
		}
	}
	return 1
}

// completeKeywords are the words of completeStates' columns.
var completeKeywords = [...]struct {
	word  string
	class int
}{{"EXPLAIN", 2}, {"CREATE", 3}, {"TEMP", 4}, {"TEMPORARY", 4}, {"TRIGGER", 5}, {"END", 6}}

// Next returns the token at the start of sql, which is not empty. It
// follows SQLite's tokenizer (sqlite3GetToken in tokenize.c), but that a
// NUL byte is a byte like any other, where SQLite stops reading.
func Next(sql string) Token {
	n, kind := scan(sql)
	return Token{Kind: kind, Text: sql[:n]}
}

// scan returns the length and kind of the token at the start of s.
func scan(s string) (int, Kind) {
	at := func(i int) byte { return byteAt(s, i) }
	switch c := s[0]; {
	case c == ' ' || c == '\t' || c == '\n' || c == '\f' || c == '\r': // not '\v'
		i := 1
		for isSpace(at(i)) {
			i++
		}
		return i, Space
	case c == '-' && at(1) == '-':
		if i := strings.IndexByte(s, '\n'); i >= 0 {
			return i, Comment
		}
		return len(s), Comment
	case c == '-' && at(1) == '>':
		if at(2) == '>' {
			return 3, Operator
		}
		return 2, Operator
	case c == '/' && at(1) == '*' && at(2) != 0:
		if i := strings.Index(s[2:], "*/"); i >= 0 {
			return i + 4, Comment
		}
		return len(s), Comment
	case c == '(':
		return 1, LParen
	case c == ')':
		return 1, RParen
	case c == ';':
		return 1, Semicolon
	case c == '!' && at(1) != '=':
		return 1, Illegal
	case strings.IndexByte("=<>!|", c) >= 0:
		switch s[:min(len(s), 2)] {
		case "==", "<=", "<>", "<<", ">=", ">>", "!=", "||":
			return 2, Operator
		}
		return 1, Operator
	case strings.IndexByte("%,&~+*-/", c) >= 0:
		return 1, Operator
	case c == '\'' || c == '"' || c == '`':
		for i := 1; i < len(s); i++ {
			if s[i] != c {
				continue
			}
			if at(i+1) != c {
				if c == '\'' {
					return i + 1, String
				}
				return i + 1, QuotedID
			}
			i++ // a doubled quote stands for itself
		}
		return len(s), Illegal
	case c == '[':
		if i := strings.IndexByte(s, ']'); i >= 0 {
			return i + 1, QuotedID
		}
		return len(s), Illegal
	case c == '.' && !isDigit(at(1)):
		return 1, Operator
	case c == '.' || isDigit(c):
		return number(s)
	case c == '?':
		i := 1
		for isDigit(at(i)) {
			i++
		}
		return i, Variable
	case c == '$' || c == '@' || c == ':' || c == '#':
		return variable(s)
	case (c == 'x' || c == 'X') && at(1) == '\'':
		i := 2
		for isHexDigit(at(i)) {
			i++
		}
		kind := Blob
		if at(i) != '\'' || i%2 != 0 {
			kind = Illegal
			for i < len(s) && s[i] != '\'' {
				i++
			}
		}
		return min(i+1, len(s)), kind
	case c == 0xEF && at(1) == 0xBB && at(2) == 0xBF:
		return 3, Comment // a byte order mark
	case isIDChar(c) && !isDigit(c): // '$' was taken above
		i := 1
		for isIDChar(at(i)) {
			i++
		}
		return i, Word
	}
	return 1, Illegal
}

// number scans a numeric literal: decimal, with an optional fraction and
// exponent, or hexadecimal, with '_' between digits. Identifier characters
// run on into one illegal token ("1abc").
func number(s string) (int, Kind) {
	at := func(i int) byte { return byteAt(s, i) }
	digits := func(i int, ok func(byte) bool) int {
		for ok(at(i)) || at(i) == '_' {
			i++
		}
		return i
	}
	var i int
	if s[0] == '0' && (at(1) == 'x' || at(1) == 'X') && isHexDigit(at(2)) {
		i = digits(3, isHexDigit)
	} else {
		i = digits(0, isDigit)
		if at(i) == '.' {
			i = digits(i+1, isDigit)
		}
		if (at(i) == 'e' || at(i) == 'E') &&
			(isDigit(at(i+1)) || (at(i+1) == '+' || at(i+1) == '-') && isDigit(at(i+2))) {
			i = digits(i+2, isDigit)
		}
	}
	kind := Number
	for isIDChar(at(i)) {
		kind = Illegal
		i++
	}
	return i, kind
}

// variable scans a named parameter: $name, @name, :name or #name, with
// SQLite's Tcl forms ("$a::b", "$a(x)").
func variable(s string) (int, Kind) {
	n, i := 0, 1
	for i < len(s) {
		c := s[i]
		switch {
		case isIDChar(c):
			n++
			i++
			continue
		case c == '(' && n > 0:
			i++
			for i < len(s) && !isSpace(s[i]) && s[i] != ')' {
				i++
			}
			if i < len(s) && s[i] == ')' {
				return i + 1, Variable
			}
			return i, Illegal
		case c == ':' && i+1 < len(s) && s[i+1] == ':':
			i += 2
			continue
		}
		break
	}
	if n == 0 {
		return i, Illegal
	}
	return i, Variable
}

// byteAt returns s[i], or 0 past the end of s, as C's strings read.
func byteAt(s string, i int) byte {
	if i < len(s) {
		return s[i]
	}
	return 0
}

// isSpace is SQLite's sqlite3Isspace.
func isSpace(c byte) bool { return c == ' ' || c >= '\t' && c <= '\r' }

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func isHexDigit(c byte) bool { return isDigit(c) || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' }

// isIDChar is SQLite's IdChar: a byte that may appear in an identifier.
// Every byte from 0x80 up counts, so UTF-8 names work.
func isIDChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || isDigit(c) || c == '_' || c == '$' || c >= 0x80
}
