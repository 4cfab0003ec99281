package d1local

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"

	"github.com/d1idem/d1idem/internal/redact"
)

// configView is a Config as it is printed: the same fields (a type of its
// own has none of Config's methods, so fmt prints them), the token
// replaced.
type configView Config

func (c Config) view() configView {
	v := configView(c)
	v.Token = redact.Token(c.Token)
	return v
}

// String formats the configuration as %+v would, with the token replaced
// by "[REDACTED]".
func (c Config) String() string { return fmt.Sprintf("%+v", c.view()) }

// GoString formats the configuration as %#v would, with the token replaced
// by "[REDACTED]".
func (c Config) GoString() string {
	return strings.Replace(fmt.Sprintf("%#v", c.view()), "d1local.configView", "d1local.Config", 1)
}

// Format implements fmt.Formatter: %#v is GoString, %q the quoted String,
// and every other verb String. None shows the token.
func (c Config) Format(f fmt.State, verb rune) { redact.Format(f, verb, c) }

// LogValue implements slog.LogValuer, without the token.
func (c Config) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("dir", c.Dir),
		slog.String("token", redact.Token(c.Token)),
		slog.Bool("no_auto_create", c.NoAutoCreate),
		slog.String("account_id", c.AccountID),
		slog.Int("rate_limit", c.RateLimit.Limit),
		slog.Duration("rate_limit_window", c.RateLimit.Window),
		slog.Int("max_open_databases", c.MaxOpenDatabases),
	)
}

// MarshalJSON implements json.Marshaler, so that json.Marshal and slog's
// JSON handler (for a Config inside another value) never show the token:
// the fields that are data, named as json.Marshal names them, with the
// token replaced by "[REDACTED]". Now, Faults and Logger are left out.
func (c Config) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Dir, Token       string
		NoAutoCreate     bool
		AccountID        string
		RateLimit        RateLimit
		MaxOpenDatabases int
	}{c.Dir, redact.Token(c.Token), c.NoAutoCreate, c.AccountID, c.RateLimit, c.MaxOpenDatabases})
}

// String describes the server by where it keeps its databases and the
// account it reports, without its token.
func (s *Server) String() string {
	return fmt.Sprintf("d1local.Server{Dir:%s AccountID:%s}", s.cfg.Dir, s.account)
}

// GoString describes the server as Go syntax, without its state.
func (s *Server) GoString() string {
	return fmt.Sprintf("&d1local.Server{Dir:%q, AccountID:%q}", s.cfg.Dir, s.account)
}

// Format implements fmt.Formatter: %#v is GoString, %q the quoted String,
// and every other verb String. None shows the token.
func (s *Server) Format(f fmt.State, verb rune) { redact.Format(f, verb, s) }

// LogValue implements slog.LogValuer, without the token.
func (s *Server) LogValue() slog.Value {
	return slog.GroupValue(slog.String("dir", s.cfg.Dir), slog.String("account_id", s.account))
}

// MarshalJSON implements json.Marshaler, with what LogValue shows.
func (s *Server) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct{ Dir, AccountID string }{s.cfg.Dir, s.account})
}
