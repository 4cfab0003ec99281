package cli

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/d1idem/d1idem/internal/textsafe"
)

// Terminal-safe output. A value the CLI read (from the ledger, a database,
// D1's answers) may hold any UTF-8, and a terminal obeys the control
// characters it gets: ESC sequences retitle the window, clear the screen or
// rewrite what was printed. So nothing the CLI prints of such a value
// reaches the terminal raw unless it is printable, by the rule of package
// textsafe, which the console shares. Three forms share that rule: display
// (a value in a table or a field: Go-quoted when not plain, \x1b, \t,
// \u009b, \xff), escapeText (free text: errors, lines, cells; the same
// escapes, no quotes) and shellQuote (a value in a command printed to be
// pasted: the escapes a shell reads back into the same bytes). JSON output
// escapes the control characters (see jsonSafe).

// display makes a ledger value safe to show in a table or a field
// (textsafe.Display).
func display(s string) string { return textsafe.Display(s) }

// escapeText escapes in a line of text what may not reach the terminal raw
// (textsafe.Escape).
func escapeText(s string) string { return textsafe.Escape(s) }

// shellQuote quotes s as one word of a command line the CLI prints to be
// pasted: as it is when it is plain; in single quotes when every character
// may be shown raw; else in ANSI-C quotes, $'...' (bash, zsh, ksh93, POSIX
// sh since 2024), where each byte that may not (and \ and ') is an escape:
// \t, \n, ... as Go spells them, and three octal digits for the others,
// every byte of a multi-byte rune included. An octal escape is read the
// same by every such shell in any locale (\xHH may take more digits in
// some; bash leaves \uHHHH as it is outside UTF-8 locales): the pasted
// word is s's exact bytes. A NUL byte cannot be in an argument at all: see
// principalArg.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("_-.,:/@%+=", r))
	}) < 0 {
		return s
	}
	if textsafe.AllShownRaw(s) {
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
		case textsafe.ShownRaw(r, n):
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

// jsonSafe escapes in JSON that encoding/json wrote the control characters
// it leaves raw, DEL (U+007F) and C1 (U+0080 to U+009F), as \u007f ...
// \u009f: it escapes the others (C0, and invalid UTF-8 as U+FFFD), and
// these can only be inside its strings, where the escape means the same
// character. Every JSON the CLI prints goes through it.
func jsonSafe(b []byte) []byte {
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
