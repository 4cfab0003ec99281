package cli

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/d1idem/d1idem/internal/human"
)

// The demo's --metrics summary is made from the measurements the ledger and
// its D1 client record through the OpenTelemetry API (the same instruments
// an application's SDK receives), tallied here by a MeterProvider of the
// API's own: counters' sums and histograms' counts and sums, by attribute.
// The CLI links no telemetry SDK (a TestLint rule), so it takes none.

// tally adds up the measurements of its MeterProvider's counters and
// histograms. It is safe for concurrent use.
type tally struct {
	mu     sync.Mutex
	values map[tallyKey]*tallyValue
}

// tallyKey is one instrument and one of its attribute values.
type tallyKey struct{ metric, attr, value string }

// tallyValue is a counter's sum, or a histogram's count and sum.
type tallyValue struct {
	count int64
	sum   float64
}

func newTally() *tally { return &tally{values: map[tallyKey]*tallyValue{}} }

// record adds one measurement v under each attribute of attrs, and under
// none ("", "").
func (t *tally) record(name string, attrs attribute.Set, v float64, count int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	add := func(k tallyKey) {
		tv := t.values[k]
		if tv == nil {
			tv = &tallyValue{}
			t.values[k] = tv
		}
		tv.count += count
		tv.sum += v
	}
	add(tallyKey{metric: name})
	for _, kv := range attrs.ToSlice() {
		add(tallyKey{name, string(kv.Key), kv.Value.String()})
	}
}

// get returns the tally of metric, for the attribute's value (all of them
// for attr "").
func (t *tally) get(name, attr, value string) tallyValue {
	t.mu.Lock()
	defer t.mu.Unlock()
	if tv := t.values[tallyKey{name, attr, value}]; tv != nil {
		return *tv
	}
	return tallyValue{}
}

// by returns the sums (or the counts) of metric by the values of attr, as
// "value n, ...", largest first, or in all for attr ""; "none" when there
// are none.
func (t *tally) by(name, attr string, counts bool) string {
	if attr == "" {
		tv := t.get(name, "", "")
		if n := tv.sum; n > 0 {
			return fmt.Sprintf("%g", n)
		}
		return "none"
	}
	t.mu.Lock()
	type entry struct {
		value string
		n     float64
	}
	var es []entry
	for k, v := range t.values {
		if k.metric == name && k.attr == attr {
			n := v.sum
			if counts {
				n = float64(v.count)
			}
			es = append(es, entry{k.value, n})
		}
	}
	t.mu.Unlock()
	if len(es) == 0 {
		return "none"
	}
	slices.SortFunc(es, func(a, b entry) int {
		return cmp.Or(cmp.Compare(b.n, a.n), strings.Compare(a.value, b.value))
	})
	parts := make([]string, len(es))
	for i, e := range es {
		parts[i] = fmt.Sprintf("%s %g", e.value, e.n)
	}
	return strings.Join(parts, ", ")
}

// provider is a MeterProvider whose counters and histograms add to t; its
// other instruments do nothing.
func (t *tally) provider() metric.MeterProvider { return tallyProvider{t: t} }

type tallyProvider struct {
	noop.MeterProvider
	t *tally
}

func (p tallyProvider) Meter(string, ...metric.MeterOption) metric.Meter { return tallyMeter{t: p.t} }

type tallyMeter struct {
	noop.Meter
	t *tally
}

func (m tallyMeter) Int64Counter(name string, _ ...metric.Int64CounterOption) (metric.Int64Counter, error) {
	return tallyCounter{name: name, t: m.t}, nil
}

func (m tallyMeter) Float64Histogram(name string, _ ...metric.Float64HistogramOption) (metric.Float64Histogram, error) {
	return tallyFloatHistogram{name: name, t: m.t}, nil
}

func (m tallyMeter) Int64Histogram(name string, _ ...metric.Int64HistogramOption) (metric.Int64Histogram, error) {
	return tallyIntHistogram{name: name, t: m.t}, nil
}

type tallyCounter struct {
	noop.Int64Counter
	name string
	t    *tally
}

func (c tallyCounter) Add(_ context.Context, v int64, opts ...metric.AddOption) {
	c.t.record(c.name, metric.NewAddConfig(opts).Attributes(), float64(v), 0)
}

func (tallyCounter) Enabled(context.Context) bool { return true }

type tallyFloatHistogram struct {
	noop.Float64Histogram
	name string
	t    *tally
}

func (h tallyFloatHistogram) Record(_ context.Context, v float64, opts ...metric.RecordOption) {
	h.t.record(h.name, metric.NewRecordConfig(opts).Attributes(), v, 1)
}

func (tallyFloatHistogram) Enabled(context.Context) bool { return true }

type tallyIntHistogram struct {
	noop.Int64Histogram
	name string
	t    *tally
}

func (h tallyIntHistogram) Record(_ context.Context, v int64, opts ...metric.RecordOption) {
	h.t.record(h.name, metric.NewRecordConfig(opts).Attributes(), float64(v), 1)
}

func (tallyIntHistogram) Enabled(context.Context) bool { return true }

// renderDemoMetrics writes the summary of what the story's metrics say.
func renderDemoMetrics(w io.Writer, t *tally) error {
	calls := t.get("d1idem.d1.call.duration", "", "")
	stmts := t.get("d1idem.d1.call.statements", "", "")
	d1 := "none"
	if calls.count > 0 {
		d1 = fmt.Sprintf("%d, %s on average, %.1f statements each (%s)", calls.count,
			human.Duration(time.Duration(calls.sum/float64(calls.count)*float64(time.Second))), stmts.sum/float64(max(stmts.count, 1)),
			t.by("d1idem.d1.call.duration", "d1idem.d1.call.kind", true))
	}
	fmt.Fprintln(w, "\nWhat the story's OpenTelemetry metrics say (docs/observability.md names them):")
	return printFields(w, [][2]string{
		{"  requests, by outcome", t.by("d1idem.request.duration", "d1idem.outcome", true)},
		{"  D1 calls", d1},
		{"  D1 calls, by result", t.by("d1idem.d1.call.duration", "d1idem.d1.result", true)},
		{"  completions", t.by("d1idem.completions", "d1idem.completion.result", false)},
		{"  takeovers", t.by("d1idem.takeovers", "", false)},
		{"  lease renewals", t.by("d1idem.lease.renewals", "d1idem.renewal.result", false)},
		{"  leases lost", t.by("d1idem.lease.lost", "d1idem.lease.cause", false)},
		{"  releases", t.by("d1idem.releases", "d1idem.release.result", false)},
		{"  budget sheds", t.by("d1idem.d1.budget.sheds", "", false)},
	})
}
