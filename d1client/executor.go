package d1client

import "context"

// Executor runs statements on one D1 database as *Client.Exec does: one
// call, one transaction, one Result per statement. It honours the options it
// knows and ignores the others; its errors match this package's sentinels.
type Executor interface {
	Exec(ctx context.Context, stmts []Statement, opts ...ExecOption) ([]Result, error)
}

var _ Executor = (*Client)(nil)
