package bridge_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/d1idem/d1idem"
	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/idem/idemhttp"
	"github.com/d1idem/d1idem/internal/d1test"
)

// bizInsert is the business statement the operator lists in
// BRIDGE_ALLOWED_STATEMENTS, as idemhttp.Tx would send it.
const bizInsert = "INSERT INTO business (principal, key, note) VALUES (?, ?, ?)"

// ledgerOnly starts a ledger-only bridge that also accepts bizInsert.
func ledgerOnly(t *testing.T) *d1test.Backend {
	t.Helper()
	return d1test.Bridge(t, d1test.BridgeConfig{Mode: "ledger-only", Allowed: []string{bizInsert}, Pool: 6})
}

// ledgerDB makes a fresh database of a ledger-only bridge ready for the
// ledger: the schema and the business table, made through the admin bridge
// (the ledger-only one refuses DDL), and a client on each bridge.
func ledgerDB(t *testing.T, b *d1test.Backend) (db *d1test.Database, bridged, admin *d1client.Client) {
	t.Helper()
	db = b.NewDatabase(t)
	admin = db.Admin(t).Client(t)
	d1test.ApplySchema(t, admin)
	if _, err := admin.Query(t.Context(), "CREATE TABLE business (principal TEXT NOT NULL, key TEXT NOT NULL, note TEXT)"); err != nil {
		t.Fatal(err)
	}
	return db, db.Client(t), admin
}

// ledgerStatements reads the list the bridge ships (ledger-statements.js).
func ledgerStatements(t testing.TB) []string {
	t.Helper()
	src, err := os.ReadFile("ledger-statements.js")
	if err != nil {
		t.Fatal(err)
	}
	i := bytes.Index(src, []byte("export default ["))
	if i < 0 {
		t.Fatal("ledger-statements.js has no default export")
	}
	list := bytes.Replace(src[i+len("export default "):], []byte(",\n];"), []byte("\n]"), 1)
	var out []string
	if err := json.Unmarshal(list, &out); err != nil {
		t.Fatalf("ledger-statements.js: %v", err)
	}
	return out
}

// ledgerSQL returns the shipped statement that contains every fragment.
func ledgerSQL(t testing.TB, fragments ...string) string {
	t.Helper()
	for _, s := range ledgerStatements(t) {
		ok := true
		for _, f := range fragments {
			ok = ok && strings.Contains(s, f)
		}
		if ok {
			return s
		}
	}
	t.Fatalf("no shipped ledger statement contains %q", fragments)
	return ""
}

// testClock is an injected clock.
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *testClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// TestLedgerOnlyLedgerWorks: through a ledger-only bridge the ledger does
// all it does, on D1's clock and on an injected one: begin (claim, replay,
// takeover), renew, complete, release, sweep, lookup, transactional
// completion with an operator-listed statement, and the middleware end to
// end. A transactional completion with a statement the operator did not
// list is refused whole: the key stays pending, no business row is written.
func TestLedgerOnlyLedgerWorks(t *testing.T) {
	b := ledgerOnly(t)
	for _, injected := range []bool{false, true} {
		name := "D1 clock"
		if injected {
			name = "injected clock"
		}
		t.Run(name, func(t *testing.T) { ledgerOnlyLedgerWorks(t, b, injected) })
	}
}

