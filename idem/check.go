package idem

import (
	"context"
	"errors"
	"fmt"

	"github.com/d1idem/d1idem"
	"github.com/d1idem/d1idem/d1client"
)

// ErrSchemaDrift: the ledger table lacks something of the schema (its index).
var ErrSchemaDrift = errors.New("idem: the ledger table does not match the schema")

// checkSQL reads no row, but names every column of the schema (a missing
// one is an SQL error), and says whether the updated_at index exists.
var checkSQL = []string{
	`SELECT principal, key, fingerprint, status, generation, response_status, response_body, response_headers, created_at, updated_at
FROM ` + d1idem.Table + ` LIMIT 0`,
	`SELECT count(*) FROM sqlite_master WHERE type = 'index' AND tbl_name = '` + d1idem.Table + `' AND name = '` + d1idem.UpdatedAtIndex + `'`,
}

// Check verifies, at start-up, that the ledger can serve: that D1 accepts
// the token, knows the database and holds the ledger table with the
// schema's columns and index (one D1 call per database), and for a sharded
// ledger that one ring is recorded and every database is the home it is
// given as. Its error names the fix (see Remedy): the token's permission,
// the database ID, `d1idem schema apply` or schema.Apply. Call it before
// serving, so that a misconfiguration stops the deploy instead of failing
// every request.
func (l *Ledger) Check(ctx context.Context) error {
	homes := []*home{l.single}
	if l.shards != nil {
		homes = homes[:0]
		for _, id := range l.shards.ids {
			homes = append(homes, l.shards.homes[id])
		}
	}
	for _, h := range homes {
		if err := l.checkHome(ctx, h); err != nil {
			return err
		}
	}
	if l.shards != nil {
		if _, err := l.RefreshRing(ctx); err != nil {
			return withFix(fmt.Errorf("idem: check: %w", err))
		}
	}
	return nil
}

// checkHome runs the check's statements at h.
func (l *Ledger) checkHome(ctx context.Context, h *home) error {
	where := "idem: check"
	if h.id != "" {
		where += fmt.Sprintf(" of database %q", h.id)
	}
	stmts := make([]d1client.Statement, len(checkSQL))
	for i, sql := range checkSQL {
		stmts[i] = d1client.Statement{SQL: sql}
	}
	res, err := h.db.Exec(ctx, stmts, opCheck)
	if err != nil {
		return withFix(fmt.Errorf("%s: %w", where, err))
	}
	var n int64
	if len(res[1].Rows) != 1 || res[1].Rows[0].Scan(&n) != nil || n == 0 {
		return withFix(fmt.Errorf("%s: %w: the index %s on updated_at is missing", where, ErrSchemaDrift, d1idem.UpdatedAtIndex))
	}
	return nil
}

// withFix appends Remedy's fix, if it knows one, to err's message.
func withFix(err error) error {
	if fix := Remedy(err); fix != "" {
		return &fixedError{err: err, fix: fix}
	}
	return err
}

// fixedError is an error with the fix an operator should apply.
type fixedError struct {
	err error
	fix string
}

func (e *fixedError) Error() string { return e.err.Error() + "; fix: " + e.fix }
func (e *fixedError) Unwrap() error { return e.err }
