package cli

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/internal/human"
)

// admin returns the ledger's administrative API on the connection, with
// the TTL and retention the application uses (the commands' --ttl and
// --retention) and the CLI's clock: D1's own unless a test injects one. The
// ledger, not the CLI, owns every statement, clock expression and status.
func admin(o *options, cn *conn, cfg idem.Config) (*idem.Admin, error) {
	cfg.Clock = o.now
	l, err := idem.New(cn.db, cfg)
	if err != nil {
		return nil, configUsage(err)
	}
	return l.Admin(), nil
}

// keysAdmin is the administrative API for the keys commands, which read and
// release but never sweep: only the TTL matters, so the lease and the
// retention are set to what any TTL accepts.
func keysAdmin(o *options, cn *conn, ttl time.Duration) (*idem.Admin, error) {
	return admin(o, cn, keysConfig(ttl))
}

// keysConfig is the ledger configuration of the keys commands.
func keysConfig(ttl time.Duration) idem.Config {
	return idem.Config{TTL: ttl, MaxLease: ttl, Retention: max(idem.DefaultRetention, 2*ttl+idem.RetentionMargin)}
}

// flagOf names the CLI flag of a ledger configuration field, or "".
func flagOf(field string) string {
	switch field {
	case "Config.TTL":
		return "--ttl"
	case "Config.Retention":
		return "--retention"
	case "Config.SweepBatch":
		return "--batch"
	}
	return ""
}

// configUsage turns an invalid ledger configuration from flags into a
// usage error naming the flag.
func configUsage(err error) error {
	var ce *idem.ConfigError
	if errors.As(err, &ce) {
		if flag := flagOf(ce.Field); flag != "" {
			return usagef("%s %s is out of range: %s", flag, ce.Value, ce.Want)
		}
	}
	return err
}

// ledgerErr prefixes an error of the administrative API with the command,
// leaving out the ledger's own prefix before a D1 error.
func ledgerErr(cmd string, err error) error {
	var de *d1client.Error
	if errors.As(err, &de) {
		return fmt.Errorf("%s: %w", cmd, de)
	}
	return fmt.Errorf("%s: %w", cmd, err)
}

// keyState is what a row means for the client's next retry. The ledger
// cannot tell a released row from one whose owner stopped renewing it: both
// are pending past the TTL, awaiting the retry that takes them over.
type keyState string

const (
	stateInFlight      keyState = "in_flight"      // pending, renewed recently: its owner is running
	stateOwnerQuiet    keyState = "owner_quiet"    // pending, missed its heartbeats, inside the TTL
	stateAwaitingRetry keyState = "awaiting_retry" // pending past the TTL: the next retry takes it over
	stateCompleted     keyState = "completed"      // retries replay the stored response
	stateUnknown       keyState = "unknown"        // a status the ledger does not write
)

// lease is how the application holds its keys: the TTL after which the next
// retry takes a pending key over, and how often a running request renews
// its key (idem.Config.TTL and Heartbeat).
type lease struct{ ttl, heartbeat time.Duration }

// leaseOf is the lease of a TTL and a heartbeat; heartbeat 0 means the
// ledger's default, a third of the TTL.
func leaseOf(ttl, heartbeat time.Duration) lease {
	if heartbeat <= 0 {
		heartbeat = ttl / 3
	}
	return lease{ttl: ttl, heartbeat: heartbeat}
}

// quietAfter is how long a pending row may go without an update before its
// owner is presumed dead: two heartbeats (two thirds of the TTL by
// default).
func (l lease) quietAfter() time.Duration { return min(2*l.heartbeat, l.ttl) }

// stateOf classifies a row under the application's lease.
func stateOf(k *idem.KeyRecord, l lease) keyState {
	switch {
	case k.Status == idem.StatusCompleted:
		return stateCompleted
	case k.Status != idem.StatusPending:
		return stateUnknown
	case k.Stuck:
		return stateAwaitingRetry
	case k.SinceUpdate() > l.quietAfter():
		return stateOwnerQuiet
	}
	return stateInFlight
}

// words names the state in tables: "awaiting retry".
func (s keyState) words() string {
	if s == stateUnknown {
		return "unknown status"
	}
	return strings.ReplaceAll(string(s), "_", " ")
}

// keySummaryJSON is a row in keys list and keys stuck --json.
type keySummaryJSON struct {
	Principal      string `json:"principal"`
	Key            string `json:"key"`
	Status         string `json:"status"`
	State          string `json:"state"`
	Generation     int64  `json:"generation"`
	ResponseStatus *int64 `json:"response_status"`
	CreatedAt      string `json:"created_at"`
	CreatedAtMS    int64  `json:"created_at_ms"`
	UpdatedAt      string `json:"updated_at"`
	UpdatedAtMS    int64  `json:"updated_at_ms"`
	AgeMS          int64  `json:"age_ms"`
	SinceUpdateMS  int64  `json:"since_update_ms"`
	Stuck          bool   `json:"stuck"`
}

func summaryJSON(k *idem.KeyRecord, l lease) keySummaryJSON {
	return keySummaryJSON{
		Principal: k.Principal, Key: k.Key, Status: string(k.Status), State: string(stateOf(k, l)), Generation: k.Generation,
		ResponseStatus: k.ResponseStatus,
		CreatedAt:      human.Time(k.CreatedAt), CreatedAtMS: k.CreatedAt.UnixMilli(),
		UpdatedAt: human.Time(k.UpdatedAt), UpdatedAtMS: k.UpdatedAt.UnixMilli(),
		AgeMS: k.Age().Milliseconds(), SinceUpdateMS: k.SinceUpdate().Milliseconds(),
		Stuck: k.Stuck,
	}
}

func summariesJSON(keys []idem.KeyRecord, l lease) []keySummaryJSON {
	out := make([]keySummaryJSON, 0, len(keys))
	for i := range keys {
		out = append(out, summaryJSON(&keys[i], l))
	}
	return out
}
