package d1client

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/d1idem/d1idem/internal/redact"
)

// opaqueToken is the length from which a token (Cloudflare's have 40
// characters) is redacted even glued to other words ("Bearer%20TOKEN").
const opaqueToken = 16

// redactText returns s with the token replaced by redact.Redacted; a token
// shorter than opaqueToken only as a whole word ("local" leaves "localhost" alone).
func redactText(s, tok string) string {
	if tok == "" || !strings.Contains(s, tok) {
		return s
	}
	if len(tok) >= opaqueToken {
		return strings.ReplaceAll(s, tok, redact.Redacted)
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		end := i + len(tok)
		glued := (i > 0 && wordByte(s[i-1]) && wordByte(tok[0])) ||
			(end < len(s) && wordByte(s[end]) && wordByte(tok[len(tok)-1]))
		if strings.HasPrefix(s[i:], tok) && !glued {
			b.WriteString(redact.Redacted)
			i = end - 1
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// wordByte reports whether c continues a word: an ASCII letter or digit,
// '_', '-', or a byte of a multi-byte UTF-8 character.
func wordByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c >= 0x80
}

// redactedCause hides a cause whose text names the token from Unwrap, not
// from errors.Is.
type redactedCause struct {
	text  string
	cause error
}

func (r *redactedCause) Error() string { return r.text }

// Is reports whether the hidden cause matches target.
func (r *redactedCause) Is(target error) bool { return errors.Is(r.cause, target) }

// configView is a Config as printed, without its methods or secrets.
type configView Config

func (c Config) view() configView {
	v := configView(c)
	v.APIToken = redact.Token(c.APIToken)
	v.BridgeURL = redactURL(c.BridgeURL)
	return v
}

// String formats the configuration as %+v would, the API token redacted.
func (c Config) String() string { return fmt.Sprintf("%+v", c.view()) }

// GoString formats the configuration as %#v would, the API token redacted.
func (c Config) GoString() string {
	return strings.Replace(fmt.Sprintf("%#v", c.view()), "d1client.configView", "d1client.Config", 1)
}

// Format implements fmt.Formatter: %#v is GoString, %q the quoted String,
// and every other verb String. None shows the API token.
func (c Config) Format(f fmt.State, verb rune) { redact.Format(f, verb, c) }

// LogValue implements slog.LogValuer, without the API token.
func (c Config) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("base_url", c.BaseURL),
		slog.String("bridge_url", redactURL(c.BridgeURL)),
		slog.String("api_token", redact.Token(c.APIToken)),
		slog.String("account_id", c.AccountID),
		slog.String("database_id", c.DatabaseID),
		slog.Duration("attempt_timeout", c.AttemptTimeout),
		slog.String("budget", c.Budget.String()),
	)
}

// MarshalJSON implements json.Marshaler without the API token or the
// bridge URL's secret, the Budget and the Account as their String.
func (c Config) MarshalJSON() ([]byte, error) {
	v := struct {
		BaseURL, BridgeURL, APIToken, AccountID, DatabaseID string
		Retry                                               RetryPolicy
		AttemptTimeout                                      time.Duration
		Budget                                              string
		Account                                             string `json:",omitempty"`
		Coalesce                                            CoalesceConfig
	}{
		BaseURL: c.BaseURL, BridgeURL: redactURL(c.BridgeURL), APIToken: redact.Token(c.APIToken),
		AccountID: c.AccountID, DatabaseID: c.DatabaseID, Retry: c.Retry, AttemptTimeout: c.AttemptTimeout,
		Budget: c.Budget.String(), Coalesce: c.Coalesce,
	}
	if c.Account != nil {
		v.Account = c.Account.String()
	}
	return json.Marshal(v)
}

// clientView is what a Client shows of itself.
type clientView struct{ BaseURL, AccountID, DatabaseID string }

func (c *Client) view() clientView {
	return clientView{c.cfg.BaseURL, c.cfg.AccountID, c.cfg.DatabaseID}
}

// String describes the client: the database it reaches and where.
func (c *Client) String() string { return fmt.Sprintf("d1client.Client%+v", c.view()) }

// GoString describes the client as Go syntax, without its state.
func (c *Client) GoString() string {
	return strings.Replace(fmt.Sprintf("%#v", c.view()), "d1client.clientView", "&d1client.Client", 1)
}

// Format implements fmt.Formatter: %#v is GoString, %q the quoted String,
// and every other verb String. None shows the API token.
func (c *Client) Format(f fmt.State, verb rune) { redact.Format(f, verb, c) }

// LogValue implements slog.LogValuer, without the API token.
func (c *Client) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("base_url", c.cfg.BaseURL),
		slog.String("account_id", c.cfg.AccountID),
		slog.String("database_id", c.cfg.DatabaseID),
	)
}

// MarshalJSON implements json.Marshaler, with what LogValue shows.
func (c *Client) MarshalJSON() ([]byte, error) { return json.Marshal(c.view()) }
