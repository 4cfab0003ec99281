// Package d1localtest runs a d1local server for tests, the way
// net/http/httptest runs an HTTP server: New starts one on a loopback port,
// with a ready d1client.Client, and the test's cleanup stops it.
//
//	func TestOrders(t *testing.T) {
//		srv := d1localtest.New(t, d1localtest.WithSchema())
//		api := orders.NewAPI(srv.Client) // the code under test, on a local D1
//		...
//	}
//
// Databases live in memory unless WithConfig sets a directory. The server
// speaks the D1 REST API (see package d1local), so code that takes a base
// URL instead of a client can use URL, AccountID and DatabaseID, as it would
// use Cloudflare's.
//
// # API stability
//
// New, Start, the options and Server follow the module's semantic
// versioning; what the server answers is package d1local's.
package d1localtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/d1idem/d1idem"
	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1client/budget"
	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/internal/redact"
)

// DatabaseID is the database Server.Client uses unless WithDatabaseID says
// otherwise.
const DatabaseID = "test"

// Server is a d1local server on a loopback port. Printed (fmt, slog,
// json.Marshal), it never shows its Token.
type Server struct {
	// URL is the server's base URL, "http://127.0.0.1:<port>", for
	// d1client.Config.BaseURL, CLOUDFLARE_BASE_URL or
	// CLOUDFLARE_API_BASE_URL (which may also carry the /client/v4 suffix).
	URL string
	// AccountID is the account ID of Client (d1local accepts any).
	AccountID string
	// DatabaseID is the database of Client.
	DatabaseID string
	// Token is the API token Client sends: the one WithConfig configured,
	// or "" when the server requires none.
	Token string
	// Client is a d1client.Client for DatabaseID, with no request budget.
	Client *d1client.Client
	// D1 is the d1local server itself: for fault injection (Inject), call
	// counts and database management.
	D1 *d1local.Server

	ts        *httptest.Server
	closeOnce sync.Once
	closeErr  error
}

// Option configures New and Start.
type Option func(*options)

type options struct {
	cfg        d1local.Config
	databaseID string
	schema     bool
}

// WithConfig starts d1local with cfg (a directory, a token, faults, an API
// budget, ...) instead of the default in-memory configuration.
func WithConfig(cfg d1local.Config) Option {
	return func(o *options) { o.cfg = cfg }
}

// WithDatabaseID makes Client use the database id instead of DatabaseID.
func WithDatabaseID(id string) Option {
	return func(o *options) { o.databaseID = id }
}

// WithSchema applies the idempotency ledger's schema (schema.sql, see
// d1idem.Schema) to Client's database before New returns.
func WithSchema() Option {
	return func(o *options) { o.schema = true }
}

// New starts a Server for the test t; it is closed when t ends (or by
// Close). Any failure to start ends the test.
func New(t testing.TB, opts ...Option) *Server {
	t.Helper()
	s, err := Start(opts...)
	if err != nil {
		t.Fatalf("d1localtest: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("d1localtest: %v", err)
		}
	})
	return s
}

// Start starts a Server outside a test, for a TestMain or an example. The
// caller must Close it.
func Start(opts ...Option) (*Server, error) {
	o := options{databaseID: DatabaseID}
	for _, opt := range opts {
		opt(&o)
	}
	d, err := d1local.New(o.cfg)
	if err != nil {
		return nil, err
	}
	if o.cfg.NoAutoCreate {
		if err := d.CreateDatabase(o.databaseID); err != nil {
			d.Close()
			return nil, err
		}
	}
	account := o.cfg.AccountID
	if account == "" {
		account = d1local.DefaultAccountID
	}
	s := &Server{AccountID: account, DatabaseID: o.databaseID, Token: o.cfg.Token, D1: d, ts: httptest.NewServer(d)}
	s.URL = s.ts.URL
	if s.Client, err = s.NewClient(o.databaseID); err != nil {
		s.Close()
		return nil, err
	}
	if o.schema {
		if err := applySchema(s.Client); err != nil {
			s.Close()
			return nil, err
		}
	}
	return s, nil
}

// NewClient returns a d1client.Client for another database of the server,
// configured as Client is; mods adjust its configuration first.
func (s *Server) NewClient(databaseID string, mods ...func(*d1client.Config)) (*d1client.Client, error) {
	cfg := d1client.Config{
		BaseURL:    s.URL,
		APIToken:   s.Token,
		AccountID:  s.AccountID,
		DatabaseID: databaseID,
		HTTPClient: s.ts.Client(),
	}
	unlimited(&cfg)
	for _, m := range mods {
		m(&cfg)
	}
	return d1client.New(cfg)
}

// unlimited gives cfg no request budget: d1local has no API limit unless
// its Config.RateLimit sets one.
func unlimited(cfg *d1client.Config) {
	cfg.Budget = budget.Unlimited()
}

// applySchema runs the ledger schema's statements as one batch.
func applySchema(c *d1client.Client) error {
	var stmts []d1client.Statement
	for _, sql := range d1idem.SchemaStatements() {
		stmts = append(stmts, d1client.Statement{SQL: sql})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.Exec(ctx, stmts); err != nil {
		return fmt.Errorf("applying the ledger schema: %w", err)
	}
	return nil
}

// Close stops the server and closes its databases. It is safe to call
// more than once.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		s.ts.Close()
		if err := s.D1.Close(); err != nil {
			s.closeErr = errors.Join(errors.New("closing d1local"), err)
		}
	})
	return s.closeErr
}

// String describes the server by its URL and database, without its token.
func (s *Server) String() string {
	return fmt.Sprintf("d1localtest.Server{URL:%s AccountID:%s DatabaseID:%s}", s.URL, s.AccountID, s.DatabaseID)
}

// Format implements fmt.Formatter: every verb prints String (%q quoted),
// so that no verb shows the token.
func (s *Server) Format(f fmt.State, verb rune) { redact.Format(f, verb, s) }

// LogValue implements slog.LogValuer, without the token.
func (s *Server) LogValue() slog.Value {
	return slog.GroupValue(slog.String("url", s.URL), slog.String("account_id", s.AccountID), slog.String("database_id", s.DatabaseID))
}

// MarshalJSON implements json.Marshaler, with what LogValue shows.
func (s *Server) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct{ URL, AccountID, DatabaseID string }{s.URL, s.AccountID, s.DatabaseID})
}
