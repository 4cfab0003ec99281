// Package embedded runs d1local in process on a loopback port: the embedded
// default of the CLI's --local mode and the demo.
package embedded

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1client/budget"
	"github.com/d1idem/d1idem/d1local"
)

// AccountID is the account ID used with an embedded server (d1local does not
// check it).
const AccountID = "00000000000000000000000000000000"

// DatabaseID is the database ID used when none is given.
const DatabaseID = "local"

// Server is a d1local server listening on 127.0.0.1.
type Server struct {
	// URL is the server's base URL, for d1client.Config.BaseURL or
	// CLOUDFLARE_BASE_URL.
	URL   string
	D1    *d1local.Server
	http  *http.Server
	ln    net.Listener
	done  chan error
	token string
}

// Format implements fmt.Formatter: whatever the verb, a Server prints as
// its URL, never with its token.
func (s *Server) Format(f fmt.State, _ rune) { fmt.Fprintf(f, "embedded.Server{URL:%s}", s.URL) }

// Start starts d1local with cfg on addr ("127.0.0.1:0" when empty).
func Start(cfg d1local.Config, addr string) (*Server, error) {
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	d, err := d1local.New(cfg)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		_ = d.Close()
		return nil, fmt.Errorf("listening on %s: %w", addr, err)
	}
	s := &Server{URL: "http://" + ln.Addr().String(), D1: d, ln: ln, done: make(chan error, 1), token: cfg.Token,
		http: &http.Server{Handler: d, ReadHeaderTimeout: 10 * time.Second}}
	go func() { s.done <- s.http.Serve(ln) }()
	return s, nil
}

// Client returns a d1client for one of the server's databases, with an
// unlimited request budget (there is no API limit to respect locally).
func (s *Server) Client(databaseID string, mod ...func(*d1client.Config)) (*d1client.Client, error) {
	if databaseID == "" {
		databaseID = DatabaseID
	}
	cfg := d1client.Config{BaseURL: s.URL, APIToken: s.token, AccountID: AccountID, DatabaseID: databaseID, Budget: budget.Unlimited()}
	for _, m := range mod {
		m(&cfg)
	}
	return d1client.New(cfg)
}

// Close stops the server and closes its databases.
func (s *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := s.http.Shutdown(ctx)
	if serr := <-s.done; serr != nil && !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	return errors.Join(err, s.D1.Close())
}
