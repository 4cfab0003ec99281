// Package oteltest gives tests an OpenTelemetry SDK that keeps what it
// receives in memory: a metric provider with a manual reader and a tracer
// provider with a span recorder, and helpers to read them. The library
// packages never link the SDK; their tests do, through this package.
//
// Import it from _test.go files only.
package oteltest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// Recorder is an SDK that records in memory.
type Recorder struct {
	Reader         *sdkmetric.ManualReader
	MeterProvider  *sdkmetric.MeterProvider
	Spans          *tracetest.SpanRecorder
	TracerProvider *sdktrace.TracerProvider
}

// New returns a Recorder that samples every span.
func New() *Recorder {
	r := &Recorder{Reader: sdkmetric.NewManualReader(), Spans: tracetest.NewSpanRecorder()}
	r.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(r.Reader))
	r.TracerProvider = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(r.Spans), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	return r
}

// Point is one data point of a metric: a counter's or a gauge's value, or
// a histogram's count and sum.
type Point struct {
	Metric string
	Unit   string
	Attrs  attribute.Set
	Value  float64 // counters and gauges
	Count  uint64  // histograms
	Sum    float64 // histograms
}

// Metrics is one collection.
type Metrics []Point

// Collect collects every metric the provider has.
func (r *Recorder) Collect(t testing.TB) Metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var out Metrics
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			out = append(out, points(m)...)
		}
	}
	return out
}

func points(m metricdata.Metrics) []Point {
	var out []Point
	add := func(attrs attribute.Set, v float64, count uint64, sum float64) {
		out = append(out, Point{Metric: m.Name, Unit: m.Unit, Attrs: attrs, Value: v, Count: count, Sum: sum})
	}
	switch d := m.Data.(type) {
	case metricdata.Sum[int64]:
		for _, p := range d.DataPoints {
			add(p.Attributes, float64(p.Value), 0, 0)
		}
	case metricdata.Sum[float64]:
		for _, p := range d.DataPoints {
			add(p.Attributes, p.Value, 0, 0)
		}
	case metricdata.Gauge[int64]:
		for _, p := range d.DataPoints {
			add(p.Attributes, float64(p.Value), 0, 0)
		}
	case metricdata.Gauge[float64]:
		for _, p := range d.DataPoints {
			add(p.Attributes, p.Value, 0, 0)
		}
	case metricdata.Histogram[int64]:
		for _, p := range d.DataPoints {
			add(p.Attributes, 0, p.Count, float64(p.Sum))
		}
	case metricdata.Histogram[float64]:
		for _, p := range d.DataPoints {
			add(p.Attributes, 0, p.Count, p.Sum)
		}
	}
	return out
}

// Match returns the points of the metric whose attributes include every
// one of attrs.
func (ms Metrics) Match(metric string, attrs ...attribute.KeyValue) Metrics {
	var out Metrics
	for _, p := range ms {
		if p.Metric != metric {
			continue
		}
		ok := true
		for _, kv := range attrs {
			if v, has := p.Attrs.Value(kv.Key); !has || v != kv.Value {
				ok = false
				break
			}
		}
		if ok {
			out = append(out, p)
		}
	}
	return out
}

// Value is the sum of the values of the points Match returns (a counter's
// total over the other attributes).
func (ms Metrics) Value(metric string, attrs ...attribute.KeyValue) float64 {
	var v float64
	for _, p := range ms.Match(metric, attrs...) {
		v += p.Value
	}
	return v
}

// Count is the sum of the counts of the histogram points Match returns.
func (ms Metrics) Count(metric string, attrs ...attribute.KeyValue) uint64 {
	var n uint64
	for _, p := range ms.Match(metric, attrs...) {
		n += p.Count
	}
	return n
}

// Names returns the names of the metrics collected, sorted, each once.
func (ms Metrics) Names() []string {
	var out []string
	for _, p := range ms {
		out = append(out, p.Metric)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// String lists the points, one a line, for failure messages.
func (ms Metrics) String() string {
	var b strings.Builder
	for _, p := range ms {
		fmt.Fprintf(&b, "%s{%s} value=%g count=%d\n", p.Metric, p.Attrs.Encoded(attribute.DefaultEncoder()), p.Value, p.Count)
	}
	return b.String()
}

// Ended returns the ended spans with the given name (every ended span for
// "").
func (r *Recorder) Ended(name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range r.Spans.Ended() {
		if name == "" || s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

// Attr returns the value of a span's attribute.
func Attr(s sdktrace.ReadOnlySpan, key attribute.Key) (attribute.Value, bool) {
	for _, kv := range s.Attributes() {
		if kv.Key == key {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

// NoSecrets fails t if a secret appears in anything the recorder kept: the
// name, attributes, status and events of every span, the attributes of
// every point of ms, and the instrument names.
func (r *Recorder) NoSecrets(t testing.TB, ms Metrics, secrets ...string) {
	t.Helper()
	check := func(where, s string) {
		t.Helper()
		for _, secret := range secrets {
			if secret != "" && strings.Contains(s, secret) {
				t.Errorf("%s holds the secret %q: %s", where, secret, s)
			}
		}
	}
	attrs := func(where string, kvs []attribute.KeyValue) {
		t.Helper()
		for _, kv := range kvs {
			check(where, string(kv.Key)+"="+kv.Value.String())
		}
	}
	for _, s := range r.Spans.Ended() {
		where := "span " + s.Name()
		check(where, s.Name())
		check(where+" status", s.Status().Description)
		attrs(where, s.Attributes())
		for _, e := range s.Events() {
			check(where+" event", e.Name)
			attrs(where+" event", e.Attributes)
		}
	}
	for _, p := range ms {
		check("metric", p.Metric)
		attrs("metric "+p.Metric, p.Attrs.ToSlice())
	}
}
