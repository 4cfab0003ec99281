package idem

import (
	"errors"
	"strings"

	"github.com/d1idem/d1idem"
	"github.com/d1idem/d1idem/d1client"
)

// Remedy returns what an operator should do about an error of the ledger,
// when it is known: a missing table, a table that does not match the
// schema, a sharded ledger whose databases or replicas disagree, refused
// credentials. It returns "" otherwise. A transport logs it beside the
// error when it refuses a request for a ledger failure.
func Remedy(err error) string {
	if err == nil {
		return ""
	}
	msg := err.Error()
	switch {
	case errors.Is(err, d1client.ErrSQL) && strings.Contains(msg, "no such table: "+d1idem.Table):
		return "the ledger table is missing: run `d1idem schema apply` (or apply d1idem.Schema) on this database"
	case errors.Is(err, d1client.ErrSQL) && strings.Contains(msg, "no such column"):
		return "the ledger table does not match the schema: run `d1idem schema verify`"
	case errors.Is(err, ErrNoRing):
		return "no ring is recorded in the sharded ledger's databases: record one with Admin.InitRing (docs/sharding.md)"
	case errors.Is(err, ErrRingConflict):
		return "the sharded ledger's databases hold conflicting rings; it serves nothing until they agree: see 'd1idem ring status' and docs/sharding.md"
	case errors.Is(err, ErrHomeMismatch):
		return "a database is given to this replica under another home ID than it recorded: give every replica the same Home IDs for the same databases (docs/sharding.md)"
	case errors.Is(err, ErrUnknownHome):
		return "the ring routes this principal to a database this replica has no Home for: give every replica every database of the ring (docs/sharding.md)"
	case errors.Is(err, d1client.ErrAuth):
		return "D1 refused the request: check the API token (it needs D1 edit permission), the account ID and the database ID"
	}
	return ""
}
