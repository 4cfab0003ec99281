package d1test

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Environment variables the workerd leg reads.
const (
	// EnvWorkerdURL points the workerd leg at a server.mjs already running
	// (for debugging); nothing is started then, and every database is
	// wiped before use. EnvWorkerdToken is its bridge's BRIDGE_SECRET.
	EnvWorkerdURL   = "D1TEST_WORKERD_URL"
	EnvWorkerdToken = "D1TEST_WORKERD_TOKEN"
	// EnvNode names the node binary; the default is "node" from PATH.
	EnvNode = "D1TEST_NODE"
	// EnvConformanceDir overrides the directory holding server.mjs and its
	// node_modules; the default is <repo root>/conformance.
	EnvConformanceDir = "D1TEST_CONFORMANCE_DIR"
	// EnvWorkerdMarker names a directory where each test binary that asks
	// for the workerd leg writes a file saying whether it ran ("ran") or
	// why not ("skipped: ..." or "failed: ..."); `make test` reads them to
	// say whether the leg ran.
	EnvWorkerdMarker = "D1TEST_WORKERD_MARKER"
)

// startTimeout bounds the wait for server.mjs's LISTENING line. workerd
// starts in about a second on a quiet machine; a loaded one needs far more.
const startTimeout = 90 * time.Second

// workerdProc is one server.mjs process: the shared one of the test binary
// (see Workerd), or a test's own (see Bridge).
type workerdProc struct {
	entryURL   string // Miniflare's entry: the harness on /__spec/*, else the bridge
	bridgeURL  string // the bridge's own socket
	adminURL   string // a full-mode bridge on the same databases; "" if none
	token      string // the bridges' BRIDGE_SECRET
	pool       int
	wipeAlways bool // an external server: databases may hold old data
	hc         *http.Client

	cmd    *exec.Cmd
	stdin  *os.File // write end of the child's stdin; never closed, see start
	stderr *tailBuffer
	exited chan struct{}

	mu       sync.Mutex
	next     int
	released []int
}

var workerd struct {
	once sync.Once
	proc *workerdProc
	skip string // why the leg cannot run (missing Node or npm packages)
	err  error  // the leg should run but could not start
}

// Workerd returns the backend for Cloudflare's real local D1 behind the
// bridge: the Worker of bridge/worker.js, run with workerd's real D1
// bindings by a single `node conformance/server.mjs 0` shared by every test
// of the binary, started on first use, with a random BRIDGE_SECRET that the
// backend's clients send as their token. It exits when the test binary does
// (its stdin reaches EOF).
//
// If Node or conformance/node_modules is missing, Workerd calls t.Skip, or
// t.Fatal when the CI environment variable is non-empty. A server that fails
// to start always fails t.
func Workerd(t testing.TB) *Backend {
	t.Helper()
	b, reason := workerdBackend(t)
	if b == nil {
		t.Skip(reason)
	}
	return b
}

// workerdBackend returns the backend, or nil and the skip reason. It fails
// t for real errors, and for a missing toolchain in CI.
func workerdBackend(t testing.TB) (*Backend, string) {
	t.Helper()
	workerd.once.Do(startWorkerd)
	switch {
	case workerd.err != nil:
		t.Fatalf("d1test: workerd: %v", workerd.err)
	case workerd.skip != "":
		if os.Getenv("CI") != "" {
			t.Fatalf("d1test: workerd leg cannot run in CI: %s; install Node >= 20 and run `npm ci` in conformance/ (or `make test`)", workerd.skip)
		}
		return nil, "workerd leg skipped: " + workerd.skip + "; run `make test` with Node 20 and npm to include it"
	}
	p := workerd.proc
	select {
	case <-p.exited:
		t.Fatalf("d1test: the workerd server (conformance/server.mjs) has exited; its stderr:\n%s", p.stderr.String())
	default:
	}
	return p.backend(), ""
}

