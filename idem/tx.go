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
var ErrTxClosed = errors.New("idem: Tx closed: the statements will not be committed")

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
func (l *Ledger) CompleteTx(ctx context.Context, r *Reservation, resp Response, stmts []d1client.Statement) (done Completion, err error) {
	defer l.completed(r, &done, &err)
	w := l.prepare(r, resp)
	h, err := l.homeOf(r)
	if err != nil {
		return w.done, fmt.Errorf("%w: %w", ErrTxNotCommitted, err)
	}
	batch := make([]d1client.Statement, 0, len(stmts)+2)
	batch = append(batch, l.sql.guard(r))
	batch = append(batch, stmts...)
	batch = append(batch, w.stmt)
	err = l.finish(ctx, h, r, batch, len(stmts), &w)
	if err == nil {
		return w.done, nil
	}
	if errors.Is(err, ErrReservationExpired) {
		// Nothing was sent; the row may not be ours any more.
		return w.done, fmt.Errorf("%w: %w", ErrTxNotCommitted, err)
	}
	// Nothing, or (if the failure was ambiguous) everything, committed.
	if st, lerr := l.completionState(ctx, h, r, &w); lerr == nil && st == rowOurs {
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
