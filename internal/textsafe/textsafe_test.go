package textsafe

import (
	"strconv"
	"testing"
	"unicode/utf8"
)

// hidden describes the first rune of s that is neither printable nor a
// newline or tab allowed by lines; "" when there is none.
func hidden(s string, lines bool) string {
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if !ShownRaw(r, n) && !(lines && (r == '\n' || r == '\t')) {
			return strconv.QuoteRune(r)
		}
		i += n
	}
	return ""
}

// values are values a terminal or a reader could misread: control
// sequences, white space, invisible characters, letters that must stay
// readable, and invalid UTF-8.
var values = []string{
	"\x1b]0;title\a", "\x1b[2J", "\u009b", "a\x1bb\x7fc", "line\nbreak", "tab\there", "carriage\rreturn",
	`"double"`, " edges ", "", "é", "日本", "é\x1b日本", "\u2028\u202e\ufeff", "\U000e0001", "\xff\x9b\xc3",
	"<img src=x onerror=alert(1)>", "acct_42",
}

func TestEscape(t *testing.T) {
	for in, want := range map[string]string{
		"plain text, \"quoted\" and back\\slashed": "plain text, \"quoted\" and back\\slashed",
		"é 日本":                      "é 日本",
		"\x1b]0;t\a\x1b[2J":         `\x1b]0;t\a\x1b[2J`,
		"\u009b31m \x7f \x00 \t \n": `\u009b31m \x7f \x00 \t \n`,
		"\xff\x9b":                  `\xff\x9b`,
		"\u202e":                    `\u202e`,
	} {
		got := Escape(in)
		if got != want || Escape(got) != got || hidden(got, false) != "" {
			t.Errorf("Escape(%q) = %q, want %q", in, got, want)
		}
	}
	for _, v := range values {
		if got := Escape(v); hidden(got, false) != "" {
			t.Errorf("Escape(%q) = %q shows %s raw", v, got, hidden(got, false))
		}
	}
}

func TestEscapeLines(t *testing.T) {
	for in, want := range map[string]string{
		"{\n\t\"a\": 1\n}": "{\n\t\"a\": 1\n}",
		"a\r\nb\x1b[31m":   `a\r` + "\n" + `b\x1b[31m`,
		"\u202eevil\n\xff": `\u202eevil` + "\n" + `\xff`,
	} {
		got := EscapeLines(in)
		if got != want || EscapeLines(got) != got || hidden(got, true) != "" {
			t.Errorf("EscapeLines(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestDisplay: a value is shown as it is when it is plain printable ASCII,
// else Go-quoted; either way nothing is hidden and the quoted form reads
// back as the value.
func TestDisplay(t *testing.T) {
	for _, v := range values {
		d := Display(v)
		if hidden(d, false) != "" || Escape(d) != d {
			t.Errorf("Display(%q) = %q is not safe", v, d)
		}
		if d == v {
			continue
		}
		if back, err := strconv.Unquote(d); err != nil || back != v && utf8.ValidString(v) {
			t.Errorf("Display(%q) = %q reads back as %q, %v", v, d, back, err)
		}
	}
	for in, want := range map[string]string{"acct_42": "acct_42", " edges ": `" edges "`, `"\x1b"`: `"\"\\x1b\""`, "": `""`} {
		if got := Display(in); got != want {
			t.Errorf("Display(%q) = %s, want %s", in, got, want)
		}
	}
}
