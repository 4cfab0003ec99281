package faults

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/idem/idemhttp"
	"github.com/d1idem/d1idem/internal/d1test"
)

var bg = context.Background()

// adminMark starts the SQL of the suite's own set-up and inspection
// statements. The fault hook never touches a call that carries it, so what
// the suite reads is what D1 holds.
const adminMark = "/*faults:admin*/ "

// auditSQL is the suite's instrumentation, installed next to the ledger's
// table in the same database. Triggers record, inside the very transaction
// that makes them, every claim, takeover, pending-to-completed transition,
// deletion and business write, with D1's clock; they never change what the
// ledger's statements see or return. A change that must never happen (a
// completed row updated or deleted, a second business row for one key) is
// recorded as an event the invariant checks count.
var auditSQL = []string{
	// The business table of the suite's handlers. No unique constraint on
	// (principal, key) on purpose: a double write must be visible, not
	// refused.
	`CREATE TABLE business (
  seq       INTEGER PRIMARY KEY AUTOINCREMENT,
  principal TEXT NOT NULL,
  key       TEXT NOT NULL,
  exec_id   TEXT NOT NULL,
  at        INTEGER NOT NULL
)`,
	// The randomized run's side writes (callers that share the ledger's D1
	// client): one row per execution of a write, keyed by its token.
	`CREATE TABLE side_writes (
  seq   INTEGER PRIMARY KEY AUTOINCREMENT,
  token TEXT NOT NULL
)`,
	`CREATE TABLE audit_completions (
  seq              INTEGER PRIMARY KEY AUTOINCREMENT,
  principal        TEXT NOT NULL,
  key              TEXT NOT NULL,
  generation       INTEGER NOT NULL,
  response_status  INTEGER,
  response_body    TEXT,
  response_headers TEXT,
  at               INTEGER NOT NULL
)`,
	// extra: the deleted row's updated_at, for deletions.
	`CREATE TABLE audit_events (
  seq        INTEGER PRIMARY KEY AUTOINCREMENT,
  kind       TEXT NOT NULL,
  principal  TEXT NOT NULL,
  key        TEXT NOT NULL,
  generation INTEGER,
  detail     TEXT,
  extra      INTEGER,
  at         INTEGER NOT NULL
)`,
	`CREATE INDEX audit_events_kind ON audit_events (kind)`,
	// A completion is recorded twice: its response in audit_completions,
	// and its place in the key's history among the other events.
	`CREATE TRIGGER audit_completion AFTER UPDATE OF status ON idempotency_keys
WHEN OLD.status = 'pending' AND NEW.status = 'completed'
BEGIN
  INSERT INTO audit_completions (principal, key, generation, response_status, response_body, response_headers, at)
  VALUES (NEW.principal, NEW.key, NEW.generation, NEW.response_status, NEW.response_body, NEW.response_headers,
          CAST(unixepoch('subsec') * 1000 AS INTEGER));
  INSERT INTO audit_events (kind, principal, key, generation, at)
  VALUES ('completed', NEW.principal, NEW.key, NEW.generation, CAST(unixepoch('subsec') * 1000 AS INTEGER));
END`,
	`CREATE TRIGGER audit_claim AFTER INSERT ON idempotency_keys
BEGIN
  INSERT INTO audit_events (kind, principal, key, generation, at)
  VALUES ('claim', NEW.principal, NEW.key, NEW.generation, CAST(unixepoch('subsec') * 1000 AS INTEGER));
END`,
	// A takeover sets updated_at to now; a release (idem.Ledger.Release,
	// idem.Admin.Release) moves the generation on with updated_at set back
	// past the TTL.
	`CREATE TRIGGER audit_takeover AFTER UPDATE OF generation ON idempotency_keys
WHEN NEW.generation <> OLD.generation
BEGIN
  INSERT INTO audit_events (kind, principal, key, generation, detail, at)
  VALUES (CASE WHEN NEW.updated_at < OLD.updated_at THEN 'released' ELSE 'takeover' END,
          NEW.principal, NEW.key, NEW.generation, 'from ' || OLD.generation, CAST(unixepoch('subsec') * 1000 AS INTEGER));
END`,
	// A completed row changes only when an operator forgets it
	// (Admin.Release with Force: one generation on, pending, no response);
	// any other change is recorded as a violation.
	`CREATE TRIGGER audit_overwrite AFTER UPDATE ON idempotency_keys
WHEN OLD.status = 'completed'
BEGIN
  INSERT INTO audit_events (kind, principal, key, generation, detail, at)
  VALUES (CASE WHEN NEW.status = 'pending' AND NEW.generation = OLD.generation + 1 AND NEW.response_status IS NULL
               THEN 'completed_row_released' ELSE 'completed_row_updated' END,
          NEW.principal, NEW.key, NEW.generation, 'was generation ' || OLD.generation, CAST(unixepoch('subsec') * 1000 AS INTEGER));
END`,
	`CREATE TRIGGER audit_delete AFTER DELETE ON idempotency_keys
BEGIN
  INSERT INTO audit_events (kind, principal, key, generation, extra, at)
  VALUES (CASE OLD.status WHEN 'completed' THEN 'completed_row_deleted' ELSE 'pending_row_deleted' END,
          OLD.principal, OLD.key, OLD.generation, OLD.updated_at, CAST(unixepoch('subsec') * 1000 AS INTEGER));
END`,
	`CREATE TRIGGER audit_business AFTER INSERT ON business
BEGIN
  INSERT INTO audit_events (kind, principal, key, detail, at)
  VALUES (CASE WHEN (SELECT count(*) FROM business WHERE principal = NEW.principal AND key = NEW.key) > 1
               THEN 'duplicate_business_write' ELSE 'business_write' END,
          NEW.principal, NEW.key, NEW.exec_id, CAST(unixepoch('subsec') * 1000 AS INTEGER));
END`,
}

