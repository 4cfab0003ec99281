package textsafe

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
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
	"\u009b2J\u009b31m", "\x1b7\x1b0123", // digits after an escape stay themselves
	"it's", `back\slash`, "$(echo pwned)", "`echo pwned`", "${HOME}", "!bang", "a  b", "-flag-like", // the shell's own
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

// shellValues are values a shell could misread, beside those above.
var shellValues = []string{"it's", `back\slash`, "$(echo pwned)", "`echo pwned`", "${HOME}", "!bang", "a  b", "-flag-like", "\u009b2J\u009b31m", "\x1b7\x1b0123"}

// TestShellQuotePastesExactBytes: every value, quoted by ShellQuote and
// pasted into bash, is one argument with exactly its bytes, in a UTF-8
// locale and in the C locale (where bash leaves \uHHHH as it is); and the
// quoted word shows nothing raw that it should not.
func TestShellQuotePastesExactBytes(t *testing.T) {
	all := append(append([]string{}, values...), shellValues...)
	line := "printf '%s\\0'"
	for _, v := range all {
		q := ShellQuote(v)
		if h := hidden(q, false); h != "" || !utf8.ValidString(q) {
			t.Errorf("ShellQuote(%q) = %q: %s raw", v, q, h)
		}
		line += " " + q
	}
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skipf("no bash to paste into: %v", err)
	}
	for _, locale := range []string{"C.UTF-8", "C"} {
		cmd := exec.Command("bash", "-c", line)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "LC_ALL=" + locale}
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("bash cannot read %q: %v", line, err)
		}
		got := strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00")
		if len(got) != len(all) {
			t.Fatalf("LC_ALL=%s: %d arguments, want %d: %q", locale, len(got), len(all), got)
		}
		for i, v := range all {
			if got[i] != v {
				t.Errorf("LC_ALL=%s: %s pasted gives %q, want %q", locale, ShellQuote(v), got[i], v)
			}
		}
	}
	for v, want := range map[string]string{
		"acct_42":           "acct_42",
		"it's":              `'it'\''s'`,
		"é":                 "'é'",
		"é\x1b日本":           `$'é\033日本'`,
		"\x1b]0;title\a":    `$'\033]0;title\a'`,
		"\u009b2J":          `$'\302\2332J'`,
		"it's\n":            `$'it\047s\n'`,
		`back\slash` + "\t": `$'back\\slash\t'`,
		"\xff":              `$'\377'`,
		"":                  "''",
	} {
		if got := ShellQuote(v); got != want {
			t.Errorf("ShellQuote(%q) = %s, want %s", v, got, want)
		}
	}
}

// TestLine: white space other than plain spaces becomes one space, plain
// spaces stay, and the rest is escaped.
func TestLine(t *testing.T) {
	for in, want := range map[string]string{
		"a\n\tb  c\r\n":          "a b  c",
		"run 'd1idem  x'\x1b[2J": `run 'd1idem  x'\x1b[2J`,
		"\u2028x\u00a0y":         "x y",
	} {
		if got := Line(in); got != want {
			t.Errorf("Line(%q) = %q, want %q", in, got, want)
		}
	}
	for _, v := range values {
		if got := Line(v); hidden(got, false) != "" || strings.Contains(got, "\n") {
			t.Errorf("Line(%q) = %q", v, got)
		}
	}
}

// TestJSON: DEL and the C1 controls, which encoding/json leaves raw, are
// escaped, and the JSON still decodes to the same strings.
func TestJSON(t *testing.T) {
	v := map[string]string{"k\u0085": "\x1b[2J\u009b\x7f é\u00a0日本 \u0080\u009f"}
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	safe := JSON(b)
	if strings.ContainsAny(string(safe), "\x7f\u0080\u0085\u009b\u009f") {
		t.Fatalf("a control character raw in %s", safe)
	}
	if !strings.Contains(string(safe), `\u009b\u007f é`) || !strings.Contains(string(safe), `"k\u0085"`) {
		t.Errorf("JSON = %s", safe)
	}
	var back map[string]string
	if err := json.Unmarshal(safe, &back); err != nil || fmt.Sprint(back) != fmt.Sprint(v) {
		t.Errorf("JSON(%s) decodes to %q (%v), want %q", b, back, err, v)
	}
}
