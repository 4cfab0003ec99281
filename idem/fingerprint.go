package idem

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"strings"
	"unicode/utf8"
)

// MaxKeyLength is the longest Idempotency-Key accepted.
const MaxKeyLength = 255

// ValidKey reports whether key matches ^[\x20-\x7e]{1,255}$ (docs/contract.md#2-key).
func ValidKey(key string) bool {
	unprintable := func(c rune) bool { return c < 0x20 || c > 0x7e }
	return len(key) > 0 && len(key) <= MaxKeyLength && strings.IndexFunc(key, unprintable) < 0
}

// HeaderValue returns what a Worker's Headers.get(name) returns for h: the field's values trimmed of
// HTTP whitespace, joined by ", " and decoded as UTF-8 as workerd does; "" when the field is absent.
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

const httpWhitespace = "\t\n\r "

// decodeUTF8 decodes s as the WHATWG UTF-8 decoder does: each maximal ill-formed subsequence (a
// valid sequence's longest prefix, or a stray byte) becomes one U+FFFD.
func decodeUTF8(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			// A proper prefix of a valid sequence is not a full rune.
			for n < min(3, len(s)-i) && !utf8.FullRuneInString(s[i:i+n+1]) {
				n++
			}
			b.WriteRune(utf8.RuneError)
		} else {
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// Fingerprint computes a request's fingerprint (docs/contract.md#3-fingerprint) as a Worker running
// the spec does, byte for byte: the lowercase hex SHA-256 of
//
//	METHOD "\n" pathAndQuery "\n" name1 ":" value1 "\n" ... nameN ":" valueN "\n" body
//
// where METHOD is upper-cased, each name is one of headerNames (lower-case, in order) with its value
// as HeaderValue gives it, and body is streamed in as raw bytes. PathAndQuery derives pathAndQuery.
func Fingerprint(method, pathAndQuery string, header http.Header, headerNames []string, body io.Reader) (string, error) {
	fields := make([]string, len(headerNames))
	for i, name := range headerNames {
		fields[i] = name + ":" + HeaderValue(header, name)
	}
	h := sha256.New()
	io.WriteString(h, strings.ToUpper(method)+"\n"+pathAndQuery+"\n"+strings.Join(fields, "\n")+"\n")
	if body != nil {
		if _, err := io.Copy(h, body); err != nil {
			return "", err
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// PathAndQuery returns url.pathname + url.search as a Worker's WHATWG URL parser computes them from
// r.RequestURI: no fragment or empty query, dot segments resolved, "\" a separator, bytes outside
// the URL code points percent-encoded, all else kept as sent.
func PathAndQuery(r *http.Request) string {
	target := r.RequestURI
	if target == "" && r.URL != nil {
		target = r.URL.RequestURI()
	}
	return normalizeTarget(target)
}

// Bytes percent-encoded in the path and the query, besides controls, space and non-ASCII.
const (
	pathEscapes  = "\"#<>?`{}"
	queryEscapes = "\"#<>'"
)

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
	path, query, _ := strings.Cut(target, "?")
	if query != "" {
		return normalizePath(path) + "?" + percentEncode(query, queryEscapes)
	}
	return normalizePath(path)
}

func normalizePath(path string) string {
	parts := strings.Split(strings.TrimPrefix(strings.ReplaceAll(path, "\\", "/"), "/"), "/")
	var segs []string
	for i, seg := range parts {
		switch strings.ToLower(seg) {
		case "..", ".%2e", "%2e.", "%2e%2e":
			segs = segs[:max(len(segs)-1, 0)]
			fallthrough
		case ".", "%2e":
			if i == len(parts)-1 {
				segs = append(segs, "")
			}
		default:
			segs = append(segs, percentEncode(seg, pathEscapes))
		}
	}
	return "/" + strings.Join(segs, "/")
}

func percentEncode(s, escapes string) string {
	const hexUpper = "0123456789ABCDEF"
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= 0x20 || c >= 0x7f || strings.IndexByte(escapes, c) >= 0 {
			b.Write([]byte{'%', hexUpper[c>>4], hexUpper[c&0xf]})
		} else {
			b.WriteByte(c)
		}
	}
	return b.String()
}
