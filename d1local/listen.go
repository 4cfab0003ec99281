package d1local

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"
)

// Listening is a Server serving D1's REST API on a TCP address: what
// `d1idem local serve` runs, and the embedded D1 of its --local mode. Its
// String is its URL, never its token.
type Listening struct {
	// D1 is the server, for its databases (Databases, CreateDatabase).
	D1 *Server
	// URL is its base URL, "http://127.0.0.1:PORT", for
	// d1client.Config.BaseURL or CLOUDFLARE_BASE_URL.
	URL string
	// Addr is the address it listens on.
	Addr net.Addr

	http *http.Server
	done chan error // Serve's error
}

// Listen starts a Server of cfg serving on addr (a free loopback port when
// addr is ""). Close stops it.
func Listen(cfg Config, addr string) (*Listening, error) {
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	s, err := New(cfg)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		_ = s.Close()
		return nil, fmt.Errorf("listening on %s: %w", addr, err)
	}
	l := &Listening{D1: s, URL: "http://" + ln.Addr().String(), Addr: ln.Addr(), done: make(chan error, 1),
		http: &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}}
	go func() { l.done <- l.http.Serve(ln) }()
	return l, nil
}

// String is the server's URL.
func (l *Listening) String() string { return "d1local.Listening{URL:" + l.URL + "}" }

// Wait serves until ctx ends, then closes the server (nil unless closing
// fails), or until serving fails (its error, the server closed).
func (l *Listening) Wait(ctx context.Context) error {
	select {
	case err := <-l.done:
		l.done <- err
	case <-ctx.Done():
	}
	return l.Close()
}

// Close stops serving, within 5 seconds for the calls under way, and
// closes the databases. It returns why serving stopped, if it failed.
func (l *Listening) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := l.http.Shutdown(ctx)
	if serr := <-l.done; serr != nil && !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(serr, err)
	}
	l.done <- http.ErrServerClosed
	return errors.Join(err, l.D1.Close())
}
