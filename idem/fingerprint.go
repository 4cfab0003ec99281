package idem

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"strings"
	"unicode/utf8"
)

// MaxKeyLength is the longest Idempotency-Key accepted
// (docs/contract.md#2-key).
const MaxKeyLength = 255

// ValidKey reports whether key is 1 to 255 printable ASCII characters,
// ^[\x20-\x7e]{1,255}$ (docs/contract.md#2-key).
func ValidKey(key string) bool {
	if len(key) == 0 || len(key) > MaxKeyLength {
		return false
	}
	for i := 0; i < len(key); i++ {
		if key[i] < 0x20 || key[i] > 0x7e {
			return false
		}
	}
	return true
}

// HeaderValue returns what a Worker's Headers.get(name) returns for h: every
// value of the field, stripped of leading and trailing HTTP whitespace as
// Fetch normalizes it, joined by ", ", and decoded as UTF-8 the way workerd
// decodes header bytes (each ill-formed sequence one U+FFFD, as the WHATWG
// UTF-8 decoder does); "" when the field is absent.
func HeaderValue(h http.Header, name string) string {
	values := h.Values(name)
	if len(values) == 1 {
		return decodeUTF8(strings.Trim(values[0], httpWhitespace))
	}
	parts := make([]string, len(values))
	for i, v := range values {
		parts[i] = strings.Trim(v, httpWhitespace)
	}
	return decodeUTF8(strings.Join(parts, ", "))
}

// httpWhitespace is Fetch's HTTP whitespace.
const httpWhitespace = "\t\n\r "

// decodeUTF8 decodes s as the WHATWG UTF-8 decoder does: valid UTF-8 is
// kept, and each maximal ill-formed subsequence (a lead byte and the valid
// continuation bytes after it, or a stray byte) becomes one U+FFFD.
func decodeUTF8(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		if r, size := utf8.DecodeRuneInString(s[i:]); r != utf8.RuneError || size > 1 {
			b.WriteString(s[i : i+size])
			i += size
			continue
		}
		b.WriteRune(utf8.RuneError)
		i += illFormedLength(s[i:])
	}
	return b.String()
}

// illFormedLength is the length of the maximal ill-formed subsequence at the
// start of s, which does not begin with a valid UTF-8 sequence.
func illFormedLength(s string) int {
	c := s[0]
	var need int
	lo, hi := byte(0x80), byte(0xbf) // the bounds of the first continuation byte
	switch {
	case c >= 0xc2 && c <= 0xdf:
		need = 1
	case c == 0xe0:
		need, lo = 2, 0xa0
	case c == 0xed:
		need, hi = 2, 0x9f
	case c >= 0xe1 && c <= 0xef:
		need = 2
	case c == 0xf0:
		need, lo = 3, 0x90
	case c == 0xf4:
		need, hi = 3, 0x8f
	case c >= 0xf1 && c <= 0xf3:
		need = 3
	default:
		return 1
	}
	n := 1
	for ; n <= need && n < len(s); n++ {
		if s[n] < lo || s[n] > hi {
			break
		}
		lo, hi = 0x80, 0xbf
	}
	return n
}

