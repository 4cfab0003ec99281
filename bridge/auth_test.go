package bridge_test

import (
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/internal/d1test"
)

// TestAuth: the bridge answers only requests that carry its secret as a
// bearer token. A missing header or any other token (empty, a prefix of the
// secret, the secret with a byte more, another case) is 401 with code 10000,
// a header that is not "Bearer <token>" 400 with code 6003, as Cloudflare's
// API answers; nothing of a refused request runs, and no answer contains the
// secret.
func TestAuth(t *testing.T) {
	b := d1test.Workerd(t)
	secret := b.Token
	if len(secret) < 16 {
		t.Fatalf("the workerd backend has no proper secret (%d bytes)", len(secret))
	}
	db := b.NewDatabase(t)
	create := `{"sql":"CREATE TABLE made_by_refused_request (x)"}`

	for _, tc := range []struct {
		name   string
		header http.Header
	}{
		{"no header", http.Header{}},
		{"wrong token", bearer("0123456789abcdef0123456789abcdef")},
		{"prefix of the secret", bearer(secret[:len(secret)-1])},
		{"secret and one byte more", bearer(secret + "0")},
		{"first half of the secret", bearer(secret[:len(secret)/2])},
		{"secret in upper case", bearer(strings.ToUpper(secret))},
		{"one byte", bearer("x")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := db.PostHeader(t, "raw", tc.header, create)
			wantError(t, res, http.StatusUnauthorized, 10000, "Authentication error")
			if got := res.Header.Get("WWW-Authenticate"); !strings.HasPrefix(got, "Bearer") {
				t.Errorf("WWW-Authenticate = %q", got)
			}
			if strings.Contains(string(res.Body), secret) {
				t.Errorf("the answer contains the secret")
			}
		})
	}
	for _, tc := range []struct{ name, value string }{
		{"basic", "Basic " + secret},
		{"no scheme", secret},
		{"empty bearer", "Bearer "},
		{"two tokens", "Bearer " + secret + " " + secret},
		{"token with a comma", "Bearer " + secret + "," + secret},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := db.PostHeader(t, "raw", http.Header{"Authorization": {tc.value}}, create)
			e := wantError(t, res, http.StatusBadRequest, 6003, "Invalid request headers")
			if len(e.ErrorChain) != 1 || !strings.Contains(string(e.ErrorChain[0]), `"code":6111`) {
				t.Errorf("error_chain = %s, want code 6111", e.ErrorChain)
			}
		})
	}

	t.Run("right secret", func(t *testing.T) {
		wantOK(t, db.PostHeader(t, "raw", bearer(secret), `{"sql":"SELECT 1"}`), 1)
		// The scheme is case-insensitive, as HTTP says.
		wantOK(t, db.PostHeader(t, "raw", http.Header{"Authorization": {"bearer " + secret}}, `{"sql":"SELECT 1"}`), 1)
	})

	t.Run("nothing ran", func(t *testing.T) {
		c := db.Client(t)
		if n := count(t, c, "SELECT count(*) FROM sqlite_master WHERE name = 'made_by_refused_request'"); n != 0 {
			t.Errorf("a refused request created its table")
		}
	})

	t.Run("d1client", func(t *testing.T) {
		wrong := db.Client(t, func(c *d1client.Config) { c.APIToken = "not-the-secret-not-the-secret" })
		_, err := wrong.Query(t.Context(), "SELECT 1")
		e := clientError(t, err, d1client.ErrAuth, http.StatusUnauthorized)
		if len(e.Codes) != 1 || e.Codes[0] != 10000 {
			t.Errorf("codes = %v, want [10000]", e.Codes)
		}
		none := db.Client(t, func(c *d1client.Config) { c.APIToken = "" })
		_, err = none.Query(t.Context(), "SELECT 1")
		clientError(t, err, d1client.ErrAuth, http.StatusUnauthorized)
	})

	// The token is checked before the database is looked up, so the names
	// a bridge serves cannot be probed without it.
	t.Run("before the database", func(t *testing.T) {
		res := b.Database("no-such-database").PostHeader(t, "raw", bearer("wrong-wrong-wrong-wrong"), `{"sql":"SELECT 1"}`)
		wantError(t, res, http.StatusUnauthorized, 10000)
		res = b.Database("no-such-database").Post(t, "raw", `{"sql":"SELECT 1"}`)
		wantError(t, res, http.StatusNotFound, 7404, "The database no-such-database could not be found")
	})
}

