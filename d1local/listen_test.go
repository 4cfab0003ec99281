package d1local_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/d1idem/d1idem/d1local"
)

// TestListen: a Listening server answers on its URL, on a loopback port
// by default, prints as its URL without its token, and stops serving at
// Close or when Wait's context ends.
func TestListen(t *testing.T) {
	l, err := d1local.Listen(d1local.Config{Token: "secret-token"}, "")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(l.URL, "http://127.0.0.1:") || strings.Contains(l.String(), "secret-token") {
		t.Errorf("URL %s, String %s", l.URL, l)
	}
	resp, err := http.Get(l.URL + "/client/v4/accounts/a/d1/database")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden { // no token: D1's 403 code 10000
		t.Errorf("status %d", resp.StatusCode)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := l.Wait(ctx); err != nil {
		t.Errorf("Wait: %v", err)
	}
	if _, err := http.Get(l.URL); err == nil {
		t.Error("still serving after Wait")
	}
}
