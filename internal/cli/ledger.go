package cli

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/idem"
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
	return admin(o, cn, idem.Config{TTL: ttl, MaxLease: ttl, Retention: max(idem.DefaultRetention, 2*ttl+idem.RetentionMargin)})
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

// quietAfter is how long a pending row may go without an update before its
// owner is presumed dead: two thirds of the TTL, since a live owner renews
// its row every third of it (idem.Config.Heartbeat's default).
func quietAfter(ttl time.Duration) time.Duration { return ttl * 2 / 3 }

// stateOf classifies a row read with the given TTL.
func stateOf(k *idem.KeyRecord, ttl time.Duration) keyState {
	switch {
	case k.Status == idem.StatusCompleted:
		return stateCompleted
	case k.Status != idem.StatusPending:
		return stateUnknown
	case k.Stuck:
		return stateAwaitingRetry
	case k.SinceUpdate() > quietAfter(ttl):
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

func summaryJSON(k *idem.KeyRecord, ttl time.Duration) keySummaryJSON {
	return keySummaryJSON{
		Principal: k.Principal, Key: k.Key, Status: string(k.Status), State: string(stateOf(k, ttl)), Generation: k.Generation,
		ResponseStatus: k.ResponseStatus,
		CreatedAt:      formatTime(k.CreatedAt), CreatedAtMS: k.CreatedAt.UnixMilli(),
		UpdatedAt: formatTime(k.UpdatedAt), UpdatedAtMS: k.UpdatedAt.UnixMilli(),
		AgeMS: k.Age().Milliseconds(), SinceUpdateMS: k.SinceUpdate().Milliseconds(),
		Stuck: k.Stuck,
	}
}

func summariesJSON(keys []idem.KeyRecord, ttl time.Duration) []keySummaryJSON {
	out := make([]keySummaryJSON, 0, len(keys))
	for i := range keys {
		out = append(out, summaryJSON(&keys[i], ttl))
	}
	return out
}

// formatTime formats a ledger time in UTC.
func formatTime(t time.Time) string { return formatUTC(t.UnixMilli()) }