// TestSecretComparedInConstantTime checks the structure of worker.js's
// authentication, which timing measurements on a shared machine could not
// prove: the presented token and the secret are both HMAC-SHA256'd under a
// key generated in the Worker (never exported) and only the two digests are
// compared, with crypto.subtle.timingSafeEqual or a loop without an early
// exit; the secret itself is compared with nothing but the empty
// placeholders of an unset setting.
func TestSecretComparedInConstantTime(t *testing.T) {
	src, err := os.ReadFile("worker.js")
	if err != nil {
		t.Fatal(err)
	}
	code := stripComments(string(src))

	auth := functionBody(t, code, "async function authenticate(")
	for _, want := range []string{`crypto.subtle.sign("HMAC", config.macKey`, "timingSafeEqual(mac, config.secretMac)", "timingSafeEqual(mac, config.previousMac)"} {
		if !strings.Contains(auth, want) {
			t.Errorf("authenticate does not contain %q:\n%s", want, auth)
		}
	}
	build := functionBody(t, code, "async function buildConfig(")
	for _, want := range []string{
		`crypto.subtle.generateKey({ name: "HMAC", hash: "SHA-256" }, false, ["sign"])`,
		`crypto.subtle.sign("HMAC", macKey, new TextEncoder().encode(secret))`,
		`crypto.subtle.sign("HMAC", macKey, new TextEncoder().encode(previous))`,
	} {
		if !strings.Contains(build, want) {
			t.Errorf("buildConfig does not contain %q", want)
		}
	}
	eq := functionBody(t, code, "function timingSafeEqual(")
	if !strings.Contains(eq, "crypto.subtle.timingSafeEqual(a, b)") {
		t.Errorf("timingSafeEqual does not use crypto.subtle.timingSafeEqual")
	}
	loop := eq[strings.Index(eq, "for ("):]
	if strings.Contains(loop[:strings.Index(loop, "return")], "break") || strings.Count(loop, "return") != 1 {
		t.Errorf("the fallback loop may exit early:\n%s", loop)
	}

	// BRIDGE_SECRET and BRIDGE_SECRET_PREVIOUS are each read in one place,
	// and neither a secret nor a token is ever an operand of ==, ===, != or
	// !== except against the literals of an unset setting.
	previous := strings.Count(code, "env.BRIDGE_SECRET_PREVIOUS")
	if n := strings.Count(code, "env.BRIDGE_SECRET") - previous; n != 1 || strings.Count(code, "BRIDGE_SECRET;") != 1 || previous != 1 {
		t.Errorf("env.BRIDGE_SECRET is read %d times and env.BRIDGE_SECRET_PREVIOUS %d times, want once each (in buildConfig)", n, previous)
	}
	cmp := regexp.MustCompile(`([\w.\[\]"']+)\s*(?:===|!==|==|!=)\s*([\w.\[\]"']+)`)
	literal := regexp.MustCompile(`^(undefined|null|""|''|\d+|"[^"]*"|'[^']*')$`)
	for _, m := range cmp.FindAllStringSubmatch(code, -1) {
		for i, side := range []string{m[1], m[2]} {
			other := []string{m[2], m[1]}[i]
			s := strings.ToLower(side)
			if (strings.Contains(s, "secret") || strings.Contains(s, "token") || strings.Contains(s, "mac") || side == "m[1]") && !literal.MatchString(other) {
				t.Errorf("worker.js compares %q with %q directly", side, other)
			}
		}
	}
}

// functionBody returns the source of the function that starts with sig,
// through its closing brace.
func functionBody(t testing.TB, code, sig string) string {
	t.Helper()
	i := strings.Index(code, sig)
	if i < 0 {
		t.Fatalf("worker.js has no %q", sig)
	}
	open := strings.Index(code[i:], "{\n") + i
	depth := 0
	for j := open; j < len(code); j++ {
		switch code[j] {
		case '{':
			depth++
		case '}':
			depth--
			if depth == 0 {
				return code[i : j+1]
			}
		}
	}
	t.Fatalf("unbalanced braces after %q", sig)
	return ""
}

