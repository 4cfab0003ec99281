package idem

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
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

// Words names the state in a sentence or a table: "awaiting retry",
// "unknown status".
func (s KeyState) Words() string {
	if s == KeyUnknown {
		return "unknown status"
	}
	return strings.ReplaceAll(string(s), "_", " ")
}

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

// StuckKeys are the pending keys whose owner has gone quiet, as
// Admin.Stuck reads them, oldest first: those still inside the TTL (their
// retries get in progress until it passes; a forced release lets them
// retry now) and those past it (the next retry takes them over). Its JSON
// form (MarshalJSON) has the TTL and QuietAfter in milliseconds (ttl_ms,
// quiet_after_ms), the counts (total, owner_quiet, awaiting_retry),
// partial, and the keys shown (keys), owner-quiet ones first.
type StuckKeys struct {
	OwnerQuiet, AwaitingRetry   []KeyRecord // the oldest of each, at most Admin.Stuck's limit
	NOwnerQuiet, NAwaitingRetry int64       // how many there are of each, shown or not
	// Partial reports that more pending rows remain than were read (the
	// counts are of the oldest MaxStuckRows).
	Partial         bool
	TTL, QuietAfter time.Duration // the ledger's TTL, and Admin.QuietAfter
}

// MaxStuckRows bounds the rows Admin.Stuck reads: 20 pages of
// MaxListLimit, 20 D1 calls.
const MaxStuckRows = 20 * MaxListLimit

// Stuck pages through the pending rows with no update for longer than
// QuietAfter, oldest first (at most MaxStuckRows), and keeps at most limit
// (1 to MaxListLimit) of each group.
func (a *Admin) Stuck(ctx context.Context, limit int) (StuckKeys, error) {
	out := StuckKeys{TTL: a.l.cfg.TTL, QuietAfter: a.QuietAfter()}
	if limit < 1 || limit > MaxListLimit {
		return out, fmt.Errorf("idem: stuck: limit %d is out of range: use 1 to %d", limit, MaxListLimit)
	}
	opts := ListOptions{Status: StatusPending, OlderThan: out.QuietAfter, Limit: MaxListLimit}
	for read := 0; read < MaxStuckRows; read += MaxListLimit {
		page, err := a.List(ctx, opts)
		if err != nil {
			return out, err
		}
		for _, k := range page.Keys {
			group, n := &out.OwnerQuiet, &out.NOwnerQuiet
			if k.State == KeyAwaitingRetry {
				group, n = &out.AwaitingRetry, &out.NAwaitingRetry
			}
			*n++
			if len(*group) < limit {
				*group = append(*group, k)
			}
		}
		if opts.Cursor = page.NextCursor; opts.Cursor == "" {
			break
		}
	}
	out.Partial = opts.Cursor != ""
	return out, nil
}

// MarshalJSON writes the stuck keys as d1idem keys stuck --json does.
func (s StuckKeys) MarshalJSON() ([]byte, error) {
	keys := append(append([]KeyRecord{}, s.OwnerQuiet...), s.AwaitingRetry...)
	return json.Marshal(struct {
		TTLMS         int64       `json:"ttl_ms"`
		QuietAfterMS  int64       `json:"quiet_after_ms"`
		Total         int64       `json:"total"`
		OwnerQuiet    int64       `json:"owner_quiet"`
		AwaitingRetry int64       `json:"awaiting_retry"`
		Partial       bool        `json:"partial"`
		Keys          []KeyRecord `json:"keys"`
	}{s.TTL.Milliseconds(), s.QuietAfter.Milliseconds(), s.NOwnerQuiet + s.NAwaitingRetry, s.NOwnerQuiet, s.NAwaitingRetry, s.Partial, keys})
}
