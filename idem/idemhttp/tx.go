package idemhttp

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/d1idem/d1idem/d1client"
)

// Tx collects a handler's own D1 statements (the business write, such as the
// order INSERT) so that they commit in the same D1 batch, and so the same
// transaction, as the fenced completion (idem.Ledger.CompleteTx). A guard
// statement goes first: when the reservation's generation is no longer the
// pending owner (a takeover happened), it aborts the whole batch, and the
// business write never lands. That makes a mutation kept in D1 happen
// exactly once per key, even across takeovers.
//
// The middleware puts a Tx in every executing handler's context; get it with
// TxFromContext. Statements added to it must not fail by design (use
// INSERT ... ON CONFLICT for natural keys): a batch that fails commits
// nothing, and the request is answered with an error instead of the
// handler's response.
//
// The handler's response is sent only after the batch commits, so a client
// never receives a success for writes that did not commit. While statements
// are queued, a flush is held (the response goes out after the commit) and
// a hijack is refused. Once the response is streamed (a flush with nothing
// queued) or the connection hijacked, or once the handler has returned, Add
// fails with ErrTxClosed and commits nothing; the middleware then logs the
// refusal at ERROR and, for a streamed response, aborts it (the client
// sees a broken response, never a complete one). Queue statements before
// the first flush.
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

// Add queues statements to commit with the completion, in order. It fails
// with ErrTxClosed, queuing nothing, once the response has been streamed or
// hijacked or the handler has returned.
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

func withTx(ctx context.Context, tx *Tx) context.Context { return context.WithValue(ctx, txKey{}, tx) }

// TxFromContext returns the transactional completion of the request being
// executed, when the handler runs under the middleware.
func TxFromContext(ctx context.Context) (*Tx, bool) {
	tx, ok := ctx.Value(txKey{}).(*Tx)
	return tx, ok
}
