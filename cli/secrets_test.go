package cli

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/d1idem/d1idem/d1client"
)

// An open database of a set never shows its API token or its bridge URL's
// secret, whatever prints it.
func TestConnNeverShowsSecrets(t *testing.T) {
	const token, secret = "cli_SECRET_token_0c7a", "cli_SECRET_bridge_5e11"
	var conns []*conn
	for _, cfg := range []d1client.Config{
		{APIToken: token, AccountID: "acct", DatabaseID: "db"},
		{BridgeURL: "https://:" + secret + "@bridge.example.com", AccountID: "acct", DatabaseID: "db"},
	} {
		db, err := d1client.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, &conn{db: db, databaseID: "db", where: "database db"})
	}
	s := &dbSet{conns: conns}
	for _, cn := range conns {
		cn.set = s
		var buf bytes.Buffer
		slog.New(slog.NewTextHandler(&buf, nil)).Info("t", "conn", cn, "in", struct{ C conn }{*cn}, "set", s)
		texts := []string{buf.String()}
		for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%d"} {
			texts = append(texts, fmt.Sprintf(verb, *cn), fmt.Sprintf(verb, cn), fmt.Sprintf(verb, s), fmt.Sprintf(verb, *s))
		}
		for _, s := range texts {
			if strings.Contains(s, token) || strings.Contains(s, secret) {
				t.Errorf("printed as %s", s)
			}
		}
	}
}
