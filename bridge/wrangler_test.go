package bridge_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/d1idem/d1idem/internal/d1test"
)

// TestWranglerTemplate deploys the bridge as a user would, locally: the
// shipped worker.js and ledger-statements.js with wrangler.toml.example as
// wrangler.toml and the secret in .dev.vars, under `wrangler dev --local`
// (the pinned wrangler 4.86.0, the same workerd as the tests). Wrangler's
// own reading of the template ([vars.BRIDGE_DATABASES] as a table, the
// database's UUID and name, BRIDGE_ALLOWED_STATEMENTS as a TOML array) must
// give the Worker a configuration it serves: in full mode as the template
// stands, and in ledger-only mode with its commented block enabled.
func TestWranglerTemplate(t *testing.T) {
	if testing.Short() {
		t.Skip("starts wrangler dev")
	}
	d1test.Workerd(t) // skips, or fails in CI, when Node or node_modules is missing
	root, err := d1test.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	wrangler := filepath.Join(root, "conformance", "node_modules", "wrangler", "bin", "wrangler.js")
	if _, err := os.Stat(wrangler); err != nil {
		t.Fatalf("the pinned wrangler is missing (npm ci in conformance/): %v", err)
	}
	template, err := os.ReadFile("wrangler.toml.example")
	if err != nil {
		t.Fatal(err)
	}
	const uuid = "00000000-0000-4000-8000-000000000000"
	const secret = "template-test-secret-0123456789"

	t.Run("full", func(t *testing.T) {
		base := wranglerDev(t, wrangler, string(template), secret)
		post := func(db, token, sql string) (int, string) { return postSQL(t, base, db, token, sql) }
		if s, body := post(uuid, secret, "CREATE TABLE orders (id TEXT, sku TEXT)"); s != 200 {
			t.Fatalf("by UUID: %d %s", s, body)
		}
		if s, body := post("orders-db", secret, "SELECT count(*) AS n FROM orders"); s != 200 || !strings.Contains(body, `"rows":[[0]]`) {
			t.Fatalf("by name, the same database: %d %s", s, body)
		}
		if s, body := post("ORDERS_DB", secret, "SELECT 1"); s != 404 || !strings.Contains(body, `"code":7404`) {
			t.Errorf("the binding name is not a database ID: %d %s", s, body)
		}
		if s, body := post(uuid, "wrong-secret-wrong-secret", "SELECT 1"); s != 401 || !strings.Contains(body, `"code":10000`) {
			t.Errorf("wrong secret: %d %s", s, body)
		}
	})

	t.Run("ledger-only", func(t *testing.T) {
		toml := string(template)
		for _, line := range []string{"[vars]", `BRIDGE_MODE = "ledger-only"`, "BRIDGE_ALLOWED_STATEMENTS = [", `  "INSERT INTO orders (id, sku) VALUES (?, ?)",`, "]"} {
			commented := "# " + line
			if line == `  "INSERT INTO orders (id, sku) VALUES (?, ?)",` {
				commented = "#   " + strings.TrimSpace(line)
			}
			if !strings.Contains(toml, commented+"\n") {
				t.Fatalf("the template has no line %q to enable", commented)
			}
			toml = strings.Replace(toml, commented+"\n", line+"\n", 1)
		}
		base := wranglerDev(t, wrangler, toml, secret)
		if s, body := postSQL(t, base, uuid, secret, "SELECT 1"); s != 400 || !strings.Contains(body, "ledger-only mode") || !strings.Contains(body, "SQLITE_AUTH") {
			t.Errorf("an unlisted statement: %d %s", s, body)
		}
		// The listed statement passes the bridge and reaches D1, which has
		// no orders table here.
		if s, body := postSQL(t, base, uuid, secret, "INSERT INTO orders (id, sku) VALUES (?, ?)", "o1", "s1"); s != 400 || !strings.Contains(body, "no such table: orders") {
			t.Errorf("the listed statement: %d %s", s, body)
		}
	})
}

// wranglerDev runs `wrangler dev --local` on a copy of the bridge with this
// wrangler.toml and secret, and returns its base URL; it is stopped when t
// ends.
func wranglerDev(t *testing.T, wrangler, toml, secret string) string {
	t.Helper()
	dir := t.TempDir()
	for _, f := range []string{"worker.js", "ledger-statements.js"} {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "wrangler.toml"), []byte(toml), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, ".dev.vars"), []byte("BRIDGE_SECRET="+secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(node, wrangler, "dev", "--local", "--ip", "127.0.0.1", "--port", port,
		"--persist-to", filepath.Join(dir, "state"), "--show-interactive-dev-session=false", "--log-level", "warn")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "WRANGLER_SEND_METRICS=false", "CLOUDFLARE_CF_FETCH_ENABLED=false",
		"XDG_CONFIG_HOME="+filepath.Join(dir, "config"), "HOME="+dir, "BROWSER=none", "CI=true")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // wrangler starts workerd; stop them together
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
	})
	base := "http://127.0.0.1:" + port
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case <-done:
			t.Fatalf("wrangler dev exited:\n%s", out.String())
		default:
		}
		// Ready once the Worker itself answers (its envelope for an unknown
		// route): wrangler's proxy listens, and may answer an empty 404,
		// before the Worker is loaded.
		res, err := http.Post(base+"/", "application/json", nil)
		if err == nil {
			body, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if strings.Contains(string(body), `"success":false`) {
				return base
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the Worker under wrangler dev did not answer within 60 s:\n%s", out.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func freePort(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return fmt.Sprint(l.Addr().(*net.TCPAddr).Port)
}

// postSQL sends one statement to /raw and returns the status and body.
func postSQL(t testing.TB, base, db, token, sql string, params ...any) (int, string) {
	t.Helper()
	body := fmt.Sprintf(`{"sql":%q,"params":[`, sql)
	for i, p := range params {
		if i > 0 {
			body += ","
		}
		body += fmt.Sprintf("%q", p)
	}
	body += "]}"
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/accounts/acc/d1/database/"+db+"/raw", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	data, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(data)
}
