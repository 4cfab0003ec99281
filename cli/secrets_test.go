package cli

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"
)

// A connection target never shows its API token or its bridge URL's
// secret, whatever prints it.
func TestTargetNeverShowsSecrets(t *testing.T) {
	const token, secret = "cli_SECRET_token_0c7a", "cli_SECRET_bridge_5e11"
	tg := target{accountID: "acct", token: token, databaseID: "db", bridgeURL: "https://:" + secret + "@bridge.example.com", where: "database db"}
	var buf bytes.Buffer
	slog.New(slog.NewTextHandler(&buf, nil)).Info("t", "target", tg, "in", struct{ T target }{tg})
	texts := []string{buf.String()}
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%d"} {
		texts = append(texts, fmt.Sprintf(verb, tg), fmt.Sprintf(verb, &tg), fmt.Sprintf(verb, []target{tg}))
	}
	for _, s := range texts {
		if strings.Contains(s, token) || strings.Contains(s, secret) || !strings.Contains(s, "database db") {
			t.Errorf("printed as %s", s)
		}
	}
}
