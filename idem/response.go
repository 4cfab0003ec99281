package idem

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/d1idem/d1idem/d1client"
)

// ErrUnreadableRecord is returned when a completed row cannot be turned back
// into a response (its response_headers is not a JSON object of strings).
// The request must fail rather than re-execute or replay something else.
var ErrUnreadableRecord = errors.New("idem: stored response is unreadable")

// nullBodyStatuses never carry a body (the spec's NULL_BODY_STATUSES).
func nullBodyStatus(status int) bool {
	return status == http.StatusNoContent || status == http.StatusResetContent || status == http.StatusNotModified
}

// storedRow is the lookup's view of a ledger row.
type storedRow struct {
	fingerprint     string
	status          string
	generation      int64
	responseStatus  *int64
	responseBody    *string
	responseHeaders *string
}

func (r *storedRow) scan(row d1client.Row) error {
	return row.Scan(&r.fingerprint, &r.status, &r.generation, &r.responseStatus, &r.responseBody, &r.responseHeaders)
}

// response reconstructs a completed row's response the way the spec's
// replayResponse does: status (500 when null), the stored headers (never
// set-cookie or connection headers, whoever wrote the row), and the body
// unless the status forbids one.
func (r *storedRow) response() (*Response, error) {
	status := http.StatusInternalServerError
	if r.responseStatus != nil {
		status = int(*r.responseStatus)
	}
	header, err := decodeHeaders(r.responseHeaders)
	if err != nil {
		return nil, err
	}
	resp := &Response{Status: status, Header: header}
	if r.responseBody != nil && !nullBodyStatus(status) {
		resp.Body = []byte(*r.responseBody)
	}
	return resp, nil
}

func decodeHeaders(s *string) (http.Header, error) {
	h := http.Header{}
	if s == nil || *s == "" {
		return h, nil
	}
	var m map[string]string
	if err := json.Unmarshal([]byte(*s), &m); err != nil {
		return nil, fmt.Errorf("%w: response_headers: %v", ErrUnreadableRecord, err)
	}
	for name, v := range m {
		if neverReplayed[strings.ToLower(name)] {
			continue
		}
		h.Set(name, v)
	}
	return h, nil
}

// normalize applies the spec's completion rules to a handler's response. It
// returns what this caller gets, the response_headers JSON, and the body to
// store (nil for SQL NULL).
//
// A body over MaxStoredBody bytes is not stored: the row records status 500
// with a null body, and the caller gets that too, so a replay never serves a
// truncated body. A body that is not valid UTF-8 cannot live in the TEXT
// column without being altered, so it is treated the same way.
func (l *Ledger) normalize(resp Response) (Response, string, *string) {
	if resp.Status == 0 {
		resp.Status = http.StatusOK
	}
	headersJSON := captureHeaders(resp.Header, l.cfg.ReplayableHeaders)
	if len(resp.Body) > l.cfg.MaxStoredBody || !utf8.Valid(resp.Body) {
		h, _ := decodeHeaders(&headersJSON)
		return Response{Status: http.StatusInternalServerError, Header: h}, headersJSON, nil
	}
	body := string(resp.Body)
	out := resp
	if nullBodyStatus(resp.Status) {
		out.Body = nil
	}
	return out, headersJSON, &body
}

// captureHeaders is the spec's captureHeaders: a JSON object of the
// replayable headers present on the response, in allowlist order, each value
// as Fetch's Headers.get gives it, encoded as JSON.stringify encodes it.
func captureHeaders(h http.Header, names []string) string {
	var b strings.Builder
	b.WriteByte('{')
	first := true
	for _, name := range names {
		if len(h.Values(name)) == 0 {
			continue
		}
		if !first {
			b.WriteByte(',')
		}
		first = false
		writeJSString(&b, name)
		b.WriteByte(':')
		writeJSString(&b, strings.ToValidUTF8(HeaderValue(h, name), "\uFFFD"))
	}
	b.WriteByte('}')
	return b.String()
}

// writeJSString writes s as JavaScript's JSON.stringify would (Go's encoder
// also escapes U+2028 and U+2029, which JSON.stringify leaves alone).
func writeJSString(b *strings.Builder, s string) {
	const hex = "0123456789abcdef"
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch c {
		case '"', '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		default:
			if c < 0x20 {
				b.WriteString(`\u00`)
				b.WriteByte(hex[c>>4])
				b.WriteByte(hex[c&0xf])
			} else {
				b.WriteByte(c)
			}
		}
	}
	b.WriteByte('"')
}
