package idemhttp

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/d1idem/d1idem/idem"
)

// outcome is how the middleware answered a guarded request: the
// d1idem.outcome of its metric and span (docs/observability.md), named in
// answers.
type outcome uint8

const (
	outNone outcome = iota // not decided: the handler panicked
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

// resReleased is the d1idem.completion.result of a response not stored
// whose reservation was given up; completionResult gives the others.
const resReleased = "released"

// requestTrace is what the middleware learnt of a request, for its span
// and metric.
type requestTrace struct {
	start      time.Time
	outcome    outcome
	principal  string
	res        *idem.Reservation
	completion string // what became of an executed request's response
}

// endRequest records a guarded request's outcome and duration, and ends its
// span. No attribute carries a principal, a key or a token: the span has
// the principal's short SHA-256 digest, as the logs do.
func (m *middleware) endRequest(span trace.Span, rt *requestTrace) {
	defer span.End()
	a := answers[rt.outcome]
	if rt.outcome != outNone {
		m.requests.Record(context.Background(), time.Since(rt.start).Seconds(), m.outcomeSets[rt.outcome]...)
	}
	if !span.IsRecording() {
		return
	}
	attrs := make([]attribute.KeyValue, 0, 5)
	if rt.outcome != outNone {
		attrs = append(attrs, attribute.String("d1idem.outcome", a.name))
	}
	if rt.principal != "" {
		sum := sha256.Sum256([]byte(rt.principal))
		attrs = append(attrs, attribute.String("d1idem.principal.sha256", hex.EncodeToString(sum[:])[:12]))
	}
	if r := rt.res; r != nil {
		attrs = append(attrs, attribute.Int64("d1idem.generation", r.Generation), attribute.Bool("d1idem.takeover", r.Takeover))
	}
	if rt.completion != "" {
		attrs = append(attrs, attribute.String("d1idem.completion.result", rt.completion))
	}
	span.SetAttributes(attrs...)
	if a.status >= 500 {
		span.SetStatus(codes.Error, a.name)
	}
}

// completionResult is the d1idem.completion.result of a completion that
// returned done and err, as the ledger counts it.
func completionResult(done idem.Completion, err error) string {
	switch {
	case errors.Is(err, idem.ErrReservationExpired):
		return "expired" // never sent
	case err != nil:
		return "failed" // D1 not reached in time
	case done.Stored:
		return "stored"
	}
	return "fenced_out" // a takeover superseded the reservation
}
