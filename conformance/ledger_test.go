package conformance

import (
	"fmt"
	"sync"
	"testing"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/internal/d1test"
)

// TestClaim: the claim INSERT ... ON CONFLICT DO NOTHING RETURNING returns
// the key and generation 1 the first time and no row (but the column names,
// on /raw) every later time; principals are separate namespaces.
func TestClaim(t *testing.T) {
	d1test.ForEach(t, func(t *testing.T, b *d1test.Backend) {
		c := b.NewClientSchema(t)
		first := exec(t, c, claim("p1", "k1", "fp1", 1000))[0]
		wantTable(t, &first, `["key","generation"]`, `[["k1",1]]`)
		if first.Meta.Changes != 1 {
			t.Errorf("first claim: meta.changes = %d, want 1", first.Meta.Changes)
		}
		if g := first.Rows[0][1]; g.Type() != d1client.Integer {
			t.Errorf("generation decodes as %s, want integer", g.Type())
		}

		second := exec(t, c, claim("p1", "k1", "fp-other", 2000))[0]
		wantTable(t, &second, `["key","generation"]`, `[]`)
		if second.Meta.Changes != 0 {
			t.Errorf("second claim: meta.changes = %d, want 0", second.Meta.Changes)
		}

		// Same key, another principal: an independent claim.
		other := exec(t, c, claim("p2", "k1", "fp1", 1000))[0]
		wantTable(t, &other, `["key","generation"]`, `[["k1",1]]`)

		// The losing claim changed nothing.
		res := exec(t, c, lookup("p1", "k1"))[0]
		wantTable(t, &res,
			`["fingerprint","status","generation","response_status","response_body","response_headers"]`,
			`[["fp1","pending",1,null,null,null]]`)
	})
}