// stripComments removes // line comments (outside strings well enough for
// worker.js, whose strings hold no "//" but in URLs of comments).
func stripComments(src string) string {
	var b strings.Builder
	for _, line := range strings.Split(src, "\n") {
		if i := strings.Index(line, "//"); i >= 0 && !strings.Contains(line[:i], `"`) && !strings.Contains(line[:i], "`") {
			line = line[:i]
		}
		b.WriteString(line + "\n")
	}
	return b.String()
}

// TestNoSecretRefusesEverything: a bridge deployed without BRIDGE_SECRET
// serves nothing, whatever the request carries: 500 with code 10001 and a
// message naming the fix. d1client reports it as an authentication problem
// (not retried). A secret too short to be a secret is refused the same way
// (TestWorkerUnderNode covers the other unusable secrets).
func TestNoSecretRefusesEverything(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  d1test.BridgeConfig
		want string
	}{
		{"unset", d1test.BridgeConfig{NoSecret: true}, "no BRIDGE_SECRET is set"},
		{"too short", d1test.BridgeConfig{Secret: "short-secret"}, "BRIDGE_SECRET must be 16 to 4096 visible ASCII characters"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := d1test.Bridge(t, tc.cfg)
			db := b.NewDatabase(t)
			for _, h := range []http.Header{{}, bearer(b.Token), bearer("")} {
				res := db.PostHeader(t, "raw", h, `{"sql":"SELECT 1"}`)
				wantError(t, res, http.StatusInternalServerError, 10001, "bridge misconfigured: ", tc.want)
			}
			res := b.Database("x").PostHeader(t, "nope", bearer(b.Token), `{}`)
			wantError(t, res, http.StatusInternalServerError, 10001, tc.want)
			_, err := db.Client(t).Query(t.Context(), "SELECT 1")
			clientError(t, err, d1client.ErrAuth, http.StatusInternalServerError)
		})
	}
}

// TestPreviousSecret: with BRIDGE_SECRET_PREVIOUS set, the bridge accepts it
// as well as BRIDGE_SECRET (rotation without downtime), and nothing else;
// an unusable one is a misconfiguration named only to the secret's holder.
func TestPreviousSecret(t *testing.T) {
	const current, previous = "current-secret-0123456789abcdef", "previous-secret-0123456789abcdef"
	b := d1test.Bridge(t, d1test.BridgeConfig{Secret: current, Pool: 1, Env: []string{"BRIDGE_SECRET_PREVIOUS=" + previous}})
	db := b.Database("db-0")
	for _, token := range []string{current, previous} {
		wantOK(t, db.PostHeader(t, "raw", bearer(token), `{"sql":"SELECT 1"}`), 1)
	}
	for _, token := range []string{current + previous, previous[:len(previous)-1], "other-secret-0123456789abcdef"} {
		wantError(t, db.PostHeader(t, "raw", bearer(token), `{"sql":"SELECT 1"}`), http.StatusUnauthorized, 10000)
	}
	// A client configured by a bridge URL with the previous secret works.
	c, err := d1client.New(d1client.Config{BridgeURL: "http://:" + previous + "@" + strings.TrimPrefix(b.BaseURL, "http://"),
		AccountID: d1test.AccountID, DatabaseID: "db-0"})
	if err != nil {
		t.Fatal(err)
	}
	if n := count(t, c, "SELECT 1"); n != 1 {
		t.Fatalf("SELECT 1 = %d", n)
	}

	bad := d1test.Bridge(t, d1test.BridgeConfig{Secret: current, Pool: 1, Env: []string{"BRIDGE_SECRET_PREVIOUS=short"}})
	res := bad.Database("db-0").PostHeader(t, "raw", bearer(current), `{"sql":"SELECT 1"}`)
	wantError(t, res, http.StatusInternalServerError, 10001, "bridge misconfigured: BRIDGE_SECRET_PREVIOUS must be 16 to 4096")
	res = bad.Database("db-0").PostHeader(t, "raw", bearer("short"), `{"sql":"SELECT 1"}`)
	wantError(t, res, http.StatusUnauthorized, 10000)
}
