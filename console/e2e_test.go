package console

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"image/png"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/d1idem/d1idem/idem"
)

var updateScreenshot = flag.Bool("update-screenshot", false, "write the overview's screenshot to docs/console.png")

// night is an operator's night on one ledger: a key left pending by a
// killed request (owner quiet), one past the TTL (awaiting retry), one in
// flight, completed ones, and one older than the retention.
func (f *fixture) night(t testing.TB) {
	t.Helper()
	json := http.Header{"Content-Type": {"application/json"}}
	f.clock.At(t0.Add(-30*time.Hour), func() {
		f.complete(t, "acct_9", "refund-3", idem.Response{Status: 200, Header: json, Body: []byte(`{"refund":"re_31","status":"done"}`)})
	})
	f.clock.At(t0.Add(-2*time.Hour), func() {
		f.complete(t, "acct_42", "order-1", idem.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}, "Location": {"/v1/orders/17"}},
			Body: []byte("{\n  \"id\": 17,\n  \"sku\": \"tea\",\n  \"qty\": 2,\n  \"status\": \"created\"\n}")})
	})
	f.clock.At(t0.Add(-47*time.Minute), func() {
		f.complete(t, "acct_13", "sub-2", idem.Response{Status: 201, Header: json, Body: []byte(`{"subscription":"sub_2"}`)})
	})
	f.clock.At(t0.Add(-3*time.Minute), func() { f.claim(t, "acct_42", "order-8") })
	f.clock.At(t0.Add(-25*time.Second), func() { f.claim(t, "acct_42", "order-7") })
	f.clock.At(t0.Add(-2*time.Second), func() { f.claim(t, "acct_7", "pay-1") })
}

// TestBrowserScreenshot: the overview of an operator's night, as docs/
// operators.md shows it (-update-screenshot writes docs/console.png).
func TestBrowserScreenshot(t *testing.T) {
	ctx := tab(t)
	f := newFixture(t, setup{cfg: Config{AllowRelease: true}})
	f.night(t)
	run(t, ctx, chromedp.EmulateViewport(1280, 860), chromedp.Navigate(f.url+"/"))
	waitFor(t, ctx, `document.querySelectorAll("#stuck .stuck-row").length === 2`)
	shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(shot))
	if err != nil {
		t.Fatalf("the screenshot is not a PNG: %v", err)
	}
	if b := img.Bounds(); b.Dx() < 1000 || b.Dy() < 500 {
		t.Errorf("the screenshot is %v", b)
	}
	path := filepath.Join(t.TempDir(), "console.png")
	if *updateScreenshot {
		path = filepath.Join("..", "docs", "console.png")
	}
	if err := os.WriteFile(path, shot, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", path)
}

// TestBrowserStuckKeyReleased: a key left pending by a killed request
// appears on the overview as its owner goes quiet, with the ledger's
// explanation; releasing it goes through the confirmation page, which
// shows exactly what will be released, and the row in D1 is released.
func TestBrowserStuckKeyReleased(t *testing.T) {
	ctx := tab(t)
	f := newFixture(t, setup{cfg: Config{AllowRelease: true}})
	f.claim(t, "acct_42", "order-7") // and the request is killed: no completion
	f.clock.Advance(quiet + 5*time.Second)
	run(t, ctx, chromedp.Navigate(f.url+"/"))
	if got := text(t, ctx, "#count-pending"); got != "1" {
		t.Errorf("pending: %q", got)
	}
	row := text(t, ctx, "#stuck .stuck-row")
	for _, want := range []string{"acct_42", "order-7", "owner quiet", "no update for 25s (a live owner renews every 10s), inside the 30s TTL",
		"Retries get 409 idempotency_key_in_progress until the TTL has passed, in 5s."} {
		if !strings.Contains(row, want) {
			t.Errorf("the stuck row lacks %q: %q", want, row)
		}
	}
	follow(t, ctx, "#stuck a.release", 200)
	for sel, want := range map[string]string{"#confirm-principal": "acct_42", "#confirm-key": "order-7", "#confirm-generation": "1"} {
		if got := text(t, ctx, sel); got != want {
			t.Errorf("the confirmation's %s: %q, want %q", sel, got, want)
		}
	}
	if gen, _, _ := f.row(t, "acct_42", "order-7"); gen != 1 {
		t.Fatalf("the confirmation page released the key: generation %d", gen)
	}
	follow(t, ctx, "#confirm-release", 200)
	if got := text(t, ctx, "#release-done"); !strings.Contains(got, "generation 1 moved to 2") {
		t.Errorf("after the release: %q", got)
	}
	gen, status, updated := f.row(t, "acct_42", "order-7")
	if gen != 2 || status != "pending" || updated >= f.clock.Now().Add(-30*time.Second).UnixMilli() {
		t.Errorf("in D1 the key is at generation %d, %s, updated at %d: not released", gen, status, updated)
	}
	run(t, ctx, chromedp.Navigate(f.url+"/"))
	if row := text(t, ctx, "#stuck .stuck-row"); !strings.Contains(row, "awaiting retry") || !strings.Contains(row, "generation 3") {
		t.Errorf("the released key on the overview: %q", row)
	}
}

