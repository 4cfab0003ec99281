package cli

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/idem"
)

// demoTTL is the demo's TTL in tests: short, so the story takes seconds,
// and long enough for a loaded machine.
const demoTTL = "1s"

// TestDemo plays the whole story: every promise holds, the first exchange
// is shown as it travels, and the last screen gives the next steps.
func TestDemo(t *testing.T) {
	r := mustRun(t, nil, "demo", "--ttl", demoTTL)
	for _, want := range []string{
		"> POST /v1/orders HTTP/1.1\n", "> Idempotency-Key: order-1.", "> {\"sku\":\"tea\",\"qty\":2}\n",
		"< HTTP/1.1 201 Created\n", "< Location: /v1/orders/ord_",
		"answer: 201 Created, a replay (each time)", "answer: 409 Conflict (idempotency_key_reused)",
		"1 created, ", "the retry takes the key over (generation 2): one order",
		"in memory (--dir DIR keeps it)", "Every promise held.",
		"go run ./examples/orders --local .d1idem", "curl -i -X POST localhost:8080/v1/orders", "go run ./cmd/d1idem keys list --local .d1idem",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("the demo's output lacks %q", want)
		}
	}
	if n := strings.Count(r.stdout, "\n      ok: "); n != 11 || strings.Contains(r.stdout, "BROKEN") {
		t.Errorf("%d promises held, want 11:\n%s", n, r.stdout)
	}
	for _, internal := range []string{"stored=", "instance B", "{\"content-type\""} {
		if strings.Contains(r.stdout, internal) {
			t.Errorf("the demo's output uses internal words: %q", internal)
		}
	}
}

// TestDemoKeepsItsDatabase: with --dir the database is kept where the CLI
// looks, the demo says so, and a second run in the same place holds too.
func TestDemoKeepsItsDatabase(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "kept")
	for range 2 {
		r := mustRun(t, nil, "demo", "--ttl", demoTTL, "--dir", dir)
		if !strings.Contains(r.stdout, `database "d1idem" kept under `+dir) ||
			!strings.Contains(r.stdout, "The demo's database is kept under "+dir+". Look at its rows:\n  go run ./cmd/d1idem keys list --local "+dir) {
			t.Errorf("the demo does not say where it kept its database:\n%s", r.stdout)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, d1local.LocalDatabaseID+".sqlite")); err != nil {
		t.Fatal(err)
	}
	r := mustRun(t, nil, "keys", "list", "--local", dir, "--status", "completed", "--json")
	if n := strings.Count(r.stdout, `"principal": "tok_demo_alice"`); n != 8 {
		t.Errorf("keys list after two demos shows %d of their 8 keys:\n%s", n, r.stdout)
	}
}

// TestDemoFailsLoudly: against an API that does not protect its requests,
// the promises break and the demo says which, and exits 1.
func TestDemoFailsLoudly(t *testing.T) {
	unprotected := func(*idem.Ledger) (http.Handler, error) {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get(idem.HeaderKey) == "" {
				w.WriteHeader(http.StatusCreated)
				return
			}
			createDemoOrder(w, r.WithContext(context.Background()))
		}), nil
	}
	var out bytes.Buffer
	err := runDemo(context.Background(), &out, time.Second, "", unprotected)
	if err == nil || !regexp.MustCompile(`^\d+ promises broken: `).MatchString(err.Error()) || !strings.Contains(out.String(), "BROKEN: ") ||
		strings.Contains(out.String(), "Every promise held") {
		t.Errorf("err = %v\n%s", err, out.String())
	}
}
