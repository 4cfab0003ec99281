package idem

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"
)

// Causes of a handler context's cancellation (see context.Cause).
var (
	// ErrLeaseLost: a heartbeat found the reservation no longer ours (it was
	// taken over, released or swept), or no heartbeat could reach D1 for a
	// whole TTL. Another owner may be running the same mutation.
	ErrLeaseLost = errors.New("idem: lease lost: the reservation is no longer held")
	// ErrMaxLease: the handler ran longer than Config.MaxLease.
	ErrMaxLease = errors.New("idem: maximum lease duration exceeded")
)

// lease is what a reservation's heartbeat needs while its handler runs.
type lease struct {
	ctx    context.Context // the handler's context
	cancel context.CancelCauseFunc
	beat   context.Context // the heartbeat's own, ended when the handler returns
}

// heartbeat keeps r alive while its handler runs: every Config.Heartbeat it
// renews updated_at, fenced by generation, so a slow but live owner is never
// taken over. When the lease is lost, the handler's context is cancelled at
// once, with ErrLeaseLost (or ErrMaxLease) as its cause, and a log line says
// so.
func (l *Ledger) heartbeat(ls *lease, r *Reservation) {
	tick := time.NewTicker(l.cfg.Heartbeat)
	defer tick.Stop()
	maxLease := time.NewTimer(l.cfg.MaxLease - time.Since(r.acquired))
	defer maxLease.Stop()
	for {
		select {
		case <-ls.beat.Done():
			return
		case <-ls.ctx.Done():
			return
		case <-maxLease.C:
			l.log().LogAttrs(ls.ctx, slog.LevelError, "idem: handler exceeded the maximum lease; its context is cancelled",
				append(logAttrs(r), slog.Duration("max_lease", l.cfg.MaxLease))...)
			l.tel.add(l.tel.lost, 1, attrLeaseCause.String(causeMaxLease))
			ls.cancel(ErrMaxLease)
			return
		case <-tick.C:
		}
		rctx, cancel := context.WithTimeout(ls.beat, l.cfg.Heartbeat)
		ok, err := l.Renew(rctx, r)
		cancel()
		switch {
		case err == nil && ok:
		case ls.beat.Err() != nil:
			return // stopped while renewing
		case err == nil || errors.Is(err, ErrReservationExpired):
			l.log().LogAttrs(ls.ctx, slog.LevelError, "idem: lease lost: the reservation was taken over, released or expired; the handler's context is cancelled",
				logAttrs(r)...)
			cause := causeSuperseded
			if err != nil {
				cause = causeExpired
			}
			l.tel.add(l.tel.lost, 1, attrLeaseCause.String(cause))
			ls.cancel(ErrLeaseLost)
			return
		case time.Since(r.leaseStart()) >= l.cfg.TTL:
			l.log().LogAttrs(ls.ctx, slog.LevelError, "idem: lease lost: no heartbeat reached D1 for a whole TTL; the handler's context is cancelled",
				append(logAttrs(r), slog.String("error", err.Error()))...)
			l.tel.add(l.tel.lost, 1, attrLeaseCause.String(causeUnreachable))
			ls.cancel(ErrLeaseLost)
			return
		default:
			l.log().LogAttrs(ls.ctx, slog.LevelWarn, "idem: heartbeat failed; retrying at the next beat",
				append(logAttrs(r), slog.String("error", err.Error()))...)
		}
	}
}

// Hold runs fn, the mutation of an Execute decision, under a context that
// heartbeats keep r's lease alive for, cancelled with cause ErrLeaseLost or
// ErrMaxLease when the lease is lost, and returns fn's error. When fn
// returns or panics, the heartbeat stops and fn's context is cancelled
// before Hold returns or the panic goes on: no renewal races the completion.
func (l *Ledger) Hold(ctx context.Context, r *Reservation, fn func(ctx context.Context) error) error {
	hctx, cancel := context.WithCancelCause(ctx)
	beat, end := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	if l.cfg.Heartbeat > 0 {
		wg.Go(func() { l.heartbeat(&lease{ctx: hctx, cancel: cancel, beat: beat}, r) })
	}
	defer func() {
		end()
		wg.Wait() // no renewal races the completion
		cancel(nil)
	}()
	return fn(hctx)
}
