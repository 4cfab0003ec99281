package d1local

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"
)

const secretToken = "d1local_SECRET_token_7c1e"

// printed returns v as every fmt verb, slog's handlers and json.Marshal
// print it.
func printed(t *testing.T, v any) []string {
	t.Helper()
	var out []string
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%d", "%10.3v"} {
		out = append(out, verb+": "+fmt.Sprintf(verb, v))
	}
	out = append(out, fmt.Sprint(v), fmt.Sprintln(v))
	for _, h := range []func(io.Writer) slog.Handler{
		func(w io.Writer) slog.Handler { return slog.NewJSONHandler(w, nil) },
		func(w io.Writer) slog.Handler { return slog.NewTextHandler(w, nil) },
	} {
		var buf bytes.Buffer
		slog.New(h(&buf)).Info("v", "v", v, slog.Any("any", v), slog.Group("g", "v", v))
		if strings.Contains(buf.String(), "!ERROR") {
			t.Errorf("slog could not print %T: %s", v, buf.String())
		}
		out = append(out, buf.String())
	}
	b, err := json.Marshal(v)
	if err != nil {
		t.Errorf("json.Marshal(%T): %v", v, err)
	}
	return append(out, string(b))
}

// Neither a Config nor a Server shows the token, whatever prints it: any
// fmt verb, slog's text and JSON handlers, json.Marshal, alone or inside
// another value; and json.Marshal works with every field set.
func TestConfigNeverShowsTheToken(t *testing.T) {
	cfg := Config{Token: secretToken, AccountID: DefaultAccountID, RateLimit: CloudflareRateLimit(),
		Now: time.Now, Logger: slog.New(slog.DiscardHandler), Faults: func(Request) Fault { return Fault{} }}
	bare := Config{Token: secretToken}
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	type holder struct{ D1 Config }
	for name, v := range map[string]any{
		"Config": cfg, "bare Config": bare, "*Config": &cfg, "Config inside": holder{bare},
		"[]Config": []Config{bare}, "*Server": srv,
	} {
		for _, s := range printed(t, v) {
			if strings.Contains(s, secretToken) {
				t.Errorf("%s: the token is shown: %s", name, s)
			}
		}
	}
	if s := fmt.Sprintf("%+v", bare); !strings.Contains(s, "Token:[REDACTED]") {
		t.Errorf("redacted, not emptied: %s", s)
	}
	if b, _ := json.Marshal(bare); !strings.Contains(string(b), `"Token":"[REDACTED]"`) {
		t.Errorf("json: %s", b)
	}
}
