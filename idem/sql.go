package idem

import (
	"fmt"
	"strings"
	"time"

	"github.com/d1idem/d1idem/d1client"
)

// ledgerSQL holds the ledger's statements, the spec's (docs/contract.md)
// except that with D1's clock the time the spec binds is computed in SQL.
type ledgerSQL struct {
	injected bool

	claim, lookup, completeSQL, completeLookup, sweepSQL, releaseSQL, renewSQL, guardSQL,
	ringGuardSQL, ringReadSQL, movedDeleteSQL string
}

// d1Now is D1's clock in milliseconds since the epoch.
const d1Now = "CAST(unixepoch('subsec') * 1000 AS INTEGER)"

// buildSQL builds the statements for D1's clock or an injected one.
func buildSQL(injectedClock bool) ledgerSQL {
	now := func(param string) string {
		if injectedClock {
			return param
		}
		return d1Now
	}
	return ledgerSQL{
		injected: injectedClock,
		// The claim and takeover. No statement writes the empty principal's rows.
		claim: `INSERT INTO idempotency_keys (principal, key, fingerprint, status, generation, created_at, updated_at)
SELECT ?1, ?2, ?3, 'pending', 1, ` + now("?5") + `, ` + now("?5") + ` WHERE ?1 <> ''
ON CONFLICT (principal, key) DO UPDATE SET generation = generation + 1, updated_at = excluded.updated_at
WHERE status = 'pending' AND fingerprint = excluded.fingerprint AND updated_at < excluded.updated_at - ?4
RETURNING generation`,
		// The lookup, with the row's times and the clock's.
		lookup: `SELECT fingerprint, status, generation, response_status, response_body, response_headers, created_at, updated_at, ` + now("?3") + `
FROM idempotency_keys WHERE principal = ?1 AND key = ?2`,
		// The fenced completion.
		completeSQL: `UPDATE idempotency_keys
SET status = 'completed', response_status = ?1, response_body = ?2, response_headers = ?3, updated_at = ` + now("?7") + `
WHERE principal = ?4 AND key = ?5 AND generation = ?6 AND status = 'pending' AND principal <> ''
RETURNING key`,
		// The read that tells a lost completion answer from a fence.
		completeLookup: `SELECT status, generation, response_status, response_body, response_headers
FROM idempotency_keys WHERE principal = ?1 AND key = ?2`,
		// The bounded sweep.
		sweepSQL: `DELETE FROM idempotency_keys
WHERE rowid IN (
  SELECT rowid FROM idempotency_keys
  WHERE updated_at < ` + now("?3") + ` - ?1 AND principal <> ''
  LIMIT ?2
)`,
		// The release: a generation on, pending and stale. ?5: any pending
		// row, else only a stale one; ?7: a completed one too.
		releaseSQL: `UPDATE idempotency_keys
SET generation = generation + 1, status = 'pending', response_status = NULL, response_body = NULL, response_headers = NULL,
    updated_at = ` + now("?8") + ` - ?4
WHERE principal = ?1 AND key = ?2 AND generation = ?3 AND principal <> ''
  AND ((status = 'pending' AND (?5 OR updated_at < ` + now("?8") + ` - ?6)) OR (status = 'completed' AND ?7))
RETURNING generation`,
		// A fenced lease renewal.
		renewSQL: `UPDATE idempotency_keys SET updated_at = ` + now("?4") + `
WHERE principal = ?1 AND key = ?2 AND generation = ?3 AND status = 'pending' AND principal <> ''
RETURNING generation`,
		// CompleteTx's fence guard: NOT NULL aborts the batch unless r is the owner.
		guardSQL: `INSERT INTO idempotency_keys (principal, key, fingerprint, created_at, updated_at)
SELECT ?1, ?2, NULL, 0, 0
WHERE NOT EXISTS (
  SELECT 1 FROM idempotency_keys
  WHERE principal = ?1 AND key = ?2 AND generation = ?3 AND status = 'pending'
)`,
		// The ring guard aborts the batch unless this database is home ?3 and
		// holds no ring newer than epoch ?1 nor of it but digest ?2.
		ringGuardSQL: `INSERT INTO idempotency_keys (principal, key, fingerprint, created_at, updated_at)
SELECT NULL, '` + ringKey + `', '` + ringKey + `', 0, 0
WHERE NOT EXISTS (
  SELECT 1 FROM idempotency_keys WHERE principal = '' AND key = '` + homeKey + `' AND fingerprint = ?3
) OR EXISTS (
  SELECT 1 FROM idempotency_keys WHERE principal = '' AND key = '` + ringKey + `'
  AND (generation > ?1 OR (generation = ?1 AND fingerprint <> ?2))
)`,
		// The ring and the identity this database has recorded.
		ringReadSQL: `SELECT key, generation, fingerprint, response_body FROM idempotency_keys
WHERE principal = '' AND key IN ('` + ringKey + `', '` + homeKey + `')`,
		// A moved principal's stale pending row, deleted at its old home.
		movedDeleteSQL: `DELETE FROM idempotency_keys
WHERE principal = ?1 AND key = ?2 AND generation = ?3 AND status = 'pending' AND fingerprint = ?4
  AND updated_at < ` + now("?6") + ` - ?5 AND principal <> ''
RETURNING generation`,
	}
}

