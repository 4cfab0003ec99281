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
	// ErrLeaseLost: the reservation is no longer ours, or no heartbeat
	// reached D1 for a TTL. Another owner may run the same mutation.
	ErrLeaseLost = errors.New("idem: lease lost: the reservation is no longer held")
	ErrMaxLease  = errors.New("idem: maximum lease duration exceeded") // beyond Config.MaxLease
)

// heartbeat renews r's lease every Config.Heartbeat (scaled to r's TTL) until beat ends, cancelling
// ctx if it is lost.
func (l *Ledger) heartbeat(ctx context.Context, cancel context.CancelCauseFunc, beat context.Context, r *Reservation) {
	every := l.heartbeatOf(r)
	lose := func(cause string, err error, msg string, attrs ...slog.Attr) {
		l.log().LogAttrs(ctx, slog.LevelError, msg, append(r.LogValue().Group(), attrs...)...)
		l.tel.add(l.tel.lost, 1, attrLeaseCause.String(cause))
		cancel(err)
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	maxLease := time.NewTimer(l.cfg.MaxLease - time.Since(r.acquired))
	defer maxLease.Stop()
	for {
		select {
		case <-beat.Done():
			return
		case <-ctx.Done():
			return
		case <-maxLease.C:
			lose(causeMaxLease, ErrMaxLease, "idem: handler exceeded the maximum lease; its context is cancelled",
				slog.Duration("max_lease", l.cfg.MaxLease))
			return
		case <-tick.C:
		}
		// A renewal may wait for a call until the lease would end (a
		// budget's scarce calls carry many together): it is sent in time.
		rctx, stop := context.WithDeadline(beat, r.leaseStart().Add(l.ttl(r)))
		ok, err := l.Renew(rctx, r)
		stop()
		switch {
		case err == nil && ok:
		case beat.Err() != nil:
			return // stopped while renewing
		case err == nil || errors.Is(err, ErrReservationExpired):
			cause := causeSuperseded
			if err != nil {
				cause = causeExpired
			}
			lose(cause, ErrLeaseLost, "idem: lease lost: the reservation was taken over, released or expired; the handler's context is cancelled")
			return
		case time.Since(r.leaseStart()) >= l.ttl(r):
			lose(causeUnreachable, ErrLeaseLost, "idem: lease lost: no heartbeat reached D1 for a whole TTL; the handler's context is cancelled",
				ErrorAttrs(err)...)
			return
		default:
			l.log().LogAttrs(ctx, slog.LevelWarn, "idem: heartbeat failed; retrying at the next beat",
				append(r.LogValue().Group(), ErrorAttrs(err)...)...)
		}
	}
}

// Hold runs fn, an Execute decision's mutation, while heartbeats keep r's
// lease alive; if it is lost, fn's context is cancelled with cause
// ErrLeaseLost or ErrMaxLease. Heartbeats stop before Hold returns.
func (l *Ledger) Hold(ctx context.Context, r *Reservation, fn func(ctx context.Context) error) error {
	hctx, cancel := context.WithCancelCause(ctx)
	beat, end := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	if l.heartbeatOf(r) > 0 {
		wg.Go(func() { l.heartbeat(hctx, cancel, beat, r) })
	}
	defer func() {
		end()
		wg.Wait()
		cancel(nil)
	}()
	return fn(hctx)
}
