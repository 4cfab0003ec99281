package idemhttp

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/internal/otelscope"
)

// requestSpan is the name of the middleware's span.
const requestSpan = "d1idem.request"

// Attribute keys of the middleware's metric and span
// (docs/observability.md). None ever carries a principal, a key or a
// token: the span carries the principal's short SHA-256 digest, as the
// logs do; the metric not even that.
const (
	attrOutcome          = attribute.Key("d1idem.outcome")
	attrPrincipalSHA256  = attribute.Key("d1idem.principal.sha256")
	attrGeneration       = attribute.Key("d1idem.generation")
	attrTakeover         = attribute.Key("d1idem.takeover")
	attrCompletionResult = attribute.Key("d1idem.completion.result")
)

// outcome is how the middleware answered a guarded request.
type outcome uint8

const (
	outNone outcome = iota // not decided: the request panicked before
	outExecute
	outReplay
	outInProgress
	outReused
	outRetry
	outKeyMissing
	outKeyInvalid
	outUnauthenticated
	outPrincipalInvalid
	outTooLarge
	outBodyUnreadable
	outLedgerUnavailable
	outBudgetShed
	outRecordUnreadable
	outUnprotected
	numOutcomes
)

// What became of an executed request's response: the values of
// d1idem.completion.result on the request span, those of the ledger's
// completions and "released".
const (
	resStored    = "stored"     // the response is the stored one
	resFencedOut = "fenced_out" // a takeover superseded the reservation
	resFailed    = "failed"     // D1 could not be reached in time
	resExpired   = "expired"    // never sent: idem.ErrReservationExpired
	resReleased  = "released"   // not stored; the reservation was given up
)

// hashPrefix is the number of hex digits of a SHA-256 shown, as in the
// ledger's logs (idem.Reservation.LogValue).
const hashPrefix = 12

// telemetry is the middleware's instrumentation through the OpenTelemetry
// API. With the global providers left unset, the histogram and the tracer
// are no-ops; the measurement options are built once, so that recording
// allocates nothing.
type telemetry struct {
	tracer      trace.Tracer
	requests    metric.Float64Histogram
	outcomeSets [numOutcomes][]metric.RecordOption
}

// newTelemetry makes the middleware's histogram and tracer from the
// providers (nil: otel's global ones), in the ledger's scope. A histogram
// the provider refuses is replaced by its no-op, as the API's contract
// allows.
func newTelemetry(mp metric.MeterProvider, tp trace.TracerProvider) *telemetry {
	m, tracer := otelscope.New(mp, tp, idem.ScopeName)
	t := &telemetry{tracer: tracer}
	t.requests, _ = m.Float64Histogram("d1idem.request.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of the requests the middleware guarded, by outcome."),
		metric.WithExplicitBucketBoundaries(otelscope.DurationBuckets...))
	for o := outExecute; o < numOutcomes; o++ {
		t.outcomeSets[o] = []metric.RecordOption{metric.WithAttributes(attrOutcome.String(answers[o].name))}
	}
	return t
}

// requestTrace is what the middleware learnt of a request, for its span
// and metrics.
type requestTrace struct {
	start      time.Time
	outcome    outcome
	principal  string
	res        *idem.Reservation
	completion string // what became of an executed request's response
}

// endRequest records a guarded request: its outcome and duration, and its
// span's attributes. The principal goes to the span only as its short
// SHA-256 digest, as in the logs.
func (t *telemetry) endRequest(span trace.Span, rt *requestTrace) {
	if rt.outcome != outNone {
		t.requests.Record(context.Background(), time.Since(rt.start).Seconds(), t.outcomeSets[rt.outcome]...)
	}
	if !span.IsRecording() {
		span.End()
		return
	}
	attrs := make([]attribute.KeyValue, 0, 5)
	if rt.outcome != outNone {
		attrs = append(attrs, attrOutcome.String(answers[rt.outcome].name))
	}
	if rt.principal != "" {
		attrs = append(attrs, attrPrincipalSHA256.String(shortHash(rt.principal)))
	}
	if r := rt.res; r != nil {
		attrs = append(attrs, attrGeneration.Int64(r.Generation), attrTakeover.Bool(r.Takeover))
	}
	if rt.completion != "" {
		attrs = append(attrs, attrCompletionResult.String(rt.completion))
	}
	span.SetAttributes(attrs...)
	if a := answers[rt.outcome]; a.status >= 500 {
		span.SetStatus(codes.Error, a.name)
	}
	span.End()
}

// completionResult is the result of a completion that returned done and
// err.
func completionResult(done idem.Completion, err error) string {
	switch {
	case errors.Is(err, idem.ErrReservationExpired):
		return resExpired
	case err != nil:
		return resFailed
	case done.Stored:
		return resStored
	}
	return resFencedOut
}

// shortHash is the first hashPrefix hex digits of s's SHA-256: the
// principal_sha256 of the ledger's logs.
func shortHash(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])[:hashPrefix]
}
