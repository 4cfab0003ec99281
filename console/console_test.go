package console

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/internal/d1test"
)

// quiet is how long after its last update a pending key's owner is
// presumed dead under the fixtures' ledger: two heartbeats of a third of
// the 30s TTL.
const quiet = 20 * time.Second

// TestSecurityHeaders: every answer, pages, parts, files, refusals and
// errors alike, carries the strict policy; pages are not cached.
func TestSecurityHeaders(t *testing.T) {
	f := newFixture(t, setup{})
	c := client(t)
	for _, path := range []string{"/", "/live", "/keys", "/key", "/key?principal=a&key=b", "/release?principal=a&key=b&generation=1",
		"/static/console.css", "/static/console.js", "/nope", "/keys?cursor=bogus"} {
		a := get(t, c, f.url+path)
		h := a.header
		if h.Get("Content-Security-Policy") != contentSecurityPolicy || h.Get("X-Content-Type-Options") != "nosniff" ||
			h.Get("Referrer-Policy") != "no-referrer" || h.Get("X-Frame-Options") != "DENY" {
			t.Errorf("GET %s (%d): headers %v", path, a.status, h)
		}
		if strings.HasPrefix(h.Get("Content-Type"), "text/html") && h.Get("Cache-Control") != "no-store" {
			t.Errorf("GET %s: Cache-Control %q", path, h.Get("Cache-Control"))
		}
	}
	if !strings.Contains(contentSecurityPolicy, "script-src 'self';") || strings.Contains(contentSecurityPolicy, "unsafe") {
		t.Errorf("the policy is not strict: %s", contentSecurityPolicy)
	}
}

// TestLoopbackOnlyWithoutToken: without a token the console answers only
// requests addressed to a loopback name (DNS rebinding); with one, any
// name, once signed in.
func TestLoopbackOnlyWithoutToken(t *testing.T) {
	f := newFixture(t, setup{})
	c := client(t)
	for host, want := range map[string]int{"evil.example": 403, "evil.example:80": 403, "192.168.1.20:8789": 403, "localhost:8789": 200, "127.0.0.1": 200, "[::1]:1": 200} {
		req, _ := http.NewRequest(http.MethodGet, f.url+"/", nil)
		req.Host = host
		if a := do(t, c, req); a.status != want {
			t.Errorf("Host %s: %d, want %d", host, a.status, want)
		}
	}
	g := newFixture(t, setup{cfg: Config{Token: "a-token-of-32-bytes-0123456789ab"}})
	req, _ := http.NewRequest(http.MethodGet, g.url+"/", nil)
	req.Host, req.Header["Authorization"] = "console.example", []string{"Bearer a-token-of-32-bytes-0123456789ab"}
	if a := do(t, c, req); a.status != 200 {
		t.Errorf("with a token, Host console.example: %d", a.status)
	}
}

