package d1client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/jarcoal/httpmock"

	"github.com/d1idem/d1idem/d1client/budget"
)

// The API token never appears in an error's text, its formatted fields, or
// the client's logs, whatever the server answers, even a server that echoes
// the Authorization header back.
func TestTokenNeverAppearsInErrorsOrLogs(t *testing.T) {
	echo := func(status int, ctype string) httpmock.Responder {
		return func(req *http.Request) (*http.Response, error) {
			auth := req.Header.Get("Authorization")
			var body string
			if ctype == "text/html" {
				body = "<html><head><title>denied for " + auth + "</title></head></html>"
			} else {
				body = fmt.Sprintf(`{"success":false,"errors":[{"code":10000,"message":"bad token %s"},{"code":7500,"message":"%s: SQLITE_ERROR"}],"messages":[],"result":null}`, auth, auth)
			}
			res := httpmock.NewStringResponse(status, body)
			res.Header.Set("Content-Type", ctype)
			return res, nil
		}
	}
	responders := map[string]httpmock.Responder{
		"echo 403":  echo(403, "application/json"),
		"echo 400":  echo(400, "application/json"),
		"echo 500":  echo(500, "application/json"),
		"echo 200":  echo(200, "application/json"),
		"echo HTML": echo(502, "text/html"),
		"transport error naming the token": func(req *http.Request) (*http.Response, error) {
			return nil, errors.New("proxy refused " + req.Header.Get("Authorization"))
		},
	}
	files, err := filepath.Glob(filepath.Join("..", "testdata", "d1", "*.http"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no fixtures: %v", err)
	}
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".http")
		responders["fixture "+name] = replay(t, name)
	}
	for name, r := range responders {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { // retries wait fake time
				var logs bytes.Buffer
				c, _ := mockClient(t, r, func(cfg *Config) {
					cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
				})
				_, err := c.Exec(context.Background(), readStmt)
				texts := []string{logs.String()}
				if err != nil {
					texts = append(texts, err.Error(), fmt.Sprintf("%+v", err), fmt.Sprintf("%#v", err))
					for e := errors.Unwrap(err); e != nil; e = errors.Unwrap(e) {
						texts = append(texts, e.Error())
					}
				}
				for _, s := range texts {
					if strings.Contains(s, testToken) {
						t.Fatalf("token leaked: %s", s)
					}
				}
			})
		})
	}
	// Config errors do not carry the token either.
	_, err = New(Config{APIToken: testToken, AccountID: "bad/id", DatabaseID: testDatabase})
	if err == nil || strings.Contains(fmt.Sprintf("%#v %v", err, err), testToken) {
		t.Fatalf("config error: %v", err)
	}
}

// Neither a Config nor a Client shows the token, whatever prints it: any fmt
// verb, a dereferenced Client, slog's handlers, or a panic.
func TestConfigAndClientNeverShowTheToken(t *testing.T) {
	var logs bytes.Buffer
	cfg := Config{
		BaseURL: testBaseURL, APIToken: testToken, AccountID: testAccount, DatabaseID: testDatabase,
		HTTPClient: &http.Client{}, Logger: slog.New(slog.NewTextHandler(&logs, nil)), Budget: budget.New(5, time.Second),
	}
	client, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	type holder struct{ Config Config }
	values := map[string]any{
		"Config": cfg, "*Config": &cfg, "Config in a struct": holder{cfg}, "[]Config": []Config{cfg},
		"*Client": client, "Client": reflect.ValueOf(client).Elem().Interface(), // a dereferenced Client
		"[]*Client": []*Client{client},
	}
	var texts []string
	for name, v := range values {
		for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%X", "%d", "%T", "%10.3v"} {
			texts = append(texts, name+" "+verb+": "+fmt.Sprintf(verb, v))
		}
		texts = append(texts, name+" Sprint: "+fmt.Sprint(v), name+" Sprintln: "+fmt.Sprintln(v))
	}
	for _, h := range []func(io.Writer) slog.Handler{
		func(w io.Writer) slog.Handler { return slog.NewJSONHandler(w, nil) },
		func(w io.Writer) slog.Handler { return slog.NewTextHandler(w, nil) },
	} {
		var buf bytes.Buffer
		log := slog.New(h(&buf))
		log.Info("config", "cfg", cfg, "ptr", &cfg, "client", client)
		log.Info("attrs", slog.Any("cfg", cfg), slog.Any("client", client), slog.Group("g", "cfg", cfg))
		texts = append(texts, buf.String())
	}
	for _, s := range append(texts, logs.String()) {
		if strings.Contains(s, testToken) {
			t.Errorf("token shown: %s", s)
		}
	}
	// Redacted, not emptied: the token's presence shows.
	if s := fmt.Sprintf("%+v", cfg); !strings.Contains(s, "APIToken:[REDACTED]") || !strings.Contains(s, "AccountID:"+testAccount) {
		t.Errorf("%%+v = %s", s)
	}
	if s := fmt.Sprintf("%#v", cfg); !strings.HasPrefix(s, "d1client.Config{") || !strings.Contains(s, `APIToken:"[REDACTED]"`) {
		t.Errorf("%%#v = %s", s)
	}
	if s := fmt.Sprint(client); !strings.Contains(s, testDatabase) {
		t.Errorf("Client = %s", s)
	}
	// The client still sends the token.
	c, tr := mockClient(t, func(req *http.Request) (*http.Response, error) {
		if req.Header.Get("Authorization") != "Bearer "+testToken {
			return httpmock.NewStringResponse(403, `{"success":false,"errors":[{"code":10000,"message":"Authentication error"}]}`), nil
		}
		return httpmock.NewStringResponse(200, okResults(1)), nil
	})
	if _, err := c.Exec(t.Context(), readStmt); err != nil || tr.GetTotalCallCount() != 1 {
		t.Fatalf("err = %v", err)
	}
}

