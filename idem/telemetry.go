package idem

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/d1idem/d1idem/internal/otelscope"

	"github.com/d1idem/d1idem/d1client"
)

// ScopeName is the instrumentation scope of the ledger's and idemhttp's telemetry.
const ScopeName = "github.com/d1idem/d1idem/idem"

// Attribute keys of the ledger's metrics (docs/observability.md).
const (
	attrCompletionResult = attribute.Key("d1idem.completion.result")
	attrRenewalResult    = attribute.Key("d1idem.renewal.result")
	attrLeaseCause       = attribute.Key("d1idem.lease.cause")
	attrReleaseResult    = attribute.Key("d1idem.release.result")
	attrSweepSource      = attribute.Key("d1idem.sweep.source")
	attrCacheResult      = attribute.Key("d1idem.replay_cache.result")
	attrKeyStatus        = attribute.Key("d1idem.key.status")
	attrDatabase         = attribute.Key("db.namespace")
)

// The names of the ledger's D1 calls in d1client's metrics and spans.
var (
	opClaim           = d1client.Operation("claim")
	opComplete        = d1client.Operation("complete")
	opCheckCompletion = d1client.Operation("check_completion")
	opRenew           = d1client.Operation("renew")
	opRelease         = d1client.Operation("release")
	opLookup          = d1client.Operation("lookup")
	opRing            = d1client.Operation("ring")
	opCheck           = d1client.Operation("check")
)

// Results of the ledger's writes, and causes of a lost lease.
const (
	resStored    = "stored"     // completion: the response is the stored one
	resFencedOut = "fenced_out" // completion: a takeover superseded it
	resFailed    = "failed"     // D1 could not be reached in time
	resExpired   = "expired"    // never sent: ErrReservationExpired
	resRenewed   = "renewed"    // renewal: the lease is extended
	resReleased  = "released"   // release: the row moved a generation on
	resNotHeld   = "not_held"   // renewal or release: the row is no longer ours

	causeSuperseded  = "superseded"  // a renewal found the row no longer ours
	causeUnreachable = "unreachable" // no renewal reached D1 for a whole TTL
	causeExpired     = "expired"     // the reservation outlived its write window
	causeMaxLease    = "max_lease"   // the handler ran past Config.MaxLease
)

// telemetry is a Ledger's instruments; counter options are built once.
type telemetry struct {
	takeovers   metric.Int64Counter
	completions metric.Int64Counter
	renewals    metric.Int64Counter
	lost        metric.Int64Counter
	releases    metric.Int64Counter
	swept       metric.Int64Counter
	cache       metric.Int64Counter
	keys        metric.Int64Gauge
	stuck       metric.Int64Gauge
	backlog     metric.Int64Gauge

	sets map[attribute.KeyValue][]metric.AddOption // of the counters, by their one attribute
}

// newTelemetry makes the ledger's instruments from mp (nil: otel's global one).
func newTelemetry(mp metric.MeterProvider) *telemetry {
	m, _ := otelscope.New(mp, nil, ScopeName)
	t := &telemetry{sets: map[attribute.KeyValue][]metric.AddOption{}}
	counter := func(name, unit, desc string) metric.Int64Counter {
		c, _ := m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		return c
	}
	gauge := func(name, unit, desc string) metric.Int64Gauge {
		g, _ := m.Int64Gauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
		return g
	}
	t.takeovers = counter("d1idem.takeovers", "{reservation}", "Stale pending reservations taken over by a retry (their owner died or went quiet for a TTL).")
	t.completions = counter("d1idem.completions", "{completion}", "Completions (round trip 2), by result: stored, fenced_out, failed, expired.")
	t.renewals = counter("d1idem.lease.renewals", "{renewal}", "Lease renewals (heartbeats), by result: renewed, not_held, failed, expired.")
	t.lost = counter("d1idem.lease.lost", "{lease}", "Leases lost while their handler ran, by cause: superseded, unreachable, expired, max_lease.")
	t.releases = counter("d1idem.releases", "{release}", "Reservations given up so that the client may retry, by result: released, not_held, failed, expired.")
	t.swept = counter("d1idem.sweep.deleted", "{row}", "Rows deleted by the sweep, by source: completion, admin.")
	t.cache = counter("d1idem.replay_cache.lookups", "{lookup}", "Begins that looked in the replay cache (Config.ReplayCache), by result: hit (answered with no D1 call), miss.")
	t.keys = gauge("d1idem.keys", "{key}", "Rows of the ledger by status, as Admin.Stats last counted them.")
	t.stuck = gauge("d1idem.keys.stuck", "{key}", "Pending rows with no update for longer than the TTL, as Admin.Stats last counted them.")
	t.backlog = gauge("d1idem.sweep.backlog", "{row}", "Rows older than the retention, awaiting the sweep, as Admin.Stats last counted them.")
	results := map[attribute.Key][]string{
		attrCompletionResult: {resStored, resFencedOut, resFailed, resExpired},
		attrRenewalResult:    {resRenewed, resNotHeld, resFailed, resExpired},
		attrLeaseCause:       {causeSuperseded, causeUnreachable, causeExpired, causeMaxLease},
		attrReleaseResult:    {resReleased, resNotHeld, resFailed, resExpired},
		attrSweepSource:      {"completion", "admin"},
		attrCacheResult:      {"hit", "miss"},
	}
	for key, values := range results {
		for _, v := range values {
			kv := key.String(v)
			t.sets[kv] = []metric.AddOption{metric.WithAttributes(kv)}
		}
	}
	return t
}

// add adds n to c with the attribute kv, one of those newTelemetry prepared.
func (t *telemetry) add(c metric.Int64Counter, n int64, kv attribute.KeyValue) {
	c.Add(context.Background(), n, t.sets[kv]...)
}

// writeResult is the result of a write that returned ok and err.
func writeResult(ok bool, err error, success, notHeld string) string {
	switch {
	case errors.Is(err, ErrReservationExpired):
		return resExpired
	case err != nil:
		return resFailed
	case ok:
		return success
	}
	return notHeld
}

// stats records what Admin.Stats counted in database db.
func (t *telemetry) stats(ctx context.Context, db string, st Stats) {
	dbAttr := attrDatabase.String(db)
	for status, n := range st.ByStatus {
		t.keys.Record(ctx, n, metric.WithAttributes(dbAttr, attrKeyStatus.String(string(status))))
	}
	t.stuck.Record(ctx, st.Stuck, metric.WithAttributes(dbAttr))
	t.backlog.Record(ctx, st.SweepBacklog, metric.WithAttributes(dbAttr))
}
