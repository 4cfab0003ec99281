package d1local

import (
	"encoding/json"
	"fmt"
	"testing"
)

// benchClaimSQL is shaped like a ledger claim: an INSERT ... ON CONFLICT ...
// RETURNING of about 600 bytes, over several lines.
const benchClaimSQL = `INSERT INTO idempotency_keys
  (principal, key, fingerprint, status, generation, lease_owner, lease_until, created_at, updated_at)
VALUES (?1, ?2, ?3, 'pending', 1, ?4, ?5, ?6, ?6)
ON CONFLICT (principal, key) DO UPDATE SET
  status = CASE WHEN idempotency_keys.status = 'failed' THEN 'pending' ELSE idempotency_keys.status END,
  generation = idempotency_keys.generation + (idempotency_keys.status = 'failed'),
  lease_owner = CASE WHEN idempotency_keys.lease_until < ?7 THEN excluded.lease_owner ELSE idempotency_keys.lease_owner END,
  updated_at = ?8
RETURNING key, fingerprint, status, generation, lease_owner, lease_until, "response"`

// benchBodies returns request bodies for BenchmarkDecodeBody: a batch of
// 256 claims with 8 parameters each, strings and integers, and a single
// claim.
func benchBodies(b *testing.B) map[string][]byte {
	type query struct {
		SQL    string `json:"sql"`
		Params []any  `json:"params"`
	}
	claim := func(i int) query {
		return query{SQL: benchClaimSQL, Params: []any{
			"tenant-42", fmt.Sprintf("order-%08d", i), fmt.Sprintf("sha256:%064x", i*7919),
			fmt.Sprintf("worker-%d", i%16), 1767225600000 + i, 1767225570000 + i, 1767225570000, 1767225570000 + i,
		}}
	}
	batch := make([]query, 256)
	for i := range batch {
		batch[i] = claim(i)
	}
	bodies := map[string][]byte{}
	for name, v := range map[string]any{"batch256": map[string]any{"batch": batch}, "single": claim(1)} {
		body, err := json.Marshal(v)
		if err != nil {
			b.Fatal(err)
		}
		bodies[name] = body
	}
	return bodies
}

// BenchmarkDecodeBody measures decoding a request body: "reference" with
// encoding/json and no cache of split SQL, as decodeJSON does, "fast" as
// decodeBody does for a server, with a warm cache, and "fast-nocache"
// without one.
func BenchmarkDecodeBody(b *testing.B) {
	bodies := benchBodies(b)
	for _, name := range []string{"batch256", "single"} {
		body := bodies[name]
		for _, mode := range []string{"reference", "fast", "fast-nocache"} {
			b.Run(name+"/"+mode, func(b *testing.B) {
				decode := func(body []byte) ([]parsedQuery, error) { return decodeJSON(body, nil) }
				switch mode {
				case "fast":
					cache := newSplitCache()
					decode = func(body []byte) ([]parsedQuery, error) { return decodeBody(body, cache) }
				case "fast-nocache":
					decode = func(body []byte) ([]parsedQuery, error) { return decodeBody(body, nil) }
				}
				if _, err := decode(body); err != nil { // warms the cache
					b.Fatal(err)
				}
				b.SetBytes(int64(len(body)))
				b.ReportAllocs()
				for b.Loop() {
					if _, err := decode(body); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