// TestBrowserReleaseRefused: from the console's own page, a release posted
// without the CSRF token, with a wrong one, or as a GET changes nothing;
// another site's page (another port of 127.0.0.1) posting the whole form,
// the victim's CSRF token included, is refused; and with releasing off no
// release is offered, and a posted one is refused.
func TestBrowserReleaseRefused(t *testing.T) {
	ctx := tab(t)
	f := newFixture(t, setup{cfg: Config{AllowRelease: true}})
	f.claim(t, "acct_42", "order-7")
	f.clock.Advance(quiet + 5*time.Second)
	run(t, ctx, chromedp.Navigate(f.url+"/release?principal=acct_42&key=order-7&generation=1"), chromedp.WaitVisible(chromedp.ID("confirm-release")))
	token := eval[string](t, ctx, `document.querySelector('input[name=csrf]').value`)
	for name, js := range map[string]string{
		"no token":    `postRelease('')`,
		"wrong token": `postRelease('` + token[:len(token)-2] + `AA')`,
		"GET":         `fetch('/release?principal=acct_42&key=order-7&generation=1&csrf=` + token + `').then(r => r.status)`,
	} {
		status := eval[int](t, ctx, `(function(){ window.postRelease = function(csrf) {
			const body = new URLSearchParams({principal: 'acct_42', key: 'order-7', generation: '1'});
			if (csrf) { body.set('csrf', csrf); }
			return fetch('/release', {method: 'POST', body: body}).then(r => r.status);
		}; return `+js+`; })()`, chromedp.EvalAwaitPromise)
		want := 403
		if name == "GET" {
			want = 200
		}
		if status != want {
			t.Errorf("%s: %d, want %d", name, status, want)
		}
		if gen, _, _ := f.row(t, "acct_42", "order-7"); gen != 1 {
			t.Fatalf("%s released the key", name)
		}
	}

	evil := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprintf(w, `<form id="f" method="post" action="%s/release"><input name="principal" value="acct_42"><input name="key" value="order-7">
			<input name="generation" value="1"><input name="csrf" value="%s"></form><script>document.getElementById('f').submit()</script>`, f.url, token)
	}))
	run(t, ctx, chromedp.Navigate(evil+"/"))
	waitFor(t, ctx, `location.href === '`+f.url+`/release' && document.getElementById('problem') !== null`)
	if got := text(t, ctx, "#problem"); !strings.Contains(got, "other sites") {
		t.Errorf("another site's form: %q", got)
	}
	if gen, _, _ := f.row(t, "acct_42", "order-7"); gen != 1 {
		t.Fatal("another site's form released the key")
	}

	off := newFixtureOn(t, f.db, setup{})
	off.clock.Advance(quiet + 5*time.Second)
	run(t, ctx, chromedp.Navigate(off.url+"/"))
	waitFor(t, ctx, `document.querySelectorAll('#stuck .stuck-row').length === 1`)
	if n := eval[int](t, ctx, `document.querySelectorAll('a.release, form[action="/release"]').length`); n != 0 {
		t.Errorf("with releasing off the overview offers %d releases", n)
	}
	if got := text(t, ctx, "#release-mode"); got != "read only" {
		t.Errorf("the mode: %q", got)
	}
	status := eval[int](t, ctx, `fetch('/release', {method: 'POST', body: new URLSearchParams({principal: 'acct_42', key: 'order-7', generation: '1', csrf: '`+token+`'})}).then(r => r.status)`,
		chromedp.EvalAwaitPromise)
	if status != 403 {
		t.Errorf("a release posted with releasing off: %d", status)
	}
	if gen, _, _ := f.row(t, "acct_42", "order-7"); gen != 1 {
		t.Fatal("a console with releasing off released the key")
	}
}

