// Package otelscope holds what the instrumentation of d1client and idem
// share: how a package gets its meter and tracer, and the buckets of its
// duration histograms.
package otelscope

import (
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// DurationBuckets are the bounds, in seconds, of the duration histograms.
var DurationBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}

// New returns the meter and tracer of the instrumentation scope name from
// the given providers, or from OpenTelemetry's global ones where they are
// nil.
func New(mp metric.MeterProvider, tp trace.TracerProvider, name string) (metric.Meter, trace.Tracer) {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	return mp.Meter(name), tp.Tracer(name)
}