// A panic whose value is a Config or a Client prints no token: the runtime
// prints the value's String.
func TestPanicMessageHidesTheToken(t *testing.T) {
	if v := os.Getenv("D1CLIENT_PANIC"); v != "" {
		cfg := Config{APIToken: testToken, AccountID: testAccount, DatabaseID: testDatabase, BaseURL: testBaseURL}
		if v == "client" {
			c, _ := New(cfg)
			panic(c)
		}
		panic(cfg)
	}
	for _, v := range []string{"config", "client"} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestPanicMessageHidesTheToken$")
		cmd.Env = append(os.Environ(), "D1CLIENT_PANIC="+v)
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), "panic: ") || !strings.Contains(string(out), testAccount) {
			t.Fatalf("%s: the child did not panic with the value: %v\n%s", v, err, out)
		}
		if strings.Contains(string(out), testToken) {
			t.Errorf("%s: the panic message shows the token:\n%s", v, out)
		}
	}
}

// bridgeSecret is a bridge secret for the tests that print a Config.
const bridgeSecret = "brSECRET_0123456789abcdef"

// json.Marshal shows neither the API token nor the bridge URL's secret, of
// a Config alone, behind a pointer or inside another value, and it works
// with every field set (an HTTP client holds a func, which json.Marshal
// cannot write).
func TestConfigMarshalJSONHidesSecrets(t *testing.T) {
	acct, _ := budget.NewAccount(budget.New(100, time.Minute))
	for name, cfg := range map[string]Config{
		"token":      {BaseURL: testBaseURL, APIToken: testToken, AccountID: testAccount, DatabaseID: testDatabase},
		"bridge URL": {BridgeURL: "https://:" + bridgeSecret + "@bridge.example.com", AccountID: testAccount, DatabaseID: testDatabase},
		"every field": {BaseURL: testBaseURL, APIToken: testToken, AccountID: testAccount, DatabaseID: testDatabase,
			HTTPClient: &http.Client{}, Logger: slog.New(slog.DiscardHandler), Account: acct,
			Retry: DefaultRetryPolicy(), AttemptTimeout: time.Second},
	} {
		type holder struct{ Config Config }
		for kind, v := range map[string]any{"value": cfg, "pointer": &cfg, "inside": holder{cfg}, "slice": []Config{cfg}} {
			b, err := json.Marshal(v)
			if err != nil {
				t.Fatalf("%s, %s: %v", name, kind, err)
			}
			s := string(b)
			if strings.Contains(s, testToken) || strings.Contains(s, bridgeSecret) {
				t.Errorf("%s, %s: a secret is shown: %s", name, kind, s)
			}
			if !strings.Contains(s, `"AccountID":"`+testAccount+`"`) {
				t.Errorf("%s, %s: %s", name, kind, s)
			}
		}
	}
	b, _ := json.Marshal(Config{APIToken: testToken, BridgeURL: "https://:" + bridgeSecret + "@bridge.example.com"})
	if s := string(b); !strings.Contains(s, `"APIToken":"[REDACTED]"`) || !strings.Contains(s, `"BridgeURL":"https://:[REDACTED]@bridge.example.com"`) {
		t.Errorf("redacted, not emptied: %s", s)
	}
	c, err := New(Config{BaseURL: testBaseURL, APIToken: testToken, AccountID: testAccount, DatabaseID: testDatabase})
	if err != nil {
		t.Fatal(err)
	}
	if b, err := json.Marshal(c); err != nil || strings.Contains(string(b), testToken) || !strings.Contains(string(b), testDatabase) {
		t.Errorf("Client: %s, %v", b, err)
	}
}

// slog's JSON handler shows no secret of a Config inside another value (a
// struct it hands to json.Marshal), nor of a Config or a Client logged
// directly (LogValue).
func TestSlogJSONHidesToken(t *testing.T) {
	cfg := Config{BaseURL: testBaseURL, APIToken: testToken, AccountID: testAccount, DatabaseID: testDatabase}
	bridged := Config{BridgeURL: "https://:" + bridgeSecret + "@bridge.example.com", AccountID: testAccount, DatabaseID: testDatabase}
	type settings struct {
		Name string
		D1   Config
	}
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	log.Info("start", "settings", settings{"orders", cfg}, "bridged", settings{"b", bridged}, "cfg", cfg,
		slog.Any("ptr", &settings{"p", cfg}), slog.Group("g", "cfg", bridged))
	s := buf.String()
	if strings.Contains(s, testToken) || strings.Contains(s, bridgeSecret) {
		t.Fatalf("a secret is logged: %s", s)
	}
	if strings.Contains(s, "!ERROR") || !strings.Contains(s, `"D1":{"BaseURL":"`+testBaseURL) {
		t.Errorf("the Config is not logged as JSON: %s", s)
	}
}
