package cli

import (
	"errors"
	"fmt"
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

// keysAdmin is the administrative API for the keys commands, which read and
// release but never sweep: only the TTL matters, so the lease and the
// retention are set to what any TTL accepts.
func keysAdmin(o *options, cn *conn, ttl time.Duration) (*idem.Admin, error) {
	return admin(o, cn, idem.Config{TTL: ttl, MaxLease: ttl, Retention: max(idem.DefaultRetention, 2*ttl+idem.RetentionMargin)})
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

// keySummaryJSON is a row in keys list and keys stuck --json.
type keySummaryJSON struct {
	Principal      string `json:"principal"`
	Key            string `json:"key"`
	Status         string `json:"status"`
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

func summaryJSON(k *idem.KeyRecord) keySummaryJSON {
	return keySummaryJSON{
		Principal: k.Principal, Key: k.Key, Status: string(k.Status), Generation: k.Generation,
		ResponseStatus: k.ResponseStatus,
		CreatedAt:      formatTime(k.CreatedAt), CreatedAtMS: k.CreatedAt.UnixMilli(),
		UpdatedAt: formatTime(k.UpdatedAt), UpdatedAtMS: k.UpdatedAt.UnixMilli(),
		AgeMS: k.Age().Milliseconds(), SinceUpdateMS: k.SinceUpdate().Milliseconds(),
		Stuck: k.Stuck,
	}
}

func summariesJSON(keys []idem.KeyRecord) []keySummaryJSON {
	out := make([]keySummaryJSON, 0, len(keys))
	for i := range keys {
		out = append(out, summaryJSON(&keys[i]))
	}
	return out
}

// keyDetailJSON is keys get --json.
type keyDetailJSON struct {
	keySummaryJSON
	Fingerprint         string            `json:"fingerprint"`
	ResponseHeaders     map[string]string `json:"response_headers"`
	ResponseHeadersRaw  *string           `json:"response_headers_raw"`
	ResponseBodyBytes   *int              `json:"response_body_bytes"`
	ResponseBodyPreview *string           `json:"response_body_preview"`
	TTLMS               int64             `json:"ttl_ms"`
}

// formatTime formats a ledger time in UTC.
func formatTime(t time.Time) string { return formatUTC(t.UnixMilli()) }

// statusText describes the status for people.
func statusText(k *idem.KeyRecord, ttl time.Duration) string {
	switch {
	case k.Stuck:
		return fmt.Sprintf("pending, stuck: no update for %s, longer than the %s TTL", formatDuration(k.SinceUpdate()), formatDuration(ttl))
	case k.Status == idem.StatusPending:
		return fmt.Sprintf("pending: in flight, last updated %s (within the %s TTL)", formatAge(k.SinceUpdate()), formatDuration(ttl))
	case k.Status == idem.StatusCompleted:
		return "completed: retries replay the stored response"
	}
	return display(string(k.Status)) + " (not a status of the spec)"
}
