package idem

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/internal/jsonstr"
)

// ErrUnreadableRecord is returned when a completed row cannot be turned back
// into a response (its response_headers is not a JSON object of strings).
// The request must fail rather than re-execute or replay something else.
var ErrUnreadableRecord = errors.New("idem: stored response is unreadable")

// nullBodyStatus reports whether status never carries a body
// (docs/contract.md#6-responses).
func nullBodyStatus(status int) bool {
	return status == http.StatusNoContent || status == http.StatusResetContent || status == http.StatusNotModified
}

// storedRow is the lookup's view of a ledger row, with the ledger clock's
// time of the read (milliseconds since the epoch, as the row's times).
type storedRow struct {
	fingerprint          string
	status               Status
	generation           int64
	responseStatus       *int64
	responseBody         *string
	responseHeaders      *string
	createdAt, updatedAt int64
	now                  int64
}

// scan reads the lookup's columns.
func (r *storedRow) scan(row d1client.Row) error {
	return row.Scan(&r.fingerprint, (*string)(&r.status), &r.generation, &r.responseStatus, &r.responseBody, &r.responseHeaders,
		&r.createdAt, &r.updatedAt, &r.now)
}

// stale reports whether a pending row is older than ttl: a retry with the
// same fingerprint may take it over.
func (r *storedRow) stale(ttl time.Duration) bool {
	return r.updatedAt < r.now-ttl.Milliseconds()
}

// response reconstructs a completed row's response as a Worker replays it
// (docs/contract.md#6-responses): status (500 when null), the stored headers
// but those never replayed, and the body unless the status forbids one. A
// status outside 200-599 makes the row unreadable.
func (r *storedRow) response() (*Response, error) {
	status := http.StatusInternalServerError
	if r.responseStatus != nil {
		if !replayableStatus(*r.responseStatus) {
			return nil, fmt.Errorf("%w: response_status %d is not a status a response can be replayed with", ErrUnreadableRecord, *r.responseStatus)
		}
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

// replayableStatus reports whether a response with this status can be
// replayed by this package and a Worker (a Fetch Response's is 200-599).
func replayableStatus[T int | int64](status T) bool { return status >= 200 && status <= 599 }

// decodeHeaders turns a stored response_headers object into header fields.
// Values come back as UTF-8, as workerd sends them (see captureHeaders).
func decodeHeaders(s *string) (http.Header, error) {
	h := http.Header{}
	if s == nil {
		return h, nil // SQL NULL: the spec's Worker reads it as {}
	}
	// Anything but a JSON object of strings ("", "null", "[]") is a row the
	// spec's Worker cannot replay either: JSON.parse throws, or Headers
	// refuses what it returns.
	var m map[string]string
	if err := json.Unmarshal([]byte(*s), &m); err != nil || m == nil {
		if err == nil {
			err = fmt.Errorf("%s is not a JSON object", strconv.Quote(*s))
		}
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

// normalize applies the completion rules (docs/contract.md#6-responses) to
// a handler's response, and returns what this caller gets, the
// response_headers JSON, and the body to store (nil for SQL NULL), as
// Complete says.
func (l *Ledger) normalize(resp Response) (Response, string, *string) {
	if resp.Status == 0 {
		resp.Status = http.StatusOK
	}
	headersJSON := captureHeaders(resp.Header, l.cfg.ReplayableHeaders)
	if len(resp.Body) > l.cfg.MaxStoredBody || !utf8.Valid(resp.Body) || !replayableStatus(resp.Status) {
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

// captureHeaders encodes response_headers (docs/contract.md#6-responses): a
// JSON object of the replayable headers present on the response, in
// allowlist order, each value as a Worker's Headers.get gives it (see
// HeaderValue), encoded as JSON.stringify encodes it; so a row replays
// identically whoever wrote it and whoever replays it.
func captureHeaders(h http.Header, names []string) string {
	b := []byte{'{'}
	for _, name := range names {
		if len(h.Values(name)) == 0 {
			continue
		}
		if len(b) > 1 {
			b = append(b, ',')
		}
		b = appendJSString(b, name)
		b = append(b, ':')
		b = appendJSString(b, HeaderValue(h, name))
	}
	return string(append(b, '}'))
}

// appendJSString appends s as JavaScript's JSON.stringify writes it (which,
// unlike Go's encoder, leaves U+2028 and U+2029 alone).
func appendJSString(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == '"' || c == '\\' {
			b = jsonstr.AppendEscaped(b, c)
		} else {
			b = append(b, c)
		}
	}
	return append(b, '"')
}
