package idem

import (
	"errors"
	"log/slog"
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
	{ErrSchemaDrift, "", "the ledger table lacks part of the schema: run `d1idem schema apply` (or schema.Apply) on this database"},
	{d1client.ErrAuth, "", "D1 refused the API token: give it the Account > D1 > Edit permission on this account, and check the account ID"},
	{d1client.ErrNoDatabase, "", "the account has no D1 database with this ID: check the database ID (`wrangler d1 list` shows them) and the account ID"},
}

// Remedy returns what an operator should do about a known ledger error (a
// missing table, disagreeing shards, refused credentials, an unknown
// database), or "".
func Remedy(err error) string {
	for _, r := range remedies {
		if errors.Is(err, r.err) && strings.Contains(err.Error(), r.text) {
			return r.do
		}
	}
	return ""
}

// Permanent reports whether err is a refusal that no retry can cure until
// an operator fixes the configuration: D1 refused the token or knows no such
// database, the ledger table or part of its schema is missing, or d1client
// refused to send the request as invalid. Answer it with a server error and
// no Retry-After. A sharded ledger's ring errors are not permanent: another
// replica, or the same one after a deploy, may serve the retry.
func Permanent(err error) bool {
	switch {
	case errors.Is(err, d1client.ErrAuth), errors.Is(err, d1client.ErrNoDatabase),
		errors.Is(err, d1client.ErrInvalid), errors.Is(err, ErrSchemaDrift):
		return true
	}
	return errors.Is(err, d1client.ErrSQL) && Remedy(err) != ""
}

// ErrorAttrs are the log attributes of a ledger error: error, and fix where
// Remedy knows one.
func ErrorAttrs(err error) []slog.Attr {
	attrs := []slog.Attr{slog.String("error", err.Error())}
	if fix := Remedy(err); fix != "" {
		attrs = append(attrs, slog.String("fix", fix))
	}
	return attrs
}
