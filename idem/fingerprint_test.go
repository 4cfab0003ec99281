package idem

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"
	"testing/iotest"
)

type fingerprintVector struct {
	Name        string      `json:"name"`
	Method      string      `json:"method"`
	Path        string      `json:"path"`
	Headers     [][2]string `json:"headers"`
	Body        string      `json:"body"`
	Fingerprint string      `json:"fingerprint"`
}

func loadVectors(t *testing.T, data []byte) []fingerprintVector {
	t.Helper()
	var vs []fingerprintVector
	if err := json.Unmarshal(data, &vs); err != nil {
		t.Fatal(err)
	}
	if len(vs) < 10 {
		t.Fatalf("only %d vectors", len(vs))
	}
	return vs
}

// Fingerprint agrees byte for byte with the spec's computeFingerprint, run
// in Node over the same inputs (testdata/fingerprint_vectors.mjs).
func TestFingerprintMatchesSpecVectors(t *testing.T) {
	data, err := os.ReadFile("testdata/fingerprint_vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	check := func(t *testing.T, vs []fingerprintVector) {
		for _, v := range vs {
			h := http.Header{}
			for _, kv := range v.Headers {
				h.Add(kv[0], kv[1])
			}
			body, err := base64.StdEncoding.DecodeString(v.Body)
			if err != nil {
				t.Fatal(err)
			}
			got, err := Fingerprint(v.Method, v.Path, h, DefaultFingerprintHeaders, bytes.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			if got != v.Fingerprint {
				t.Errorf("%s: got %s, want %s", v.Name, got, v.Fingerprint)
			}
			if b, err := Fingerprint(v.Method, v.Path, h, DefaultFingerprintHeaders, iotest.OneByteReader(bytes.NewReader(body))); err != nil || b != got {
				t.Errorf("%s: streamed a byte at a time %s (%v) != Fingerprint %s", v.Name, b, err, got)
			}
		}
	}
	check(t, loadVectors(t, data))

	// Regenerate from the spec's code when Node is here, so the committed
	// vectors cannot drift from it.
	node, err := exec.LookPath("node")
	if err != nil {
		t.Log("node not on PATH: checked the committed vectors only")
		return
	}
	out, err := exec.Command(node, "testdata/fingerprint_vectors.mjs").Output()
	if err != nil {
		t.Fatalf("running the spec's computeFingerprint in node: %v", err)
	}
	if !bytes.Equal(bytes.TrimSpace(out), bytes.TrimSpace(data)) {
		t.Error("testdata/fingerprint_vectors.json is stale: regenerate it with node testdata/fingerprint_vectors.mjs")
	}
	check(t, loadVectors(t, out))
}

// fingerprintBytes is Fingerprint over a body in memory.
func fingerprintBytes(method, pathAndQuery string, header http.Header, headerNames []string, body []byte) string {
	fp, err := Fingerprint(method, pathAndQuery, header, headerNames, bytes.NewReader(body))
	if err != nil {
		panic(err) // hashing a bytes.Reader cannot fail
	}
	return fp
}

func TestFingerprintDistinguishes(t *testing.T) {
	h := http.Header{"Content-Type": {"application/json"}}
	base := fingerprintBytes("POST", "/a?x=1&x=2", h, DefaultFingerprintHeaders, []byte(`{"a":1}`))
	variants := map[string]string{
		"query order":  fingerprintBytes("POST", "/a?x=2&x=1", h, DefaultFingerprintHeaders, []byte(`{"a":1}`)),
		"method":       fingerprintBytes("PUT", "/a?x=1&x=2", h, DefaultFingerprintHeaders, []byte(`{"a":1}`)),
		"body spacing": fingerprintBytes("POST", "/a?x=1&x=2", h, DefaultFingerprintHeaders, []byte(`{"a": 1}`)),
		"content type": fingerprintBytes("POST", "/a?x=1&x=2", http.Header{"Content-Type": {"text/plain"}}, DefaultFingerprintHeaders, []byte(`{"a":1}`)),
		"binary bodies differing only in invalid bytes": fingerprintBytes("POST", "/a?x=1&x=2", h, DefaultFingerprintHeaders, []byte{0xff}),
	}
	for name, fp := range variants {
		if fp == base {
			t.Errorf("%s does not change the fingerprint", name)
		}
	}
	if a, b := fingerprintBytes("POST", "/b", h, DefaultFingerprintHeaders, []byte{0xff}), fingerprintBytes("POST", "/b", h, DefaultFingerprintHeaders, []byte{0xfe}); a == b {
		t.Error("two invalid UTF-8 bodies collide")
	}
	// A header off the allowlist never matters.
	h2 := h.Clone()
	h2.Set("X-Trace-Id", "t-1")
	if fingerprintBytes("POST", "/a?x=1&x=2", h2, DefaultFingerprintHeaders, []byte(`{"a":1}`)) != base {
		t.Error("an unlisted header changed the fingerprint")
	}
}

// PathAndQuery serialises the request target as new URL(request.url)
// would: pathname + search.
func TestPathAndQuery(t *testing.T) {
	tests := []struct{ target, want string }{
		{"/v1/orders", "/v1/orders"},
		{"/v1/orders?", "/v1/orders"},
		{"/v1/orders?a=1&a=2", "/v1/orders?a=1&a=2"},
		{"/v1/orders?b=2&a=1", "/v1/orders?b=2&a=1"},
		{"/caf%C3%A9/%2f?q=a%20b+c", "/caf%C3%A9/%2f?q=a%20b+c"},
		{"/caf%c3%a9", "/caf%c3%a9"},
		{"/bad%zz?x=%zz", "/bad%zz?x=%zz"},
		{"/a/./b/../c", "/a/c"},
		{"/a/%2e/b/%2E%2e/c", "/a/c"},
		{"/a/b/..", "/a/"},
		{"/a/.", "/a/"},
		{"/..", "/"},
		{"//double//slash", "//double//slash"},
		{"/a\\b", "/a/b"},
		{"/a b?c d", "/a%20b?c%20d"},
		{"/q?x='\"<>`{}", "/q?x=%27%22%3C%3E`{}"},
		{"/p\"<>`{}", "/p%22%3C%3E%60%7B%7D"},
		{"/é?é", "/%C3%A9?%C3%A9"},
		{"/f#frag", "/f"},
		{"/f?q=1#frag", "/f?q=1"},
		{"", "/"},
		{"http://example.com/abs?x=1", "/abs?x=1"},
		{"https://example.com", "/"},
	}
	for _, tc := range tests {
		if got := normalizeTarget(tc.target); got != tc.want {
			t.Errorf("normalizeTarget(%q) = %q, want %q", tc.target, got, tc.want)
		}
	}
	// Through a real request: RequestURI is used, as received.
	r := httptest.NewRequest("POST", "/x/./y?b=1&a=2", nil)
	if got := PathAndQuery(r); got != "/x/y?b=1&a=2" {
		t.Errorf("PathAndQuery = %q", got)
	}
	// A client-side request without RequestURI falls back to the URL.
	r2, _ := http.NewRequest("POST", "http://h/p?q=1", nil)
	if got := PathAndQuery(r2); got != "/p?q=1" {
		t.Errorf("PathAndQuery(client request) = %q", got)
	}
}

// ValidPrincipal is what Begin accepts: 1 to MaxPrincipalLength bytes of
// UTF-8.
func TestValidPrincipal(t *testing.T) {
	for p, want := range map[string]bool{
		"acct_42": true, "é": true, strings.Repeat("p", MaxPrincipalLength): true,
		"": false, "a\xffb": false, strings.Repeat("p", MaxPrincipalLength+1): false,
	} {
		if got := ValidPrincipal(p); got != want {
			t.Errorf("ValidPrincipal(%.20q) = %v", p, got)
		}
	}
}

func TestValidKey(t *testing.T) {
	ok := []string{"a", "8e03978e-40d5-43e8-bc93-6894a57f9324", " ", "~", strings.Repeat("k", 255), `"quoted"`}
	bad := []string{"", strings.Repeat("k", 256), "tab\t", "new\nline", "é", "\x7f", "nul\x00"}
	for _, k := range ok {
		if !ValidKey(k) {
			t.Errorf("ValidKey(%q) = false", k)
		}
	}
	for _, k := range bad {
		if ValidKey(k) {
			t.Errorf("ValidKey(%q) = true", k)
		}
	}
}

func TestHeaderValueJoinsLikeFetch(t *testing.T) {
	h := http.Header{}
	h.Add("X-Api-Version", "1")
	h.Add("x-api-version", "2")
	if got := HeaderValue(h, "x-api-version"); got != "1, 2" {
		t.Errorf("got %q", got)
	}
	if got := HeaderValue(h, "content-type"); got != "" {
		t.Errorf("absent header = %q", got)
	}
}