// inert checks that the page built no element and ran nothing from the
// ledger's values: no img at all, no script but the console's, and the
// marker the hostile values would set unset.
func inert(t *testing.T, ctx context.Context, where string) {
	t.Helper()
	if n := eval[int](t, ctx, `document.images.length`); n != 0 {
		t.Errorf("%s: %d img elements", where, n)
	}
	if src := eval[[]string](t, ctx, `Array.from(document.scripts, s => s.getAttribute('src') || 'inline')`); len(src) != 1 || src[0] != "/static/console.js" {
		t.Errorf("%s: scripts %v", where, src)
	}
	if eval[bool](t, ctx, `window.__pwned !== undefined`) {
		t.Errorf("%s: a hostile value ran", where)
	}
}

// TestBrowserHostileValuesInert: a principal, key, stored body and header
// made to run script show as text, and a principal with control
// characters shows them as Go escapes, on every page, and nothing runs.
func TestBrowserHostileValuesInert(t *testing.T) {
	ctx := tab(t)
	f := newFixture(t, setup{cfg: Config{AllowRelease: true}})
	f.exec(t, `INSERT INTO idempotency_keys (principal, key, fingerprint, status, generation, response_status, response_body, response_headers, created_at, updated_at)
		VALUES (?, ?, 'fp', 'completed', 1, 200, ?, ?, ?, ?)`, hostilePrincipal, hostileKey, hostileBody, `{"x-evil":"<script>window.__pwned=4</script>"}`,
		t0.Add(-time.Minute).UnixMilli(), t0.Add(-time.Minute).UnixMilli())
	f.exec(t, `INSERT INTO idempotency_keys (principal, key, fingerprint, status, generation, created_at, updated_at)
		VALUES (?, ?, 'fp', 'pending', 1, ?, ?)`, controlPrincipal, hostileKey, t0.Add(-time.Minute).UnixMilli(), t0.Add(-quiet-5*time.Second).UnixMilli())
	for path, shows := range map[string][]string{
		"/":                                  {controlPrincipal, hostileKey},
		"/keys":                              {hostilePrincipal, hostileKey},
		keyURL(hostilePrincipal, hostileKey): {hostilePrincipal, hostileBody, "<script>window.__pwned=4</script>"},
		keyURL(controlPrincipal, hostileKey): {controlPrincipal},
	} {
		run(t, ctx, chromedp.Navigate(f.url+path))
		page := eval[string](t, ctx, `document.body.innerText`)
		for _, v := range shows {
			want := v
			if v == controlPrincipal {
				want = `"acct\x1b[31m\u202eevil"`
			}
			if !strings.Contains(page, want) {
				t.Errorf("%s does not show %s as text:\n%s", path, want, page)
			}
		}
		if strings.Contains(page, "\x1b") || strings.Contains(page, "\u202e") {
			t.Errorf("%s shows a control character raw", path)
		}
		inert(t, ctx, path)
	}
}

