package d1client

import (
	"net/url"
	"os"
	"strings"

	"github.com/d1idem/d1idem/d1client/budget"
	"github.com/d1idem/d1idem/internal/loopback"
	"github.com/d1idem/d1idem/internal/redact"
)

// BridgeURLEnv is the environment variable New reads for the bridge URL
// when neither Config.BridgeURL nor Config.BaseURL is set.
const BridgeURLEnv = "D1IDEM_BRIDGE_URL"

// applyBridge resolves the bridge URL, if any (then it reports true), into
// BaseURL and APIToken, clears BridgeURL, and makes a zero Budget without
// an Account unlimited.
func (cfg *Config) applyBridge() (bool, error) {
	raw, name := cfg.BridgeURL, "Config.BridgeURL"
	cfg.BridgeURL = ""
	switch {
	case raw != "" && cfg.BaseURL != "":
		return false, invalidf("Config.BridgeURL and Config.BaseURL are both set; a bridge URL is the base URL (and the token): set one of them")
	case raw == "" && cfg.BaseURL == "" && os.Getenv(BridgeURLEnv) != "": // Config.BaseURL wins over the environment
		raw, name = os.Getenv(BridgeURLEnv), BridgeURLEnv
		for _, v := range []string{APIBaseURLEnv, BaseURLEnv} {
			if os.Getenv(v) != "" {
				return false, invalidf("%s and %s are both set: the bridge URL names the base URL itself; unset %s to use the bridge, or %s to use the API", BridgeURLEnv, v, v, BridgeURLEnv)
			}
		}
	}
	if raw == "" {
		return false, nil
	}
	base, secret, err := parseBridgeURL(name, raw)
	if err != nil {
		return false, err
	}
	cfg.BaseURL, cfg.APIToken = base, secret
	if cfg.Budget == (budget.Budget{}) && cfg.Account == nil {
		cfg.Budget = budget.Unlimited()
	}
	return true, nil
}

// parseBridgeURL splits a bridge URL, https://:SECRET@HOST[/PATH], into its
// base URL and its secret. Its errors never show the URL.
func parseBridgeURL(name, raw string) (base, secret string, err error) {
	const form = "https://:SECRET@HOST"
	u, perr := url.Parse(raw)
	switch {
	case perr != nil || u.Opaque != "" || u.Host == "":
		return "", "", invalidf("%s is not a URL of the form %s (the URL is not shown: it holds the secret)", name, form)
	case u.RawQuery != "" || u.Fragment != "" || u.ForceQuery:
		return "", "", invalidf("%s has a query or a fragment; the form is %s", name, form)
	case u.Scheme == "http" && !loopback.Host(u.Hostname()):
		return "", "", invalidf("%s is http:// to %s, which is not this machine: the URL carries the bridge's secret, so it must be https:// (http:// is accepted for a bridge on 127.0.0.1, such as `d1idem bridge serve`)", name, u.Host)
	case u.Scheme != "https" && u.Scheme != "http":
		return "", "", invalidf("%s must start with https:// (the form is %s)", name, form)
	}
	pass, hasPass := u.User.Password()
	switch {
	case u.User == nil || (!hasPass && u.User.Username() == ""):
		return "", "", invalidf("%s carries no secret; write it as %s, the bridge's BRIDGE_SECRET after the colon", name, form)
	case !hasPass:
		return "", "", invalidf("%s has the secret where the user name goes; write it after a colon: %s", name, form)
	case u.User.Username() != "":
		return "", "", invalidf("%s has a user name; the bridge takes none: write %s", name, form)
	case len(pass) < 16 || len(pass) > 4096 || strings.ContainsFunc(pass, func(r rune) bool { return r < 0x21 || r > 0x7e || r == ',' }):
		// SECRET_PATTERN in bridge/worker.js
		return "", "", invalidf("%s: the secret must be 16 to 4096 visible ASCII characters, without spaces or commas (percent-encode :, @, / and the like)", name)
	}
	u.User = nil
	return u.String(), pass, nil
}

// Bridge reports whether the client talks to a d1idem bridge (Config.BridgeURL).
func (c *Client) Bridge() bool { return c.bridge }

// redactURL shows a bridge URL with its secret, query and fragment left out;
// what is not a URL is shown as "[REDACTED]" whole.
func redactURL(raw string) string {
	if raw == "" {
		return ""
	}
	u, err := url.Parse(raw)
	if err != nil || u.Opaque != "" || u.Host == "" {
		return redact.Redacted
	}
	secret := u.User != nil
	u.User, u.RawQuery, u.Fragment, u.ForceQuery = nil, "", "", false
	if !secret {
		return u.String()
	}
	return u.Scheme + "://:" + redact.Redacted + "@" + strings.TrimPrefix(u.String(), u.Scheme+"://")
}