// backend returns a Backend on the process's bridge, with Admin set when
// the process has an admin bridge.
func (p *workerdProc) backend() *Backend {
	b := &Backend{
		Name:       NameWorkerd,
		BaseURL:    p.bridgeURL,
		HarnessURL: p.entryURL,
		AccountID:  AccountID,
		Token:      p.token,
		HTTPClient: p.hc,
		newID:      p.allocate,
		proc:       p,
	}
	if p.adminURL != "" {
		a := *b
		a.BaseURL = p.adminURL
		b.Admin = &a
	}
	return b
}

// RepoRoot returns the directory of the module's go.mod, found by walking up
// from the working directory.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}

func startWorkerd() {
	defer markWorkerd()
	hc := newHTTPClient()
	if u := os.Getenv(EnvWorkerdURL); u != "" {
		u = strings.TrimSuffix(u, "/")
		p := &workerdProc{entryURL: u, bridgeURL: u, token: os.Getenv(EnvWorkerdToken), wipeAlways: true,
			hc: hc, exited: make(chan struct{}), stderr: &tailBuffer{}}
		workerd.proc, workerd.err = p, p.health()
		return
	}
	node, dir, skip := toolchain()
	if skip != "" {
		workerd.skip = skip
		return
	}
	secret := newSecret()
	workerd.proc, workerd.err = launch(node, dir, hc, secret, []string{"BRIDGE_SECRET=" + secret})
}

// markWorkerd records, for `make test`, whether this test binary ran the
// workerd leg (see EnvWorkerdMarker).
func markWorkerd() {
	dir := os.Getenv(EnvWorkerdMarker)
	if dir == "" {
		return
	}
	outcome := "ran"
	switch {
	case workerd.err != nil:
		outcome = "failed: " + workerd.err.Error()
	case workerd.skip != "":
		outcome = "skipped: " + workerd.skip
	}
	name := fmt.Sprintf("%s.%d", filepath.Base(os.Args[0]), os.Getpid())
	_ = os.WriteFile(filepath.Join(dir, name), []byte(outcome+"\n"), 0o644)
}

// toolchain finds node and the conformance directory, or says why the
// workerd leg cannot run.
func toolchain() (node, dir, skip string) {
	dir = os.Getenv(EnvConformanceDir)
	if dir == "" {
		root, err := RepoRoot()
		if err != nil {
			return "", "", err.Error()
		}
		dir = filepath.Join(root, "conformance")
	}
	node = os.Getenv(EnvNode)
	if node == "" {
		node = "node"
	}
	node, err := exec.LookPath(node)
	if err != nil {
		return "", "", "node not found in PATH"
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "miniflare", "package.json")); err != nil {
		return "", "", filepath.Join(dir, "node_modules") + " is missing"
	}
	return node, dir, ""
}

// newSecret returns a random bridge secret.
func newSecret() string {
	var b [32]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// serverEnv is the environment of a server.mjs: this process's, without
// any setting of the bridge or the server, plus settings.
func serverEnv(settings []string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "BRIDGE_") || k == "D1_POOL_SIZE" || k == "CONFORMANCE_IGNORE_STDIN" {
			continue
		}
		env = append(env, kv)
	}
	return append(env, settings...)
}

