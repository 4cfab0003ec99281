package idem

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/d1idem/d1idem/d1client"
)

// Tx collects a handler's own D1 statements (the business write, such as the
// order INSERT) so that they commit in the same D1 batch, and so the same
// transaction, as the fenced completion. A guard statement goes first: when
// the reservation's generation is no longer the pending owner (a takeover
// happened), it aborts the whole batch, and the business write never lands.
// That makes a mutation kept in D1 happen exactly once per key, even across
// takeovers.
//
// The middleware puts a Tx in every executing handler's context; get it with
// TxFromContext. Statements added to it must not fail by design (use
// INSERT ... ON CONFLICT for natural keys): a batch that fails commits
// nothing, and the request is answered with an error instead of the
// handler's response.
type Tx struct {
	mu    sync.Mutex
	stmts []d1client.Statement
}

// Add queues statements to commit with the completion, in order.
func (t *Tx) Add(stmts ...d1client.Statement) {
	t.mu.Lock()
	t.stmts = append(t.stmts, stmts...)
	t.mu.Unlock()
}

func (t *Tx) statements() []d1client.Statement {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]d1client.Statement(nil), t.stmts...)
}

type txKey struct{}

func withTx(ctx context.Context, tx *Tx) context.Context { return context.WithValue(ctx, txKey{}, tx) }

// TxFromContext returns the transactional completion of the request being
// executed, when the handler runs under the middleware.
func TxFromContext(ctx context.Context) (*Tx, bool) {
	tx, ok := ctx.Value(txKey{}).(*Tx)
	return tx, ok
}

// ErrTxNotCommitted wraps the cause when a transactional completion's batch
// failed for a reason other than the fence: nothing of it was committed (or,
// if Ambiguous, it may have been; the reservation was then left to decide).
// The reservation has been released, so the client may retry.
var ErrTxNotCommitted = errors.New("idem: the mutation was not committed")

// CompleteTx is Complete with the caller's statements committed in the same
// batch: [guard, stmts..., fenced completion, lookup (, sweep)]. When the
// guard finds the reservation fenced out, nothing is committed and Stored is
// false: the business write did not happen. When the batch fails otherwise,
// the reservation is released (fenced) and the error wraps
// ErrTxNotCommitted and the cause.
func (l *Ledger) CompleteTx(ctx context.Context, r *Reservation, resp Response, stmts []d1client.Statement) (Completion, error) {
	w := l.prepare(r, resp)
	batch := make([]d1client.Statement, 0, len(stmts)+2)
	batch = append(batch, l.sql.guard(r))
	batch = append(batch, stmts...)
	batch = append(batch, w.stmt)
	err := l.finish(ctx, r, batch, len(stmts), &w)
	if err == nil {
		return w.done, nil
	}
	// Nothing, or (if the failure was ambiguous) everything, committed.
	if landed, lerr := l.holdsCompletion(ctx, r, &w); lerr == nil && landed {
		w.done.Stored = true
		return w.done, nil
	}
	// A fenced release deletes our pending row only if the batch did not
	// land, so the client may retry at once.
	if _, rerr := l.Release(ctx, r); rerr != nil {
		err = fmt.Errorf("%w (and the release failed: %v)", err, rerr)
	}
	return w.done, fmt.Errorf("%w: %w", ErrTxNotCommitted, err)
}