// calls says which of the ledger's statements one D1 call carries. Group
// commit can put several requests' statements in one call, and the
// randomized run's side callers share those calls.
type calls struct {
	claim, lookup, complete, guard, renew, release, sweep, check, business, admin bool
	// The randomized run's side traffic (markers in a comment): echo reads,
	// multi-statement SQL, side writes.
	echo, multi, sideWrite bool
	// tokens are the side callers' tokens carried by the call.
	tokens []string
}

// Markers of the randomized run's side traffic: each statement carries its
// kind and token in a comment, "/*faults:echo:TOKEN*/", so the fault hook
// knows whose statements a call carries.
const (
	markEcho      = "faults:echo:"
	markMulti     = "faults:multi:"
	markSideWrite = "faults:sidewrite:"
)

// classify recognises the ledger's statements by their SQL, as the brief of
// this suite fixes it: claims start with "INSERT INTO idempotency_keys" and
// contain "ON CONFLICT", completions contain "SET status = 'completed'",
// guards contain "WHERE NOT EXISTS".
func classify(stmts []string) calls {
	var c calls
	for _, s := range stmts {
		s = strings.TrimSpace(s)
		for _, m := range []string{markEcho, markMulti, markSideWrite} {
			if tok, ok := markedToken(s, m); ok {
				c.tokens = append(c.tokens, tok)
				switch m {
				case markEcho:
					c.echo = true
				case markMulti:
					c.multi = true
				default:
					c.sideWrite = true
				}
			}
		}
		switch {
		case strings.Contains(s, adminMark):
			c.admin = true
		case strings.HasPrefix(s, "INSERT INTO idempotency_keys") && strings.Contains(s, "ON CONFLICT"):
			c.claim = true
		case strings.Contains(s, "WHERE NOT EXISTS"):
			c.guard = true
		case strings.Contains(s, "SET status = 'completed'"):
			c.complete = true
		case strings.HasPrefix(s, "UPDATE idempotency_keys SET updated_at"):
			c.renew = true
		case strings.HasPrefix(s, "UPDATE idempotency_keys SET generation = generation + 1"):
			c.release = true
		case strings.HasPrefix(s, "DELETE FROM idempotency_keys") && strings.Contains(s, "rowid IN"):
			c.sweep = true
		case strings.HasPrefix(s, "DELETE FROM idempotency_keys"):
			c.release = true
		case strings.HasPrefix(s, "SELECT fingerprint, status"):
			c.lookup = true
		case strings.HasPrefix(s, "SELECT status, generation"):
			c.check = true
		case strings.HasPrefix(s, "INSERT INTO business") || strings.HasPrefix(s, "INSERT INTO orders"):
			c.business = true
		}
	}
	return c
}