// TestClaimRace: of 16 concurrent claims of one key, exactly one gets a row.
func TestClaimRace(t *testing.T) {
	d1test.ForEach(t, func(t *testing.T, b *d1test.Backend) {
		c := b.NewClientSchema(t)
		const n = 16
		var (
			wg   sync.WaitGroup
			mu   sync.Mutex
			wins []int
		)
		for i := range n {
			wg.Go(func() {
				res, err := c.Exec(t.Context(), []d1client.Statement{claim("p", "race", fmt.Sprint("fp", i), 1000)})
				if err != nil {
					t.Errorf("claim %d: %v", i, err)
					return
				}
				if len(res[0].Rows) == 1 {
					mu.Lock()
					wins = append(wins, i)
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		if len(wins) != 1 {
			t.Fatalf("%d claims won (%v), want exactly 1", len(wins), wins)
		}
		res := exec(t, c, lookup("p", "race"))[0]
		wantTable(t, &res,
			`["fingerprint","status","generation","response_status","response_body","response_headers"]`,
			fmt.Sprintf(`[["fp%d","pending",1,null,null,null]]`, wins[0]))
	})
}

// TestLookup: the lookup SELECT returns the stored row exactly, and no row
// (with its six column names) for an unknown key.
func TestLookup(t *testing.T) {
	d1test.ForEach(t, func(t *testing.T, b *d1test.Backend) {
		c := b.NewClientSchema(t)
		exec(t, c, claim("p1", "k1", "fp1", 1000))
		res := exec(t, c, lookup("p1", "k1"), lookup("p1", "missing"), lookup("p2", "k1"))
		const cols = `["fingerprint","status","generation","response_status","response_body","response_headers"]`
		wantTable(t, &res[0], cols, `[["fp1","pending",1,null,null,null]]`)
		wantTable(t, &res[1], cols, `[]`)
		wantTable(t, &res[2], cols, `[]`)
	})
}

// TestTakeover: the fenced takeover bumps the generation of a stale pending
// row and returns it; a fresh row, a just-taken-over row and a completed row
// give no row and stay unchanged.
func TestTakeover(t *testing.T) {
	d1test.ForEach(t, func(t *testing.T, b *d1test.Backend) {
		c := b.NewClientSchema(t)
		const t0 = 100_000
		exec(t, c, claim("p", "k", "fp", t0))

		// Fresh: updated_at (t0) is not older than now - TTL.
		fresh := exec(t, c, takeover("p", "k", t0+pendingTTL))[0]
		wantTable(t, &fresh, `["generation"]`, `[]`)
		if fresh.Meta.Changes != 0 {
			t.Errorf("fresh takeover: meta.changes = %d, want 0", fresh.Meta.Changes)
		}

		// Stale: strictly older than now - TTL.
		stale := exec(t, c, takeover("p", "k", t0+pendingTTL+1))[0]
		wantTable(t, &stale, `["generation"]`, `[[2]]`)
		if stale.Meta.Changes != 1 {
			t.Errorf("stale takeover: meta.changes = %d, want 1", stale.Meta.Changes)
		}

		// The takeover refreshed updated_at, so an immediate second one fails.
		again := exec(t, c, takeover("p", "k", t0+pendingTTL+2))[0]
		wantTable(t, &again, `["generation"]`, `[]`)

		// Much later it is stale again: generation 3.
		later := exec(t, c, takeover("p", "k", t0+3*pendingTTL))[0]
		wantTable(t, &later, `["generation"]`, `[[3]]`)

		row := query(t, c, "SELECT generation, updated_at, created_at, status FROM idempotency_keys WHERE principal = ? AND key = ?", "p", "k")
		wantTable(t, row, `["generation","updated_at","created_at","status"]`,
			fmt.Sprintf(`[[3,%d,%d,"pending"]]`, t0+3*pendingTTL, t0))

		// A completed row is never taken over, however old.
		exec(t, c, complete("p", "k", 3, 200, "ok", "{}", t0+3*pendingTTL))
		done := exec(t, c, takeover("p", "k", t0+100*pendingTTL))[0]
		wantTable(t, &done, `["generation"]`, `[]`)

		// An unknown key: no row.
		none := exec(t, c, takeover("p", "nope", t0+100*pendingTTL))[0]
		wantTable(t, &none, `["generation"]`, `[]`)
	})
}

// TestFencedCompletion: only the current generation completes the row; a
// stale owner's completion returns no row and changes nothing, and a
// completed row cannot be completed again.
func TestFencedCompletion(t *testing.T) {
	d1test.ForEach(t, func(t *testing.T, b *d1test.Backend) {
		c := b.NewClientSchema(t)
		const t0 = 100_000
		// Worker A claims (generation 1); B takes over (generation 2).
		exec(t, c, claim("p", "k", "fp", t0))
		tk := exec(t, c, takeover("p", "k", t0+pendingTTL+1))[0]
		wantTable(t, &tk, `["generation"]`, `[[2]]`)

		// A's completion is fenced out.
		a := exec(t, c, complete("p", "k", 1, 201, `{"by":"A"}`, `{"content-type":"application/json"}`, t0+pendingTTL+5))[0]
		wantTable(t, &a, `["key"]`, `[]`)
		if a.Meta.Changes != 0 {
			t.Errorf("fenced completion: meta.changes = %d, want 0", a.Meta.Changes)
		}
		still := exec(t, c, lookup("p", "k"))[0]
		wantTable(t, &still,
			`["fingerprint","status","generation","response_status","response_body","response_headers"]`,
			`[["fp","pending",2,null,null,null]]`)

		// B's completion succeeds.
		bres := exec(t, c, complete("p", "k", 2, 201, `{"by":"B"}`, `{"content-type":"application/json","location":"/v1/orders/7"}`, t0+pendingTTL+9))[0]
		wantTable(t, &bres, `["key"]`, `[["k"]]`)
		if bres.Meta.Changes != 1 {
			t.Errorf("completion: meta.changes = %d, want 1", bres.Meta.Changes)
		}
		done := exec(t, c, lookup("p", "k"))[0]
		wantTable(t, &done,
			`["fingerprint","status","generation","response_status","response_body","response_headers"]`,
			`[["fp","completed",2,201,"{\"by\":\"B\"}","{\"content-type\":\"application/json\",\"location\":\"/v1/orders/7\"}"]]`)

		// Completing again (even with the right generation) matches nothing.
		again := exec(t, c, complete("p", "k", 2, 500, "late", "{}", t0+pendingTTL+20))[0]
		wantTable(t, &again, `["key"]`, `[]`)

		// A NULL body (the oversized-body sentinel) and an empty body store
		// as NULL and "" respectively.
		exec(t, c, claim("p", "big", "fp", t0), claim("p", "empty", "fp", t0))
		exec(t, c,
			d1client.Statement{SQL: sqlComplete, Params: []any{500, nil, "{}", t0 + 1, "p", "big", 1}},
			complete("p", "empty", 1, 204, "", "{}", t0+1))
		res := query(t, c, "SELECT key, response_status, response_body, typeof(response_body) FROM idempotency_keys WHERE key IN ('big', 'empty') ORDER BY key")
		wantTable(t, res, `["key","response_status","response_body","typeof(response_body)"]`,
			`[["big",500,null,"null"],["empty",204,"","text"]]`)
	})
}

// TestSweep: the rowid-subquery DELETE removes exactly LIMIT rows, only rows
// strictly older than the cutoff, and (through the updated_at index, in
// ascending order on both backends) the oldest first.
func TestSweep(t *testing.T) {
	d1test.ForEach(t, func(t *testing.T, b *d1test.Backend) {
		c := b.NewClientSchema(t)
		// Insertion order differs from age order on purpose.
		ages := map[string]int64{"k1": 3000, "k2": 1000, "k3": 600, "k4": 300, "k5": 500, "k6": 400, "k7": 999}
		var stmts []d1client.Statement
		for _, k := range []string{"k1", "k2", "k3", "k4", "k5", "k6", "k7"} {
			stmts = append(stmts, claim("p", k, "fp", ages[k]))
		}
		exec(t, c, stmts...)

		remaining := func() string {
			res := query(t, c, "SELECT key FROM idempotency_keys ORDER BY updated_at")
			out := ""
			for _, r := range res.Rows {
				s, _ := r[0].Text()
				out += s + " "
			}
			return out
		}
		steps := []struct {
			cutoff, limit int64
			changes       int64
			left          string
		}{
			{1000, 2, 2, "k5 k3 k7 k2 k1 "}, // 300 and 400 go
			{1000, 2, 2, "k7 k2 k1 "},       // 500 and 600 go
			{1000, 2, 1, "k2 k1 "},          // only 999 is older than 1000
			{1000, 2, 0, "k2 k1 "},          // 1000 is not < 1000
			{1_000_000, 20, 2, ""},          // the rest
		}
		for i, s := range steps {
			res := exec(t, c, d1client.Statement{SQL: sqlSweep, Params: []any{s.cutoff, s.limit}})[0]
			if res.Meta.Changes != s.changes {
				t.Errorf("sweep %d (cutoff %d, limit %d): meta.changes = %d, want %d", i, s.cutoff, s.limit, res.Meta.Changes, s.changes)
			}
			wantTable(t, &res, `[]`, `[]`)
			if got := remaining(); got != s.left {
				t.Errorf("after sweep %d: rows %q, want %q", i, got, s.left)
			}
		}
	})
}
