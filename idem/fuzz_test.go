package idem

import (
	"bytes"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"testing/iotest"
)

var keyPattern = regexp.MustCompile(`^[\x20-\x7e]{1,255}$`)

// ValidKey agrees with the spec's IDEMPOTENCY_KEY_PATTERN on every input.
func FuzzValidKey(f *testing.F) {
	for _, s := range []string{"", "a", "8e03978e-40d5-43e8-bc93-6894a57f9324", "é", "\x7f", "\x1f", strings.Repeat("k", 255), strings.Repeat("k", 256), `"quoted"`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, key string) {
		if got, want := ValidKey(key), keyPattern.MatchString(key); got != want {
			t.Fatalf("ValidKey(%q) = %v, the spec's pattern says %v", key, got, want)
		}
	})
}

// The fingerprint's inputs: the request target normalises like a URL
// parser (idempotently, to URL code points only), and the streamed hash
// equals the in-memory one whatever the header values and body bytes.
func FuzzFingerprintInput(f *testing.F) {
	f.Add("POST", "/v1/orders?a=1&a=2", "application/json", "2026-01-01", []byte(`{"sku":"a"}`))
	f.Add("post", "/a/./b/../c?", "", "", []byte{0xff, 0xfe})
	f.Add("PUT", "/caf%C3%A9/%2e%2E/x?q='\"<>", "text/plain; charset=utf-8", "1, 2", []byte{})
	f.Add("DELETE", "http://example.com//x#frag", "a\x00b", "", []byte("\x00"))
	f.Fuzz(func(t *testing.T, method, target, contentType, version string, body []byte) {
		pq := normalizeTarget(target)
		if !strings.HasPrefix(pq, "/") {
			t.Fatalf("normalizeTarget(%q) = %q does not start with /", target, pq)
		}
		if again := normalizeTarget(pq); again != pq {
			t.Fatalf("not idempotent: %q -> %q -> %q", target, pq, again)
		}
		for i := 0; i < len(pq); i++ {
			if c := pq[i]; c <= 0x20 || c >= 0x7f || c == '"' || c == '<' || c == '>' || c == '#' {
				t.Fatalf("normalizeTarget(%q) = %q keeps byte %#x", target, pq, c)
			}
		}
		h := http.Header{}
		h["Content-Type"] = []string{contentType}
		h["X-Api-Version"] = strings.Split(version, "\n")
		streamed, err := Fingerprint(method, pq, h, DefaultFingerprintHeaders, bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		bytewise, err := Fingerprint(method, pq, h, DefaultFingerprintHeaders, iotest.OneByteReader(bytes.NewReader(body)))
		if err != nil || streamed != bytewise || len(streamed) != 64 {
			t.Fatalf("streamed at once %s, a byte at a time %s (%v)", streamed, bytewise, err)
		}
	})
}
