// Package textsafe is the one rule for showing a value read from the
// ledger, a database or D1's answers to a person: the d1idem command line
// on a terminal, the console in a browser. Such a value may hold any UTF-8,
// and what shows it must neither obey it (a terminal runs the control
// sequences it gets) nor hide it (a bidi override, a zero-width character
// or a trailing space makes one value look like another). So a rune is
// shown as it is only when strconv.IsPrint says so (letters of every
// script, é and 日本 included); every control character (C0, DEL, C1
// U+0080 to U+009F), every other unprintable rune and every byte of invalid
// UTF-8 is escaped, as Go spells it: \x1b, \t, \u009b, \xff.
package textsafe

import (
	"encoding/hex"
	"strconv"
	"strings"
	"unicode/utf8"
)

// ShownRaw reports whether the rune r, of width n in its string, may be
// shown as it is.
func ShownRaw(r rune, n int) bool {
	return !(r == utf8.RuneError && n == 1) && strconv.IsPrint(r)
}

// AllShownRaw reports whether every rune of s may be shown as it is.
func AllShownRaw(s string) bool {
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if !ShownRaw(r, n) {
			return false
		}
		i += n
	}
	return true
}

// Display makes a value safe to show in a table or a field: a value with
// characters that are not printable ASCII, with spaces at its edges or
// starting with a double quote is shown Go-quoted (strconv.Quote: the
// escapes above, and \" and \\), so that what is shown is unambiguous and
// reads back with strconv.Unquote.
func Display(s string) string {
	if s == "" || s[0] == ' ' || s[0] == '"' || s[len(s)-1] == ' ' {
		return strconv.Quote(s)
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return strconv.Quote(s)
		}
	}
	return s
}

// Escape escapes in a line of text what may not be shown as it is (see
// ShownRaw), as strconv.Quote spells it; the rest, quotes and backslashes
// included, is left as it is. Text that is already safe comes back
// unchanged, so escaping twice is escaping once.
func Escape(s string) string {
	return escape(s, "")
}

// EscapeLines is Escape for text shown on several lines, such as a stored
// response body: newlines and tabs are left as they are.
func EscapeLines(s string) string {
	return escape(s, "\n\t")
}

// escape is Escape, which leaves the runes of keep as they are too.
func escape(s, keep string) string {
	safe := func(r rune, n int) bool { return ShownRaw(r, n) || strings.ContainsRune(keep, r) }
	i := 0
	for i < len(s) {
		r, n := utf8.DecodeRuneInString(s[i:])
		if !safe(r, n) {
			break
		}
		i += n
	}
	if i == len(s) {
		return s
	}
	var b strings.Builder
	b.WriteString(s[:i])
	for i < len(s) {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case safe(r, n):
			b.WriteString(s[i : i+n])
		case r == utf8.RuneError && n == 1:
			b.WriteString(`\x` + hex.EncodeToString([]byte{s[i]}))
		default:
			q := strconv.QuoteRune(r) // '\x1b', '\u009b'
			b.WriteString(q[1 : len(q)-1])
		}
		i += n
	}
	return b.String()
}