// timed is a statement with the injected time, if any, as its last parameter.
func (s ledgerSQL) timed(sql string, now time.Time, params ...any) d1client.Statement {
	if s.injected {
		params = append(params, now.UnixMilli())
	}
	return d1client.Statement{SQL: sql, Params: params}
}

func (s ledgerSQL) begin(principal, key, fingerprint string, ttl time.Duration, now time.Time) []d1client.Statement {
	return []d1client.Statement{s.timed(s.claim, now, principal, key, fingerprint, ttl.Milliseconds()), s.lookupRow(principal, key, now)}
}

func (s ledgerSQL) lookupRow(principal, key string, now time.Time) d1client.Statement {
	return s.timed(s.lookup, now, principal, key)
}

func (s ledgerSQL) complete(r *Reservation, status int, body *string, headersJSON string, now time.Time) d1client.Statement {
	var bodyParam any
	if body != nil {
		bodyParam = *body
	}
	return s.timed(s.completeSQL, now, status, bodyParam, headersJSON, r.Principal, r.Key, r.Generation)
}

func (s ledgerSQL) renew(r *Reservation, now time.Time) d1client.Statement {
	return s.timed(s.renewSQL, now, r.Principal, r.Key, r.Generation)
}

func (s ledgerSQL) sweep(retention time.Duration, batch int, now time.Time) d1client.Statement {
	return s.timed(s.sweepSQL, now, retention.Milliseconds(), batch)
}

// releaseMode says which rows a release may touch.
type releaseMode int

const (
	releaseOwner releaseMode = iota // a pending row, stale or not (an owner's own, or ReleaseOptions.PendingOnly)
	releaseStuck                    // a pending row older than the TTL
	releaseForce                    // any pending row, or a completed one
)

// release backdates updated_at 1ms past the TTL: stale, far from swept.
func (s ledgerSQL) release(principal, key string, generation int64, ttl time.Duration, mode releaseMode, now time.Time) d1client.Statement {
	backdate := (ttl + time.Millisecond).Milliseconds()
	return s.timed(s.releaseSQL, now, principal, key, generation, backdate, mode != releaseStuck, ttl.Milliseconds(), mode == releaseForce)
}

// ringGuard guards a claim at the home with this ID, by ring r.
func (s ledgerSQL) ringGuard(r expect, id string) d1client.Statement {
	return d1client.Statement{SQL: s.ringGuardSQL, Params: []any{r.Epoch(), r.digest, id}}
}

func (s ledgerSQL) movedDelete(principal, key string, generation int64, fingerprint string, ttl time.Duration, now time.Time) d1client.Statement {
	return s.timed(s.movedDeleteSQL, now, principal, key, generation, fingerprint, ttl.Milliseconds())
}

// query builds one statement of the administrative API.
type query struct {
	sql      strings.Builder
	params   []any
	injected bool
	now      time.Time
}

func (s ledgerSQL) query(now time.Time) *query { return &query{injected: s.injected, now: now} }

// add appends SQL text and the parameters of its "?"s.
func (q *query) add(sql string, params ...any) *query {
	if n := strings.Count(sql, "?"); n != len(params) {
		panic(fmt.Sprintf("idem: %d parameters for %d placeholders in %q", len(params), n, sql))
	}
	q.sql.WriteString(sql)
	q.params = append(q.params, params...)
	return q
}

// clock appends the ledger's clock: D1's, or the injected time.
func (q *query) clock() *query {
	if q.injected {
		return q.add("?", q.now.UnixMilli())
	}
	return q.add(d1Now)
}

func (q *query) statement() d1client.Statement {
	return d1client.Statement{SQL: q.sql.String(), Params: q.params}
}
