package d1client

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"
)

// zeros reads as an endless run of zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// readBody returns the whole body whatever Content-Length announced, and
// stops one byte past the limit, which the caller reports.
func TestReadBody(t *testing.T) {
	for _, tc := range []struct {
		name   string
		body   string
		length int64
	}{
		{"as announced", `{"success":true}`, 16},
		{"longer than announced", `{"success":true}`, 5},
		{"unannounced", `{"success":true}`, -1},
		{"empty", "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := readBody(&http.Response{Body: io.NopCloser(strings.NewReader(tc.body)), ContentLength: tc.length})
			if err != nil || string(got) != tc.body {
				t.Errorf("readBody = %q, %v; want %q", got, err, tc.body)
			}
		})
	}
	t.Run("shorter than announced", func(t *testing.T) {
		if _, err := readBody(&http.Response{Body: io.NopCloser(strings.NewReader("{}")), ContentLength: 10}); err == nil {
			t.Error("a body shorter than its Content-Length was accepted")
		}
	})
	for _, length := range []int64{-1, maxResponseBytes} {
		got, err := readBody(&http.Response{Body: io.NopCloser(io.LimitReader(zeros{}, maxResponseBytes+100)), ContentLength: length})
		if err != nil || len(got) != maxResponseBytes+1 || !bytes.Equal(got[:8], make([]byte, 8)) {
			t.Errorf("Content-Length %d, body over the limit: read %d bytes, %v; want %d", length, len(got), err, maxResponseBytes+1)
		}
	}
}
