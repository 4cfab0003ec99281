package idem

import (
	"cmp"
	"fmt"
	"time"
)

// BeginOptions adjusts one Begin call; its zero value is the ledger's
// configuration.
type BeginOptions struct {
	// TTL replaces Config.TTL for this reservation: how long it is presumed
	// alive without a heartbeat before a retry may take it over, and how
	// long a heartbeat may fail before its handler's context is cancelled.
	// 10ms up to the ledger's TTL, which is so the longest TTL of any key:
	// the retention, the write window (docs/contract.md#5-fencing) and the
	// administrative API's stuck keys, all reckoned with Config.TTL, then
	// hold for every key. Every request of one key must use the same TTL:
	// the takeover of a stale reservation is judged by the TTL of the
	// request that takes it over.
	TTL time.Duration
}

// CheckBeginOptions returns a *ConfigError naming the field if Begin would
// refuse o.
func (l *Ledger) CheckBeginOptions(o BeginOptions) error {
	if o.TTL != 0 && (o.TTL < minTTL || o.TTL > l.cfg.TTL) {
		return &ConfigError{Field: "BeginOptions.TTL", Value: fmt.Sprint(o.TTL),
			Want: fmt.Sprintf("use %v up to the ledger's Config.TTL (%v), which must be the longest", minTTL, l.cfg.TTL)}
	}
	return nil
}

// beginTTL returns the TTL of a Begin call given opts.
func (l *Ledger) beginTTL(opts []BeginOptions) (time.Duration, error) {
	var o BeginOptions
	for _, x := range opts {
		o.TTL = cmp.Or(x.TTL, o.TTL)
	}
	if err := l.CheckBeginOptions(o); err != nil {
		return 0, err
	}
	return cmp.Or(o.TTL, l.cfg.TTL), nil
}

// ttl returns r's TTL: its own, or the ledger's.
func (l *Ledger) ttl(r *Reservation) time.Duration { return cmp.Or(r.ttl, l.cfg.TTL) }

// heartbeatOf returns how often Hold renews r's lease: Config.Heartbeat,
// scaled as r's TTL is to the ledger's (at least 1ms), or negative: never.
func (l *Ledger) heartbeatOf(r *Reservation) time.Duration { return l.heartbeatFor(l.ttl(r)) }

// heartbeatFor returns how often a lease of the given TTL is renewed.
func (l *Ledger) heartbeatFor(ttl time.Duration) time.Duration {
	hb := l.cfg.Heartbeat
	if hb <= 0 || ttl == l.cfg.TTL {
		return hb
	}
	// In floating point: hb * ttl overflows int64 nanoseconds past about 3 s².
	return max(time.Duration(float64(hb)*float64(ttl)/float64(l.cfg.TTL)), time.Millisecond)
}
