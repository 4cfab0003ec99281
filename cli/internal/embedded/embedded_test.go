package embedded

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/d1idem/d1idem/d1local"
)

// A Server never shows its token, whatever prints it.
func TestServerNeverShowsTheToken(t *testing.T) {
	const token = "embedded_SECRET_4d2f"
	s, err := Start(d1local.Config{Token: token}, "")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var buf bytes.Buffer
	slog.New(slog.NewTextHandler(&buf, nil)).Info("srv", "srv", s, "in", struct{ S *Server }{s})
	texts := []string{buf.String()}
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%d"} {
		texts = append(texts, fmt.Sprintf(verb, s), fmt.Sprintf(verb, []*Server{s}))
	}
	for _, x := range texts {
		if strings.Contains(x, token) || !strings.Contains(x, s.URL) {
			t.Errorf("printed as %s", x)
		}
	}
}
