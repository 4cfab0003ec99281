package idem

import (
	"errors"
	"strings"

	"github.com/d1idem/d1idem"
	"github.com/d1idem/d1idem/d1client"
)

// remedies maps errors (SQL ones by a text they contain) to what an operator should do.
var remedies = []struct {
	err  error
	text string
	do   string
}{
	{d1client.ErrSQL, "no such table: " + d1idem.Table, "the ledger table is missing: run `d1idem schema apply` (or apply d1idem.Schema) on this database"},
	{d1client.ErrSQL, "no such column", "the ledger table does not match the schema: run `d1idem schema verify`"},
	{ErrNoRing, "", "no ring is recorded in the sharded ledger's databases: record one with Admin.InitRing (docs/sharding.md)"},
	{ErrRingConflict, "", "the sharded ledger's databases hold conflicting rings; it serves nothing until they agree: see 'd1idem ring status' and docs/sharding.md"},
	{ErrHomeLost, "", "a database of the sharded ledger's ring lost its identity: it was replaced or wiped, with the keys it held, and its principals are refused; restore it to a moment before the loss (D1 Time Travel), or give its Home its own database again; never record the ring in it again, which would execute its keys a second time (docs/sharding.md#a-database-replaced-or-wiped)"},
	{ErrHomeMismatch, "", "a database is given to this replica under another home ID than it recorded: give every replica the same Home IDs for the same databases (docs/sharding.md)"},
	{ErrUnknownHome, "", "the ring routes this principal to a database this replica has no Home for: give every replica every database of the ring (docs/sharding.md)"},
	{d1client.ErrAuth, "", "D1 refused the request: check the API token (it needs D1 edit permission), the account ID and the database ID"},
}

// Remedy returns what an operator should do about a known ledger error (a
// missing table, disagreeing shards, refused credentials), or "".
func Remedy(err error) string {
	for _, r := range remedies {
		if errors.Is(err, r.err) && strings.Contains(err.Error(), r.text) {
			return r.do
		}
	}
	return ""
}