// TestToken: with a token, nothing but the sign-in page is served until
// the token is given, as a bearer token or by signing in; the session
// cookie holds no token; a wrong token is refused; signing out ends it.
func TestToken(t *testing.T) {
	const token = "0123456789abcdef-console-token"
	f := newFixture(t, setup{cfg: Config{Token: token, AllowRelease: true}})
	f.claim(t, "acct_secret", "k1")
	c := client(t)
	for _, path := range []string{"/", "/keys", "/key?principal=acct_secret&key=k1", "/release?principal=acct_secret&key=k1&generation=1"} {
		a := get(t, c, f.url+path)
		if a.status != http.StatusUnauthorized || !strings.Contains(a.body, `action="/login"`) || strings.Contains(a.body, "acct_secret") || strings.Contains(a.body, "orders") {
			t.Errorf("GET %s signed out: %d\n%s", path, a.status, a.body)
		}
	}
	if a := get(t, c, f.url+"/live"); a.status != http.StatusUnauthorized {
		t.Errorf("GET /live signed out: %d", a.status)
	}
	if a := post(t, c, f.url+"/release", url.Values{"principal": {"acct_secret"}, "key": {"k1"}, "generation": {"1"}}); a.status != http.StatusUnauthorized {
		t.Errorf("POST /release signed out: %d", a.status)
	}
	if a := post(t, c, f.url+"/login", url.Values{"token": {token + "x"}}); a.status != http.StatusUnauthorized || !strings.Contains(a.body, "not the console's token") {
		t.Errorf("a wrong token: %d\n%s", a.status, a.body)
	}
	a := post(t, c, f.url+"/login", url.Values{"token": {token}})
	if a.status != http.StatusSeeOther {
		t.Fatalf("signing in: %d\n%s", a.status, a.body)
	}
	cookie := a.header.Get("Set-Cookie")
	if !strings.Contains(cookie, "HttpOnly") || !strings.Contains(cookie, "SameSite=Strict") || strings.Contains(cookie, token) {
		t.Errorf("the session cookie: %s", cookie)
	}
	home := get(t, c, f.url+"/")
	if home.status != 200 || !strings.Contains(home.body, "Sign out") || strings.Contains(home.body, token) {
		t.Fatalf("signed in: %d\n%s", home.status, home.body)
	}
	req, _ := http.NewRequest(http.MethodGet, f.url+"/keys", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	if a := do(t, http.DefaultClient, req); a.status != 200 || !strings.Contains(a.body, "acct_secret") {
		t.Errorf("a bearer token: %d", a.status)
	}
	req.Header.Set("Authorization", "Bearer "+token[:len(token)-1])
	if a := do(t, http.DefaultClient, req); a.status != http.StatusUnauthorized {
		t.Errorf("a wrong bearer token: %d", a.status)
	}
	if a := post(t, c, f.url+"/logout", url.Values{"csrf": {csrfOf(t, home.body)}}); a.status != http.StatusSeeOther {
		t.Errorf("signing out: %d", a.status)
	}
	if a := get(t, c, f.url+"/"); a.status != http.StatusUnauthorized {
		t.Errorf("signed out again: %d", a.status)
	}
	if _, err := New(Config{Ledger: f.ledger, Databases: []Database{{Client: f.db}}, Token: "short"}); err == nil || !strings.Contains(err.Error(), "Config.Token") {
		t.Errorf("a short token: %v", err)
	}
}

// TestReleaseRefusedWithoutConfirmation: a release that is not the
// confirmation page's form, with its CSRF token, changes nothing: no
// token, a wrong one, one from another browser, a GET, a POST from
// another site's page; and with releasing off, none at all.
func TestReleaseRefusedWithoutConfirmation(t *testing.T) {
	f := newFixture(t, setup{cfg: Config{AllowRelease: true}})
	f.claim(t, "acct_42", "order-7")
	f.clock.Advance(quiet + 5*time.Second)
	c, other := client(t), client(t)
	confirm := get(t, c, f.url+"/release?principal=acct_42&key=order-7&generation=1")
	if confirm.status != 200 || !strings.Contains(confirm.body, `id="release-form"`) {
		t.Fatalf("the confirmation page: %d\n%s", confirm.status, confirm.body)
	}
	token := csrfOf(t, confirm.body)
	otherToken := csrfOf(t, get(t, other, f.url+"/release?principal=acct_42&key=order-7&generation=1").body)
	form := func(csrf string) url.Values {
		v := url.Values{"principal": {"acct_42"}, "key": {"order-7"}, "generation": {"1"}}
		if csrf != "" {
			v.Set("csrf", csrf)
		}
		return v
	}
	for _, tc := range []struct {
		name string
		send func() answer
	}{
		{"no token", func() answer { return post(t, c, f.url+"/release", form("")) }},
		{"a wrong token", func() answer { return post(t, c, f.url+"/release", form(token[:len(token)-2]+"AA")) }},
		{"another browser's token", func() answer { return post(t, c, f.url+"/release", form(otherToken)) }},
		{"a token without its cookie", func() answer { return post(t, client(t), f.url+"/release", form(token)) }},
		{"from another site", func() answer { return crossSite(t, c, f.url+"/release", form(token)) }},
	} {
		if a := tc.send(); a.status != http.StatusForbidden || !strings.Contains(a.body, "Nothing was changed") && !strings.Contains(a.body, "other sites") {
			t.Errorf("%s: %d\n%s", tc.name, a.status, a.body)
		}
		if gen, status, _ := f.row(t, "acct_42", "order-7"); gen != 1 || status != "pending" {
			t.Fatalf("%s released the key: generation %d, %s", tc.name, gen, status)
		}
	}
	if a := get(t, c, f.url+"/release?"+form(token).Encode()); a.status != 200 || !strings.Contains(a.body, `id="release-form"`) {
		t.Errorf("GET with the token: %d", a.status)
	}
	if gen, _, _ := f.row(t, "acct_42", "order-7"); gen != 1 {
		t.Fatal("a GET released the key")
	}
	if a := post(t, c, f.url+"/release", form(token)); a.status != http.StatusOK || !strings.Contains(a.body, "generation 1 moved to 2") || callsOf(t, a.body) != "2" {
		t.Fatalf("the confirmation's own form (the row, then the fenced release: 2 D1 calls): %d\n%s", a.status, a.body)
	}

	off := newFixtureOn(t, f.db, setup{})
	for name, a := range map[string]answer{
		"confirmation page": get(t, c, off.url+"/release?principal=acct_42&key=order-7&generation=2"),
		"POST":              post(t, c, off.url+"/release", url.Values{"principal": {"acct_42"}, "key": {"order-7"}, "generation": {"2"}, "csrf": {token}}),
	} {
		if a.status != http.StatusForbidden || !strings.Contains(a.body, "Releasing is off") {
			t.Errorf("release off, %s: %d\n%s", name, a.status, a.body)
		}
	}
	if a := get(t, c, off.url+"/"); strings.Contains(a.body, "/release?") || !strings.Contains(a.body, "read only") {
		t.Errorf("release off, the overview offers a release:\n%s", a.body)
	}
}

// crossSite posts a form as another site's page would: the browser says
// where it comes from.
func crossSite(t testing.TB, c *http.Client, u string, form url.Values) answer {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, u, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	req.Header.Set("Origin", "http://evil.example")
	return do(t, c, req)
}

// TestReleaseFenced: a key taken over or renewed between the confirmation
// and the POST is not released; the page says what the key holds now.
func TestReleaseFenced(t *testing.T) {
	f := newFixture(t, setup{cfg: Config{AllowRelease: true}})
	f.claim(t, "acct_42", "order-7")
	f.clock.Advance(31 * time.Second) // past the TTL: its next retry takes it over
	c := client(t)
	if a := get(t, c, f.url+"/release?principal=acct_42&key=order-7&generation=1"); a.status != http.StatusConflict || !strings.Contains(a.body, "Nothing to release") {
		t.Errorf("a key awaiting retry needs no release: %d\n%s", a.status, a.body)
	}
	f.clock.Advance(-9 * time.Second) // 22s: owner quiet
	confirm := get(t, c, f.url+"/release?principal=acct_42&key=order-7&generation=1")
	if confirm.status != 200 {
		t.Fatalf("confirmation: %d\n%s", confirm.status, confirm.body)
	}
	f.clock.Advance(9 * time.Second)
	f.claim(t, "acct_42", "order-7") // the retry takes it over: generation 2
	a := post(t, c, f.url+"/release", url.Values{"principal": {"acct_42"}, "key": {"order-7"}, "generation": {"1"}, "csrf": {csrfOf(t, confirm.body)}})
	if a.status != http.StatusConflict || !strings.Contains(a.body, "at generation 2 now") {
		t.Errorf("a release of a generation taken over: %d\n%s", a.status, a.body)
	}
	if gen, status, _ := f.row(t, "acct_42", "order-7"); gen != 2 || status != "pending" {
		t.Errorf("the key is at generation %d, %s", gen, status)
	}
	for q, want := range map[string]int{
		"principal=acct_42&key=order-7&generation=0": 400, "principal=acct_42&key=order-7": 400, "principal=&key=order-7&generation=1": 400,
		"principal=acct_42&key=nope&generation=1": 404, `principal="acct&key=k&generation=1`: 400,
	} {
		if a := get(t, c, f.url+"/release?"+q); a.status != want {
			t.Errorf("GET /release?%s: %d, want %d", q, a.status, want)
		}
	}
}

// TestHostileValuesEscaped: a principal, key, header or body made to run
// script or drive a terminal is shown as text, its control characters as
// Go escapes, on every page; and links carry it exactly.
func TestHostileValuesEscaped(t *testing.T) {
	f := newFixture(t, setup{cfg: Config{AllowRelease: true}})
	f.exec(t, `INSERT INTO idempotency_keys (principal, key, fingerprint, status, generation, response_status, response_body, response_headers, created_at, updated_at)
		VALUES (?, ?, 'fp', 'completed', 1, 200, ?, ?, ?, ?)`, hostilePrincipal, hostileKey, hostileBody, `{"x-evil":"<script>window.__pwned=4</script>"}`,
		t0.Add(-time.Minute).UnixMilli(), t0.Add(-time.Minute).UnixMilli())
	f.exec(t, `INSERT INTO idempotency_keys (principal, key, fingerprint, status, generation, created_at, updated_at)
		VALUES (?, 'k', 'fp', 'pending', 1, ?, ?)`, controlPrincipal, t0.Add(-time.Minute).UnixMilli(), t0.Add(-quiet-5*time.Second).UnixMilli())
	c := client(t)
	pages := map[string]string{
		"/": get(t, c, f.url+"/").body, "/keys": get(t, c, f.url+"/keys").body,
		"/key": get(t, c, f.url+keyURL(hostilePrincipal, hostileKey)).body, "/key control": get(t, c, f.url+keyURL(controlPrincipal, "k")).body,
		"/release": get(t, c, f.url+"/release?"+url.Values{"principal": {controlPrincipal}, "key": {"k"}, "generation": {"1"}}.Encode()).body,
	}
	for name, body := range pages {
		for _, raw := range []string{"<img", "<script>window", "\x1b", "\u202e"} {
			if strings.Contains(body, raw) {
				t.Errorf("%s holds %q raw", name, raw)
			}
		}
	}
	for name, want := range map[string]string{
		"/keys":        "&lt;img src=x onerror=&#34;window.__pwned=1&#34;&gt;",
		"/key":         "&lt;img src=x onerror=window.__pwned=3&gt;",
		"/key control": `&#34;acct\x1b[31m\u202eevil&#34;`,
		"/release":     `&#34;acct\x1b[31m\u202eevil&#34;`,
	} {
		if !strings.Contains(pages[name], want) {
			t.Errorf("%s does not show %s:\n%s", name, want, pages[name])
		}
	}
	if !strings.Contains(pages["/key"], "&lt;script&gt;window.__pwned=4&lt;/script&gt;") {
		t.Errorf("the hostile header is not shown as text:\n%s", pages["/key"])
	}
	// The control principal's release names it exactly: its hidden field
	// is Go-quoted, and reads back as the same bytes.
	if !strings.Contains(pages["/release"], `name="principal" value="&#34;acct\x1b[31m\u202eevil&#34;"`) {
		t.Errorf("the release form's principal:\n%s", pages["/release"])
	}
}

// The hostile values of the tests.
const (
	hostilePrincipal = `<img src=x onerror="window.__pwned=1">`
	hostileKey       = `<script>window.__pwned=2</script>`
	hostileBody      = `<img src=x onerror=window.__pwned=3>`
	controlPrincipal = "acct\x1b[31m\u202eevil"
)

func (f *fixture) exec(t testing.TB, sql string, params ...any) {
	t.Helper()
	if _, err := f.db.Query(context.Background(), sql, params...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// TestKeysPaging: the keys page pages with Admin.List's cursors, one D1
// call a page, through every key exactly once; a cursor it did not hand
// out is refused.
func TestKeysPaging(t *testing.T) {
	f := newFixture(t, setup{})
	for i := range 7 {
		f.clock.Advance(time.Second)
		f.claim(t, "acct_1", fmt.Sprintf("k%d", i))
	}
	c := client(t)
	seen := map[string]bool{}
	next := f.url + "/keys?limit=3"
	for pages := 0; next != ""; pages++ {
		if pages > 3 {
			t.Fatal("more than three pages of three for seven keys")
		}
		a := get(t, c, next)
		if a.status != 200 || callsOf(t, a.body) != "1" {
			t.Fatalf("%s: %d, %s D1 calls", next, a.status, callsOf(t, a.body))
		}
		for i := range 7 {
			if strings.Contains(a.body, fmt.Sprintf(`>k%d<`, i)) {
				if seen[fmt.Sprint(i)] {
					t.Errorf("k%d on two pages", i)
				}
				seen[fmt.Sprint(i)] = true
			}
		}
		next = ""
		if m := nextLink.FindStringSubmatch(a.body); m != nil {
			next = f.url + strings.ReplaceAll(m[1], "&amp;", "&")
		}
	}
	if len(seen) != 7 {
		t.Errorf("saw %d of 7 keys", len(seen))
	}
	if a := get(t, c, f.url+"/keys?cursor=v1.bogus"); a.status != http.StatusBadRequest || !strings.Contains(a.body, "Not a cursor") {
		t.Errorf("a bogus cursor: %d", a.status)
	}
	for _, q := range []string{"status=done", "older_than=-1s", "older_than=soon", "limit=0", "limit=1001", `principal="x`} {
		if a := get(t, c, f.url+"/keys?"+q); a.status != http.StatusBadRequest {
			t.Errorf("/keys?%s: %d", q, a.status)
		}
	}
}

// nextLink finds the keys page's next page.
var nextLink = regexp.MustCompile(`href="([^"]+)" id="next-page"`)

// TestCallsShown: each page says the D1 calls it cost, on each database;
// the overview, read once per refresh interval, is shared by the pages
// opened within it.
func TestCallsShown(t *testing.T) {
	f := newFixture(t, setup{cfg: Config{Refresh: time.Hour}})
	f.claim(t, "acct_1", "k1")
	c := client(t)
	if got := callsOf(t, get(t, c, f.url+"/").body); got != "2" {
		t.Errorf("the overview cost %s D1 calls, want 2 (the stats, a page of stuck keys)", got)
	}
	if a := get(t, c, f.url+"/live"); callsOf(t, a.body) != "no" || !strings.Contains(a.body, "read") {
		t.Errorf("the overview within the refresh interval: %s", a.body)
	}
	for path, want := range map[string]string{"/keys": "1", "/key?principal=acct_1&key=k1": "1", "/key": "no"} {
		if got := callsOf(t, get(t, c, f.url+path).body); got != want {
			t.Errorf("%s cost %s D1 calls, want %s", path, got, want)
		}
	}
}

// TestSeveralDatabases: on a ledger across two databases, the overview
// shows each database, the ring, and the calls on each.
func TestSeveralDatabases(t *testing.T) {
	b := d1test.Local(t)
	a1, a2 := b.NewClientSchema(t), b.NewClientSchema(t)
	l, err := idem.NewSharded([]idem.Home{{ID: "ledger-a", DB: a1}, {ID: "ledger-b", DB: a2}}, idem.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Admin().InitRing(context.Background()); err != nil {
		t.Fatal(err)
	}
	for i := range 6 {
		if _, err := l.Begin(context.Background(), fmt.Sprintf("acct_%d", i), "k", "fp"); err != nil {
			t.Fatal(err)
		}
	}
	h, err := New(Config{Ledger: l, Databases: []Database{{ID: "ledger-a", Client: a1}, {ID: "ledger-b", Client: a2}}})
	if err != nil {
		t.Fatal(err)
	}
	srv := newServer(t, h)
	a := get(t, client(t), srv+"/")
	for _, want := range []string{"2 databases (ledger-a, ledger-b)", "Version 1, stable: ledger-a, ledger-b.", `id="databases"`,
		"This page cost 6 D1 calls (ledger-a: 3, ledger-b: 3)", `<div class="value" id="count-keys">6</div>`} {
		if !strings.Contains(a.body, want) {
			t.Errorf("the overview lacks %q:\n%s", want, a.body)
		}
	}
}

// TestNoSecretInPages: neither the API token the clients use nor the
// console's token appears on any page.
func TestNoSecretInPages(t *testing.T) {
	const apiToken, token = "cf-api-token-SECRET-123", "console-token-SECRET-4567"
	f := newFixture(t, setup{cfg: Config{Token: token, AllowRelease: true}, client: []func(*d1client.Config){func(c *d1client.Config) { c.APIToken = apiToken }}})
	f.claim(t, "acct_1", "k1")
	f.clock.Advance(quiet + time.Second)
	c := client(t)
	post(t, c, f.url+"/login", url.Values{"token": {token}})
	for _, path := range []string{"/", "/live", "/keys", "/key?principal=acct_1&key=k1", "/release?principal=acct_1&key=k1&generation=1", "/login", "/nope"} {
		a := get(t, c, f.url+path)
		if strings.Contains(a.body, "SECRET") || strings.Contains(fmt.Sprint(a.header), "SECRET") {
			t.Errorf("%s shows a secret:\n%s", path, a.body)
		}
	}
}

// TestMethods: each page answers its methods, others get 405 with Allow;
// unknown pages 404.
func TestMethods(t *testing.T) {
	f := newFixture(t, setup{})
	c := client(t)
	for _, tc := range []struct {
		method, path string
		status       int
		allow        string
	}{
		{http.MethodPost, "/", 405, "GET, HEAD"}, {http.MethodDelete, "/release", 405, "GET, HEAD, POST"},
		{http.MethodGet, "/logout", 405, "POST"}, {http.MethodGet, "/nope", 404, ""}, {http.MethodHead, "/keys", 200, ""},
	} {
		req, _ := http.NewRequest(tc.method, f.url+tc.path, nil)
		req.Header.Set("Sec-Fetch-Site", "same-origin")
		a := do(t, c, req)
		if a.status != tc.status || a.header.Get("Allow") != tc.allow {
			t.Errorf("%s %s: %d, Allow %q", tc.method, tc.path, a.status, a.header.Get("Allow"))
		}
	}
}

// TestReleaseSparesACompletionMeanwhile: the owner of a quiet key that
// completes it between the console's read of the row and its forced
// release keeps its stored response; nothing is released.
func TestReleaseSparesACompletionMeanwhile(t *testing.T) {
	var f *fixture
	var once sync.Once
	hook := func(c *d1client.Config) {
		base := c.HTTPClient.Transport
		if base == nil {
			base = http.DefaultTransport
		}
		c.HTTPClient = &http.Client{Transport: roundTripFunc(func(req *http.Request) (*http.Response, error) {
			body, err := io.ReadAll(req.Body)
			if err != nil {
				return nil, err
			}
			if strings.Contains(string(body), "UPDATE idempotency_keys\\nSET generation = generation + 1") { // the release
				once.Do(func() {
					f.exec(t, `UPDATE idempotency_keys SET status = 'completed', response_status = 201, response_body = '{}', response_headers = '{}'
						WHERE principal = 'acct_42' AND key = 'order-7'`)
				})
			}
			req.Body = io.NopCloser(bytes.NewReader(body))
			return base.RoundTrip(req)
		})}
	}
	f = newFixture(t, setup{cfg: Config{AllowRelease: true}, client: []func(*d1client.Config){hook}})
	f.claim(t, "acct_42", "order-7")
	f.clock.Advance(22 * time.Second) // owner quiet: a forced release is advised
	c := client(t)
	confirm := get(t, c, f.url+"/release?principal=acct_42&key=order-7&generation=1")
	if confirm.status != 200 {
		t.Fatalf("confirmation: %d\n%s", confirm.status, confirm.body)
	}
	post(t, c, f.url+"/release", url.Values{"principal": {"acct_42"}, "key": {"order-7"}, "generation": {"1"}, "csrf": {csrfOf(t, confirm.body)}})
	if gen, status, _ := f.row(t, "acct_42", "order-7"); gen != 1 || status != "completed" {
		t.Errorf("the key completed meanwhile is at generation %d, %s; want 1, completed", gen, status)
	}
}

// roundTripFunc is an http.RoundTripper.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
