package ordersdemo

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// Metrics sums up what the ledger and its D1 client measure through the
// OpenTelemetry API during a play, read by the SDK's ManualReader as an
// application's exporter reads them: counters' sums and histograms' counts
// and sums, by attribute.
type Metrics struct {
	// Provider is the MeterProvider to give the ledger
	// (idem.Config.MeterProvider) and its client (d1client.Config).
	Provider *sdkmetric.MeterProvider
	reader   *sdkmetric.ManualReader
}

// NewMetrics returns a Metrics; Shutdown its Provider when done.
func NewMetrics() *Metrics {
	reader := sdkmetric.NewManualReader()
	return &Metrics{Provider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)), reader: reader}
}

// tallyKey is one instrument and one of its attribute values; attr "" is
// every measurement of the instrument.
type tallyKey struct{ metric, attr, value string }

// tallyValue is a counter's sum, or a histogram's count and sum.
type tallyValue struct {
	count int64
	sum   float64
}

type tally map[tallyKey]tallyValue

// collect reads what was measured so far.
func (m *Metrics) collect(ctx context.Context) (tally, error) {
	var rm metricdata.ResourceMetrics
	if err := m.reader.Collect(ctx, &rm); err != nil {
		return nil, err
	}
	t := tally{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					t.add(m.Name, p.Attributes.ToSlice(), float64(p.Value), 0)
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					t.add(m.Name, p.Attributes.ToSlice(), p.Sum, int64(p.Count))
				}
			case metricdata.Histogram[int64]:
				for _, p := range d.DataPoints {
					t.add(m.Name, p.Attributes.ToSlice(), float64(p.Sum), int64(p.Count))
				}
			}
		}
	}
	return t, nil
}

// add adds a data point under the instrument, and under each of its
// attributes.
func (t tally) add(name string, attrs []attribute.KeyValue, sum float64, count int64) {
	keys := []tallyKey{{metric: name}}
	for _, kv := range attrs {
		keys = append(keys, tallyKey{name, string(kv.Key), kv.Value.String()})
	}
	for _, k := range keys {
		v := t[k]
		t[k] = tallyValue{count: v.count + count, sum: v.sum + sum}
	}
}

// by returns the sums (or the counts) of metric by the values of attr, as
// "value n, ...", largest first, or in all for attr ""; "none" when there
// are none.
func (t tally) by(name, attr string, counts bool) string {
	if attr == "" {
		if n := t[tallyKey{metric: name}].sum; n > 0 {
			return fmt.Sprintf("%g", n)
		}
		return "none"
	}
	type entry struct {
		value string
		n     float64
	}
	var es []entry
	for k, v := range t {
		if k.metric == name && k.attr == attr {
			n := v.sum
			if counts {
				n = float64(v.count)
			}
			es = append(es, entry{k.value, n})
		}
	}
	if len(es) == 0 {
		return "none"
	}
	slices.SortFunc(es, func(a, b entry) int { return cmp.Or(cmp.Compare(b.n, a.n), strings.Compare(a.value, b.value)) })
	parts := make([]string, len(es))
	for i, e := range es {
		parts[i] = fmt.Sprintf("%s %g", e.value, e.n)
	}
	return strings.Join(parts, ", ")
}

// WriteSummary writes what the metrics measured so far say: requests by
// outcome, D1 calls, completions, takeovers, leases, releases and budget
// sheds, under the names docs/observability.md gives them.
func (m *Metrics) WriteSummary(ctx context.Context, w io.Writer) error {
	t, err := m.collect(ctx)
	if err != nil {
		return err
	}
	calls, stmts := t[tallyKey{metric: "d1idem.d1.call.duration"}], t[tallyKey{metric: "d1idem.d1.call.statements"}]
	d1 := "none"
	if calls.count > 0 {
		d1 = fmt.Sprintf("%d, %s on average, %.1f statements each (%s)", calls.count,
			duration(time.Duration(calls.sum/float64(calls.count)*float64(time.Second))), stmts.sum/float64(max(stmts.count, 1)),
			t.by("d1idem.d1.call.duration", "d1idem.d1.call.kind", true))
	}
	fmt.Fprintln(w, "\nWhat the story's OpenTelemetry metrics say (docs/observability.md names them):")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, f := range [][2]string{
		{"requests, by outcome", t.by("d1idem.request.duration", "d1idem.outcome", true)},
		{"D1 calls", d1},
		{"D1 calls, by result", t.by("d1idem.d1.call.duration", "d1idem.d1.result", true)},
		{"completions", t.by("d1idem.completions", "d1idem.completion.result", false)},
		{"takeovers", t.by("d1idem.takeovers", "", false)},
		{"lease renewals", t.by("d1idem.lease.renewals", "d1idem.renewal.result", false)},
		{"leases lost", t.by("d1idem.lease.lost", "d1idem.lease.cause", false)},
		{"releases", t.by("d1idem.releases", "d1idem.release.result", false)},
		{"budget sheds", t.by("d1idem.d1.budget.sheds", "", false)},
	} {
		fmt.Fprintf(tw, "  %s\t%s\n", f[0], f[1])
	}
	return tw.Flush()
}