// ledgerOnlyLedgerWorks is TestLedgerOnlyLedgerWorks on a fresh database
// of b, on D1's clock or on an injected one.
func ledgerOnlyLedgerWorks(t *testing.T, b *d1test.Backend, injected bool) {
	_, c, admin := ledgerDB(t, b)
	clk := &testClock{now: time.Now()}
	cfg := idem.Config{Heartbeat: -1}
	if injected {
		cfg.Clock = clk.Now
	}
	l, err := idem.New(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	lo := ledgerOnlyRun{ctx: t.Context(), l: l, admin: admin,
		stored: idem.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"ok":true}`)}}

	lo.claimRenewCompleteReplay(t)
	d := lo.releaseThenTakeover(t)

	// Transactional completion with the operator's statement.
	biz := d1client.Statement{SQL: bizInsert, Params: []any{"acct", "k2", "from CompleteTx"}}
	if cp, err := l.CompleteTx(lo.ctx, d.Reservation, lo.stored, []d1client.Statement{biz}); err != nil || !cp.Stored {
		t.Fatalf("CompleteTx: %+v %v", cp, err)
	}
	if n := count(t, admin, "SELECT count(*) FROM business WHERE key = 'k2'"); n != 1 {
		t.Fatalf("%d business rows for k2, want 1", n)
	}

	if !lo.unlistedRefusedWhole(t) {
		return
	}
	lo.sweep(t, clk, injected)
	lo.middlewareEndToEnd(t)
}

// ledgerOnlyRun is one run of TestLedgerOnlyLedgerWorks: its ledger
// through the ledger-only bridge, a client on the admin bridge, and the
// response its completions store.
type ledgerOnlyRun struct {
	ctx    context.Context
	l      *idem.Ledger
	admin  *d1client.Client
	stored idem.Response
}

// begin begins key for principal "acct" with the fingerprint "fp-"+key.
func (lo ledgerOnlyRun) begin(t *testing.T, key string) idem.Decision {
	t.Helper()
	d, err := lo.l.Begin(lo.ctx, "acct", key, "fp-"+key)
	if err != nil {
		t.Fatalf("Begin(%s): %v", key, err)
	}
	return d
}

// claimRenewCompleteReplay claims k1, renews, completes, and checks that
// Begin and Lookup replay it.
func (lo ledgerOnlyRun) claimRenewCompleteReplay(t *testing.T) {
	t.Helper()
	d := lo.begin(t, "k1")
	if d.Outcome != idem.Execute || d.Reservation.Generation != 1 {
		t.Fatalf("k1: %+v", d)
	}
	if ok, err := lo.l.Renew(lo.ctx, d.Reservation); err != nil || !ok {
		t.Fatalf("Renew: %v %v", ok, err)
	}
	if cp, err := lo.l.Complete(lo.ctx, d.Reservation, lo.stored); err != nil || !cp.Stored {
		t.Fatalf("Complete: %+v %v", cp, err)
	}
	if d := lo.begin(t, "k1"); d.Outcome != idem.Replay || string(d.Response.Body) != `{"ok":true}` {
		t.Fatalf("replay of k1: %+v", d)
	}
	if d, err := lo.l.Lookup(lo.ctx, "acct", "k1", "fp-k1"); err != nil || d.Outcome != idem.Replay {
		t.Fatalf("Lookup: %+v %v", d, err)
	}
}

// releaseThenTakeover claims k2 and releases it, and checks that the next
// request takes the key over; it returns that request's decision.
func (lo ledgerOnlyRun) releaseThenTakeover(t *testing.T) idem.Decision {
	t.Helper()
	d := lo.begin(t, "k2")
	if ok, err := lo.l.Release(lo.ctx, d.Reservation); err != nil || !ok {
		t.Fatalf("Release: %v %v", ok, err)
	}
	d = lo.begin(t, "k2")
	if d.Outcome != idem.Execute || !d.Reservation.Takeover || d.Reservation.Generation < 2 {
		t.Fatalf("after the release: %+v", d)
	}
	return d
}

// unlistedRefusedWhole claims k3 and completes it transactionally with a
// statement the operator did not list, and checks that the bridge refuses
// the batch whole: no business row, the key still pending. It reports
// false when the error is not the bridge's refusal (refusedError has then
// failed t).
func (lo ledgerOnlyRun) unlistedRefusedWhole(t *testing.T) bool {
	t.Helper()
	d := lo.begin(t, "k3")
	unlisted := d1client.Statement{SQL: "INSERT INTO business (principal, key) VALUES (?, ?)", Params: []any{"acct", "k3"}}
	_, err := lo.l.CompleteTx(lo.ctx, d.Reservation, lo.stored, []d1client.Statement{unlisted})
	if e := refusedError(t, err); e == nil {
		return false
	}
	if n := count(t, lo.admin, "SELECT count(*) FROM business WHERE key = 'k3'"); n != 0 {
		t.Errorf("the refused batch wrote %d business rows", n)
	}
	if n := count(t, lo.admin, "SELECT count(*) FROM idempotency_keys WHERE key = 'k3' AND status = 'pending'"); n != 1 {
		t.Errorf("k3 is not pending after the refused completion")
	}
	return true
}

// sweep checks that the sweep deletes a row past the retention; on the
// injected clock, 48 hours on, it deletes the run's other rows too.
func (lo ledgerOnlyRun) sweep(t *testing.T, clk *testClock, injected bool) {
	t.Helper()
	old := time.Now().Add(-48 * time.Hour).UnixMilli()
	if _, err := lo.admin.Query(lo.ctx, `INSERT INTO idempotency_keys (principal, key, fingerprint, status, generation, created_at, updated_at)
VALUES ('acct', 'old', 'fp', 'completed', 1, ?, ?)`, old, old); err != nil {
		t.Fatal(err)
	}
	if n, err := lo.l.Admin().Sweep(lo.ctx); err != nil || n != 1 {
		t.Fatalf("Sweep: %d %v, want 1 row", n, err)
	}
	if n := count(t, lo.admin, "SELECT count(*) FROM idempotency_keys WHERE key = 'old'"); n != 0 {
		t.Errorf("the swept row is still there")
	}
	if injected {
		clk.Advance(48 * time.Hour)
		if n, err := lo.l.Admin().Sweep(lo.ctx); err != nil || n < 3 {
			t.Fatalf("Sweep after 48 h: %d %v", n, err)
		}
	}
}

// middlewareEndToEnd sends one request twice through the middleware,
// whose handler writes through idemhttp.Tx, and checks that the second is
// the first's replay, and that the handler ran once, with one business
// row.
func (lo ledgerOnlyRun) middlewareEndToEnd(t *testing.T) {
	t.Helper()
	mw, err := idemhttp.New(lo.l, idemhttp.Options{Principal: func(r *http.Request) (string, error) {
		if p := r.Header.Get("X-Principal"); p != "" {
			return p, nil
		}
		return "", errors.New("no principal")
	}})
	if err != nil {
		t.Fatal(err)
	}
	var runs int
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs++
		tx, _ := idemhttp.TxFromContext(r.Context())
		tx.Add(d1client.Statement{SQL: bizInsert, Params: []any{r.Header.Get("X-Principal"), r.Header.Get(idemhttp.HeaderKey), "from the middleware"}})
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, `{"order":"created"}`)
	})))
	defer srv.Close()
	for i := range 2 {
		req, _ := http.NewRequestWithContext(lo.ctx, http.MethodPost, srv.URL+"/orders", strings.NewReader(`{"sku":"a"}`))
		req.Header.Set("X-Principal", "acct")
		req.Header.Set(idemhttp.HeaderKey, "order-1")
		req.Header.Set("Content-Type", "application/json")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		replayed := res.Header.Get(idemhttp.HeaderReplayed) == "true"
		if res.StatusCode != http.StatusCreated || string(body) != `{"order":"created"}` || replayed != (i == 1) {
			t.Fatalf("request %d: %d %q replayed=%v", i+1, res.StatusCode, body, replayed)
		}
	}
	if runs != 1 || count(t, lo.admin, "SELECT count(*) FROM business WHERE key = 'order-1'") != 1 {
		t.Errorf("handler ran %d times; want once, with one business row", runs)
	}
}

// refusedError asserts that err is the bridge's ledger-only refusal as
// d1client reports it: a deterministic SQL error (HTTP 400, code 7500,
// SQLITE_AUTH), not ambiguous, naming ledger-only mode.
func refusedError(t testing.TB, err error) *d1client.Error {
	t.Helper()
	e := clientError(t, err, d1client.ErrSQL, http.StatusBadRequest)
	if e.SQLiteCode != "SQLITE_AUTH" || e.Ambiguous || !strings.Contains(e.Message, "ledger-only mode") {
		t.Errorf("refusal: code %q, ambiguous %v, message %q", e.SQLiteCode, e.Ambiguous, e.Message)
	}
	return e
}

// TestLedgerOnlyRefuses: a ledger-only bridge refuses, before anything
// runs, every statement that is not exactly one of the ledger's texts or
// the operator's: other reads and writes, DDL and DROP, the listed texts
// with a byte changed (whitespace, case, a comment, a semicolon, a second
// statement), the schema itself; and a batch holding one such statement is
// refused whole. The answer is D1's own shape for an authorizer refusal,
// 400 with code 7500 "not authorized: ...: SQLITE_AUTH", on /raw and
// /query. The listed texts pass.
func TestLedgerOnlyRefuses(t *testing.T) {
	b := ledgerOnly(t)
	db, c, admin := ledgerDB(t, b)
	claim := ledgerSQL(t, "INSERT INTO idempotency_keys", "ON CONFLICT", "unixepoch")
	lookup := ledgerSQL(t, "SELECT fingerprint, status", "unixepoch")
	claimParams := []any{"acct", "k", "fp", 30000}

	single := []struct{ name, sql string }{
		{"business read", "SELECT * FROM business"},
		{"ledger read", "SELECT * FROM idempotency_keys"},
		{"drop", "DROP TABLE business"},
		{"drop ledger", "DROP TABLE idempotency_keys"},
		{"unbounded delete", "DELETE FROM idempotency_keys"},
		{"schema", d1idem.SchemaStatements()[0]},
		{"empty", ""},
		{"trailing space", claim + " "},
		{"leading newline", "\n" + claim},
		{"double space", strings.Replace(claim, " ", "  ", 1)},
		{"lower case", strings.ToLower(claim)},
		{"trailing comment", claim + " -- ok"},
		{"leading comment", "/* ok */ " + claim},
		{"semicolon", claim + ";"},
		{"second statement", lookup + "; DROP TABLE business"},
		{"listed business statement changed", strings.Replace(bizInsert, "VALUES", "values", 1)},
	}
	for _, tc := range single {
		t.Run(tc.name, func(t *testing.T) {
			for _, ep := range []string{"raw", "query"} {
				res := db.Post(t, ep, map[string]any{"sql": tc.sql})
				wantError(t, res, http.StatusBadRequest, 7500, "not authorized: the bridge runs in ledger-only mode and the statement is neither", "nothing was executed: SQLITE_AUTH")
			}
			if tc.sql == "" || strings.Contains(tc.sql, "; ") {
				return // d1client refuses empty and multi-statement SQL itself
			}
			_, err := c.Query(t.Context(), tc.sql)
			refusedError(t, err)
		})
	}

	t.Run("batch with one unlisted statement", func(t *testing.T) {
		for i, batch := range [][]d1client.Statement{
			{d1client.Statement{SQL: claim, Params: claimParams}, d1client.Statement{SQL: lookup, Params: []any{"acct", "k"}}, {SQL: "DELETE FROM business"}},
			{{SQL: "SELECT 1"}, d1client.Statement{SQL: claim, Params: claimParams}},
			{d1client.Statement{SQL: claim, Params: claimParams}, d1client.Statement{SQL: bizInsert + " ", Params: []any{"acct", "k", "x"}}},
		} {
			_, err := c.Exec(t.Context(), batch)
			e := refusedError(t, err)
			if want := fmt.Sprintf("statement %d of %d", []int{3, 1, 2}[i], len(batch)); !strings.Contains(e.Message, want) {
				t.Errorf("batch %d: message %q does not name %q", i, e.Message, want)
			}
		}
		if n := count(t, admin, "SELECT count(*) FROM idempotency_keys"); n != 0 {
			t.Errorf("a refused batch claimed %d keys", n)
		}
		res := db.Post(t, "raw", map[string]any{"batch": []map[string]any{{"sql": claim, "params": claimParams}, {"sql": "DROP TABLE business"}}})
		wantError(t, res, http.StatusBadRequest, 7500, "statement 2 of 2 is neither", ": SQLITE_AUTH")
		if n := count(t, admin, "SELECT count(*) FROM sqlite_master WHERE name = 'business'"); n != 1 {
			t.Errorf("the business table was dropped")
		}
	})

	t.Run("schema through the ledger-only bridge", func(t *testing.T) {
		var stmts []d1client.Statement
		for _, s := range d1idem.SchemaStatements() {
			stmts = append(stmts, d1client.Statement{SQL: s})
		}
		_, err := b.NewDatabase(t).Client(t).Exec(t.Context(), stmts)
		refusedError(t, err)
	})

	t.Run("listed statements pass", func(t *testing.T) {
		res, err := c.Exec(t.Context(), []d1client.Statement{
			d1client.Statement{SQL: claim, Params: claimParams},
			d1client.Statement{SQL: lookup, Params: []any{"acct", "k"}},
			d1client.Statement{SQL: bizInsert, Params: []any{"acct", "k", "listed"}},
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(res[0].Rows) != 1 || len(res[1].Rows) != 1 {
			t.Errorf("claim and lookup: %d and %d rows", len(res[0].Rows), len(res[1].Rows))
		}
		wantOK(t, db.Post(t, "query", map[string]any{"sql": lookup, "params": []any{"acct", "k"}}), 1)
		// Every shipped statement is accepted as it is (what it does with
		// these parameters does not matter here, only that it runs).
		for _, s := range ledgerStatements(t) {
			params := []any{"p", "k2"}
			for len(params) < maxParam(s) {
				params = append(params, 1)
			}
			res := db.Post(t, "raw", map[string]any{"sql": s, "params": params[:maxParam(s)]})
			if res.Status != http.StatusOK && strings.Contains(errorMessage(res), "ledger-only") {
				t.Errorf("shipped statement refused:\n%s", s)
			}
		}
	})

	t.Run("the admin bridge is not restricted", func(t *testing.T) {
		if n := count(t, admin, "SELECT count(*) FROM business"); n != 1 {
			t.Errorf("business rows: %d, want 1", n)
		}
	})
}

// maxParam returns the highest ?N in s (the ledger's statements number
// their parameters).
func maxParam(s string) int {
	n := 0
	for i := 1; i <= 9; i++ {
		if strings.Contains(s, fmt.Sprintf("?%d", i)) {
			n = i
		}
	}
	return n
}

// errorMessage returns the first error message of an envelope.
func errorMessage(res *d1test.Response) string {
	var env struct {
		Errors []struct {
			Message string `json:"message"`
		} `json:"errors"`
	}
	if json.Unmarshal(res.Body, &env) != nil || len(env.Errors) == 0 {
		return string(res.Body)
	}
	return env.Errors[0].Message
}

// TestLedgerOnlyCannotForgeTheRing: the holder of a ledger-only secret
// sends the ledger's own statements at the ring row: a forced release
// (which moved its epoch on and made it pending), then a completion of it
// with a ring of their own, a sweep with a negative retention (which
// reached the year-9999 rows), a claim of the empty principal. Each is
// accepted by the bridge (they are the ledger's texts) and changes
// nothing: the ring and the identity row stay as the operator recorded
// them, and a ledger through the bridge routes by the operator's ring.
func TestLedgerOnlyCannotForgeTheRing(t *testing.T) {
	b := ledgerOnly(t)
	_, bridged, admin := ledgerDB(t, b)
	ctx := t.Context()
	op, err := idem.NewSharded([]idem.Home{{ID: "home-a", DB: admin}}, idem.Config{})
	if err != nil {
		t.Fatal(err)
	}
	st, err := op.Admin().InitRing(ctx)
	if err != nil {
		t.Fatal(err)
	}
	reserved := func() string {
		t.Helper()
		res, err := admin.Query(ctx, "SELECT * FROM idempotency_keys WHERE principal = '' ORDER BY key")
		if err != nil {
			t.Fatal(err)
		}
		return fmt.Sprint(res.Rows)
	}
	before := reserved()
	epoch := st.Ring.Epoch()
	evil := `{"format":"d1idem-ring/1","version":9,"phase":"stable","homes":["evil"]}`
	d1Clock := "CAST(unixepoch('subsec') * 1000 AS INTEGER)"
	attacks := []d1client.Statement{
		{SQL: ledgerSQL(t, "SET generation = generation + 1, status = 'pending'", d1Clock), Params: []any{"", "d1idem:ring", epoch, 30001, true, 30000, true}},
		{SQL: ledgerSQL(t, "SET status = 'completed'", d1Clock), Params: []any{200, evil, "{}", "", "d1idem:ring", epoch + 1}},
		{SQL: ledgerSQL(t, "SET status = 'completed'", d1Clock), Params: []any{200, evil, "{}", "", "d1idem:ring", epoch}},
		{SQL: ledgerSQL(t, "SET generation = generation + 1, status = 'pending'", d1Clock), Params: []any{"", "d1idem:home", 1, 30001, true, 30000, true}},
		{SQL: ledgerSQL(t, "SET updated_at = "+d1Clock), Params: []any{"", "d1idem:ring", epoch}},
		{SQL: ledgerSQL(t, "DELETE FROM idempotency_keys\nWHERE rowid IN", d1Clock), Params: []any{int64(-1e15), 1000}},
		{SQL: ledgerSQL(t, "DELETE FROM idempotency_keys\nWHERE principal = ?1", d1Clock), Params: []any{"", "d1idem:ring", epoch, st.Ring.String(), int64(-1e15)}},
		{SQL: ledgerSQL(t, "ON CONFLICT (principal, key) DO UPDATE", d1Clock), Params: []any{"", "d1idem:ring", "fp", int64(-1e15)}},
		{SQL: ledgerSQL(t, "ON CONFLICT (principal, key) DO UPDATE", d1Clock), Params: []any{"", "d1idem:other", "fp", 30000}},
	}
	for _, a := range attacks {
		if _, err := bridged.Exec(ctx, []d1client.Statement{a}); err != nil && errors.Is(err, d1client.ErrSQL) && strings.Contains(err.Error(), "not authorized") {
			t.Fatalf("the bridge refused a ledger statement: %v", err)
		}
		if after := reserved(); after != before {
			t.Fatalf("%q with %v, through the ledger-only bridge, changed the reserved rows:\n%s\nto\n%s", a.SQL, a.Params, before, after)
		}
	}
	l, err := idem.NewSharded([]idem.Home{{ID: "home-a", DB: bridged}}, idem.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := l.Ring(ctx); err != nil || r.String() != st.Ring.String() {
		t.Errorf("a ledger through the bridge routes by %s, %v; want %s", r, err, st.Ring)
	}
}
