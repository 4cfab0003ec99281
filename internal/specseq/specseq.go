// Package specseq runs the request path of the spec, Idempotency-Key Ledger
// on D1, statement by statement, as its handleIdempotentMutation does: the
// claim, then the lookup, then the takeover, each its own D1 call, and the
// completion. It is the reference that tests prove the ledger equivalent to
// and that benchmarks compare the ledger with (see
// docs/contract.md#4-claim). It is not part of the SDK.
package specseq

import (
	"context"
	"fmt"
	"time"

	"github.com/d1idem/d1idem/d1client"
)

// The spec's statements, verbatim.
const (
	Claim = `INSERT INTO idempotency_keys (principal, key, fingerprint, status, generation, created_at, updated_at)
   VALUES (?, ?, ?, 'pending', 1, ?, ?)
   ON CONFLICT (principal, key) DO NOTHING
   RETURNING key, generation`
	Lookup = `SELECT fingerprint, status, generation, response_status, response_body, response_headers
     FROM idempotency_keys WHERE principal = ? AND key = ?`
	Takeover = `UPDATE idempotency_keys
   SET generation = generation + 1, updated_at = ?
   WHERE principal = ? AND key = ? AND status = 'pending' AND updated_at < ?
   RETURNING generation`
	Complete = `UPDATE idempotency_keys
     SET status = 'completed', response_status = ?, response_body = ?, response_headers = ?, updated_at = ?
     WHERE principal = ? AND key = ? AND generation = ? AND status = 'pending'
     RETURNING key`
	Sweep = `DELETE FROM idempotency_keys
       WHERE rowid IN (
         SELECT rowid FROM idempotency_keys
         WHERE updated_at < ?
         LIMIT ?
       )`
)

// Outcome is the spec's decision, spelled so that two runs compare as
// strings: "execute gen=N takeover=B", "replay status=S body=\"...\"",
// "reused", "in_progress" or "retry". Generation is set for execute.
type Outcome struct {
	Text       string
	Generation int64
}

// Begin runs the spec's claim, lookup and takeover in sequence, one D1 call
// each, with now as the spec's Date.now().
func Begin(ctx context.Context, db *d1client.Client, principal, key, fp string, now time.Time, ttl time.Duration) (Outcome, error) {
	ms := now.UnixMilli()
	claim, err := db.Query(ctx, Claim, principal, key, fp, ms, ms)
	if err != nil {
		return Outcome{}, err
	}
	if len(claim.Rows) == 1 {
		gen, _ := claim.Rows[0][1].Int64()
		return Outcome{fmt.Sprintf("execute gen=%d takeover=false", gen), gen}, nil
	}
	look, err := db.Query(ctx, Lookup, principal, key)
	if err != nil {
		return Outcome{}, err
	}
	if len(look.Rows) == 0 {
		return Outcome{Text: "retry"}, nil
	}
	row := look.Rows[0]
	if fpv, _ := row[0].Text(); fpv != fp {
		return Outcome{Text: "reused"}, nil
	}
	if st, _ := row[1].Text(); st == "completed" {
		status := int64(500)
		if !row[3].IsNull() {
			status, _ = row[3].Int64()
		}
		body, _ := row[4].Text()
		return Outcome{Text: fmt.Sprintf("replay status=%d body=%q", status, body)}, nil
	}
	take, err := db.Query(ctx, Takeover, ms, principal, key, ms-ttl.Milliseconds())
	if err != nil {
		return Outcome{}, err
	}
	if len(take.Rows) == 0 {
		return Outcome{Text: "in_progress"}, nil
	}
	gen, _ := take.Rows[0][0].Int64()
	return Outcome{fmt.Sprintf("execute gen=%d takeover=true", gen), gen}, nil
}

// CompleteRow runs the spec's fenced completion and reports whether it
// stored the response.
func CompleteRow(ctx context.Context, db *d1client.Client, principal, key string, generation int64, status int, body, headersJSON string, now time.Time) (bool, error) {
	res, err := db.Query(ctx, Complete, status, body, headersJSON, now.UnixMilli(), principal, key, generation)
	if err != nil {
		return false, err
	}
	return len(res.Rows) == 1, nil
}
