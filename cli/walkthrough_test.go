package cli

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/d1idem/d1idem/internal/d1test"
)

var updateDocs = flag.Bool("update-docs", false, "rewrite the outputs of docs/operators.md's walk-through with those of this run")

// docPort is the example API's port in the doc; the test serves on a free
// one and shows it as this.
const docPort = "8080"

// docStep is a step of the doc's walk-through: a command of a "$ " line
// with the output the doc shows under it (lines [from, to) of the file), or
// a directive of an HTML comment, "<!-- walkthrough: restart -->".
type docStep struct {
	command, directive string
	want               []string
	from, to           int
}

// walkthroughSteps reads the steps of the section of operators.md titled
// heading, up to the next section of its level.
func walkthroughSteps(t *testing.T, lines []string, heading string) []docStep {
	var steps []docStep
	in, fenced := false, false
	for i, line := range lines {
		switch {
		case line == heading:
			in = true
		case in && strings.HasPrefix(line, "## "):
			return steps
		case !in:
		case strings.HasPrefix(line, "```"):
			fenced = !fenced
			if !fenced && len(steps) > 0 && steps[len(steps)-1].to < 0 {
				steps[len(steps)-1].to = i
			}
		case fenced && strings.HasPrefix(line, "$ "):
			if len(steps) > 0 && steps[len(steps)-1].to < 0 {
				steps[len(steps)-1].to = i
			}
			steps = append(steps, docStep{command: strings.TrimPrefix(line, "$ "), from: i + 1, to: -1})
		case fenced && len(steps) > 0 && steps[len(steps)-1].to < 0:
			steps[len(steps)-1].want = append(steps[len(steps)-1].want, line)
		case strings.HasPrefix(line, "<!-- walkthrough: "):
			steps = append(steps, docStep{directive: strings.TrimSuffix(strings.TrimPrefix(line, "<!-- walkthrough: "), " -->")})
		}
	}
	if !in {
		t.Fatalf("operators.md has no %q", heading)
	}
	return steps
}

