package d1client

import (
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
)

// redacted stands for the API token wherever a Config is printed.
const redacted = "[REDACTED]"

// redactToken returns what is printed for the token: redacted, or "" when
// none is set.
func redactToken(token string) string {
	if token == "" {
		return ""
	}
	return redacted
}

// configView is a Config as it is printed: the same fields (a type of its
// own has none of Config's methods, so fmt prints them), the token and the
// bridge URL's secret replaced.
type configView Config

func (c Config) view() configView {
	v := configView(c)
	v.APIToken = redactToken(c.APIToken)
	v.BridgeURL = redactURL(c.BridgeURL)
	return v
}

// String formats the configuration as %+v would, with the API token
// replaced by "[REDACTED]".
func (c Config) String() string { return fmt.Sprintf("%+v", c.view()) }

// GoString formats the configuration as %#v would, with the API token
// replaced by "[REDACTED]".
func (c Config) GoString() string {
	return strings.Replace(fmt.Sprintf("%#v", c.view()), "d1client.configView", "d1client.Config", 1)
}

// Format implements fmt.Formatter: %#v is GoString, %q the quoted String,
// and every other verb String. None shows the API token.
func (c Config) Format(f fmt.State, verb rune) { formatWith(f, verb, c.String(), c.GoString()) }

// LogValue implements slog.LogValuer, without the API token.
func (c Config) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("base_url", c.BaseURL),
		slog.String("bridge_url", redactURL(c.BridgeURL)),
		slog.String("api_token", redactToken(c.APIToken)),
		slog.String("account_id", c.AccountID),
		slog.String("database_id", c.DatabaseID),
		slog.Duration("attempt_timeout", c.AttemptTimeout),
		slog.String("budget", c.Budget.String()),
	)
}

// String describes the client: the database it reaches and where.
func (c *Client) String() string {
	return fmt.Sprintf("d1client.Client{BaseURL:%s AccountID:%s DatabaseID:%s}", c.cfg.BaseURL, c.cfg.AccountID, c.cfg.DatabaseID)
}

// GoString describes the client as Go syntax, without its state.
func (c *Client) GoString() string {
	return fmt.Sprintf("&d1client.Client{BaseURL:%q, AccountID:%q, DatabaseID:%q}", c.cfg.BaseURL, c.cfg.AccountID, c.cfg.DatabaseID)
}

// Format implements fmt.Formatter: %#v is GoString, %q the quoted String,
// and every other verb String. None shows the API token.
func (c *Client) Format(f fmt.State, verb rune) { formatWith(f, verb, c.String(), c.GoString()) }

// LogValue implements slog.LogValuer, without the API token.
func (c *Client) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("base_url", c.cfg.BaseURL),
		slog.String("account_id", c.cfg.AccountID),
		slog.String("database_id", c.cfg.DatabaseID),
	)
}

func formatWith(f fmt.State, verb rune, s, gs string) {
	switch {
	case verb == 'v' && f.Flag('#'):
		io.WriteString(f, gs)
	case verb == 'q':
		io.WriteString(f, strconv.Quote(s))
	default:
		io.WriteString(f, s)
	}
}