// launch runs server.mjs with the given settings (environment variables,
// see server.mjs) and waits for its LISTENING line. token is the bridges'
// secret, sent by the backend's clients.
func launch(node, dir string, hc *http.Client, token string, settings []string) (*workerdProc, error) {
	// The child's stdin is a pipe whose write end only this process holds,
	// in a package variable (so no finalizer closes it). When the test
	// binary exits, for whatever reason, the kernel closes it, server.mjs
	// sees EOF and disposes Miniflare, which stops workerd.
	inR, inW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(node, "server.mjs", "0")
	cmd.Dir = dir
	cmd.Stdin, cmd.Stdout, cmd.Stderr = inR, outW, errW
	cmd.Env = serverEnv(settings)
	p := &workerdProc{cmd: cmd, stdin: inW, stderr: &tailBuffer{}, exited: make(chan struct{}), hc: hc, token: token}
	err = cmd.Start()
	inR.Close()
	outW.Close()
	errW.Close()
	if err != nil {
		inW.Close()
		outR.Close()
		errR.Close()
		return nil, fmt.Errorf("starting %s server.mjs: %w", node, err)
	}
	go func() {
		_, _ = io.Copy(p.stderr, errR)
		errR.Close()
	}()
	go func() {
		_ = cmd.Wait()
		close(p.exited)
	}()
	listening := make(chan map[string]string, 1) // "LISTENING", "BRIDGE", "ADMIN" -> URL
	go func() {
		sc := bufio.NewScanner(outR)
		urls := map[string]string{}
		for sc.Scan() {
			if name, u, ok := strings.Cut(sc.Text(), " "); ok {
				urls[name] = strings.TrimSpace(u)
				if name == "LISTENING" {
					listening <- urls
					break
				}
			}
		}
		_, _ = io.Copy(io.Discard, outR) // keep draining: a full pipe would block the server
		outR.Close()
	}()
	timer := time.NewTimer(startTimeout)
	defer timer.Stop()
	select {
	case u := <-listening:
		p.entryURL, p.bridgeURL, p.adminURL = u["LISTENING"], u["BRIDGE"], u["ADMIN"]
		if p.bridgeURL == "" {
			p.bridgeURL = p.entryURL
		}
	case <-p.exited:
		return nil, fmt.Errorf("server.mjs exited before listening (%s); stderr:\n%s", cmd.ProcessState, p.stderr.String())
	case <-timer.C:
		_ = cmd.Process.Kill()
		return nil, fmt.Errorf("server.mjs printed no LISTENING line within %s; stderr:\n%s", startTimeout, p.stderr.String())
	}
	if err := p.health(); err != nil {
		_ = cmd.Process.Kill()
		return nil, err
	}
	return p, nil
}

// health reads the pool size from the harness's GET /__spec/healthz.
func (p *workerdProc) health() error {
	res, err := do(p.hc, http.MethodGet, p.entryURL+"/__spec/healthz", nil, nil)
	if err != nil {
		return fmt.Errorf("GET /__spec/healthz: %w", err)
	}
	var h struct {
		OK   bool `json:"ok"`
		Pool int  `json:"pool"`
	}
	if err := json.Unmarshal(res.Body, &h); err != nil || !h.OK || h.Pool < 1 {
		return fmt.Errorf("GET /__spec/healthz: HTTP %d %q", res.Status, res.Body)
	}
	p.pool = h.Pool
	return nil
}

// allocate hands out the next unused database of the pool ("db-<i>") and
// releases it when t ends. When every database has been used, released ones
// are wiped (every table, view and trigger dropped) and handed out again.
func (p *workerdProc) allocate(t testing.TB) string {
	t.Helper()
	p.mu.Lock()
	var (
		i     int
		dirty bool
	)
	switch {
	case p.next < p.pool:
		i, dirty = p.next, p.wipeAlways
		p.next++
	case len(p.released) > 0:
		i, dirty = p.released[0], true
		p.released = p.released[1:]
	default:
		p.mu.Unlock()
		t.Fatalf("d1test: all %d workerd databases are in use; raise D1_POOL_SIZE", p.pool)
	}
	p.mu.Unlock()
	id := "db-" + strconv.Itoa(i)
	if dirty {
		if err := p.wipe(id); err != nil {
			t.Fatalf("d1test: wiping workerd database %s for reuse: %v", id, err)
		}
	}
	t.Cleanup(func() {
		p.mu.Lock()
		p.released = append(p.released, i)
		p.mu.Unlock()
	})
	return id
}

