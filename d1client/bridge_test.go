package d1client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jarcoal/httpmock"

	"github.com/d1idem/d1idem/d1client/budget"
)

const bridgeSecretValue = "brs_0f1e2d3c4b5a69788796a5b4"

// bridgeMock answers /raw at host with an empty success when the request
// carries the bridge's secret as its bearer token, 401/10000 otherwise (the
// bridge's answers, bridge/README.md), and counts the calls.
func bridgeMock(host string) *httpmock.MockTransport {
	tr := httpmock.NewMockTransport()
	url := host + "/accounts/" + testAccount + "/d1/database/" + testDatabase + "/raw"
	tr.RegisterResponder(http.MethodPost, url, func(req *http.Request) (*http.Response, error) {
		if req.Header.Get("Authorization") != "Bearer "+bridgeSecretValue {
			return httpmock.NewStringResponse(401, `{"result":null,"success":false,"errors":[{"code":10000,"message":"Authentication error"}],"messages":[]}`), nil
		}
		return httpmock.NewStringResponse(200, okResults(1)), nil
	})
	return tr
}

// The bridge URL gives the client its base URL and its token (the API token
// is not sent), and no budget: 1201 calls go out at once where the default
// budget stops the 1201st. An explicit Budget is kept.
func TestBridgeURL(t *testing.T) {
	t.Setenv(APIBaseURLEnv, "")
	t.Setenv(BaseURLEnv, "")
	t.Setenv(BridgeURLEnv, "")
	cases := []struct {
		name, bridge, host string
	}{
		{"https", "https://:" + bridgeSecretValue + "@d1idem-bridge.example.workers.dev", "https://d1idem-bridge.example.workers.dev"},
		{"with a path", "https://:" + bridgeSecretValue + "@bridge.example.com/client/v4/", "https://bridge.example.com/client/v4"},
		{"http on loopback", "http://:" + bridgeSecretValue + "@127.0.0.1:8788", "http://127.0.0.1:8788"},
		{"http on localhost", "http://:" + bridgeSecretValue + "@localhost:8788", "http://localhost:8788"},
		{"http on ::1", "http://:" + bridgeSecretValue + "@[::1]:8788", "http://[::1]:8788"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tr := bridgeMock(tc.host)
			c, err := New(Config{BridgeURL: tc.bridge, APIToken: testToken, AccountID: testAccount, DatabaseID: testDatabase,
				HTTPClient: &http.Client{Transport: tr}})
			if err != nil {
				t.Fatal(err)
			}
			if !c.Bridge() || c.BaseURL() != strings.TrimSuffix(tc.host, "/")+"/" {
				t.Fatalf("Bridge() = %v, BaseURL() = %s", c.Bridge(), c.BaseURL())
			}
			if strings.Contains(fmt.Sprintf("%v %+v %#v", c, c, c), bridgeSecretValue) {
				t.Fatalf("the client shows the secret")
			}
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			for i := range 1201 {
				if _, err := c.Exec(ctx, readStmt); err != nil {
					t.Fatalf("call %d: %v", i+1, err)
				}
			}
			if n := tr.GetTotalCallCount(); n != 1201 || c.BudgetWait() != 0 {
				t.Fatalf("%d calls sent, budget wait %s", n, c.BudgetWait())
			}
		})
	}
	// Without a bridge the same calls meet the budget: after its burst, the
	// pace (1200 calls per 300 s: one every 250 ms) makes a call with a short
	// deadline fail at once with ErrBudget. An explicit budget is kept on a
	// bridge too.
	paced := func(t *testing.T, cfg Config) {
		t.Helper()
		cfg.AccountID, cfg.DatabaseID = testAccount, testDatabase
		cfg.HTTPClient = &http.Client{Transport: bridgeMock("https://bridge.example.com")}
		c, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 100 {
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
			_, err := c.Exec(ctx, readStmt)
			cancel()
			if errors.Is(err, ErrBudget) {
				return
			}
			if err != nil {
				t.Fatalf("call %d: %v", i+1, err)
			}
		}
		t.Fatalf("100 calls went through at once (bridge %v); want ErrBudget once the burst is spent", c.Bridge())
	}
	t.Run("the default budget without a bridge", func(t *testing.T) {
		paced(t, Config{BaseURL: "https://bridge.example.com", APIToken: bridgeSecretValue})
	})
	t.Run("an explicit budget is kept", func(t *testing.T) {
		paced(t, Config{BridgeURL: "https://:" + bridgeSecretValue + "@bridge.example.com", Budget: budget.New(2, time.Hour)})
	})
	t.Run("an Account's budget is kept", func(t *testing.T) {
		account, err := budget.NewAccount(budget.New(2, time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		paced(t, Config{BridgeURL: "https://:" + bridgeSecretValue + "@bridge.example.com", Account: account})
	})
}

// D1IDEM_BRIDGE_URL is the bridge URL when the Config names no address; a
// Config's BaseURL wins over it, as over the other variables.
func TestBridgeURLFromEnvironment(t *testing.T) {
	t.Setenv(APIBaseURLEnv, "")
	t.Setenv(BaseURLEnv, "")
	t.Setenv(BridgeURLEnv, "https://:"+bridgeSecretValue+"@bridge.example.com")
	tr := bridgeMock("https://bridge.example.com")
	c, err := New(Config{APIToken: testToken, AccountID: testAccount, DatabaseID: testDatabase, HTTPClient: &http.Client{Transport: tr}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(t.Context(), readStmt); err != nil || !c.Bridge() || c.BaseURL() != "https://bridge.example.com/" {
		t.Fatalf("err = %v, bridge %v, base %s", err, c.Bridge(), c.BaseURL())
	}
	c, err = New(Config{BaseURL: testBaseURL, APIToken: testToken, AccountID: testAccount, DatabaseID: testDatabase})
	if err != nil || c.Bridge() || c.BaseURL() != testBaseURL+"/" {
		t.Fatalf("with Config.BaseURL: err = %v, bridge %v, base %s", err, c.Bridge(), c.BaseURL())
	}
}

// Ambiguous settings and malformed bridge URLs are refused before anything
// is sent, with an error that names the setting and never shows the secret.
func TestBridgeURLRefused(t *testing.T) {
	const s = bridgeSecretValue
	cases := []struct {
		name      string
		cfg       Config
		env       map[string]string
		fragments []string
	}{
		{"bridge and base URL", Config{BridgeURL: "https://:" + s + "@b.example.com", BaseURL: testBaseURL}, nil,
			[]string{"Config.BridgeURL and Config.BaseURL are both set"}},
		{"variable and CLOUDFLARE_BASE_URL", Config{}, map[string]string{BridgeURLEnv: "https://:" + s + "@b.example.com", BaseURLEnv: testBaseURL},
			[]string{BridgeURLEnv + " and " + BaseURLEnv + " are both set"}},
		{"variable and CLOUDFLARE_API_BASE_URL", Config{}, map[string]string{BridgeURLEnv: "https://:" + s + "@b.example.com", APIBaseURLEnv: testBaseURL},
			[]string{BridgeURLEnv + " and " + APIBaseURLEnv + " are both set"}},
		{"no secret", Config{BridgeURL: "https://b.example.com"}, nil, []string{"carries no secret", "https://:SECRET@HOST"}},
		{"the secret as a user name", Config{BridgeURL: "https://" + s + "@b.example.com"}, nil, []string{"where the user name goes"}},
		{"a user name", Config{BridgeURL: "https://admin:" + s + "@b.example.com"}, nil, []string{"has a user name"}},
		{"a short secret", Config{BridgeURL: "https://:short@b.example.com"}, nil, []string{"16 to 4096 visible ASCII"}},
		{"a secret with a comma", Config{BridgeURL: "https://:" + s + "%2C@b.example.com"}, nil, []string{"without spaces or commas"}},
		{"plain http off this machine", Config{BridgeURL: "http://:" + s + "@b.example.com"}, nil, []string{"http:// to b.example.com", "must be https://"}},
		{"another scheme", Config{BridgeURL: "ftp://:" + s + "@b.example.com"}, nil, []string{"must start with https://"}},
		{"a query", Config{BridgeURL: "https://:" + s + "@b.example.com/?token=x"}, nil, []string{"a query or a fragment"}},
		{"not a URL", Config{BridgeURL: "https://:" + s + "@b.exa mple.com"}, nil, []string{"is not a URL", "not shown"}},
		{"no host", Config{BridgeURL: s}, nil, []string{"is not a URL"}},
		{"the variable, malformed", Config{}, map[string]string{BridgeURLEnv: "https://" + s + "@b.example.com"}, []string{BridgeURLEnv + " has the secret where the user name goes"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, v := range []string{APIBaseURLEnv, BaseURLEnv, BridgeURLEnv} {
				t.Setenv(v, tc.env[v])
			}
			tc.cfg.AccountID, tc.cfg.DatabaseID = testAccount, testDatabase
			_, err := New(tc.cfg)
			var e *Error
			if !errors.As(err, &e) || !errors.Is(err, ErrInvalid) {
				t.Fatalf("err = %v, want ErrInvalid", err)
			}
			for _, f := range tc.fragments {
				if !strings.Contains(err.Error(), f) {
					t.Errorf("%q does not say %q", err, f)
				}
			}
			if strings.Contains(fmt.Sprintf("%v %+v %#v", err, err, err), s) {
				t.Errorf("the error shows the secret: %v", err)
			}
		})
	}
}

// A Config never shows the bridge URL's secret, whatever prints it; the
// URL's address shows, and that it has a secret.
func TestConfigNeverShowsTheBridgeSecret(t *testing.T) {
	cfgs := map[string]Config{
		"bridge URL":     {BridgeURL: "https://:" + bridgeSecretValue + "@bridge.example.com/client/v4", AccountID: testAccount},
		"with a query":   {BridgeURL: "https://:" + bridgeSecretValue + "@bridge.example.com/?q=" + bridgeSecretValue},
		"not a URL":      {BridgeURL: "https://:" + bridgeSecretValue + "@bri dge"},
		"secret as user": {BridgeURL: "https://" + bridgeSecretValue + "@bridge.example.com"},
	}
	for name, cfg := range cfgs {
		var texts []string
		for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%d"} {
			texts = append(texts, fmt.Sprintf(verb, cfg), fmt.Sprintf(verb, &cfg))
		}
		var buf bytes.Buffer
		slog.New(slog.NewJSONHandler(&buf, nil)).Info("cfg", "cfg", cfg)
		slog.New(slog.NewTextHandler(&buf, nil)).Info("cfg", "cfg", cfg)
		texts = append(texts, buf.String())
		for _, s := range texts {
			if strings.Contains(s, bridgeSecretValue) {
				t.Errorf("%s: secret shown: %s", name, s)
			}
		}
	}
	if s := fmt.Sprintf("%+v", cfgs["bridge URL"]); !strings.Contains(s, "BridgeURL:https://:[REDACTED]@bridge.example.com/client/v4") {
		t.Errorf("%%+v = %s", s)
	}
}
