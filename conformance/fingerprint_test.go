package conformance

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strings"
	"testing"

	"github.com/d1idem/d1idem/internal/d1test"
)

// specFingerprint is the spec's computeFingerprint written in Go from its
// text: SHA-256 over "METHOD\npathAndQuery\ncontent-type:<v>\nx-api-version:<v>\n"
// followed by the raw body bytes, in lowercase hex. Headers.get joins
// repeated values with ", "; an absent header is "".
func specFingerprint(method, pathAndQuery string, h http.Header, body []byte) string {
	var b strings.Builder
	b.WriteString(strings.ToUpper(method) + "\n" + pathAndQuery + "\n")
	for i, name := range []string{"content-type", "x-api-version"} {
		if i > 0 {
			b.WriteString("\n")
		}
		b.WriteString(name + ":" + strings.Join(h.Values(name), ", "))
	}
	b.WriteString("\n")
	sum := sha256.Sum256(append([]byte(b.String()), body...))
	return hex.EncodeToString(sum[:])
}

// TestSpecFingerprintEndpoint checks harness.js's /__spec/fingerprint, the
// spec's own computeFingerprint running in workerd, against the Go reading
// of the spec above. It is a workerd-only test: d1local serves D1, not the
// spec's Worker. Other packages compare their fingerprints with the
// endpoint through d1test.SpecFingerprint.
func TestSpecFingerprintEndpoint(t *testing.T) {
	d1test.Workerd(t)
	cases := []struct {
		name, method, path string
		header             http.Header
		body               []byte
	}{
		{"json", "POST", "/v1/orders?a=1", http.Header{"Content-Type": {"application/json"}}, []byte(`{"amount":100,"currency":"usd"}`)},
		{"raw bytes", "POST", "/v1/upload", http.Header{"Content-Type": {"application/octet-stream"}}, []byte{0xff, 0xfe, 0x00, 0x80, 'a'}},
		{"query order kept", "PUT", "/v1/items?id=2&id=1&z=", nil, []byte("x")},
		{"api version", "PATCH", "/v1/orders/7", http.Header{"Content-Type": {"application/json"}, "X-Api-Version": {"2024-01-01"}}, []byte(`{}`)},
		{"ignored headers", "POST", "/v1/orders", http.Header{"X-Request-Id": {"abc"}, "User-Agent": {"t"}}, nil},
		{"escaped path", "DELETE", "/v1/a%20b/%E2%9C%93?q=%2F", nil, nil},
		{"root", "POST", "/", nil, []byte("root")},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, seen := d1test.SpecFingerprint(t, tc.method, tc.path, tc.header, tc.body)
			if seen != tc.path {
				t.Errorf("the Worker hashed path %q, sent %q", seen, tc.path)
			}
			if want := specFingerprint(tc.method, tc.path, tc.header, tc.body); got != want {
				t.Errorf("fingerprint = %s, want %s", got, want)
			}
		})
	}
	// Sanity: the inputs matter.
	a, _ := d1test.SpecFingerprint(t, "POST", "/v1/orders?a=1", nil, []byte("x"))
	b, _ := d1test.SpecFingerprint(t, "POST", "/v1/orders?a=2", nil, []byte("x"))
	c, _ := d1test.SpecFingerprint(t, "POST", "/v1/orders?a=1", http.Header{"X-Api-Version": {"2"}}, []byte("x"))
	if a == b || a == c || b == c {
		t.Errorf("distinct requests share a fingerprint: %s %s %s", a, b, c)
	}
}
