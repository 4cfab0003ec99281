package console

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/d1idem/d1idem/internal/loopback"
)

// ErrNotLoopback is the error of Listen for an address other than a
// loopback one without a token: anyone who can reach it could read the
// ledger.
var ErrNotLoopback = errors.New("not a loopback address")

// Listen listens on addr (host:port) for the console. Without a token it
// accepts a loopback address only (127.0.0.1, [::1], localhost), and
// refuses any other with ErrNotLoopback before listening on it.
func Listen(addr, token string) (net.Listener, error) {
	if token == "" && !loopback.Host(addr) {
		return nil, fmt.Errorf("console: %s is %w: anyone who can reach it could read the ledger", addr, ErrNotLoopback)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("console: listening on %s: %w", addr, err)
	}
	// A name such as localhost could resolve to an address that is not.
	if tcp, ok := ln.Addr().(*net.TCPAddr); token == "" && (!ok || !tcp.IP.IsLoopback()) {
		ln.Close()
		return nil, fmt.Errorf("console: %s listens on %s, which is %w", addr, ln.Addr(), ErrNotLoopback)
	}
	return ln, nil
}

// Serve serves h on ln until ctx ends, which is a clean stop: it then
// closes the server and returns nil.
func Serve(ctx context.Context, ln net.Listener, h http.Handler) error {
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	stop := context.AfterFunc(ctx, func() { _ = hs.Close() })
	defer stop()
	if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("console: %w", err)
	}
	return nil
}
