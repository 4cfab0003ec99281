// Package textsafe is the one rule for showing a value read from the
// ledger, a database or D1's answers to a person: the d1idem command line
// on a terminal, the console in a browser. Such a value may hold any UTF-8,
// and what shows it must neither obey it (a terminal runs the control
// sequences it gets) nor hide it (a bidi override, a zero-width character
// or a trailing space makes one value look like another). So a rune is
// shown as it is only when strconv.IsPrint says so (letters of every
// script, é and 日本 included); every control character (C0, DEL, C1
// U+0080 to U+009F), every other unprintable rune and every byte of invalid
// UTF-8 is escaped, as Go spells it: \x1b, \t, \u009b, \xff. The forms
// of that rule: Display (a value in a table or a field), Escape and Line
// (free text), EscapeLines (a body on several lines), ShellQuote (a value
// in a command printed to be pasted) and JSON (JSON for a terminal).
package textsafe

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"unicode"
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

// ShellQuote quotes s as one word of a command line printed to be pasted
// into a shell: as it is when it is plain; in single quotes when every
// character may be shown raw; else in ANSI-C quotes, $'...' (bash, zsh,
// ksh93, POSIX sh since 2024), where each byte that may not (and \ and ')
// is an escape: \t, \n, ... as Go spells them, and three octal digits for
// the others, every byte of a multi-byte rune included. An octal escape is
// read the same by every such shell in any locale (\xHH may take more
// digits in some; bash leaves \uHHHH as it is outside UTF-8 locales): the
// pasted word is s's exact bytes. A NUL byte cannot be in an argument at
// all: the caller must name such a value another way.
func ShellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("_-.,:/@%+=", r))
	}) < 0 {
		return s
	}
	if AllShownRaw(s) {
		return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
	}
	var b strings.Builder
	b.WriteString("$'")
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == '\\':
			b.WriteString(`\\`)
		case r == '\'':
			b.WriteString(`\047`) // not \': older bash history expansion misreads it
		case ShownRaw(r, n):
			b.WriteString(s[i : i+n])
		case strings.ContainsRune("\a\b\f\n\r\t\v", r):
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		default:
			for _, c := range []byte(s[i : i+n]) {
				fmt.Fprintf(&b, `\%03o`, c)
			}
		}
		i += n
	}
	return b.String() + "'"
}

// Line makes s one line of text safe on a terminal, such as an error
// message: each run of white space other than plain spaces (kept: a
// suggested command may hold them) becomes one space, and the rest is
// escaped as Escape does.
func Line(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if !unicode.IsSpace(r) {
			b.WriteString(s[i : i+n])
			i += n
			continue
		}
		end := i + strings.IndexFunc(s[i:], func(r rune) bool { return !unicode.IsSpace(r) })
		if end < i {
			end = len(s)
		}
		if run := s[i:end]; strings.Trim(run, " ") == "" {
			b.WriteString(run)
		} else {
			b.WriteByte(' ')
		}
		i = end
	}
	return Escape(strings.TrimSpace(b.String()))
}

// JSON escapes, in JSON that encoding/json wrote, the control characters
// it leaves raw, DEL (U+007F) and C1 (U+0080 to U+009F), as \u007f ...
// \u009f: it escapes the others (C0, and invalid UTF-8 as U+FFFD), and
// these can only be inside its strings, where the escape means the same
// character. JSON printed on a terminal goes through it.
func JSON(b []byte) []byte {
	if bytes.IndexByte(b, 0x7f) < 0 && bytes.IndexByte(b, 0xc2) < 0 {
		return b
	}
	out := make([]byte, 0, len(b)+16)
	for i := 0; i < len(b); i++ {
		switch c := b[i]; {
		case c == 0x7f:
			out = append(out, `\u007f`...)
		case c == 0xc2 && i+1 < len(b) && b[i+1] >= 0x80 && b[i+1] <= 0x9f:
			out = append(out, `\u00`...)
			out = append(out, hex.EncodeToString(b[i+1:i+2])...)
			i++
		default:
			out = append(out, c)
		}
	}
	return out
}
