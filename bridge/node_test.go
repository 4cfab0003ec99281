package bridge_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/d1idem/d1idem/internal/d1test"
)

// nodeScript drives worker.js in Node with a fake D1 binding whose calls
// fail the ways production D1's do, which local workerd cannot be made to.
// It prints one JSON line per case: {"case","status","code","message"}.
const nodeScript = `
import worker from "./worker.js";

const secret = "node-test-secret-0123456789";
function fakeD1(failure) {
  const fail = async () => { throw failure; };
  return {
    prepare: () => ({ bind: () => ({ all: fail, raw: fail }) }),
    batch: fail,
    alwaysPrimarySession: { _sendOrThrow: fail },
  };
}
async function call(name, failure, { token = secret, body = { sql: "SELECT 1" }, env = {} } = {}) {
  const e = { BRIDGE_SECRET: secret, DB: fakeD1(failure), ...env };
  const req = new Request("http://bridge/accounts/a/d1/database/DB/raw", {
    method: "POST",
    headers: { authorization: "Bearer " + token, "content-type": "application/json" },
    body: typeof body === "string" ? body : JSON.stringify(body),
  });
  const res = await worker.fetch(req, e);
  const j = await res.json();
  console.log(JSON.stringify({ case: name, status: res.status, code: j.errors?.[0]?.code ?? 0, message: j.errors?.[0]?.message ?? "" }));
}
const d1 = (m) => new Error("D1_ERROR: " + m);
await call("overloaded", d1("D1 DB is overloaded. Requests queued for too long."));
await call("queue full", d1("D1 DB is overloaded. Too many requests queued."));
await call("reset", d1("D1 DB reset because its code was updated."));
await call("network", d1("Network connection lost."));
await call("internal", d1("internal error; reference = abc123"));
await call("storage timeout", d1("D1 DB storage operation exceeded timeout which caused object to be reset."));
await call("memory", d1("D1 DB's isolate exceeded its memory limit and was reset."));
await call("sql", d1("no such table: nope: SQLITE_ERROR"));
await call("type error", null, { body: { sql: "SELECT ?", params: [{ a: 1 }] } });
// Values the binding's message cannot show are still type errors (400), not
// internal ones (500, retried as transient); a long one is not echoed whole.
await call("type error, toString not a function", null, { body: { sql: "SELECT ?", params: [{ toString: 1 }] } });
await call("type error, nested too deep", null, { body: '{"sql":"SELECT ?","params":[' + "[".repeat(20000) + "1" + "]".repeat(20000) + "]}" });
await call("type error, long", null, { body: { sql: "SELECT ?", params: [Array(1000).fill(1000)] } });
await call("javascript", new TypeError("x is not a function"));
await call("public mode", d1("D1 DB is overloaded. Requests queued for too long."), { env: { BRIDGE_RAW_MODE: "public" } });
// Settings the Worker cannot read.
const ok = d1("no such table: t: SQLITE_ERROR");
await call("secret too short", ok, { env: { BRIDGE_SECRET: "short-secret" }, token: "short-secret" });
await call("secret with a comma", ok, { env: { BRIDGE_SECRET: "0123456789,abcdef" }, token: "x" });
await call("unknown mode", ok, { env: { BRIDGE_MODE: "open" } });
await call("raw mode", ok, { env: { BRIDGE_RAW_MODE: "fast" } });
await call("allowed not JSON", ok, { env: { BRIDGE_ALLOWED_STATEMENTS: "SELECT 1" } });
await call("allowed not a list", ok, { env: { BRIDGE_ALLOWED_STATEMENTS: '{"a":"SELECT 1"}' } });
await call("allowed with a number", ok, { env: { BRIDGE_ALLOWED_STATEMENTS: ["SELECT 1", 2] } });
await call("databases not an object", ok, { env: { BRIDGE_DATABASES: '["DB"]' } });
await call("databases naming no binding", ok, { env: { BRIDGE_DATABASES: { DB: "OTHER" } } });
await call("databases as an object", ok, { env: { BRIDGE_DATABASES: { DB: "DB" } } });
await call("misconfigured, wrong token", ok, { env: { BRIDGE_MODE: "open" }, token: "not-the-secret-at-all" });
// Node has no crypto.subtle.timingSafeEqual: the fallback loop decides.
await call("fallback compare, wrong token", null, { token: secret.slice(0, -1) + "X" });
await call("fallback compare, right token", d1("no such table: t: SQLITE_ERROR"));
`

