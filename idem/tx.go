package idem

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/d1idem/d1idem/d1client"
)

// ErrTxNotCommitted wraps why CompleteTx's batch failed other than by the fence.
var ErrTxNotCommitted = errors.New("idem: the mutation was not committed")

// CompleteTx is Complete with the caller's statements in the same batch behind a fence guard:
// fenced out, nothing is committed and Stored is false. The statements must not fail by design
// (use INSERT ... ON CONFLICT); if the batch fails, the reservation is released for a retry.
func (l *Ledger) CompleteTx(ctx context.Context, r *Reservation, resp Response, stmts []d1client.Statement) (done Completion, err error) {
	return l.completeTx(ctx, r, resp, stmts, l.cfg.ReplayableHeaders)
}

// completeTx is CompleteTx, storing the headers named in replayable.
func (l *Ledger) completeTx(ctx context.Context, r *Reservation, resp Response, stmts []d1client.Statement, replayable []string) (done Completion, err error) {
	defer l.completed(r, &done, &err)
	w := l.prepare(ctx, r, resp, replayable)
	h, err := l.homeOf(r)
	if err != nil {
		return w.done, fmt.Errorf("%w: %w", ErrTxNotCommitted, err)
	}
	guard := d1client.Statement{SQL: l.sql.guardSQL, Params: []any{r.Principal, r.Key, r.Generation}}
	batch := append(make([]d1client.Statement, 0, len(stmts)+3), guard)
	batch = append(append(batch, stmts...), w.stmt)
	sent := time.Now()
	err = l.finish(ctx, h, r, batch, len(stmts), &w)
	if err == nil {
		l.remember(r, &w, sent, nil)
		return w.done, nil
	}
	if errors.Is(err, ErrReservationExpired) {
		return w.done, fmt.Errorf("%w: %w", ErrTxNotCommitted, err) // nothing was sent
	}
	// Nothing, or (if the failure was ambiguous) everything, committed.
	if st, lerr := l.completionState(ctx, h, r, &w); lerr == nil && st == rowOurs {
		w.done.Stored = true
		l.remember(r, &w, sent, nil)
		return w.done, nil
	}
	// The release is fenced: it touches the row only if the batch did not land.
	if _, rerr := l.Release(ctx, r); rerr != nil {
		err = fmt.Errorf("%w (and the release failed: %v)", err, rerr)
	}
	return w.done, fmt.Errorf("%w: %w", ErrTxNotCommitted, err)
}
