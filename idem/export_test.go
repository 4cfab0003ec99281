package idem

import "time"

// SetTestHooks replaces the heartbeat's ticker and observes its renewals,
// so that tests drive heartbeats beat by beat instead of by wall-clock time.
// Call it before the ledger is used.
func SetTestHooks(l *Ledger, newTicker func(time.Duration) (<-chan time.Time, func()), afterBeat func(r *Reservation, renewed bool, err error)) {
	l.hooks = testHooks{newTicker: newTicker, afterBeat: afterBeat}
}

// DecodeUTF8 is decodeUTF8, for tests of package idem_test.
var DecodeUTF8 = decodeUTF8
