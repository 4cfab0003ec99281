package idem

import (
	"context"
	"errors"
	"fmt"

	"github.com/d1idem/d1idem/d1client"
)

// ErrTxNotCommitted wraps the cause when a transactional completion's batch
// failed for a reason other than the fence: nothing of it was committed
// (unless the failure was ambiguous and the row could not be read after
// it), and the reservation was released so the client may retry.
var ErrTxNotCommitted = errors.New("idem: the mutation was not committed")

// CompleteTx is Complete with the caller's statements committed in the same
// batch: [guard, stmts..., fenced completion (, sweep)]. When the guard finds
// the reservation fenced out, nothing is committed and Stored is false. When
// the batch fails otherwise, the reservation is released and the error wraps
// ErrTxNotCommitted and the cause. The statements must not fail by design
// (use INSERT ... ON CONFLICT for natural keys): a failing batch commits
// nothing. idemhttp commits what its handler queued on an idemhttp.Tx so.
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
