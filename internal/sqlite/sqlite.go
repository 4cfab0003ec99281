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
	if f := scanners[s[0]]; f != nil {
		return f(s)
	}
	return 1, Illegal
}

// scanners is the scanner of a token by its first byte (nil: a byte no
// token starts with), as SQLite's tokenizer classes the first byte in its
// aiClass table.
var scanners = func() (t [256]func(string) (int, Kind)) {
	set := func(bytes string, f func(string) (int, Kind)) {
		for i := range len(bytes) {
			t[bytes[i]] = f
		}
	}
	for c := range len(t) {
		if isIDChar(byte(c)) {
			t[c] = word
		}
	}
	set(" \t\n\f\r", space) // not '\v', which only continues a run
	set("-", minus)
	set("/", slash)
	set("=<>!|%,&~+*", operator)
	set("();", punctuation)
	set("'\"`", quoted)
	set("[", bracketed)
	set(".", dot)
	set("0123456789", number)
	set("?", numbered)
	set("$@:#", variable)
	set("xX", blobOrWord)
	set("\xef", bomOrWord)
	return t
}()

// space scans a run of whitespace.
func space(s string) (int, Kind) {
	i := 1
	for isSpace(byteAt(s, i)) {
		i++
	}
	return i, Space
}

// minus scans a '-': a comment to the end of the line ("--"), the JSON
// operators "->" and "->>", or a minus.
func minus(s string) (int, Kind) {
	switch byteAt(s, 1) {
	case '-':
		if i := strings.IndexByte(s, '\n'); i >= 0 {
			return i, Comment
		}
		return len(s), Comment
	case '>':
		if byteAt(s, 2) == '>' {
			return 3, Operator
		}
		return 2, Operator
	}
	return 1, Operator
}

// slash scans a '/': a comment "/* */", running to the end of the text
// when unterminated, or a division. A "/*" that ends the text is a '/'.
func slash(s string) (int, Kind) {
	if byteAt(s, 1) != '*' || byteAt(s, 2) == 0 {
		return 1, Operator
	}
	if i := strings.Index(s[2:], "*/"); i >= 0 {
		return i + 4, Comment
	}
	return len(s), Comment
}

// operator scans an operator of one or two bytes other than those of minus
// and slash. A '!' alone is illegal.
func operator(s string) (int, Kind) {
	switch s[:min(len(s), 2)] {
	case "==", "<=", "<>", "<<", ">=", ">>", "!=", "||":
		return 2, Operator
	}
	if s[0] == '!' {
		return 1, Illegal
	}
	return 1, Operator
}

// punctuation scans a '(', a ')' or a ';'.
func punctuation(s string) (int, Kind) {
	switch s[0] {
	case '(':
		return 1, LParen
	case ')':
		return 1, RParen
	}
	return 1, Semicolon
}

// quoted scans a string literal ('...') or a quoted identifier ("..." or
// `...`), where a doubled quote stands for itself. An unterminated one is
// illegal and runs to the end of the text.
func quoted(s string) (int, Kind) {
	q := s[0]
	for i := 1; i < len(s); i++ {
		if s[i] != q {
			continue
		}
		if byteAt(s, i+1) != q {
			if q == '\'' {
				return i + 1, String
			}
			return i + 1, QuotedID
		}
		i++ // a doubled quote stands for itself
	}
	return len(s), Illegal
}

// bracketed scans a quoted identifier [...], which has no escape.
func bracketed(s string) (int, Kind) {
	if i := strings.IndexByte(s, ']'); i >= 0 {
		return i + 1, QuotedID
	}
	return len(s), Illegal
}

// dot scans a '.': a number when a digit follows (".5"), an operator
// otherwise.
func dot(s string) (int, Kind) {
	if isDigit(byteAt(s, 1)) {
		return number(s)
	}
	return 1, Operator
}

// numbered scans a numbered parameter: ? or ?NNN.
func numbered(s string) (int, Kind) {
	i := 1
	for isDigit(byteAt(s, i)) {
		i++
	}
	return i, Variable
}

// blobOrWord scans a blob literal, x'00ff', whose hexadecimal digits come
// in pairs (otherwise it is illegal, and runs to its closing quote), or a
// word that starts with an x.
func blobOrWord(s string) (int, Kind) {
	if byteAt(s, 1) != '\'' {
		return word(s)
	}
	i := 2
	for isHexDigit(byteAt(s, i)) {
		i++
	}
	kind := Blob
	if byteAt(s, i) != '\'' || i%2 != 0 {
		kind = Illegal
		for i < len(s) && s[i] != '\'' {
			i++
		}
	}
	return min(i+1, len(s)), kind
}

// bomOrWord scans a UTF-8 byte order mark, which SQLite reads as a
// comment, or a word that starts with the byte 0xEF.
func bomOrWord(s string) (int, Kind) {
	if byteAt(s, 1) == 0xBB && byteAt(s, 2) == 0xBF {
		return 3, Comment
	}
	return word(s)
}

// word scans a keyword or a bare identifier.
func word(s string) (int, Kind) {
	i := 1
	for isIDChar(byteAt(s, i)) {
		i++
	}
	return i, Word
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
