package console

import (
	"context"
	"errors"
	"net/http"
	"testing"
)

// TestListen: without a token Listen takes a loopback address only, and
// refuses any other before listening on it; with one, any.
func TestListen(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:0", ":0", "[::]:0", "192.0.2.1:0", "console.example:0"} {
		if ln, err := Listen(addr, ""); !errors.Is(err, ErrNotLoopback) {
			if ln != nil {
				ln.Close()
			}
			t.Errorf("Listen(%q) without a token: %v, want ErrNotLoopback", addr, err)
		}
	}
	for _, tc := range []struct{ addr, token string }{{"127.0.0.1:0", ""}, {"localhost:0", ""}, {"0.0.0.0:0", "a-token-of-32-bytes-0123456789ab"}} {
		ln, err := Listen(tc.addr, tc.token)
		if err != nil {
			t.Errorf("Listen(%q, token %t): %v", tc.addr, tc.token != "", err)
			continue
		}
		ln.Close()
	}
}

// TestServe: Serve serves until its context ends, then returns nil, and
// the address is free again.
func TestServe(t *testing.T) {
	ln, err := Listen("127.0.0.1:0", "")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Serve(ctx, ln, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusTeapot) }))
	}()
	res, err := http.Get("http://" + ln.Addr().String() + "/")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusTeapot {
		t.Errorf("GET: %d", res.StatusCode)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Serve after its context ended: %v", err)
	}
	again, err := Listen(ln.Addr().String(), "")
	if err != nil {
		t.Fatalf("the address is still taken: %v", err)
	}
	again.Close()
}
