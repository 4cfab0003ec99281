package cli

import (
	"context"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/internal/d1test"
)

// consoleLine is the line console prints once it listens.
var consoleLine = regexp.MustCompile(`d1idem console serving http://([0-9.:\[\]]+)/ for the ledger on `)

// startConsole starts `d1idem console args...` and returns its address and
// what it printed once it listens; it stops when the test ends, and must
// exit 0 then.
func startConsole(t *testing.T, args ...string) (addr, printed string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var out, errb syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, newApp(&out, &errb, &options{}), append([]string{"d1idem", "console", "--listen", "127.0.0.1:0"}, args...), &errb)
	}()
	t.Cleanup(func() {
		cancel()
		if code := <-done; code != 0 {
			t.Errorf("console exited %d: %s", code, errb.String())
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if o := out.String(); strings.Contains(o, "Ctrl-C stops it.") {
			if m := consoleLine.FindStringSubmatch(o); m != nil {
				return m[1], o
			}
		}
		select {
		case code := <-done:
			done <- code
			t.Fatalf("console exited %d before listening: %s%s", code, out.String(), errb.String())
		case <-time.After(10 * time.Millisecond):
		}
	}
	t.Fatalf("console did not start: %s%s", out.String(), errb.String())
	return "", ""
}

// TestConsoleServes: d1idem console serves the ledger the connection
// flags name, read only unless --allow-release, and stops cleanly.
func TestConsoleServes(t *testing.T) {
	db := newSchemaDB(t, "orders")
	db.insert(t, time.Now(), scenario...)
	addr, printed := startConsole(t, db.args()...)
	for _, want := range []string{"for the ledger on database orders", "read only: --allow-release lets operators release stuck keys",
		"the overview refreshes every 10s"} {
		if !strings.Contains(printed, want) {
			t.Errorf("console printed no %q:\n%s", want, printed)
		}
	}
	res, err := http.Get("http://" + addr + "/keys?principal=acct_42")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || !strings.Contains(string(body), "order-7") || !strings.Contains(string(body), "read only") || strings.Contains(string(body), "tok_test") {
		t.Errorf("GET /keys: %d\n%s", res.StatusCode, body)
	}
	_, printed = startConsole(t, db.args("--allow-release", "--refresh", "0")...)
	if !strings.Contains(printed, "releasing keys is on") || !strings.Contains(printed, "does not refresh by itself") {
		t.Errorf("console --allow-release --refresh 0 printed:\n%s", printed)
	}
}

// TestConsoleNeedsATokenOffLoopback: off loopback the console needs a
// token, of at least 16 characters, which it never prints; bad flags are
// usage errors of one line, before any database is opened.
func TestConsoleNeedsATokenOffLoopback(t *testing.T) {
	for _, args := range [][]string{
		{"--listen", "0.0.0.0:0"}, {"--listen", ":0"},
		{"--token", "short"}, {"--refresh", "500ms"}, {"--retention", "0s"}, {"stray"},
	} {
		r := runCLI(t, nil, append([]string{"console"}, args...)...)
		if r.code != exitUsage || strings.Count(r.stderr, "\n") != 1 {
			t.Errorf("console %v: want exit 2 and one line; %s", args, r)
		}
	}
	r := runCLI(t, nil, "console", "--listen", "0.0.0.0:0")
	if !strings.Contains(r.stderr, "is not a loopback address") || !strings.Contains(r.stderr, "--token") || !strings.Contains(r.stderr, envConsoleToken) {
		t.Errorf("off loopback: %s", r)
	}
	const token = "a-console-token-0123456789"
	db := newSchemaDB(t, "orders")
	t.Setenv(envConsoleToken, token)
	addr, printed := startConsole(t, db.args("--listen", "0.0.0.0:0")...)
	if strings.Contains(printed, token) || !strings.Contains(printed, "Sign in with the token of --token ($D1IDEM_CONSOLE_TOKEN)") {
		t.Errorf("console with a token printed:\n%s", printed)
	}
	_, port, _ := net.SplitHostPort(addr)
	res, err := http.Get("http://127.0.0.1:" + port + "/")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusUnauthorized {
		t.Errorf("without the token: %d", res.StatusCode)
	}
}

// TestConsoleMissingLedger: a database without the ledger stops the
// console before it serves, with the error every command gives.
func TestConsoleMissingLedger(t *testing.T) {
	db := newLedgerDB(t, "orders")
	r := runCLI(t, nil, db.args("console", "--listen", "127.0.0.1:0")...)
	if r.code != exitError || !strings.Contains(r.stderr, "d1idem schema apply") || r.stdout != "" {
		t.Errorf("console on a database without the ledger: %s", r)
	}
}

// TestConsoleHelpExamples: d1idem --help lists console; console --help
// names its flags, and its examples name only flags it has, pasted into a
// shell; the first serves as it is, on a ledger under .d1idem.
func TestConsoleHelpExamples(t *testing.T) {
	checkHelpMentions(t, []string{"console"}, []string{"--listen ADDRESS", "(default: \"127.0.0.1:8789\")", "--token TOKEN", "[$D1IDEM_CONSOLE_TOKEN]",
		"--allow-release", "--refresh DURATION", "   d1idem console --local .d1idem\n", "   d1idem console --database orders --allow-release\n"})
	if top := mustRun(t, nil, "--help").stdout; !strings.Contains(top, "console  serve a web console") {
		t.Errorf("d1idem --help does not list console:\n%s", top)
	}
	help := mustRun(t, nil, "console", "--help").stdout
	golden(t, "help_console", help)
	var examples []string
	for _, line := range strings.Split(help, "\n") {
		if strings.HasPrefix(line, "      d1idem console ") { // the description's examples
			examples = append(examples, strings.TrimSpace(line))
		}
	}
	if len(examples) < 4 {
		t.Fatalf("console --help has %d examples:\n%s", len(examples), help)
	}
	for _, ex := range examples {
		if r := runCLI(t, nil, append(pasted(t, ex), "--help")...); r.code != 0 || !strings.Contains(r.stdout, "d1idem console - ") {
			t.Errorf("%s: %s", ex, r)
		}
	}
	t.Chdir(t.TempDir())
	mustRun(t, nil, "schema", "apply", "--local", ".d1idem")
	addr, _ := startConsole(t, pasted(t, examples[0])[1:]...)
	res, err := http.Get("http://" + addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 200 {
		t.Errorf("%s: GET / %d", examples[0], res.StatusCode)
	}
}

// getBody GETs a console page, which must answer 200.
func getBody(t *testing.T, url string) string {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	if res.StatusCode != 200 {
		t.Fatalf("GET %s: %d\n%s", url, res.StatusCode, body)
	}
	return string(body)
}

// TestConsoleConnections: the console opens its databases as every
// command does: a ledger across several local databases (its ring, each
// database's figures and calls), and one reached through a bridge, whose
// secret no page shows.
func TestConsoleConnections(t *testing.T) {
	t.Setenv("D1_DATABASE_ID", "")
	dir := t.TempDir()
	mustRun(t, nil, "schema", "apply", "--local", dir, "--database-id", "ledger-a", "--database-id", "ledger-b")
	mustRun(t, nil, "ring", "init", "--local", dir, "--databases-prefix", "ledger-")
	addr, printed := startConsole(t, "--local", dir, "--databases-prefix", "ledger-")
	if !strings.Contains(printed, "for the ledger on 2 databases") {
		t.Errorf("console on two databases printed:\n%s", printed)
	}
	body := getBody(t, "http://"+addr+"/")
	for _, want := range []string{"Version 1, stable: ledger-a, ledger-b.", `id="databases"`, "(ledger-a: 3, ledger-b: 3)"} {
		if !strings.Contains(body, want) {
			t.Errorf("the overview on two databases lacks %q:\n%s", want, body)
		}
	}

	const secret = "dev-secret-0123456789abcdef"
	b := d1test.LocalConfig(t, d1local.Config{Token: secret})
	d1test.ApplySchema(t, b.Database(ordersID).Client(t, func(c *d1client.Config) { c.APIToken = secret }))
	for _, v := range []string{d1client.BridgeURLEnv, d1client.BaseURLEnv, d1client.APIBaseURLEnv, "CLOUDFLARE_API_TOKEN"} {
		t.Setenv(v, "")
	}
	addr, printed = startConsole(t, "--bridge-url", "http://:"+secret+"@"+strings.TrimPrefix(b.BaseURL, "http://"),
		"--account-id", d1test.AccountID, "--database-id", ordersID)
	body = getBody(t, "http://"+addr+"/keys")
	if !strings.Contains(printed, "through the bridge at "+b.BaseURL) || !strings.Contains(body, "through the bridge") ||
		strings.Contains(printed, secret) || strings.Contains(body, secret) {
		t.Errorf("console through a bridge printed:\n%s\nand served:\n%s", printed, body)
	}
}
