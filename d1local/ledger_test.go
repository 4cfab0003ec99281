package d1local

import (
	"testing"

	"github.com/d1idem/d1idem"
	"github.com/d1idem/d1idem/internal/specseq"
)

// The statements of the spec ("Idempotency-Key Ledger on D1"), verbatim
// (internal/specseq holds them).
const (
	claimSQL    = specseq.Claim
	lookupSQL   = specseq.Lookup
	takeoverSQL = specseq.Takeover
	completeSQL = specseq.Complete
	sweepSQL    = specseq.Sweep
)

func TestLedgerStatements(t *testing.T) {
	h := newHarness(t, Config{})
	const db = "ledger"
	// The schema file, comments and all, as one multi-statement sql.
	if res := h.ok(t, db, q(d1idem.Schema())); len(res) != 2 {
		t.Fatalf("schema gave %d results, want 2", len(res))
	}

	step := func(t *testing.T, endpoint string, body any, wantRows string, wantChanges int64) {
		t.Helper()
		r := h.post(t, db, endpoint, body)
		if r.status != 200 {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
		if got := string(r.results[0].Results); got != wantRows {
			t.Errorf("results = %s, want %s", got, wantRows)
		}
		if got, _ := r.results[0].Meta.Changes.Int64(); got != wantChanges {
			t.Errorf("changes = %d, want %d", got, wantChanges)
		}
	}

	t.Run("claim wins once", func(t *testing.T) {
		step(t, "query", q(claimSQL, "p1", "k1", "fp1", 1000, 1000), `[{"key":"k1","generation":1}]`, 1)
		step(t, "query", q(claimSQL, "p1", "k1", "fp1", 1000, 1000), `[]`, 0)
		step(t, "raw", q(claimSQL, "p1", "k1", "fp1", 1000, 1000), `{"columns":["key","generation"],"rows":[]}`, 0)
		// Another principal, same key: its own claim.
		step(t, "raw", q(claimSQL, "p2", "k1", "fp1", 1000, 1000), `{"columns":["key","generation"],"rows":[["k1",1]]}`, 1)
	})
	t.Run("lookup", func(t *testing.T) {
		step(t, "query", q(lookupSQL, "p1", "k1"),
			`[{"fingerprint":"fp1","status":"pending","generation":1,"response_status":null,"response_body":null,"response_headers":null}]`, 0)
		step(t, "query", q(lookupSQL, "p1", "nope"), `[]`, 0)
	})
	t.Run("fenced takeover", func(t *testing.T) {
		// Stale (updated_at 1000 < 1500): bumps to generation 2.
		step(t, "query", q(takeoverSQL, 2000, "p1", "k1", 1500), `[{"generation":2}]`, 1)
		// Fresh now (2000 is not < 1500): nothing.
		step(t, "query", q(takeoverSQL, 2000, "p1", "k1", 1500), `[]`, 0)
		step(t, "raw", q(takeoverSQL, 3000, "p1", "k1", 2500), `{"columns":["generation"],"rows":[[3]]}`, 1)
	})
	t.Run("fenced completion", func(t *testing.T) {
		headers := `{"content-type":"application/json"}`
		// The fenced-out owner (generation 1) is rejected.
		step(t, "query", q(completeSQL, 201, `{"id":1}`, headers, 4000, "p1", "k1", 1), `[]`, 0)
		// The current owner (generation 3) completes.
		step(t, "query", q(completeSQL, 201, `{"id":1}`, headers, 4000, "p1", "k1", 3), `[{"key":"k1"}]`, 1)
		// Completing twice does nothing.
		step(t, "query", q(completeSQL, 500, "late", headers, 4100, "p1", "k1", 3), `[]`, 0)
		step(t, "query", q(lookupSQL, "p1", "k1"),
			`[{"fingerprint":"fp1","status":"completed","generation":3,"response_status":201,"response_body":"{\"id\":1}","response_headers":"{\"content-type\":\"application/json\"}"}]`, 0)
		// A completed row is never taken over.
		step(t, "query", q(takeoverSQL, 99999, "p1", "k1", 99999), `[]`, 0)
	})
	t.Run("bounded sweep", func(t *testing.T) {
		for i, updated := range []int{300, 400, 500, 600} {
			key := string(rune('a' + i))
			step(t, "query", q(claimSQL, "p1", key, "fp", updated, updated), `[{"key":"`+key+`","generation":1}]`, 1)
		}
		// 5 rows are older than 1001 (p2/k1 at 1000, and a..d); the sweep
		// deletes 2 per call.
		step(t, "query", q(sweepSQL, 1001, 2), `[]`, 2)
		step(t, "query", q("SELECT count(*) AS n FROM idempotency_keys WHERE updated_at < 1001"), `[{"n":3}]`, 0)
		step(t, "query", q(sweepSQL, 1001, 2), `[]`, 2)
		step(t, "query", q(sweepSQL, 1001, 2), `[]`, 1)
		step(t, "query", q(sweepSQL, 1001, 2), `[]`, 0)
		// The completed row (updated_at 4000) stays.
		step(t, "query", q("SELECT principal, key FROM idempotency_keys"), `[{"principal":"p1","key":"k1"}]`, 0)
	})
	t.Run("constraint errors", func(t *testing.T) {
		insert := `INSERT INTO idempotency_keys (principal, key, fingerprint, created_at, updated_at) VALUES (?, ?, ?, ?, ?)`
		if msg := h.sqlError(t, db, q(insert, "p1", "k1", "x", 1, 1)); msg !=
			"UNIQUE constraint failed: idempotency_keys.principal, idempotency_keys.key: SQLITE_CONSTRAINT (extended: SQLITE_CONSTRAINT_PRIMARYKEY)" {
			t.Errorf("message %q", msg)
		}
		if msg := h.sqlError(t, db, q(insert, "p1", "k9", nil, 1, 1)); msg !=
			"NOT NULL constraint failed: idempotency_keys.fingerprint: SQLITE_CONSTRAINT (extended: SQLITE_CONSTRAINT_NOTNULL)" {
			t.Errorf("message %q", msg)
		}
	})
}