// markedToken returns the token of a side-traffic marker in s.
func markedToken(s, mark string) (string, bool) {
	i := strings.Index(s, "/*"+mark)
	if i < 0 {
		return "", false
	}
	rest := s[i+2+len(mark):]
	j := strings.Index(rest, "*/")
	if j < 0 {
		return "", false
	}
	return rest[:j], true
}

// roundTrip names the part of the request path a call belongs to, for the
// fault counts: "claim" (round trip 1), "completion" (round trip 2, plain or
// transactional), "renew", "release", "check" (the read after an empty
// completion answer), "side" (side traffic alone) or "other".
func (c calls) roundTrip() string {
	switch {
	case c.claim:
		return "claim"
	case c.complete || c.guard:
		return "completion"
	case c.renew:
		return "renew"
	case c.release:
		return "release"
	case c.check:
		return "check"
	case c.echo || c.multi || c.sideWrite:
		return "side"
	}
	return "other"
}

// policy chooses the fault for one call (never called for admin calls).
type policy func(req d1local.Request, c calls) d1local.Fault

// Account IDs of clients whose calls the fault hook tells apart: the
// randomized run's operator (never faulted), its starved instance and its
// steady instance.
// Neither backend checks the account ID.
const (
	operatorAccount = "0000000000000000000000000000000a"
	starvedAccount  = "0000000000000000000000000000000c"
	steadyAccount   = "0000000000000000000000000000000d"
)

// world is one d1local server and one database holding the ledger schema,
// the business table and the audit triggers. Every ledger instance of a test
// gets its own d1client on it (its own group commit and 971 block), as
// separate processes would.
type world struct {
	t     testing.TB
	b     *d1test.Backend
	dbh   *d1test.Database
	admin *d1client.Client

	pol atomic.Pointer[policy]

	mu       sync.Mutex
	injected map[string]int  // "<fault>@<round trip>[/C]" -> count
	faulted  map[string]bool // side tokens carried by a call that was faulted
	multiSQL map[string]bool // tokens of multi-statement SQL that reached D1
}

func newWorld(t testing.TB) *world {
	t.Helper()
	return newWorldFor(t, false)
}

// newWorldFor is newWorld on d1local, or, onBridge, on the bridge in
// workerd behind a proxy that injects the same faults (bridgeWithFaults).
func newWorldFor(t testing.TB, onBridge bool) *world {
	t.Helper()
	w := &world{t: t, injected: map[string]int{}, faulted: map[string]bool{}, multiSQL: map[string]bool{}}
	if onBridge {
		w.b = bridgeWithFaults(t, w.hook, w.forwardFailed)
	} else {
		w.b = d1test.LocalConfig(t, d1local.Config{Faults: w.hook})
	}
	w.dbh = w.b.NewDatabase(t)
	w.admin = w.dbh.Client(t)
	d1test.ApplySchema(t, w.admin)
	var stmts []d1client.Statement
	for _, s := range auditSQL {
		stmts = append(stmts, d1client.Statement{SQL: adminMark + s})
	}
	w.mustExec(stmts...)
	return w
}

// client returns a new D1 client on the world's database.
func (w *world) client(mods ...func(*d1client.Config)) *d1client.Client {
	return w.dbh.Client(w.t, mods...)
}

// setPolicy installs the fault policy (nil: no faults).
func (w *world) setPolicy(p policy) {
	if p == nil {
		w.pol.Store(nil)
		return
	}
	w.pol.Store(&p)
}

func (w *world) hook(req d1local.Request) d1local.Fault {
	c := classify(req.Statements)
	if c.multi {
		w.mu.Lock()
		for _, s := range req.Statements {
			if tok, ok := markedToken(s, markMulti); ok {
				w.multiSQL[tok] = true
			}
		}
		w.mu.Unlock()
	}
	if c.admin || req.AccountID == operatorAccount {
		return d1local.Fault{}
	}
	p := w.pol.Load()
	if p == nil {
		return d1local.Fault{}
	}
	f := (*p)(req, c)
	if !f.IsZero() {
		site := c.roundTrip()
		if req.AccountID == starvedAccount {
			site += "/C"
		}
		w.mu.Lock()
		w.injected[faultName(f)+"@"+site]++
		if f != (d1local.Fault{Latency: f.Latency}) { // more than a delay
			for _, tok := range c.tokens {
				w.faulted[tok] = true
			}
		}
		w.mu.Unlock()
	}
	return f
}

