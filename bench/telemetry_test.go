package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1client/budget"
	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/idem/idemhttp"
	"github.com/d1idem/d1idem/internal/d1test"
)

// telemetryBlock is how many requests each side serves in turn.
const telemetryBlock = 10

// guardedService is the middleware around a small handler, on its own
// d1local reached in process, reporting to the providers (nil: otel's
// global ones, which nothing in this binary sets: instrumentation off).
func guardedService(b *testing.B, mp metric.MeterProvider, tp trace.TracerProvider) http.Handler {
	b.Helper()
	local, err := d1local.New(d1local.Config{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { local.Close() })
	db, err := d1client.New(d1client.Config{BaseURL: inProcessURL, AccountID: "acct", DatabaseID: "bench",
		HTTPClient: &http.Client{Transport: inProcess{local}}, Budget: budget.Unlimited(),
		MeterProvider: mp, TracerProvider: tp})
	if err != nil {
		b.Fatal(err)
	}
	d1test.ApplySchema(b, db)
	ledger, err := idem.New(db, idem.Config{Heartbeat: -1, MeterProvider: mp, TracerProvider: tp})
	if err != nil {
		b.Fatal(err)
	}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id":"ord_1","status":"created"}`))
	})
	return idemhttp.Must(ledger, idemhttp.Options{Principal: func(*http.Request) (string, error) { return "acct", nil }})(handler)
}

// spanCounter is a span processor that counts the spans ended: the SDK
// records each span and makes its read-only snapshot for it, as for any
// processor; what an exporter then does with them is the application's
// choice, not the instrumentation's cost.
type spanCounter struct{ ended atomic.Int64 }

func (c *spanCounter) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (c *spanCounter) OnEnd(sdktrace.ReadOnlySpan)                     { c.ended.Add(1) }
func (c *spanCounter) Shutdown(context.Context) error                  { return nil }
func (c *spanCounter) ForceFlush(context.Context) error                { return nil }

// BenchmarkMiddlewareTelemetry: the process's CPU time per request through
// the middleware (1 KB body, d1local in process, as in
// BenchmarkMiddlewareOverhead) with the instrumentation off (no provider
// configured) and on (the OpenTelemetry SDK with an in-memory metric reader
// and every span sampled and recorded, each handed to a span processor). The two services take turns
// by blocks of telemetryBlock requests, so that a busy machine slows both
// alike; overhead-% is the median of the overheads of each four blocks
// (off, on, on, off), off-cpu-µs/req and on-cpu-µs/req are the means.
// Target: under 10 % overhead.
func BenchmarkMiddlewareTelemetry(b *testing.B) {
	if _, ok := processCPU(); !ok {
		b.Skip("the process's CPU time is not available on this system")
	}
	spans := &spanCounter{}
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithSpanProcessor(spans))
	defer mp.Shutdown(ctx)
	defer tp.Shutdown(ctx)
	services := [2]http.Handler{guardedService(b, nil, nil), guardedService(b, mp, tp)}
	body := bytes.Repeat([]byte("x"), 1024)
	for _, path := range []string{"first_execution", "replay"} {
		b.Run(path, func(b *testing.B) {
			serve := func(side int, key string) {
				req := httptest.NewRequest(http.MethodPost, "/v1/orders", bytes.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Idempotency-Key", key)
				rec := httptest.NewRecorder()
				services[side].ServeHTTP(rec, req)
				if rec.Code != http.StatusCreated {
					b.Fatalf("status %d: %s", rec.Code, rec.Body)
				}
			}
			key := func(i int) string {
				if path == "replay" {
					return "replayed"
				}
				return fmt.Sprintf("first-%d-%d", b.N, i)
			}
			// Both warm: connections, SQLite's caches, the replayed row.
			for side := range services {
				for i := range telemetryBlock {
					serve(side, key(-1-i))
				}
			}
			spans.ended.Store(0)
			var cpu [2]time.Duration
			var served [2]int
			var quad [2]time.Duration // of the current off, on, on, off
			var ratios []float64      // on / off of each whole quad
			b.ReportAllocs()
			b.ResetTimer()
			for start := 0; start < b.N; start += telemetryBlock {
				// Off, on, on, off, ...: a drift in the machine's load
				// weighs on both alike.
				side := [4]int{0, 1, 1, 0}[(start/telemetryBlock)%4]
				n := min(telemetryBlock, b.N-start)
				before, _ := processCPU()
				for i := range n {
					serve(side, key(start+i))
				}
				after, _ := processCPU()
				cpu[side] += after - before
				served[side] += n
				if n == telemetryBlock {
					quad[side] += after - before
				}
				if (start/telemetryBlock)%4 == 3 {
					if n == telemetryBlock {
						ratios = append(ratios, float64(quad[1])/float64(quad[0]))
					}
					quad = [2]time.Duration{}
				}
			}
			if served[0] == 0 || served[1] == 0 {
				return // too few iterations for both sides
			}
			off := float64(cpu[0].Nanoseconds()) / float64(served[0]) / 1e3
			on := float64(cpu[1].Nanoseconds()) / float64(served[1]) / 1e3
			b.ReportMetric(off, "off-cpu-µs/req")
			b.ReportMetric(on, "on-cpu-µs/req")
			// The median of the quads' ratios: a garbage collection or
			// another process's burst skews a quad, not the figure.
			overhead := 100 * (on - off) / off
			if len(ratios) > 0 {
				slices.Sort(ratios)
				overhead = 100 * (ratios[len(ratios)/2] - 1)
			}
			b.ReportMetric(overhead, "overhead-%")
			b.ReportMetric(float64(spans.ended.Load())/float64(served[1]), "spans/req")
			var rm metricdata.ResourceMetrics
			if err := reader.Collect(ctx, &rm); err != nil || len(rm.ScopeMetrics) != 2 {
				b.Fatalf("collect: %v, %d scopes, want the ledger's and the client's", err, len(rm.ScopeMetrics))
			}
		})
	}
}
