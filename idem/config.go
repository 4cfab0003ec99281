package idem

import (
	"cmp"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// Defaults, from the spec where it has them.
const (
	DefaultTTL           = 30 * time.Second // PENDING_TTL_MS
	DefaultRetention     = 24 * time.Hour   // RETENTION_MS
	DefaultSweepBatch    = 20               // SWEEP_BATCH_SIZE
	DefaultMaxStoredBody = 16_384           // RESPONSE_BODY_MAX_BYTES
	DefaultSweepInterval = time.Minute      // how often a completion carries a sweep
	DefaultMaxLease      = 10 * time.Minute // longest a heartbeat keeps a reservation alive
)

const (
	// RetentionMargin is how much the retention must exceed MaxLease + TTL,
	// so an owner cancelled at MaxLease completes before its row is swept.
	RetentionMargin = time.Minute
	MaxSweepBatch   = 1000 // the largest Config.SweepBatch
)

// Limits of the configuration, as Config documents them.
const (
	minTTL           = 10 * time.Millisecond
	maxTTL           = 24 * time.Hour
	maxMaxLease      = 7 * 24 * time.Hour
	maxRetention     = 10 * 365 * 24 * time.Hour
	maxSweepInterval = 24 * time.Hour
	maxStoredBody    = 1 << 20
	maxReplayCache   = 1 << 30
)

// The spec's FINGERPRINT_HEADERS and REPLAYABLE_HEADERS.
var (
	DefaultFingerprintHeaders = []string{"content-type", "x-api-version"}
	DefaultReplayableHeaders  = []string{"content-type", "location"}
)

// Config configures a Ledger; a zero field means its default. Every Ledger
// sharing one table should use the same TTL and Retention.
type Config struct {
	// TTL is how long a pending reservation is presumed alive before a retry
	// may take it over; well above the slowest mutation. 10ms-24h; default 30s.
	TTL time.Duration
	// Retention is how long a row is kept after its last update. From MaxLease
	// + TTL + RetentionMargin to 10 years; default 24h.
	Retention time.Duration
	// SweepBatch bounds the rows one sweep deletes. 1 to 1000; default 20.
	SweepBatch int
	// SweepInterval is how often a completion carries a sweep (at once again
	// after a full batch). Up to 24h; default 1 minute.
	SweepInterval time.Duration
	// MaxStoredBody caps the stored body in bytes; a larger one is stored as
	// the spec's sentinel. 1 to 1 MiB; default 16,384.
	MaxStoredBody int
	// FingerprintHeaders are the request headers fingerprinted, in order.
	FingerprintHeaders []string
	// ReplayableHeaders are the response headers stored and replayed, in
	// order; set-cookie and other per-response headers are refused.
	ReplayableHeaders []string
	// Clock, if set, supplies the ledger's timestamps, as the spec's
	// Date.now(). nil means D1's own clock: one clock for every instance.
	Clock func() time.Time
	// Heartbeat is how often Hold renews a lease: 1ms up to the TTL; default TTL/3; negative: never.
	Heartbeat time.Duration
	// MaxLease bounds how long heartbeats keep a reservation alive. The TTL
	// to 7 days; default 10 minutes, or the TTL if longer.
	MaxLease time.Duration
	// ReplayCache, if positive, keeps up to this many bytes of completed
	// responses in memory, so that a replay this process can answer costs no
	// D1 call. An entry is served only for its principal's key with the same
	// fingerprint, and never past its row's retention; the least recently
	// used go first. 0 (the default): off. Up to 1 GiB.
	ReplayCache int
	Logger      *slog.Logger // nil means slog.Default()
	// MeterProvider receives the ledger's and idemhttp's metrics, and
	// TracerProvider idemhttp's spans; nil means otel's global ones.
	MeterProvider  metric.MeterProvider
	TracerProvider trace.TracerProvider
}

// ConfigError is an invalid field of Config, or of idemhttp.Options.
type ConfigError struct {
	Field string // "Config.TTL", "Options.Timeout", ...
	Value string // the value given, formatted
	Want  string // what is accepted
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("idem: %s %s is out of range: %s", e.Field, e.Value, e.Want)
}

// withDefaults fills in the zero fields and checks every field, in order.
func (c Config) withDefaults() (Config, error) {
	c.TTL = cmp.Or(c.TTL, DefaultTTL)
	c.Heartbeat = cmp.Or(c.Heartbeat, c.TTL/3)
	c.MaxLease = cmp.Or(c.MaxLease, max(DefaultMaxLease, c.TTL))
	c.Retention = cmp.Or(c.Retention, DefaultRetention)
	c.SweepBatch = cmp.Or(c.SweepBatch, DefaultSweepBatch)
	c.SweepInterval = cmp.Or(c.SweepInterval, DefaultSweepInterval)
	c.MaxStoredBody = cmp.Or(c.MaxStoredBody, DefaultMaxStoredBody)
	minRetention := c.MaxLease + c.TTL + RetentionMargin
	for _, ch := range []struct {
		field string
		value any
		bad   bool
		want  string
	}{
		{"TTL", c.TTL, c.TTL < minTTL || c.TTL > maxTTL, fmt.Sprintf("use %v to %v", minTTL, maxTTL)},
		{"Heartbeat", c.Heartbeat, c.Heartbeat >= 0 && (c.Heartbeat < time.Millisecond || c.Heartbeat >= c.TTL),
			fmt.Sprintf("use 1ms up to (not including) the TTL (%v), or a negative value to disable heartbeats", c.TTL)},
		{"MaxLease", c.MaxLease, c.MaxLease < c.TTL || c.MaxLease > maxMaxLease, fmt.Sprintf("use the TTL (%v) to %v", c.TTL, maxMaxLease)},
		{"Retention", c.Retention, c.Retention < minRetention || c.Retention > maxRetention,
			fmt.Sprintf("use MaxLease (%v) + TTL (%v) + %v = %v to %v, so that no row a live owner may still write is swept",
				c.MaxLease, c.TTL, RetentionMargin, minRetention, maxRetention)},
		{"SweepBatch", c.SweepBatch, c.SweepBatch < 1 || c.SweepBatch > MaxSweepBatch, fmt.Sprintf("use 1 to %d", MaxSweepBatch)},
		{"SweepInterval", c.SweepInterval, c.SweepInterval < 0 || c.SweepInterval > maxSweepInterval,
			fmt.Sprintf("use a positive duration up to %v", maxSweepInterval)},
		{"MaxStoredBody", c.MaxStoredBody, c.MaxStoredBody < 1 || c.MaxStoredBody > maxStoredBody, fmt.Sprintf("use 1 to %d bytes", maxStoredBody)},
		{"ReplayCache", c.ReplayCache, c.ReplayCache < 0 || c.ReplayCache > maxReplayCache, fmt.Sprintf("use 0 (off) to %d bytes", maxReplayCache)},
	} {
		if ch.bad {
			return c, &ConfigError{Field: "Config." + ch.field, Value: fmt.Sprint(ch.value), Want: ch.want}
		}
	}
	var err error
	if c.FingerprintHeaders, err = lowerNames("Config.FingerprintHeaders", c.FingerprintHeaders, DefaultFingerprintHeaders); err != nil {
		return c, err
	}
	if c.ReplayableHeaders, err = lowerNames("Config.ReplayableHeaders", c.ReplayableHeaders, DefaultReplayableHeaders); err != nil {
		return c, err
	}
	for i, h := range c.ReplayableHeaders {
		if neverReplayed[h] {
			return c, &ConfigError{Field: fmt.Sprintf("Config.ReplayableHeaders[%d]", i), Value: strconv.Quote(h), Want: "this header must never be replayed"}
		}
	}
	return c, nil
}

// neverReplayed are response headers scoped to a connection or response, or unsafe to share.
var neverReplayed = map[string]bool{
	"set-cookie": true, "content-length": true, "transfer-encoding": true, "connection": true,
	"keep-alive": true, "date": true, "trailer": true, "upgrade": true, "idempotent-replayed": true,
}

// lowerNames lower-cases names (def's if nil), checking each is an RFC 9110 token.
func lowerNames(field string, names, def []string) ([]string, error) {
	if names == nil {
		names = def
	}
	notToken := func(c rune) bool { return c <= ' ' || c >= 0x7f || strings.ContainsRune(`"(),/:;<=>?@[\]{}`, c) }
	out := make([]string, len(names))
	for i, n := range names {
		n = strings.ToLower(strings.TrimSpace(n))
		if n == "" || strings.IndexFunc(n, notToken) >= 0 {
			return nil, &ConfigError{Field: fmt.Sprintf("%s[%d]", field, i), Value: strconv.Quote(names[i]), Want: "use a header name"}
		}
		out[i] = n
	}
	return out, nil
}