// volatile are the parts of an output that differ from run to run: times,
// ages, IDs, fingerprints, sizes, cursors. They are compared as
// placeholders.
var volatile = []struct {
	re   *regexp.Regexp
	repl string
}{
	{regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z`), "<TIME>"},
	{regexp.MustCompile(`Date: .*`), "Date: <DATE>"},
	{regexp.MustCompile(`ord_[0-9a-f]{16}`), "ord_<ID>"},
	{regexp.MustCompile(`\b[0-9a-f]{64}\b`), "<FINGERPRINT>"},
	{regexp.MustCompile(`v1\.[A-Za-z0-9_=-]+\.[0-9a-f]+`), "<CURSOR>"},
	{regexp.MustCompile(`\d+ bytes \(\d+\.\d [KM]iB\)`), "<SIZE>"},
	{regexp.MustCompile(`"(\w+)_ms":\s*\d+`), `"${1}_ms": <N>`},
	{regexp.MustCompile(`Content-Length: \d+`), "Content-Length: <N>"},
	{regexp.MustCompile(`\b(\d+(\.\d+)?(ms|s|m|h|d))+\b`), "<DURATION>"},
	{regexp.MustCompile(`\s+`), " "},
}

func normalize(lines []string) []string {
	var out []string
	for _, l := range lines {
		for _, v := range volatile {
			l = v.re.ReplaceAllString(l, v.repl)
		}
		out = append(out, strings.TrimSpace(l))
	}
	return out
}

// TestOperatorsWalkThrough runs the stuck-key walk-through of
// docs/operators.md with the shipped programs (the example API, built and
// run as a process, crashed and restarted as the doc says; the CLI in
// process; curl's requests from Go) and checks that every output is the
// one the doc shows, but for times, ages and IDs. With -update-docs it
// rewrites the doc's outputs instead.
func TestOperatorsWalkThrough(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the example API")
	}
	root, err := d1test.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	docPath := filepath.Join(root, "docs", "operators.md")
	raw, err := os.ReadFile(docPath)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(raw), "\n")
	steps := walkthroughSteps(t, lines, "## A key is stuck: what to do")
	if len(steps) < 10 {
		t.Fatalf("the walk-through has only %d steps", len(steps))
	}
	w := newWalker(t, root)
	got := make([][]string, len(steps))
	for i, s := range steps {
		got[i] = w.do(s)
		if s.command == "" || *updateDocs {
			continue
		}
		if want, have := normalize(s.want), normalize(got[i]); strings.Join(want, "\n") != strings.Join(have, "\n") {
			t.Errorf("$ %s\n--- the doc shows:\n%s\n--- the programs print:\n%s", s.command, strings.Join(s.want, "\n"), strings.Join(got[i], "\n"))
		}
	}
	if *updateDocs {
		for i := len(steps) - 1; i >= 0; i-- {
			if steps[i].command != "" {
				lines = append(lines[:steps[i].from], append(got[i], lines[steps[i].to:]...)...)
			}
		}
		if err := os.WriteFile(docPath, []byte(strings.Join(lines, "\n")), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// walker runs the walk-through's commands in a directory of its own.
type walker struct {
	t         *testing.T
	dir, port string
	orders    string // the example API's binary
	api       *exec.Cmd
	apiArgs   []string
	apiOut    *syncBuffer
	apiDone   chan error
	client    *http.Client
}

func newWalker(t *testing.T, root string) *walker {
	// Each curl is a process of its own: a fresh connection every time.
	w := &walker{t: t, dir: t.TempDir(), client: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}}
	w.orders = filepath.Join(t.TempDir(), "orders")
	build := exec.Command("go", "build", "-o", w.orders, "./examples/orders")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./examples/orders: %v\n%s", err, out)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, w.port, _ = net.SplitHostPort(ln.Addr().String())
	ln.Close()
	t.Chdir(w.dir)
	t.Cleanup(w.stop)
	return w
}

// do runs a step and returns its output as the doc shows it.
func (w *walker) do(s docStep) []string {
	w.t.Helper()
	switch {
	case strings.HasPrefix(s.directive, "sleep "):
		d, err := time.ParseDuration(strings.TrimPrefix(s.directive, "sleep "))
		if err != nil {
			w.t.Fatal(err)
		}
		time.Sleep(d)
		return nil
	case s.directive == "restart":
		w.restart()
		return nil
	case s.directive != "":
		w.t.Fatalf("unknown directive %q", s.directive)
	}
	args, err := shellWords(strings.ReplaceAll(s.command, ":"+docPort, ":"+w.port))
	if err != nil {
		w.t.Fatalf("%s: %v", s.command, err)
	}
	var out string
	switch {
	case len(args) > 2 && args[0] == "go" && args[2] == "./examples/orders":
		out = w.start(args[3:])
	case args[0] == "curl":
		out = w.curl(args[1:])
	case args[0] == "d1idem":
		out = w.d1idem(args[1:])
	default:
		w.t.Fatalf("the walk-through runs %q, which the test does not know", args[0])
	}
	return strings.Split(strings.TrimRight(strings.ReplaceAll(out, ":"+w.port, ":"+docPort), "\n"), "\n")
}

// start starts the example API and returns what it prints on starting.
func (w *walker) start(args []string) string {
	w.apiArgs = args
	w.apiOut = &syncBuffer{}
	w.api = exec.Command(w.orders, args...)
	w.api.Dir, w.api.Stdout, w.api.Stderr = w.dir, w.apiOut, w.apiOut
	if err := w.api.Start(); err != nil {
		w.t.Fatal(err)
	}
	w.apiDone = make(chan error, 1)
	go func() { w.apiDone <- w.api.Wait() }()
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(w.apiOut.String(), "look at the ledger with:\n  ") || !strings.HasSuffix(w.apiOut.String(), "\n") {
		select {
		case err := <-w.apiDone:
			w.t.Fatalf("the example API exited: %v\n%s", err, w.apiOut.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("the example API did not start:\n%s", w.apiOut.String())
		}
	}
	return w.apiOut.String()
}

// restart waits for the example API to have exited (crashed), and starts
// it again.
func (w *walker) restart() {
	select {
	case err := <-w.apiDone:
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 3 {
			w.t.Fatalf("the example API did not crash as staged: %v\n%s", err, w.apiOut.String())
		}
	case <-time.After(30 * time.Second):
		w.t.Fatalf("the example API is still running:\n%s", w.apiOut.String())
	}
	w.start(w.apiArgs)
}

func (w *walker) stop() {
	if w.api != nil && w.api.ProcessState == nil {
		_ = w.api.Process.Kill()
		<-w.apiDone
	}
}

// d1idem runs the CLI in process: stdout, then stderr, then the exit
// status when it is not 0.
func (w *walker) d1idem(args []string) string {
	r := runCLI(w.t, nil, args...)
	out := r.stdout + r.stderr
	if r.code != 0 {
		out += fmt.Sprintf("[exit %d]\n", r.code)
	}
	return out
}

// curl sends the request of a "curl -sSi ..." command line and returns
// what curl prints: the status line, the headers (in the order Go's server
// writes them), a blank line and the body; or curl's error line.
func (w *walker) curl(args []string) string {
	req, err := curlRequest(args)
	if err != nil {
		w.t.Fatal(err)
	}
	res, err := w.client.Do(req)
	if err != nil {
		if errors.Is(err, io.EOF) {
			return "curl: (52) Empty reply from server\n"
		}
		w.t.Fatalf("%v; the example API printed:\n%s", err, w.apiOut.String())
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		w.t.Fatal(err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s\n", res.Proto, res.Status)
	names := make([]string, 0, len(res.Header))
	for n := range res.Header {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		for _, v := range res.Header[n] {
			fmt.Fprintf(&b, "%s: %s\n", n, v)
		}
	}
	fmt.Fprintf(&b, "\n%s\n", body)
	return b.String()
}

// curlRequest builds the request of curl's arguments: -sSi, -X METHOD,
// -H HEADER, -d BODY and the URL.
func curlRequest(args []string) (*http.Request, error) {
	method, body, url := "GET", "", ""
	header := http.Header{}
	for i := 0; i < len(args); i++ {
		switch a := args[i]; {
		case a == "-sSi" || a == "-si" || a == "-i":
		case (a == "-X" || a == "-H" || a == "-d") && i+1 < len(args):
			i++
			switch a {
			case "-X":
				method = args[i]
			case "-H":
				name, value, _ := strings.Cut(args[i], ":")
				header.Add(name, strings.TrimSpace(value))
			case "-d":
				body = args[i]
			}
		case !strings.HasPrefix(a, "-"):
			url = a
		default:
			return nil, fmt.Errorf("curl %s: the test does not know %s", strings.Join(args, " "), a)
		}
	}
	if !strings.HasPrefix(url, "http") {
		url = "http://" + url
	}
	req, err := http.NewRequestWithContext(context.Background(), method, url, strings.NewReader(body))
	if err == nil {
		req.Header = header
	}
	return req, err
}

// shellWords splits a command line as a POSIX shell would, for the quoting
// the doc uses: single quotes, and backslash-newline continuations.
func shellWords(s string) ([]string, error) {
	var words []string
	var cur bytes.Buffer
	inWord, quoted := false, false
	sc := bufio.NewScanner(strings.NewReader(s))
	sc.Split(bufio.ScanRunes)
	for sc.Scan() {
		r := sc.Text()
		switch {
		case quoted && r == "'":
			quoted = false
		case quoted:
			cur.WriteString(r)
		case r == "'":
			quoted, inWord = true, true
		case r == " " || r == "\t" || r == "\n" || r == "\\":
			if inWord {
				words, inWord = append(words, cur.String()), false
				cur.Reset()
			}
		default:
			cur.WriteString(r)
			inWord = true
		}
	}
	if quoted {
		return nil, fmt.Errorf("unterminated quote in %q", s)
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words, nil
}
