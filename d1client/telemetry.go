package d1client

import (
	"context"
	"runtime"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/d1idem/d1idem/d1client/budget"
	"github.com/d1idem/d1idem/internal/otelscope"
)

const (
	// ScopeName is the instrumentation scope of the client's metrics and spans.
	ScopeName = "github.com/d1idem/d1idem/d1client"

	// Attribute keys of the client's metrics and spans (docs/observability.md).
	// None ever carries a parameter value, a principal, a key or a token.
	attrOperation  = attribute.Key("d1idem.d1.operation")
	attrResult     = attribute.Key("d1idem.d1.result")
	attrCallKind   = attribute.Key("d1idem.d1.call.kind")
	attrStatements = attribute.Key("d1idem.d1.statements")
	attrCallStmts  = attribute.Key("d1idem.d1.call.statements")
	attrAttempt    = attribute.Key("d1idem.d1.attempt")
	attrPriority   = attribute.Key("d1idem.d1.priority")
	attrDatabase   = attribute.Key("db.namespace")
	attrAccount    = attribute.Key("cloud.account.id")
	attrHTTPStatus = attribute.Key("http.response.status_code")

	defaultOperation = "exec"
	numResults       = int(kindShed) + 1 // ok, then each kind
)

// callKinds name the kinds of call: one statement, one caller's batch, group commit.
var callKinds = [...]string{"single", "batch", "coalesced"}

// kindClasses name the kinds of failure in metrics and spans, "ok" for none.
var kindClasses = [numResults]string{0: "ok", kindSQL: "sql", kindAuth: "auth", kindNoDatabase: "no_database",
	kindRateLimited: "rate_limited", kindOverloaded: "overloaded", kindTransient: "transient", kindNonJSON: "non_json",
	kindEnvelope: "envelope", kindResultCount: "result_count", kindTransport: "transport", kindInvalid: "invalid",
	kindRejected: "rejected", kindBudget: "budget", kindShed: "shed"}

// class is the name of a kind of failure in metrics and spans.
func (k kind) class() string { return kindClasses[k] }

// telemetry is a Client's OpenTelemetry instrumentation; the measurement
// options are built once, so that recording allocates nothing.
type telemetry struct {
	tracer                             trace.Tracer
	callDuration, opDuration, waitTime metric.Float64Histogram // seconds
	callStatements                     metric.Int64Histogram
	retries, sheds                     metric.Int64Counter

	db       attribute.KeyValue
	callSets [len(callKinds)][numResults][]metric.RecordOption
	stmtSets [len(callKinds)][]metric.RecordOption
	waitSets [2][]metric.RecordOption // by class
	shedSets [2][]metric.AddOption
	ops      sync.Map // operation name -> *opTelemetry
}

// opTelemetry are the measurement options of one operation name.
type opTelemetry struct {
	span   string
	attr   attribute.KeyValue
	record [numResults][]metric.RecordOption
	add    [numResults][]metric.AddOption
}

func recordWith(kvs ...attribute.KeyValue) []metric.RecordOption {
	return []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(kvs...))}
}

func addWith(kvs ...attribute.KeyValue) []metric.AddOption {
	return []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(kvs...))}
}

// newTelemetry makes the instruments of a client of database db from the
// providers (nil: otel's global ones); one a provider refuses is a no-op.
func newTelemetry(mp metric.MeterProvider, tp trace.TracerProvider, db string) *telemetry {
	m, tracer := otelscope.New(mp, tp, ScopeName)
	t := &telemetry{tracer: tracer, db: attrDatabase.String(db)}
	seconds := func(name, desc string) metric.Float64Histogram {
		h, _ := m.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc),
			metric.WithExplicitBucketBoundaries(otelscope.DurationBuckets...))
		return h
	}
	t.callDuration = seconds("d1idem.d1.call.duration", "Duration of HTTP calls to D1's API (what the API budget counts), by kind and result.")
	t.opDuration = seconds("d1idem.d1.operation.duration", "Duration of Exec calls as their callers see them (group commit, budget waits and retries included), by operation and result.")
	t.waitTime = seconds("d1idem.d1.budget.wait.duration", "Time calls waited for the API budget before they were sent (only calls that waited).")
	t.callStatements, _ = m.Int64Histogram("d1idem.d1.call.statements", metric.WithUnit("{statement}"),
		metric.WithDescription("Statements carried by each HTTP call to D1's API."),
		metric.WithExplicitBucketBoundaries(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024))
	t.retries, _ = m.Int64Counter("d1idem.d1.retries", metric.WithUnit("{retry}"),
		metric.WithDescription("Attempts repeated after a failure, by operation and the failure's class."))
	t.sheds, _ = m.Int64Counter("d1idem.d1.budget.sheds", metric.WithUnit("{call}"),
		metric.WithDescription("Calls refused, unsent, because the API budget had no call for them before their deadline (ErrBudget)."))
	for ck, name := range callKinds {
		kindAttr := attrCallKind.String(name)
		t.stmtSets[ck] = recordWith(t.db, kindAttr)
		for r := range numResults {
			t.callSets[ck][r] = recordWith(t.db, kindAttr, attrResult.String(kindClasses[r]))
		}
	}
	for cl := range 2 {
		p := attrPriority.Bool(budget.Class(cl) == budget.Priority)
		t.waitSets[cl] = recordWith(t.db, p)
		t.shedSets[cl] = addWith(t.db, p)
	}
	return t
}

