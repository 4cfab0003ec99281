package idem_test

import (
	"net/http"
	"testing"
	"unicode/utf8"

	"github.com/d1idem/d1idem/idem"
)

// Header values decode as workerd decodes them: UTF-8, with one U+FFFD per
// maximal ill-formed subsequence (the WHATWG decoder). The expectations are
// what workerd gives (TestReplayedHeadersAgreeWithSpecWorker and
// TestFingerprintAgreesWithSpecWorker check it on workerd itself).
func TestDecodeUTF8LikeWorkerd(t *testing.T) {
	const r = "\uFFFD"
	for in, want := range map[string]string{
		"":                     "",
		"plain":                "plain",
		"caf\xc3\xa9":          "café",
		"\xe2\x82\xac":         "€",
		"\xf0\x9f\x98\x80":     "😀",
		"caf\xe9":              "caf" + r,
		"a\xe9\xe9b":           "a" + r + r + "b",
		"a\xe2\x82x":           "a" + r + "x",
		"\xf0\x9f\x98":         r,
		"\xc0\xaf":             r + r,
		"\xe0\x80\x80":         r + r + r,
		"\xed\xa0\x80":         r + r + r,
		"\xed\x9f\xbf":         "\ud7ff",
		"\xf4\x90\x80\x80":     r + r + r + r,
		"\xf4\x8f\xbf\xbf":     "\U0010ffff",
		"\x80\x80":             r + r,
		"\xe2\x82\xe2\x82\xac": r + "€",
		"\xff\xfe":             r + r,
		"x\xf1\x80\x80":        "x" + r,
		"\xf1\x80\x80\xe2\x82": r + r,
	} {
		if got := idem.DecodeUTF8(in); got != want {
			t.Errorf("DecodeUTF8(%q) = %q, want %q", in, got, want)
		}
	}
}

// HeaderValue is a Worker's Headers.get: values stripped of HTTP
// whitespace, joined by ", ", decoded as above.
func TestHeaderValueLikeWorker(t *testing.T) {
	h := http.Header{"Location": {" /a\t", "/caf\xe9 "}, "X-One": {"\r\nv\r\n"}}
	if got := idem.HeaderValue(h, "location"); got != "/a, /caf\uFFFD" {
		t.Errorf("got %q", got)
	}
	if got := idem.HeaderValue(h, "x-one"); got != "v" {
		t.Errorf("got %q", got)
	}
	if got := idem.HeaderValue(h, "absent"); got != "" {
		t.Errorf("got %q", got)
	}
}

// Whatever the bytes, the decoded value is valid UTF-8, and valid UTF-8 is
// kept as it is.
func FuzzDecodeUTF8(f *testing.F) {
	for _, s := range []string{"caf\xe9", "a\xe2\x82x", "\xed\xa0\x80", "€"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := idem.DecodeUTF8(s)
		if !utf8.ValidString(got) {
			t.Fatalf("DecodeUTF8(%q) = %q is not UTF-8", s, got)
		}
		if utf8.ValidString(s) && got != s {
			t.Fatalf("DecodeUTF8(%q) changed valid UTF-8 to %q", s, got)
		}
	})
}
