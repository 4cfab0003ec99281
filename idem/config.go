package idem

import (
	"cmp"
	"fmt"
	"log/slog"
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

// RetentionMargin is how much longer than MaxLease plus the TTL the
// retention must be: within it an owner cancelled at MaxLease still
// completes, and a write in flight lands, before the sweep may delete the
// row.
const RetentionMargin = time.Minute

// MaxSweepBatch is the largest Config.SweepBatch.
const MaxSweepBatch = 1000

// Limits of the configuration, as Config documents them.
const (
	minTTL           = 10 * time.Millisecond
	maxTTL           = 24 * time.Hour
	maxMaxLease      = 7 * 24 * time.Hour
	maxRetention     = 10 * 365 * 24 * time.Hour
	maxSweepInterval = 24 * time.Hour
	maxStoredBody    = 1 << 20
)

const defaultRenewFraction = 3 // heartbeat every TTL/3

// DefaultFingerprintHeaders and DefaultReplayableHeaders are the spec's
// FINGERPRINT_HEADERS and REPLAYABLE_HEADERS.
var (
	DefaultFingerprintHeaders = []string{"content-type", "x-api-version"}
	DefaultReplayableHeaders  = []string{"content-type", "location"}
)

// Config configures a Ledger; a zero field means its default. Every Ledger
// sharing one table should use the same TTL and Retention.
type Config struct {
	// TTL is how long a pending reservation is presumed alive: after it, a
	// retry with the same fingerprint takes the reservation over. Set it well
	// above the slowest realistic mutation. 10ms to 24h; default 30s.
	TTL time.Duration
	// Retention is how long any row is kept after its last update before the
	// sweep deletes it: the retention promised to clients. It must be at
	// least MaxLease + TTL + RetentionMargin, so that no row an owner may
	// still write is swept. Up to 10 years; default 24h.
	Retention time.Duration
	// SweepBatch bounds the rows one sweep deletes. 1 to 1000; default 20.
	SweepBatch int
	// SweepInterval is how often a completion carries a sweep; a sweep that
	// deletes a full batch keeps the next completion sweeping too, so a
	// backlog clears. Up to 24h; default 1 minute.
	SweepInterval time.Duration
	// MaxStoredBody caps the stored response body in bytes. A larger body is
	// stored as a null body with status 500, as the spec says. 1 to 1 MiB;
	// default 16,384.
	MaxStoredBody int
	// FingerprintHeaders are the request headers that take part in the
	// fingerprint, in order. Default content-type, x-api-version.
	FingerprintHeaders []string
	// ReplayableHeaders are the response headers stored and replayed, in
	// order. Default content-type, location. set-cookie is refused.
	ReplayableHeaders []string

	// Clock, if set, supplies the timestamps of claims, takeovers,
	// completions, releases and sweeps, bound as parameters as the spec does
	// with Date.now(). When nil (the default), D1's own clock supplies them,
	// inside each statement: one clock for every instance.
	Clock func() time.Time

	// Heartbeat renews a reservation's lease while its handler runs (see
	// Hold). 1ms up to the TTL; default TTL/3; negative disables
	// heartbeats.
	Heartbeat time.Duration
	// MaxLease bounds how long heartbeats keep one reservation alive: a
	// handler running longer has its context cancelled. The TTL to 7 days;
	// default 10 minutes, or the TTL if that is longer.
	MaxLease time.Duration

	// Logger receives fenced-out completions, lost leases, released
	// reservations and ledger failures, never with a full principal (see
	// Reservation.LogValue). nil means slog.Default().
	Logger *slog.Logger

	// MeterProvider receives the ledger's and idemhttp's metrics, and
	// TracerProvider idemhttp's request spans (docs/observability.md); the
	// D1 clients' come from their d1client.Config. nil means otel's global
	// providers, which do nothing until the application sets them.
	MeterProvider  metric.MeterProvider
	TracerProvider trace.TracerProvider
}

// ConfigError is an invalid field of Config, or of the options of a
// transport built on the ledger (idemhttp.Options).
type ConfigError struct {
	Field string // "Config.TTL", "Options.Timeout", ...
	Value string // the value given, formatted
	Want  string // what is accepted
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("idem: %s %s is out of range: %s", e.Field, e.Value, e.Want)
}

func configErr(field string, value any, want string, args ...any) error {
	return &ConfigError{Field: field, Value: fmt.Sprint(value), Want: fmt.Sprintf(want, args...)}
}

// minRetention is the shortest retention cfg accepts.
func (c Config) minRetention() time.Duration { return c.MaxLease + c.TTL + RetentionMargin }

func (c Config) withDefaults() (Config, error) {
	for _, step := range []func(*Config) error{(*Config).leaseDefaults, (*Config).sweepDefaults, (*Config).headerDefaults} {
		if err := step(&c); err != nil {
			return c, err
		}
	}
	return c, nil
}

// leaseDefaults fills in and checks the TTL, the heartbeat and MaxLease.
func (c *Config) leaseDefaults() error {
	c.TTL = cmp.Or(c.TTL, DefaultTTL)
	if c.TTL < minTTL || c.TTL > maxTTL {
		return configErr("Config.TTL", c.TTL, "use %v to %v", minTTL, maxTTL)
	}
	c.Heartbeat = cmp.Or(c.Heartbeat, c.TTL/defaultRenewFraction)
	if c.Heartbeat >= 0 && (c.Heartbeat < time.Millisecond || c.Heartbeat >= c.TTL) {
		return configErr("Config.Heartbeat", c.Heartbeat, "use 1ms up to (not including) the TTL (%v), or a negative value to disable heartbeats", c.TTL)
	}
	c.MaxLease = cmp.Or(c.MaxLease, max(DefaultMaxLease, c.TTL))
	if c.MaxLease < c.TTL || c.MaxLease > maxMaxLease {
		return configErr("Config.MaxLease", c.MaxLease, "use the TTL (%v) to %v", c.TTL, maxMaxLease)
	}
	return nil
}

// sweepDefaults fills in and checks the retention, the sweep and the
// stored body's cap.
func (c *Config) sweepDefaults() error {
	c.Retention = cmp.Or(c.Retention, DefaultRetention)
	if c.Retention < c.minRetention() || c.Retention > maxRetention {
		return configErr("Config.Retention", c.Retention,
			"use MaxLease (%v) + TTL (%v) + %v = %v to %v, so that no row a live owner may still write is swept",
			c.MaxLease, c.TTL, RetentionMargin, c.minRetention(), maxRetention)
	}
	c.SweepBatch = cmp.Or(c.SweepBatch, DefaultSweepBatch)
	if c.SweepBatch < 1 || c.SweepBatch > MaxSweepBatch {
		return configErr("Config.SweepBatch", c.SweepBatch, "use 1 to %d", MaxSweepBatch)
	}
	c.SweepInterval = cmp.Or(c.SweepInterval, DefaultSweepInterval)
	if c.SweepInterval < 0 || c.SweepInterval > maxSweepInterval {
		return configErr("Config.SweepInterval", c.SweepInterval, "use a positive duration up to %v", maxSweepInterval)
	}
	c.MaxStoredBody = cmp.Or(c.MaxStoredBody, DefaultMaxStoredBody)
	if c.MaxStoredBody < 1 || c.MaxStoredBody > maxStoredBody {
		return configErr("Config.MaxStoredBody", c.MaxStoredBody, "use 1 to %d bytes", maxStoredBody)
	}
	return nil
}

// headerDefaults fills in and checks the header lists.
func (c *Config) headerDefaults() error {
	var err error
	if c.FingerprintHeaders, err = lowerNames("Config.FingerprintHeaders", c.FingerprintHeaders, DefaultFingerprintHeaders); err != nil {
		return err
	}
	if c.ReplayableHeaders, err = lowerNames("Config.ReplayableHeaders", c.ReplayableHeaders, DefaultReplayableHeaders); err != nil {
		return err
	}
	for i, h := range c.ReplayableHeaders {
		if neverReplayed[h] {
			return configErr(fmt.Sprintf("Config.ReplayableHeaders[%d]", i), fmt.Sprintf("%q", h), "this header must never be replayed")
		}
	}
	return nil
}

// neverReplayed are response headers that are connection-scoped, computed
// per response, or unsafe to hand to another request.
var neverReplayed = map[string]bool{
	"set-cookie": true, "content-length": true, "transfer-encoding": true, "connection": true,
	"keep-alive": true, "date": true, "trailer": true, "upgrade": true, "idempotent-replayed": true,
}

// lowerNames returns the header names in lower case, or def's when names is
// nil, checking each.
func lowerNames(field string, names, def []string) ([]string, error) {
	if names == nil {
		names = def
	}
	out := make([]string, len(names))
	for i, n := range names {
		n = strings.ToLower(strings.TrimSpace(n))
		if !validToken(n) {
			return nil, configErr(fmt.Sprintf("%s[%d]", field, i), fmt.Sprintf("%q", names[i]), "use a header name")
		}
		out[i] = n
	}
	return out, nil
}

// validToken reports whether s is an RFC 9110 token: a header name or a
// method.
func validToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}
