// Package d1idem holds what every part of d1idem shares: the ledger schema,
// embedded from schema.sql so that the SDK, the CLI and the tests have one
// source of truth. docs/contract.md#1-schema states what the schema is held
// to.
//
// The packages beneath it carry the product:
//
//   - d1client: the D1 REST client (statements, batches, exact decoding, the
//     error model, retries, the request budget and group commit).
//   - d1local: a D1-compatible REST server on SQLite, for local development,
//     tests and fault injection.
//   - idem: the ledger state machine, fingerprinting and the net/http
//     middleware.
//   - schema: applies and verifies this schema on a live database, recorded
//     as a wrangler migration.
//   - cli: the d1idem admin command line (cmd/d1idem is its thin main).
//
// # API stability
//
// Schema, SchemaStatements, Table, UpdatedAtIndex and Version follow the
// module's semantic versioning. The schema itself (docs/contract.md#1-schema) is
// shared with Workers that run the spec's code, and changes only with it.
package d1idem

import (
	_ "embed"

	"github.com/d1idem/d1idem/internal/sqlite"
)

//go:embed schema.sql
var schemaSQL string

// Table is the name of the ledger table the schema creates.
const Table = "idempotency_keys"

// UpdatedAtIndex is the name of the index on updated_at that the pending
// TTL check and the sweep rely on.
const UpdatedAtIndex = "idx_idempotency_keys_updated_at"

// Schema returns the ledger schema exactly as schema.sql holds it: the
// CREATE TABLE and CREATE INDEX of docs/contract.md#1-schema, comments
// included.
func Schema() string { return schemaSQL }

// SchemaStatements returns the schema split into its statements, each without
// its trailing semicolon, ready to travel as separate entries of one D1 batch
// (D1 rejects parameters with multi-statement SQL, and batch entries keep the
// result count exact). Comments stay inside the statements, where SQLite
// ignores them.
func SchemaStatements() []string {
	var out []string
	for _, s := range sqlite.Split(schemaSQL) {
		out = append(out, s.SQL)
	}
	return out
}