// forwardFailed records a call the bridge's fault proxy could not forward:
// a fault its client saw, as "proxy_error@<round trip>".
func (w *world) forwardFailed(req d1local.Request) {
	c := classify(req.Statements)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.injected["proxy_error@"+c.roundTrip()]++
	for _, tok := range c.tokens {
		w.faulted[tok] = true
	}
}

// faultName names a fault's kind for the counts.
func faultName(f d1local.Fault) string {
	var n string
	switch {
	case f.RateLimit:
		n = "ratelimit971"
	case f.LoseResponse:
		n = "lost_response"
	case f.Overloaded:
		n = "overloaded429"
	case f.Internal:
		n = "internal500"
	case f.BadGateway:
		n = "badgateway502"
	case f.Latency > 0:
		return "latency"
	default:
		return "none"
	}
	if f.AfterCommit && !f.RateLimit && !f.LoseResponse {
		n += "+after_commit"
	}
	return n
}

// injectedCount returns how many faults matched the prefix ("" for all).
func (w *world) injectedCount(prefix string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for k, v := range w.injected {
		if strings.HasPrefix(k, prefix) {
			n += v
		}
	}
	return n
}

// injectedAt returns how many faults of one kind were injected at one site
// ("internal500@claim").
func (w *world) injectedAt(site string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.injected[site]
}

func (w *world) injectedSnapshot() map[string]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[string]int, len(w.injected))
	for k, v := range w.injected {
		out[k] = v
	}
	return out
}

// sideSnapshot returns the side tokens that were faulted and the
// multi-statement SQL that reached D1.
func (w *world) sideSnapshot() (faulted, multi map[string]bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	faulted, multi = map[string]bool{}, map[string]bool{}
	for k := range w.faulted {
		faulted[k] = true
	}
	for k := range w.multiSQL {
		multi[k] = true
	}
	return faulted, multi
}

// once returns a policy that applies f to the first call matching, and to no
// other call.
func once(match func(calls) bool, f d1local.Fault) policy {
	var done atomic.Bool
	return func(_ d1local.Request, c calls) d1local.Fault {
		if match(c) && done.CompareAndSwap(false, true) {
			return f
		}
		return d1local.Fault{}
	}
}

// always applies f to every call matching.
func always(match func(calls) bool, f d1local.Fault) policy {
	return func(_ d1local.Request, c calls) d1local.Fault {
		if match(c) {
			return f
		}
		return d1local.Fault{}
	}
}

func isClaim(c calls) bool      { return c.claim }
func isCompletion(c calls) bool { return c.complete }

// exec runs admin statements.
func (w *world) mustExec(stmts ...d1client.Statement) []d1client.Result {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(bg, 20*time.Second)
	defer cancel()
	res, err := w.admin.Exec(ctx, stmts)
	if err != nil {
		w.t.Fatalf("admin exec: %v", err)
	}
	return res
}

// query runs one admin read.
func (w *world) query(sql string, params ...any) []d1client.Row {
	w.t.Helper()
	return w.mustExec(d1client.Statement{SQL: adminMark + sql, Params: params})[0].Rows
}

func (w *world) count(sql string, params ...any) int64 {
	w.t.Helper()
	rows := w.query(sql, params...)
	n, _ := rows[0][0].Int64()
	return n
}

// ledgerRow is a row of idempotency_keys.
type ledgerRow struct {
	Principal, Key, Fingerprint, Status string
	Generation                          int64
	RespStatus                          *int64
	RespBody, RespHeaders               *string
	CreatedAt, UpdatedAt                int64
}

func (r ledgerRow) body() string {
	if r.RespBody == nil {
		return "<null>"
	}
	return *r.RespBody
}

func (r ledgerRow) headers() string {
	if r.RespHeaders == nil {
		return "<null>"
	}
	return *r.RespHeaders
}

func (r ledgerRow) status() int64 {
	if r.RespStatus == nil {
		return 0
	}
	return *r.RespStatus
}

const rowColumns = `principal, key, fingerprint, status, generation, response_status, response_body, response_headers, created_at, updated_at`

func scanRow(row d1client.Row) ledgerRow {
	var r ledgerRow
	if err := row.Scan(&r.Principal, &r.Key, &r.Fingerprint, &r.Status, &r.Generation, &r.RespStatus, &r.RespBody, &r.RespHeaders, &r.CreatedAt, &r.UpdatedAt); err != nil {
		panic(err)
	}
	return r
}

