package idemhttp

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/d1idem/d1idem/d1client"
)

// Tx collects a handler's own D1 statements (the business write, such as the
// order INSERT) so that they commit in the same D1 batch as the fenced
// completion (idem.Ledger.CompleteTx), behind a guard that aborts the batch
// when a takeover superseded the reservation: a mutation kept in D1 happens
// exactly once per key. Get it with TxFromContext. Statements must not fail
// by design (use INSERT ... ON CONFLICT): a failed batch commits nothing,
// and the request is answered with an error instead of the handler's
// response.
//
// The response is sent only after the batch commits: while statements are
// queued, a flush is held and a hijack refused. Queue statements before the
// first flush: once the response has streamed or the connection was
// hijacked, or the handler has returned, Add fails with ErrTxClosed; the
// middleware logs that at ERROR and aborts a streamed response.
type Tx struct {
	mu      sync.Mutex
	stmts   []d1client.Statement
	closed  error // why Add fails; nil while open
	refused int   // Adds refused after the Tx closed
}

// ErrTxClosed is returned by Tx.Add once its statements can no longer
// commit with the response.
var ErrTxClosed = errors.New("idemhttp: Tx closed: the statements will not be committed")

var (
	errTxStreamed = fmt.Errorf("%w: the response was already streamed (flushed before any statement was queued)", ErrTxClosed)
	errTxHijacked = fmt.Errorf("%w: the connection was hijacked", ErrTxClosed)
	errTxDone     = fmt.Errorf("%w: the handler has returned", ErrTxClosed)
)

// Add queues statements to commit with the completion, in order, or fails
// with ErrTxClosed, queuing nothing.
func (t *Tx) Add(stmts ...d1client.Statement) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed != nil {
		t.refused++
		return t.closed
	}
	t.stmts = append(t.stmts, stmts...)
	return nil
}

// closeLocked closes the Tx for why, unless it is closed already. t.mu is
// held.
func (t *Tx) closeLocked(why error) {
	if t.closed == nil {
		t.closed = why
	}
}

// finish closes the Tx when the handler returns and hands over its
// statements and the number of Adds it refused.
func (t *Tx) finish() ([]d1client.Statement, int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closeLocked(errTxDone)
	return t.stmts, t.refused
}

type txKey struct{}

// TxFromContext returns the Tx of the request a handler executes under the
// middleware.
func TxFromContext(ctx context.Context) (*Tx, bool) {
	tx, ok := ctx.Value(txKey{}).(*Tx)
	return tx, ok
}