// Fingerprint computes a request's fingerprint (docs/contract.md#3-fingerprint)
// byte for byte as a Worker running the spec does: the lowercase hex SHA-256
// of
//
//	METHOD "\n" pathAndQuery "\n" name1 ":" value1 "\n" ... nameN ":" valueN "\n" body
//
// where METHOD is upper-cased, each name is one of headerNames (lower-case,
// in order) with its value as HeaderValue gives it, and body is streamed into
// the hash as raw bytes. pathAndQuery is hashed as given: PathAndQuery
// derives it from a request as a Worker does.
func Fingerprint(method, pathAndQuery string, header http.Header, headerNames []string, body io.Reader) (string, error) {
	h := sha256.New()
	writePrefix(h, method, pathAndQuery, header, headerNames)
	if body != nil {
		if _, err := io.Copy(h, body); err != nil {
			return "", err
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func writePrefix(w io.Writer, method, pathAndQuery string, header http.Header, headerNames []string) {
	io.WriteString(w, strings.ToUpper(method))
	io.WriteString(w, "\n")
	io.WriteString(w, pathAndQuery)
	io.WriteString(w, "\n")
	for i, name := range headerNames {
		if i > 0 {
			io.WriteString(w, "\n")
		}
		io.WriteString(w, name)
		io.WriteString(w, ":")
		io.WriteString(w, HeaderValue(header, name))
	}
	io.WriteString(w, "\n")
}

// PathAndQuery returns url.pathname + url.search for the request as a
// Worker computes it from new URL(request.url): the request target as
// received (r.RequestURI), serialised as the WHATWG URL parser does. For a
// well-formed target that is the target verbatim; otherwise a fragment and
// an empty query are dropped, "." and ".." segments (also spelled %2e) are
// resolved, "\" is a path separator, and bytes outside the URL code points
// are percent-encoded (in the path, controls, space, '"', '<', '>', '`',
// '{', '}' and non-ASCII; in the query, controls, space, '"', '<', '>', the
// single quote and non-ASCII). Existing escapes and the query's parameters
// are kept exactly as sent.
func PathAndQuery(r *http.Request) string {
	target := r.RequestURI
	if target == "" && r.URL != nil {
		target = r.URL.RequestURI()
	}
	return normalizeTarget(target)
}

func normalizeTarget(target string) string {
	// Absolute form (a proxy request): drop scheme and authority.
	if i := strings.Index(target, "://"); i > 0 && !strings.ContainsAny(target[:i], "/?#") {
		rest := target[i+3:]
		if j := strings.IndexAny(rest, "/?#\\"); j >= 0 {
			target = rest[j:]
		} else {
			target = "/"
		}
	}
	if i := strings.IndexByte(target, '#'); i >= 0 {
		target = target[:i]
	}
	path, query, hasQuery := strings.Cut(target, "?")
	var b strings.Builder
	b.WriteString(normalizePath(path))
	if hasQuery && query != "" {
		b.WriteByte('?')
		percentEncode(&b, query, queryEscape)
	}
	return b.String()
}

func normalizePath(path string) string {
	path = strings.ReplaceAll(path, "\\", "/")
	path = strings.TrimPrefix(path, "/")
	var segs []string
	parts := strings.Split(path, "/")
	for i, seg := range parts {
		last := i == len(parts)-1
		switch {
		case isDoubleDot(seg):
			if len(segs) > 0 {
				segs = segs[:len(segs)-1]
			}
			if last {
				segs = append(segs, "")
			}
		case isSingleDot(seg):
			if last {
				segs = append(segs, "")
			}
		default:
			var b strings.Builder
			percentEncode(&b, seg, pathEscape)
			segs = append(segs, b.String())
		}
	}
	return "/" + strings.Join(segs, "/")
}

func isSingleDot(s string) bool { return s == "." || strings.EqualFold(s, "%2e") }

func isDoubleDot(s string) bool {
	switch strings.ToLower(s) {
	case "..", ".%2e", "%2e.", "%2e%2e":
		return true
	}
	return false
}

func pathEscape(c byte) bool {
	return c <= 0x20 || c >= 0x7f || c == '"' || c == '#' || c == '<' || c == '>' || c == '?' || c == '`' || c == '{' || c == '}'
}

func queryEscape(c byte) bool {
	return c <= 0x20 || c >= 0x7f || c == '"' || c == '#' || c == '<' || c == '>' || c == '\''
}

func percentEncode(b *strings.Builder, s string, escape func(byte) bool) {
	const hexUpper = "0123456789ABCDEF"
	for i := 0; i < len(s); i++ {
		c := s[i]
		if escape(c) {
			b.WriteByte('%')
			b.WriteByte(hexUpper[c>>4])
			b.WriteByte(hexUpper[c&0xf])
		} else {
			b.WriteByte(c)
		}
	}
}