// row reads one ledger row.
func (w *world) row(principal, key string) (ledgerRow, bool) {
	w.t.Helper()
	rows := w.query(`SELECT `+rowColumns+` FROM idempotency_keys WHERE principal = ? AND key = ?`, principal, key)
	if len(rows) == 0 {
		return ledgerRow{}, false
	}
	return scanRow(rows[0]), true
}

func (w *world) rows() map[pk]ledgerRow {
	w.t.Helper()
	out := map[pk]ledgerRow{}
	w.paged(`SELECT rowid, `+rowColumns+` FROM idempotency_keys`, "rowid", func(row d1client.Row) int64 {
		var r ledgerRow
		var rowid int64
		if err := row.Scan(&rowid, &r.Principal, &r.Key, &r.Fingerprint, &r.Status, &r.Generation, &r.RespStatus, &r.RespBody, &r.RespHeaders, &r.CreatedAt, &r.UpdatedAt); err != nil {
			w.t.Fatal(err)
		}
		out[pk{r.Principal, r.Key}] = r
		return rowid
	})
	return out
}

// paged runs an admin read of a whole table in pages of pageRows: sql
// selects the column col first, and scan returns its value for each row.
func (w *world) paged(sql, col string, scan func(d1client.Row) int64) {
	w.t.Helper()
	const pageRows = 5000
	after := int64(-1 << 62)
	for {
		rows := w.query(sql+` WHERE `+col+` > ? ORDER BY `+col+` LIMIT ?`, after, pageRows)
		for _, row := range rows {
			after = scan(row)
		}
		if len(rows) < pageRows {
			return
		}
	}
}

// pk is a ledger key: (principal, key).
type pk struct{ P, K string }

func (k pk) String() string { return k.P + "/" + k.K }

// businessRow is one row of the business table.
type businessRow struct {
	Seq        int64
	P, K, Exec string
	At         int64
}

func (w *world) business() map[pk][]businessRow {
	w.t.Helper()
	out := map[pk][]businessRow{}
	w.paged(`SELECT seq, principal, key, exec_id, at FROM business`, "seq", func(row d1client.Row) int64 {
		var b businessRow
		if err := row.Scan(&b.Seq, &b.P, &b.K, &b.Exec, &b.At); err != nil {
			w.t.Fatal(err)
		}
		out[pk{b.P, b.K}] = append(out[pk{b.P, b.K}], b)
		return b.Seq
	})
	return out
}

// sideWrites counts the side_writes rows per token.
func (w *world) sideWrites() map[string]int {
	w.t.Helper()
	out := map[string]int{}
	w.paged(`SELECT seq, token FROM side_writes`, "seq", func(row d1client.Row) int64 {
		var seq int64
		var tok string
		if err := row.Scan(&seq, &tok); err != nil {
			w.t.Fatal(err)
		}
		out[tok]++
		return seq
	})
	return out
}

// completion is one audited pending-to-completed transition.
type completion struct {
	Seq        int64
	P, K       string
	Generation int64
	Status     *int64
	Body, Hdrs *string
	At         int64
}

func (w *world) completions() []completion {
	w.t.Helper()
	var out []completion
	w.paged(`SELECT seq, principal, key, generation, response_status, response_body, response_headers, at FROM audit_completions`, "seq", func(row d1client.Row) int64 {
		var c completion
		if err := row.Scan(&c.Seq, &c.P, &c.K, &c.Generation, &c.Status, &c.Body, &c.Hdrs, &c.At); err != nil {
			w.t.Fatal(err)
		}
		out = append(out, c)
		return c.Seq
	})
	return out
}

// event is one audited event.
type event struct {
	Seq        int64
	Kind, P, K string
	Generation *int64
	Detail     *string
	Extra      *int64 // a deleted row's updated_at
	At         int64
}

func (e event) gen() int64 {
	if e.Generation == nil {
		return 0
	}
	return *e.Generation
}

func (e event) String() string {
	s := fmt.Sprintf("d1@%d %s", e.At, e.Kind)
	if e.Generation != nil {
		s += fmt.Sprintf(" gen=%d", *e.Generation)
	}
	if e.Detail != nil {
		s += " " + *e.Detail
	}
	if e.Extra != nil {
		s += fmt.Sprintf(" (updated %d ms before)", e.At-*e.Extra)
	}
	return s
}