// TestBrowserRefresh: the overview refreshes itself without reloading the
// page: a new key and a new stuck key (with a hostile principal, which
// stays inert) appear, and the page's own state survives.
func TestBrowserRefresh(t *testing.T) {
	ctx := tab(t)
	f := newFixture(t, setup{cfg: Config{Refresh: 200 * time.Millisecond, AllowRelease: true}})
	f.claim(t, "acct_1", "k1")
	run(t, ctx, chromedp.Navigate(f.url+"/"))
	if got := text(t, ctx, "#count-keys"); got != "1" {
		t.Fatalf("keys: %q", got)
	}
	eval[bool](t, ctx, `window.__marker = true`)
	f.claim(t, "acct_2", "k2")
	waitFor(t, ctx, `document.getElementById('count-keys').textContent === '2'`)
	f.exec(t, `INSERT INTO idempotency_keys (principal, key, fingerprint, status, generation, created_at, updated_at)
		VALUES (?, 'k3', 'fp', 'pending', 1, ?, ?)`, hostilePrincipal, t0.Add(-time.Minute).UnixMilli(), t0.Add(-quiet-5*time.Second).UnixMilli())
	waitFor(t, ctx, `document.querySelector('#stuck') !== null && document.querySelector('#stuck').innerText.includes('`+strings.ReplaceAll(hostilePrincipal, `"`, `\"`)+`')`)
	if !eval[bool](t, ctx, `window.__marker === true`) {
		t.Error("the page was reloaded")
	}
	if got := text(t, ctx, "#refresh-status"); !strings.HasPrefix(got, "Refreshed at") {
		t.Errorf("the refresh status: %q", got)
	}
	inert(t, ctx, "the refreshed overview")
}

// TestBrowserPaging: the keys page's Next link pages through every key
// once, by Admin.List's cursors.
func TestBrowserPaging(t *testing.T) {
	ctx := tab(t)
	f := newFixture(t, setup{})
	for i := range 5 {
		f.clock.Advance(time.Second)
		f.claim(t, "acct_1", fmt.Sprintf("k%d", i))
	}
	run(t, ctx, chromedp.Navigate(f.url+"/keys?limit=2"))
	var seen []string
	for page := 1; ; page++ {
		keys := eval[[]string](t, ctx, `Array.from(document.querySelectorAll('#keys .key'), e => e.textContent)`)
		seen = append(seen, keys...)
		if !strings.Contains(text(t, ctx, "#page-calls"), "This page cost 1 D1 call.") {
			t.Errorf("page %d: %q", page, text(t, ctx, "#page-calls"))
		}
		if !eval[bool](t, ctx, `document.getElementById('next-page') !== null`) {
			break
		}
		if page > 3 {
			t.Fatal("more than three pages")
		}
		follow(t, ctx, "#next-page", 200)
	}
	if strings.Join(seen, ",") != "k0,k1,k2,k3,k4" {
		t.Errorf("paged through %v", seen)
	}
}

// TestBrowserLookup: the lookup form finds a key by principal and key and
// shows its stored response as text: status, headers, and the body with
// its lines; a key that is not there is said to be missing.
func TestBrowserLookup(t *testing.T) {
	ctx := tab(t)
	f := newFixture(t, setup{})
	f.night(t)
	run(t, ctx, chromedp.Navigate(f.url+"/key"),
		chromedp.SendKeys(chromedp.CSS(`#lookup input[name=principal]`), "acct_42"),
		chromedp.SendKeys(chromedp.CSS(`#lookup input[name=key]`), "order-1"))
	follow(t, ctx, `#lookup button[type=submit]`, 200)
	for sel, want := range map[string]string{
		"#key-principal": "acct_42", "#key-key": "order-1", "#key-generation": "1", "#response-status": "201",
		"#response-headers": "content-type\tapplication/json\nlocation\t/v1/orders/17", // stored by their lower-case names (idem.Config.ReplayableHeaders)
		"#response-body":    "{\n  \"id\": 17,\n  \"sku\": \"tea\",\n  \"qty\": 2,\n  \"status\": \"created\"\n}",
	} {
		if got := text(t, ctx, sel); got != want {
			t.Errorf("%s: %q, want %q", sel, got, want)
		}
	}
	if got := text(t, ctx, "#key-status"); !strings.HasPrefix(got, "completed, completed:") {
		t.Errorf("the status: %q", got)
	}
	if got := text(t, ctx, "#page-calls"); got != "This page cost 1 D1 call." {
		t.Errorf("the footer: %q", got)
	}
	run(t, ctx, chromedp.Navigate(f.url+"/key"),
		chromedp.SendKeys(chromedp.CSS(`#lookup input[name=principal]`), "acct_42"),
		chromedp.SendKeys(chromedp.CSS(`#lookup input[name=key]`), "order-9"))
	follow(t, ctx, `#lookup button[type=submit]`, 404)
	if got := text(t, ctx, "#lookup-missing"); !strings.Contains(got, "No key order-9 for principal acct_42") {
		t.Errorf("a missing key: %q", got)
	}
}