// TestWorkerUnderNode runs worker.js in Node against a fake binding: the
// binding's failures map to the REST API's statuses (D1 overloaded 429,
// its transient failures 500, SQL errors 400, all code 7500, so clients
// retry only what is retryable), in both raw modes; every unreadable
// setting is refused with 500/10001 naming it (to a caller with the secret;
// 401 to others); and the constant-time comparison's fallback (no
// crypto.subtle.timingSafeEqual, as in Node) accepts the secret and refuses
// a token one byte off.
func TestWorkerUnderNode(t *testing.T) {
	d1test.Workerd(t) // skips, or fails in CI, when Node is missing
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	files := map[string]string{"package.json": `{"type":"module"}`, "test.js": nodeScript}
	for _, f := range []string{"worker.js", "ledger-statements.js"} {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		files[f] = string(data)
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(node, "test.js")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node: %v\n%s", err, out)
	}
	type result struct {
		Case    string `json:"case"`
		Status  int    `json:"status"`
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	got := map[string]result{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		var r result
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("node printed %q", line)
		}
		got[r.Case] = r
	}
	for _, want := range []result{
		{"overloaded", 429, 7500, "D1 DB is overloaded. Requests queued for too long."},
		{"queue full", 429, 7500, "D1 DB is overloaded. Too many requests queued."},
		{"reset", 500, 7500, "D1 DB reset because its code was updated."},
		{"network", 500, 7500, "Network connection lost."},
		{"internal", 500, 7500, "internal error; reference = abc123"},
		{"storage timeout", 500, 7500, "D1 DB storage operation exceeded timeout which caused object to be reset."},
		{"memory", 500, 7500, "D1 DB's isolate exceeded its memory limit and was reset."},
		{"sql", 400, 7500, "no such table: nope: SQLITE_ERROR"},
		{"type error", 400, 7500, "Type 'object' not supported for value '[object Object]'"},
		{"type error, toString not a function", 400, 7500, "Type 'object' not supported for value '[object]'"},
		{"type error, nested too deep", 400, 7500, "Type 'object' not supported for value '[array]'"},
		{"type error, long", 400, 7500, "Type 'object' not supported for value '" + strings.Repeat("1000,", 40) + "... (4999 characters)'"},
		{"javascript", 500, 7500, "internal error: x is not a function"},
		{"public mode", 429, 7500, "D1 DB is overloaded. Requests queued for too long."},
		{"secret too short", 500, 10001, "bridge misconfigured: BRIDGE_SECRET must be 16 to 4096 visible ASCII characters, no spaces or commas"},
		{"secret with a comma", 500, 10001, "bridge misconfigured: BRIDGE_SECRET must be 16 to 4096 visible ASCII characters, no spaces or commas"},
		{"unknown mode", 500, 10001, `bridge misconfigured: BRIDGE_MODE "open" is neither "full" nor "ledger-only"`},
		{"raw mode", 500, 10001, `bridge misconfigured: BRIDGE_RAW_MODE "fast" is neither "internal" nor "public"`},
		{"allowed not JSON", 500, 10001, "bridge misconfigured: BRIDGE_ALLOWED_STATEMENTS is not valid JSON: "},
		{"allowed not a list", 500, 10001, "bridge misconfigured: BRIDGE_ALLOWED_STATEMENTS must be a JSON array of SQL strings"},
		{"allowed with a number", 500, 10001, "bridge misconfigured: BRIDGE_ALLOWED_STATEMENTS must be a JSON array of SQL strings"},
		{"databases not an object", 500, 10001, `bridge misconfigured: BRIDGE_DATABASES must be a JSON object {"<database id or name>": "<D1 binding>"}`},
		{"databases naming no binding", 500, 10001, `bridge misconfigured: BRIDGE_DATABASES maps "DB" to "OTHER", which is not a D1 binding of this Worker`},
		{"databases as an object", 400, 7500, "no such table: t: SQLITE_ERROR"},
		{"misconfigured, wrong token", 401, 10000, "Authentication error"},
		{"fallback compare, wrong token", 401, 10000, "Authentication error"},
		{"fallback compare, right token", 400, 7500, "no such table: t: SQLITE_ERROR"},
	} {
		g, ok := got[want.Case]
		if strings.HasSuffix(want.Message, ": ") && strings.HasPrefix(g.Message, want.Message) {
			g.Message = want.Message // the JSON parser's own words follow
		}
		if !ok || g != want {
			t.Errorf("%s: got %+v, want %+v", want.Case, g, want)
		}
	}
}
