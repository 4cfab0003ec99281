package d1client

import "context"

// Executor runs statements on one D1 database: each Exec is one call, one
// transaction, and returns one Result per statement. *Client is the
// Executor of D1's REST API; the ledger (package idem) takes any Executor,
// so a test fake or another transport can stand in for it. An Executor
// honours the options it knows and ignores the others; its errors should
// match this package's sentinels (ErrSQL for a statement SQLite refused,
// nothing of the call committed).
type Executor interface {
	Exec(ctx context.Context, stmts []Statement, opts ...ExecOption) ([]Result, error)
}

var _ Executor = (*Client)(nil)