// wipe drops every user table, view and trigger of a database (indexes go
// with their tables) and empties sqlite_sequence, in one batch, through the
// admin bridge when there is one (a ledger-only bridge would refuse it).
func (p *workerdProc) wipe(id string) error {
	base := p.bridgeURL
	if p.adminURL != "" {
		base = p.adminURL
	}
	d := &Database{Backend: &Backend{BaseURL: base, AccountID: AccountID, HTTPClient: p.hc}, ID: id}
	post := func(body any) ([]json.RawMessage, error) {
		data, _ := json.Marshal(body)
		res, err := do(p.hc, http.MethodPost, d.URL("raw"), authHeader(p.token, http.Header{"Content-Type": {"application/json"}}), data)
		if err != nil {
			return nil, err
		}
		var env struct {
			Success bool              `json:"success"`
			Result  []json.RawMessage `json:"result"`
		}
		if err := json.Unmarshal(res.Body, &env); err != nil || !env.Success {
			return nil, fmt.Errorf("HTTP %d: %s", res.Status, res.Body)
		}
		return env.Result, nil
	}
	res, err := post(map[string]any{"sql": `SELECT type, name, coalesce(sql, '') FROM sqlite_master
		WHERE type IN ('table', 'view', 'trigger') AND name NOT LIKE '\_cf\_%' ESCAPE '\'
		ORDER BY type = 'table', sql LIKE 'CREATE VIRTUAL%' DESC`})
	if err != nil {
		return err
	}
	var r struct {
		Results struct {
			Rows [][3]string `json:"rows"`
		} `json:"results"`
	}
	if len(res) != 1 || json.Unmarshal(res[0], &r) != nil {
		return fmt.Errorf("unexpected listing %s", res)
	}
	batch := []map[string]any{{"sql": "PRAGMA defer_foreign_keys = ON"}}
	for _, row := range r.Results.Rows {
		typ, name := row[0], row[1]
		switch {
		case name == "sqlite_sequence":
			batch = append(batch, map[string]any{"sql": "DELETE FROM sqlite_sequence"})
		case strings.HasPrefix(name, "sqlite_"):
		default:
			batch = append(batch, map[string]any{"sql": "DROP " + strings.ToUpper(typ) + " IF EXISTS " + quoteIdent(name)})
		}
	}
	if len(batch) == 1 {
		return nil
	}
	_, err = post(map[string]any{"batch": batch})
	return err
}

func quoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

// tailBuffer keeps the last 16 KiB written to it.
type tailBuffer struct {
	mu  sync.Mutex
	buf []byte
}

const tailMax = 16 << 10

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if over := len(b.buf) - tailMax; over > 0 {
		b.buf = append(b.buf[:0], b.buf[over:]...)
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.buf) == 0 {
		return "(empty)"
	}
	return string(bytes.TrimSpace(b.buf))
}

// SpecFingerprint asks the workerd server to compute the spec's
// computeFingerprint (conformance/harness.js holds the spec's function) for a
// request with the given method, path and query (which must start with "/"),
// headers and body. It returns the fingerprint and the path and query as the
// Worker saw them (after WHATWG URL parsing). It uses the shared workerd
// server, so it skips or fails exactly as Workerd does.
func SpecFingerprint(t testing.TB, method, pathAndQuery string, header http.Header, body []byte) (fingerprint, seenPathAndQuery string) {
	t.Helper()
	if !strings.HasPrefix(pathAndQuery, "/") {
		t.Fatalf("d1test: SpecFingerprint: path %q must start with /", pathAndQuery)
	}
	b := Workerd(t)
	res, err := do(b.HTTPClient, method, b.HarnessURL+"/__spec/fingerprint"+pathAndQuery, header, body)
	if err != nil {
		t.Fatalf("d1test: SpecFingerprint: %v", err)
	}
	var out struct {
		Fingerprint  string `json:"fingerprint"`
		PathAndQuery string `json:"pathAndQuery"`
	}
	if err := json.Unmarshal(res.Body, &out); err != nil || res.Status != http.StatusOK || len(out.Fingerprint) != 64 {
		t.Fatalf("d1test: SpecFingerprint: HTTP %d %q", res.Status, res.Body)
	}
	return out.Fingerprint, out.PathAndQuery
}