// op returns the options of an operation name, made on first use.
func (t *telemetry) op(name string) *opTelemetry {
	if o, ok := t.ops.Load(name); ok {
		return o.(*opTelemetry)
	}
	o := &opTelemetry{span: "d1idem.d1." + name, attr: attrOperation.String(name)}
	for r := range numResults {
		res := attrResult.String(kindClasses[r])
		o.record[r] = recordWith(t.db, o.attr, res)
		o.add[r] = addWith(t.db, o.attr, res)
	}
	known, _ := t.ops.LoadOrStore(name, o)
	return known.(*opTelemetry)
}

// callKindOf is the index in callKinds of a call of n statements.
func callKindOf(coalesced bool, n int) int {
	if coalesced {
		return 2
	}
	return min(n, 2) - 1
}

// call records one HTTP call to D1: its kind, result, duration and statements.
func (t *telemetry) call(coalesced bool, n int, k kind, d time.Duration) {
	ck := callKindOf(coalesced, n)
	t.callDuration.Record(context.Background(), d.Seconds(), t.callSets[ck][k]...)
	t.callStatements.Record(context.Background(), int64(n), t.stmtSets[ck]...)
}

// startAttempt starts an Exec attempt's span; ctx is unchanged if it does not record.
func (t *telemetry) startAttempt(ctx context.Context, o *opTelemetry) (context.Context, trace.Span) {
	sctx, span := t.tracer.Start(ctx, o.span)
	if span.IsRecording() {
		ctx = sctx
	}
	return ctx, span
}

// endAttempt sets an attempt span's attributes, all at once, and ends it;
// shared is the statements of the call that carried the caller's.
func (t *telemetry) endAttempt(span trace.Span, o *opTelemetry, attempt int, coalesced bool, stmts, shared int, err *Error) {
	defer span.End()
	if !span.IsRecording() {
		return
	}
	var k kind
	if err != nil {
		k = err.kind
		span.SetStatus(codes.Error, k.class()) // not the message: it may quote SQL
	}
	attrs := append(make([]attribute.KeyValue, 0, 8), o.attr, t.db, attrStatements.Int(stmts), attrAttempt.Int(attempt),
		attrResult.String(k.class()), attrCallKind.String(callKinds[callKindOf(coalesced, stmts)]))
	if shared > 0 {
		attrs = append(attrs, attrCallStmts.Int(shared))
	}
	if err != nil && err.StatusCode != 0 {
		attrs = append(attrs, attrHTTPStatus.Int(err.StatusCode))
	}
	span.SetAttributes(attrs...)
}

// operation records an Exec call as its caller saw it.
func (t *telemetry) operation(o *opTelemetry, k kind, d time.Duration) {
	t.opDuration.Record(context.Background(), d.Seconds(), o.record[k]...)
}

// waited records a call of class cl that waited d for the budget.
func (t *telemetry) waited(cl budget.Class, d time.Duration) {
	t.waitTime.Record(context.Background(), d.Seconds(), t.waitSets[cl]...)
}

// observeBudget registers the gauges of the account's budget as the client
// sees it, until the client is unreachable (the callback holds the Account).
func observeBudget(c *Client, mp metric.MeterProvider) {
	m, _ := otelscope.New(mp, nil, ScopeName)
	remaining, _ := m.Int64ObservableGauge("d1idem.d1.budget.remaining", metric.WithUnit("{call}"),
		metric.WithDescription("API calls left to the Cloudflare account in the current window, as the last response's Ratelimit header said."))
	limit, _ := m.Int64ObservableGauge("d1idem.d1.budget.limit", metric.WithUnit("{call}"),
		metric.WithDescription("API calls allowed per window: the Ratelimit-Policy's quota, or the local Budget's calls."))
	reset, _ := m.Float64ObservableGauge("d1idem.d1.budget.reset", metric.WithUnit("s"),
		metric.WithDescription("Seconds until the API budget's window resets, as the last response's Ratelimit header said."))
	owed, _ := m.Int64ObservableGauge("d1idem.d1.budget.owed", metric.WithUnit("{call}"),
		metric.WithDescription("Admitted calls whose Priority call to come (a claim's completion) the API budget keeps calls for."))
	acct := c.account
	opt := []metric.ObserveOption{metric.WithAttributeSet(attribute.NewSet(attrAccount.String(c.cfg.AccountID)))}
	reg, err := m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		st := acct.State()
		switch {
		case st.Quota > 0:
			o.ObserveInt64(limit, int64(st.Quota), opt...)
		case !acct.Budget().IsUnlimited():
			o.ObserveInt64(limit, int64(acct.Budget().Calls()), opt...)
		}
		if st.Estimate >= 0 { // headers of the current window
			o.ObserveInt64(remaining, int64(st.Remaining), opt...)
			o.ObserveFloat64(reset, max(0, time.Until(st.Reset).Seconds()), opt...)
		}
		o.ObserveInt64(owed, int64(st.Owed), opt...)
		return nil
	}, remaining, limit, reset, owed)
	if err == nil && reg != nil {
		runtime.AddCleanup(c, func(r metric.Registration) { _ = r.Unregister() }, reg)
	}
}
