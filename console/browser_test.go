package console

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// The browser tests drive Debian's headless Chromium with chromedp. One
// browser serves every test of the package (each in a tab of its own); it
// starts with the first test that asks for it. Where no Chromium is found
// they skip, loudly, unless CI is set: then they fail, so that CI cannot
// pass without them (.ci/run installs the chromium package).

// browser is the package's shared headless Chromium.
var browser struct {
	once   sync.Once
	ctx    context.Context // the browser's chromedp context
	stop   func()
	dir    string // its user data directory
	absent string // why there is no browser to run ("" when there is)
	err    error  // why it did not start
}

func TestMain(m *testing.M) {
	code := m.Run()
	if browser.stop != nil {
		browser.stop()
	}
	if browser.dir != "" {
		os.RemoveAll(browser.dir)
	}
	if err := markBrowser(os.Getenv("D1IDEM_BROWSER_MARKER")); err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	os.Exit(code)
}

// markBrowser leaves a word in the directory dir (make test's marker:
// D1IDEM_BROWSER_MARKER) saying whether the browser tests ran: "ran", or
// "skipped: why". go test shows a passing package's output only under -v,
// so make test's last lines say it instead. Nothing without dir, or when
// no browser test was asked for.
func markBrowser(dir string) error {
	word := ""
	switch {
	case dir == "":
		return nil
	case browser.absent != "":
		word = "skipped: " + browser.absent
	case browser.ctx != nil && browser.err == nil:
		word = "ran"
	default:
		return nil
	}
	f, err := os.CreateTemp(dir, "console.test.*")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(f, word)
	return errors.Join(err, f.Close())
}

// chromiumPath finds the browser: $D1IDEM_CHROMIUM, else Debian's
// chromium or another Chrome on PATH.
func chromiumPath() (string, error) {
	if p := os.Getenv("D1IDEM_CHROMIUM"); p != "" {
		return p, nil
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p, nil
		}
	}
	return "", errors.New("no chromium, chromium-browser or google-chrome on PATH (and D1IDEM_CHROMIUM unset)")
}

// startBrowser starts the shared browser: headless, with no sandbox (the
// tests run as root), no GPU, and none of Chromium's own traffic (updates,
// sync, safe browsing), which this machine's closed network refuses.
func startBrowser() {
	path, err := chromiumPath()
	if err != nil {
		browser.absent = err.Error()
		what := "SKIPPED"
		if os.Getenv("CI") != "" {
			what = "FAILING (CI is set)"
		}
		fmt.Fprintf(os.Stderr, "\n*** console: the browser tests are %s: %s. Install Debian's chromium (apt-get install chromium), as .ci/run does. ***\n\n", what, err)
		return
	}
	if browser.dir, err = os.MkdirTemp("", "d1idem-console-chromium-"); err != nil {
		browser.err = err
		return
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path), chromedp.NoSandbox, chromedp.UserDataDir(browser.dir), chromedp.WindowSize(1360, 900),
		chromedp.Flag("disable-gpu", true), chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-quic", true),
		chromedp.Flag("no-first-run", true), chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-sync", true))
	alloc, stopAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, stopBrowser := chromedp.NewContext(alloc)
	browser.ctx, browser.stop = ctx, func() { stopBrowser(); stopAlloc() }
	browser.err = chromedp.Do(ctx) // starts it
}

// tab opens a tab of the shared browser for t, closed when t ends. Its
// actions time out after two minutes in all: every wait in the tests is
// for something the page will show, bounded, never a sleep.
func tab(t *testing.T) context.Context {
	t.Helper()
	browser.once.Do(startBrowser)
	switch {
	case browser.absent != "" && os.Getenv("CI") != "":
		t.Fatalf("CI is set, and the browser tests cannot run: %s; .ci/run installs Debian's chromium", browser.absent)
	case browser.absent != "":
		t.Skipf("SKIPPED (no browser): %s; install Debian's chromium (apt-get install chromium) to run the browser tests", browser.absent)
	case browser.err != nil:
		t.Fatalf("starting Chromium: %v", browser.err)
	}
	ctx, closeTab := chromedp.NewContext(browser.ctx)
	t.Cleanup(closeTab)
	if err := chromedp.Do(ctx); err != nil { // opens the tab
		t.Fatalf("opening a tab: %v", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// run runs browser actions, failing t on an error.
func run(t *testing.T, ctx context.Context, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Fatal(err)
	}
}

// follow clicks the element sel matches and waits for the page it leads
// to, which must answer with status.
func follow(t *testing.T, ctx context.Context, sel string, status int64) {
	t.Helper()
	res, err := chromedp.RunResponse(ctx, chromedp.Click(chromedp.CSS(sel)))
	if err != nil {
		t.Fatalf("clicking %s: %v", sel, err)
	}
	if res.Status != status {
		t.Fatalf("clicking %s led to %s: %d, want %d", sel, res.URL, res.Status, status)
	}
}

// text is the visible text (innerText) of the first element sel matches,
// once there is one. It is read in one evaluation in the page: the
// overview's refresh may replace the element at any moment, and a query
// by DOM node (chromedp.Text) could then read a node already replaced.
func text(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	q := "document.querySelector(" + strconv.Quote(sel) + ")"
	waitFor(t, ctx, q+" !== null")
	return eval[string](t, ctx, "(e => e === null ? '' : e.innerText)("+q+")")
}

// eval evaluates a JavaScript expression in the page.
func eval[T any](t *testing.T, ctx context.Context, expr string, opts ...chromedp.EvaluateOption) T {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr, opts...))
	if err != nil {
		t.Fatalf("%s: %v", expr, err)
	}
	return v
}

// waitFor polls a JavaScript predicate in the page until it holds, for at
// most a minute (generous: the machine may be loaded).
func waitFor(t *testing.T, ctx context.Context, predicate string) {
	t.Helper()
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](predicate, chromedp.WithPollingInterval(50*time.Millisecond),
		chromedp.WithPollingTimeout(time.Minute))); err != nil {
		html, _ := chromedp.Run(ctx, chromedp.OuterHTML(chromedp.CSS("body")))
		t.Fatalf("waiting for %s: %v\npage:\n%s", predicate, err, html)
	}
}