// claimAndTakeover returns when, by D1's clock, the last claim and the last
// takeover the audit recorded happened (0 for one that did not).
func (w *world) claimAndTakeover() (claimAt, takeoverAt int64) {
	w.t.Helper()
	for _, e := range w.events() {
		switch e.Kind {
		case "claim":
			claimAt = e.At
		case "takeover":
			takeoverAt = e.At
		}
	}
	return claimAt, takeoverAt
}

func (w *world) events() []event {
	w.t.Helper()
	var out []event
	w.paged(`SELECT seq, kind, principal, key, generation, detail, extra, at FROM audit_events`, "seq", func(row d1client.Row) int64 {
		var e event
		if err := row.Scan(&e.Seq, &e.Kind, &e.P, &e.K, &e.Generation, &e.Detail, &e.Extra, &e.At); err != nil {
			w.t.Fatal(err)
		}
		out = append(out, e)
		return e.Seq
	})
	return out
}

func (w *world) eventCount(kind string) int64 {
	w.t.Helper()
	return w.count(`SELECT count(*) FROM audit_events WHERE kind = ?`, kind)
}

// d1Now reads D1's clock in milliseconds.
func (w *world) d1Now() int64 {
	w.t.Helper()
	return w.count(`SELECT CAST(unixepoch('subsec') * 1000 AS INTEGER)`)
}

// assertOnce checks a key's end state after a scenario: the row completed
// at generation gen with a 201 whose body names the execution that made the
// only business row, and exactly one audited completion.
func (w *world) assertOnce(t testing.TB, principal, key string, gen int64) {
	t.Helper()
	r, ok := w.row(principal, key)
	if !ok {
		t.Fatalf("%s/%s: no ledger row", principal, key)
	}
	if r.Status != "completed" || r.Generation != gen || r.status() != 201 {
		t.Errorf("%s/%s: row %s generation %d status %d, want completed generation %d status 201", principal, key, r.Status, r.Generation, r.status(), gen)
	}
	biz := w.business()[pk{principal, key}]
	if len(biz) != 1 {
		t.Errorf("%s/%s: %d business rows, want exactly 1: %+v", principal, key, len(biz), biz)
	} else if exec := execOf(r.body()); exec != biz[0].Exec {
		t.Errorf("%s/%s: stored response names execution %q, the business row %q", principal, key, exec, biz[0].Exec)
	}
	n := 0
	for _, c := range w.completions() {
		if c.P == principal && c.K == key {
			n++
			if c.Generation != gen {
				t.Errorf("%s/%s: a completion was stored at generation %d, want %d", principal, key, c.Generation, gen)
			}
		}
	}
	if n != 1 {
		t.Errorf("%s/%s: %d stored completions, want 1", principal, key, n)
	}
	for _, e := range w.events() {
		if e.Kind == "completed_row_updated" || e.Kind == "completed_row_deleted" || e.Kind == "duplicate_business_write" {
			t.Errorf("%s/%s: audit: %s", e.P, e.K, e)
		}
	}
}

// execOf extracts the "exec" field of a handler's JSON body.
func execOf(body string) string {
	var m struct {
		Exec string `json:"exec"`
		ID   string `json:"id"` // ordersapi
	}
	if json.Unmarshal([]byte(body), &m) != nil {
		return ""
	}
	if m.Exec != "" {
		return m.Exec
	}
	return m.ID
}

// logSink records the ledger's log lines.
type logSink struct {
	mu   sync.Mutex
	recs []logRec
}

type logRec struct {
	Time  time.Time
	Level slog.Level
	Msg   string
	Attrs map[string]string
}

func (s *logSink) handler() slog.Handler { return &sinkHandler{s: s} }

func (s *logSink) find(substr string) []logRec {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []logRec
	for _, r := range s.recs {
		if strings.Contains(r.Msg, substr) {
			out = append(out, r)
		}
	}
	return out
}

type sinkHandler struct {
	s     *logSink
	attrs []slog.Attr
}

