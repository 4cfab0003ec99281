package idem

import (
	"fmt"
	"time"

	"github.com/d1idem/d1idem/internal/human"
)

// KeyState is what a ledger row means for its client's next retry, under
// the ledger's TTL and heartbeat. The ledger cannot tell a released row from
// one whose owner stopped renewing it: both are pending past the TTL,
// awaiting the retry that takes them over.
type KeyState string

// The states of a row.
const (
	KeyInFlight      KeyState = "in_flight"      // pending, renewed recently: its owner is running
	KeyOwnerQuiet    KeyState = "owner_quiet"    // pending, two heartbeats missed, inside the TTL
	KeyAwaitingRetry KeyState = "awaiting_retry" // pending past the TTL: the next retry takes it over
	KeyCompleted     KeyState = "completed"      // retries replay the stored response
	KeyUnknown       KeyState = "unknown"        // a status the ledger does not write
)

// quietAfter is how long a pending row may go without an update before its
// owner is presumed dead: two heartbeats (two thirds of the TTL by
// default), or the TTL when the ledger renews no lease.
func (c Config) quietAfter() time.Duration {
	if c.Heartbeat <= 0 {
		return c.TTL
	}
	return min(2*c.Heartbeat, c.TTL)
}

// QuietAfter is how long a pending row may go without an update before
// Admin presumes its owner dead (KeyOwnerQuiet): two heartbeats, at most
// the TTL.
func (a *Admin) QuietAfter() time.Duration { return a.l.cfg.quietAfter() }

// stateOf classifies a row read at k.AsOf under the configuration c.
func (c Config) stateOf(k *KeyRecord) KeyState {
	switch {
	case k.Status == StatusCompleted:
		return KeyCompleted
	case k.Status != StatusPending:
		return KeyUnknown
	case k.Stuck:
		return KeyAwaitingRetry
	case k.SinceUpdate() > c.quietAfter():
		return KeyOwnerQuiet
	}
	return KeyInFlight
}

// Released reports whether the row was released (by Admin.Release, or by
// its owner's Ledger.Release) since it was created: a release sets a
// pending row's last update one TTL back, and only a release moves it
// before the row's creation. A row released long after its creation is not
// told apart from one whose owner stopped renewing it.
func (k *KeyRecord) Released() bool {
	return k.Status == StatusPending && k.UpdatedAt.Before(k.CreatedAt)
}

// Explanation says why a row is in its state and what to do about it, for
// an operator: the d1idem command line prints it, and a console can show
// it as it is. Its sentences name durations as the ledger's configuration
// has them.
type Explanation struct {
	State KeyState `json:"state"`
	// Reason says why the row is in its state: "no update for 25s (a live
	// owner renews every 10s), inside the 30s TTL".
	Reason string `json:"reason"`
	// Next says what the client's next retry gets.
	Next string `json:"next"`
	// Remedy says what an operator may do; "Nothing needs releasing." when
	// nothing is needed.
	Remedy string `json:"remedy"`
	// Release is the fenced release Remedy suggests (Admin.Release at this
	// generation, with Force); nil when none is needed.
	Release *ReleaseAdvice `json:"release"`
	// TakeoverGeneration is the generation the retry that takes the key
	// over runs at; 0 for a completed row.
	TakeoverGeneration int64 `json:"takeover_generation,omitempty"`
}

// ReleaseAdvice is the fenced release that lets a stuck key's client retry
// now.
type ReleaseAdvice struct {
	Generation int64 `json:"generation"`
	Force      bool  `json:"force"`
}

// Explain says why the row k (read by this Admin) is in its state, what its
// client's next retry gets, and what an operator may do, under the ledger's
// TTL, heartbeat and retention.
func (a *Admin) Explain(k *KeyRecord) Explanation {
	c := a.l.cfg
	ttl := human.Duration(c.TTL)
	e := Explanation{State: c.stateOf(k), TakeoverGeneration: k.Generation + 1}
	switch e.State {
	case KeyAwaitingRetry:
		e.Reason = fmt.Sprintf("past the %s TTL (released, or its owner stopped renewing it)", ttl)
		if k.Released() {
			e.Reason = fmt.Sprintf("released %s (a release sets the last update one TTL, %s, back)", human.Age(k.SinceUpdate()-c.TTL-time.Millisecond), ttl)
		}
		e.Next = fmt.Sprintf("The next retry of the same request takes the key over (generation %d) and executes it.", e.TakeoverGeneration)
		e.Remedy = "Nothing needs releasing."
	case KeyOwnerQuiet:
		e.Reason = fmt.Sprintf("no update for %s (a live owner renews every %s), inside the %s TTL", human.Duration(k.SinceUpdate()), human.Duration(c.Heartbeat), ttl)
		e.Next = fmt.Sprintf("Retries get 409 idempotency_key_in_progress until the TTL has passed, in %s.", human.Duration(c.TTL-k.SinceUpdate()))
		e.Remedy = fmt.Sprintf("Its owner has missed its heartbeats and is presumed dead. To let the client retry now, release the key (at generation %d, with force: the ledger cannot prove the owner dead); the retry then takes it over at generation %d.",
			k.Generation, k.Generation+2)
		e.Release, e.TakeoverGeneration = &ReleaseAdvice{Generation: k.Generation, Force: true}, k.Generation+2
	case KeyInFlight:
		e.Reason = fmt.Sprintf("last updated %s, within the %s TTL", human.Age(k.SinceUpdate()), ttl)
		e.Next = fmt.Sprintf("Retries get 409 idempotency_key_in_progress until it completes, or until %s without an update.", ttl)
		e.Remedy = fmt.Sprintf("Its owner is presumably still running (a live owner renews the row every %s): wait.", human.Duration(c.Heartbeat))
		if c.Heartbeat <= 0 {
			e.Remedy = "Its owner is presumably still running: wait."
		}
	case KeyCompleted:
		e.Reason = "retries replay the stored response"
		e.Next = fmt.Sprintf("Retries with this key replay the stored response, without executing, until the sweep deletes the row (%s after its last update).", human.Duration(c.Retention))
		e.TakeoverGeneration = 0
	default:
		e.Reason = "not a status the ledger writes"
		e.TakeoverGeneration = 0
	}
	return e
}
