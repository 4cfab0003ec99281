package d1test

import (
	"encoding/json"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"
)

// BridgeConfig configures a bridge started by Bridge. The zero value is a
// full-mode bridge with a random secret on a pool of 8 databases.
type BridgeConfig struct {
	// Mode is BRIDGE_MODE: "" (full) or "ledger-only".
	Mode string
	// Allowed is BRIDGE_ALLOWED_STATEMENTS; nil leaves it unset.
	Allowed []string
	// Secret is BRIDGE_SECRET; "" means a random one. With NoSecret the
	// bridge starts without any (and must refuse every request).
	Secret   string
	NoSecret bool
	// Databases is BRIDGE_DATABASES as the Worker gets it (JSON text);
	// "" maps the pool ({"db-<i>": "DB_<i>"}), and "none" leaves it unset.
	Databases string
	// Env holds further environment variables of server.mjs ("NAME=value"),
	// applied last: BRIDGE_* settings given verbatim, for example.
	Env []string
	// Pool is the number of databases (D1_POOL_SIZE); 0 means 8.
	Pool int
}

// Bridge starts a bridge of the test's own, configured by cfg: its own
// server.mjs and workerd (about a second to start), stopped when t ends.
// The backend's databases are fresh; its Token is the secret (or, with
// NoSecret, a random token the bridge cannot check), and its Admin is a
// full-mode bridge with the same secret on the same databases. Bridge skips
// or fails t exactly as Workerd does when the workerd leg cannot run.
func Bridge(t testing.TB, cfg BridgeConfig) *Backend {
	t.Helper()
	node, dir, skip := toolchain()
	if skip != "" {
		Workerd(t) // skips, or fails in CI, with the shared leg's message
		t.Fatalf("d1test: %s", skip)
	}
	pool := cfg.Pool
	if pool == 0 {
		pool = 8
	}
	secret := cfg.Secret
	if secret == "" {
		secret = newSecret()
	}
	settings := []string{"BRIDGE_ADMIN=1", "D1_POOL_SIZE=" + strconv.Itoa(pool)}
	if !cfg.NoSecret {
		settings = append(settings, "BRIDGE_SECRET="+secret)
	}
	if cfg.Mode != "" {
		settings = append(settings, "BRIDGE_MODE="+cfg.Mode)
	}
	if cfg.Allowed != nil {
		list, _ := json.Marshal(cfg.Allowed)
		settings = append(settings, "BRIDGE_ALLOWED_STATEMENTS="+string(list))
	}
	if cfg.Databases != "" {
		settings = append(settings, "BRIDGE_DATABASES="+cfg.Databases)
	}
	settings = append(settings, cfg.Env...)
	hc := newHTTPClient()
	p, err := launch(node, dir, hc, secret, settings)
	if err != nil {
		t.Fatalf("d1test: starting a bridge: %v", err)
	}
	t.Cleanup(func() { p.stop(t) })
	return p.backend()
}

// stop closes the server's stdin, which makes it dispose of workerd and
// exit, and waits for that; a server that lingers is killed.
func (p *workerdProc) stop(t testing.TB) {
	p.hc.CloseIdleConnections()
	p.stdin.Close()
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
		t.Errorf("d1test: server.mjs did not exit within 10 s of its stdin closing; killed")
	}
}

// BridgeURL returns the bridge URL of a workerd backend, its address with
// its secret, http://:SECRET@127.0.0.1:PORT, as d1client.Config.BridgeURL
// and D1IDEM_BRIDGE_URL take it; "" for d1local.
func (b *Backend) BridgeURL() string {
	if b.Name != NameWorkerd || b.Token == "" {
		return ""
	}
	u := url.URL{Scheme: "http", User: url.UserPassword("", b.Token), Host: strings.TrimPrefix(b.BaseURL, "http://")}
	return u.String()
}