func (h *sinkHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *sinkHandler) Handle(_ context.Context, r slog.Record) error {
	rec := logRec{Time: r.Time, Level: r.Level, Msg: r.Message, Attrs: map[string]string{}}
	for _, a := range h.attrs {
		rec.Attrs[a.Key] = a.Value.String()
	}
	r.Attrs(func(a slog.Attr) bool {
		rec.Attrs[a.Key] = a.Value.String()
		return true
	})
	h.s.mu.Lock()
	h.s.recs = append(h.s.recs, rec)
	h.s.mu.Unlock()
	return nil
}
func (h *sinkHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &sinkHandler{s: h.s, attrs: append(append([]slog.Attr(nil), h.attrs...), as...)}
}
func (h *sinkHandler) WithGroup(string) slog.Handler { return h }

// stack is one "instance" of an application: its own D1 client and ledger,
// the middleware in front of a handler, on an httptest server.
type stack struct {
	ledger *idem.Ledger
	db     *d1client.Client
	srv    *httptest.Server
	logs   *logSink
}

// newStack starts an instance whose handler is made by mk (given the
// instance's D1 client, for handlers that write directly).
func (w *world) newStack(cfg idem.Config, mk func(db *d1client.Client) http.Handler) *stack {
	w.t.Helper()
	return w.newStackSpec(stackSpec{cfg: cfg, mk: mk})
}

// stackSpec describes an instance: its ledger's configuration, the
// middleware's options (Principal defaults to bearer), its D1 client's
// configuration changes, the handler, and what to wrap around the
// middleware (outer) and around the handler inside it (inner).
type stackSpec struct {
	cfg   idem.Config
	opts  idemhttp.Options
	mods  []func(*d1client.Config)
	mk    func(db *d1client.Client) http.Handler
	outer func(http.Handler) http.Handler
	inner func(http.Handler) http.Handler
}

func (w *world) newStackSpec(sp stackSpec) *stack {
	w.t.Helper()
	s := &stack{db: w.client(sp.mods...), logs: &logSink{}}
	cfg := sp.cfg
	if cfg.Logger == nil {
		cfg.Logger = slog.New(s.logs.handler())
	}
	l, err := idem.New(s.db, cfg)
	if err != nil {
		w.t.Fatal(err)
	}
	s.ledger = l
	opts := sp.opts
	if opts.Principal == nil {
		opts.Principal = bearer
	}
	h := sp.mk(s.db)
	if sp.inner != nil {
		h = sp.inner(h)
	}
	var root = idemhttp.Must(l, opts)(h)
	if sp.outer != nil {
		root = sp.outer(root)
	}
	s.srv = httptest.NewUnstartedServer(root)
	s.srv.Config.ErrorLog = log.New(io.Discard, "", 0) // planned panics
	s.srv.Start()
	w.t.Cleanup(s.srv.Close)
	return s
}

func bearer(r *http.Request) (string, error) {
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || tok == "" {
		return "", errors.New("no bearer token")
	}
	return tok, nil
}

// bizHandler is the suite's business handler: it commits one row of the
// business table through idemhttp.Tx (or, with direct set, with its own D1 call
// before answering, as the spec's Worker would) and answers 201 with a body
// and a Location that name this execution.
type bizHandler struct {
	db     *d1client.Client
	direct bool
	// before runs first, with the request's context and the execution ID;
	// scenarios block in it.
	before func(ctx context.Context, exec string)
	n      atomic.Int64
}

func (h *bizHandler) runs() int64 { return h.n.Load() }

func (h *bizHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	exec := fmt.Sprintf("x%d", h.n.Add(1))
	principal, _ := bearer(r)
	key := r.Header.Get(idemhttp.HeaderKey)
	if h.before != nil {
		h.before(r.Context(), exec)
	}
	insert := d1client.Statement{SQL: `INSERT INTO business (principal, key, exec_id, at) VALUES (?, ?, ?, ?)`,
		Params: []any{principal, key, exec, time.Now().UnixMilli()}}
	if h.direct {
		if _, err := h.db.Exec(context.WithoutCancel(r.Context()), []d1client.Statement{insert}); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
	} else {
		tx, ok := idemhttp.TxFromContext(r.Context())
		if !ok {
			panic("no idemhttp.Tx in the handler's context")
		}
		tx.Add(insert)
	}
	body, _ := io.ReadAll(r.Body)
	writeCreated(w, exec, key, string(body))
}

