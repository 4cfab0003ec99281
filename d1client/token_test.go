package d1client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jarcoal/httpmock"
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
			var logs bytes.Buffer
			c, _ := mockClient(t, r, func(cfg *Config) {
				cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
			})
			recordSleeps(c)
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
	}
	// Config errors do not carry the token either.
	_, err = New(Config{APIToken: testToken, AccountID: "bad/id", DatabaseID: testDatabase})
	if err == nil || strings.Contains(fmt.Sprintf("%#v %v", err, err), testToken) {
		t.Fatalf("config error: %v", err)
	}
}
