package d1localtest_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/d1local/d1localtest"
)

// A Server never shows its token, whatever prints it: fmt's verbs, slog's
// handlers, json.Marshal; and it still hands the token out.
func TestServerNeverShowsTheToken(t *testing.T) {
	const token = "d1localtest_SECRET_91ab"
	srv := d1localtest.New(t, d1localtest.WithConfig(d1local.Config{Token: token}))
	var texts []string
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%d"} {
		texts = append(texts, fmt.Sprintf(verb, srv), fmt.Sprintf(verb, []*d1localtest.Server{srv}))
	}
	var buf bytes.Buffer
	slog.New(slog.NewJSONHandler(&buf, nil)).Info("srv", "srv", srv, "in", struct{ S *d1localtest.Server }{srv})
	slog.New(slog.NewTextHandler(&buf, nil)).Info("srv", "srv", srv, "in", struct{ S *d1localtest.Server }{srv})
	b, err := json.Marshal(struct{ S *d1localtest.Server }{srv})
	if err != nil {
		t.Fatal(err)
	}
	texts = append(texts, buf.String(), string(b))
	for _, s := range texts {
		if strings.Contains(s, token) {
			t.Errorf("the token is shown: %s", s)
		}
		if !strings.Contains(s, srv.URL) {
			t.Errorf("the server is not described: %s", s)
		}
	}
	if srv.Token != token {
		t.Errorf("Token = %q", srv.Token)
	}
}