func writeCreated(w http.ResponseWriter, exec, key, reqBody string) {
	b := createdBody(exec, key, reqBody)
	setCreatedHeaders(w.Header(), exec, "")
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write(b)
}

// createdBody is the suite's 201 body: it names the execution.
func createdBody(exec, key, reqBody string) []byte {
	b, _ := json.Marshal(map[string]string{"exec": exec, "key": key, "request": reqBody})
	return b
}

// setCreatedHeaders sets the headers of the suite's 201: a Location naming
// the execution (with suffix appended), and X-Exec, which is not replayable.
func setCreatedHeaders(h http.Header, exec, suffix string) {
	h.Set("Content-Type", "application/json")
	h.Set("Location", "/v1/things/"+exec+suffix)
	h.Set("X-Exec", exec) // not replayable
}

// answer is what a client got for one request.
type answer struct {
	Status     int
	Header     http.Header
	Body       string
	Err        error
	Start, End time.Time
}

func (a answer) replayed() bool { return a.Header.Get(idemhttp.HeaderReplayed) == "true" }

// code is the "error" field of a JSON error body.
func (a answer) code() string {
	var m map[string]any
	_ = json.Unmarshal([]byte(a.Body), &m)
	s, _ := m["error"].(string)
	return s
}

func (a answer) String() string {
	if a.Err != nil {
		return "transport error: " + a.Err.Error()
	}
	r := ""
	if a.replayed() {
		r = " (replayed)"
	}
	return fmt.Sprintf("%d%s %s", a.Status, r, strings.TrimSpace(a.Body))
}

// replayable is the part of an answer a replay must reproduce: the status,
// the replayable headers and the body.
func (a answer) replayable() string {
	return fmt.Sprintf("%d|content-type=%s|location=%s|%s", a.Status, a.Header.Get("Content-Type"), a.Header.Get("Location"), a.Body)
}

var httpClient = &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 64}}

// post sends one idempotent request.
func post(ctx context.Context, url, principal, key, body string, hdr ...string) answer {
	return postKeys(ctx, url, principal, []string{key}, body, hdr...)
}

// postKeys sends one request with an Idempotency-Key field per key.
func postKeys(ctx context.Context, url, principal string, keys []string, body string, hdr ...string) answer {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return answer{Err: err}
	}
	req.Header.Set("Authorization", "Bearer "+principal)
	req.Header[idemhttp.HeaderKey] = keys
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	a := answer{Start: time.Now()}
	res, err := httpClient.Do(req)
	if err != nil {
		a.Err, a.End = err, time.Now()
		return a
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	a.Status, a.Header, a.Body, a.Err, a.End = res.StatusCode, res.Header, string(b), err, time.Now()
	return a
}

// until polls fn every interval until it returns true or the timeout ends.
func until(t testing.TB, timeout, interval time.Duration, what string, fn func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !fn() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(interval)
	}
}

// retryUntilFinal re-sends a request until the answer is final (a 2xx or a
// 4xx other than 409 in progress / retry), and returns every answer.
func retryUntilFinal(t testing.TB, timeout time.Duration, send func() answer) []answer {
	t.Helper()
	var out []answer
	until(t, timeout, 50*time.Millisecond, "a final answer", func() bool {
		a := send()
		out = append(out, a)
		return final(a)
	})
	return out
}

// final reports whether an answer settles the request: a success, a replay,
// or a client error other than "in progress" and "retry".
func final(a answer) bool {
	if a.Err != nil || a.Status >= 500 {
		return false
	}
	if a.Status == http.StatusConflict {
		c := a.code()
		return c != idemhttp.CodeKeyInProgress && c != idemhttp.CodeKeyRetry
	}
	return true
}

func summarize(as []answer) string {
	var parts []string
	for _, a := range as {
		parts = append(parts, a.String())
	}
	return strings.Join(dedupRuns(parts), "\n  ")
}

// dedupRuns collapses runs of identical lines as "line (xN)".
func dedupRuns(lines []string) []string {
	var out []string
	for i := 0; i < len(lines); {
		j := i
		for j < len(lines) && lines[j] == lines[i] {
			j++
		}
		if j-i > 1 {
			out = append(out, fmt.Sprintf("%s (x%d)", lines[i], j-i))
		} else {
			out = append(out, lines[i])
		}
		i = j
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func newLogger(s *logSink) *slog.Logger { return slog.New(s.handler()) }
