package idem

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/internal/jsonstr"
)

// ErrUnreadableRecord: a completed row cannot be replayed; the request must fail, not re-execute.
var ErrUnreadableRecord = errors.New("idem: stored response is unreadable")

func nullBodyStatus(status int) bool {
	return status == http.StatusNoContent || status == http.StatusResetContent || status == http.StatusNotModified
}

// storedRow is the lookup's view of a ledger row; times in ms since the epoch.
type storedRow struct {
	fingerprint          string
	status               Status
	generation           int64
	responseStatus       *int64
	responseBody         *string
	responseHeaders      *string
	createdAt, updatedAt int64
	now                  int64 // the ledger clock's time of the read
}

func (r *storedRow) scan(row d1client.Row) error {
	return row.Scan(&r.fingerprint, (*string)(&r.status), &r.generation, &r.responseStatus, &r.responseBody, &r.responseHeaders,
		&r.createdAt, &r.updatedAt, &r.now)
}

// response rebuilds a completed row's response as a Worker replays it (docs/contract.md#6-responses).
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

// replayableStatus reports whether a Fetch Response can have this status.
func replayableStatus[T int | int64](status T) bool { return status >= 200 && status <= 599 }

// decodeHeaders turns a stored response_headers object into header fields;
// NULL reads as {}, anything but a JSON object of strings is unreadable.
func decodeHeaders(s *string) (http.Header, error) {
	h := http.Header{}
	if s == nil {
		return h, nil
	}
	var m map[string]string
	if err := json.Unmarshal([]byte(*s), &m); err != nil || m == nil {
		if err == nil {
			err = fmt.Errorf("%s is not a JSON object", strconv.Quote(*s))
		}
		return nil, fmt.Errorf("%w: response_headers: %v", ErrUnreadableRecord, err)
	}
	for name, v := range m {
		if !neverReplayed[strings.ToLower(name)] {
			h.Set(name, v)
		}
	}
	return h, nil
}

// normalize applies the completion rules (docs/contract.md#6-responses): it
// returns what the caller gets, response_headers (the replayable headers),
// and the body (nil: the sentinel, and why in unstored).
func (l *Ledger) normalize(resp Response, replayable []string) (_ Response, headersJSON string, body *string, unstored string) {
	resp.Status = cmp.Or(resp.Status, http.StatusOK)
	headersJSON = captureHeaders(resp.Header, replayable)
	switch {
	case len(resp.Body) > l.cfg.MaxStoredBody:
		unstored = fmt.Sprintf("the body of %d bytes is over Config.MaxStoredBody (%d)", len(resp.Body), l.cfg.MaxStoredBody)
	case !utf8.Valid(resp.Body):
		unstored = "the body is not valid UTF-8 (the stored body is text)"
	case !replayableStatus(resp.Status):
		unstored = fmt.Sprintf("the status %d cannot be replayed (200-599)", resp.Status)
	}
	if unstored != "" {
		h, _ := decodeHeaders(&headersJSON)
		return Response{Status: http.StatusInternalServerError, Header: h}, headersJSON, nil, unstored
	}
	b := string(resp.Body)
	if nullBodyStatus(resp.Status) {
		resp.Body = nil
	}
	return resp, headersJSON, &b, ""
}

// captureHeaders encodes response_headers as a Worker does: replayable headers present, in order.
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

// appendJSString appends s as JSON.stringify does (leaving U+2028 and U+2029 alone, unlike Go).
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
