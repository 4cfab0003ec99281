package ordersdemo

import (
	"bytes"
	"regexp"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// The summary sums counters and counts histograms by attribute, largest
// first, and says "none" for what was not measured.
func TestMetricsSummary(t *testing.T) {
	m := NewMetrics()
	defer m.Provider.Shutdown(t.Context())
	meter := m.Provider.Meter("test")
	requests, _ := meter.Float64Histogram("d1idem.request.duration")
	for _, outcome := range []string{"execute", "replay", "replay", "reused"} {
		requests.Record(t.Context(), 0.01, metric.WithAttributes(attribute.String("d1idem.outcome", outcome)))
	}
	completions, _ := meter.Int64Counter("d1idem.completions")
	completions.Add(t.Context(), 3, metric.WithAttributes(attribute.String("d1idem.completion.result", "stored")))
	calls, _ := meter.Float64Histogram("d1idem.d1.call.duration")
	calls.Record(t.Context(), 0.5, metric.WithAttributes(attribute.String("d1idem.d1.call.kind", "claim")))
	calls.Record(t.Context(), 0.1, metric.WithAttributes(attribute.String("d1idem.d1.call.kind", "complete")))
	var out bytes.Buffer
	if err := m.WriteSummary(t.Context(), &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"  requests, by outcome  replay 2, execute 1, reused 1\n",
		"  D1 calls              2, 300ms on average, 0.0 statements each (claim 1, complete 1)\n",
		"  completions           stored 3\n",
		"  takeovers             none\n",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the summary lacks %q:\n%s", want, out.String())
		}
	}
}

// The next steps run the example on the directory given, and send it an
// order under a fresh UUID key.
func TestWriteNextSteps(t *testing.T) {
	var out bytes.Buffer
	if err := WriteNextSteps(&out, "'my dir'"); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "go run ./examples/orders --local 'my dir'\n") ||
		!regexp.MustCompile(`Idempotency-Key: [0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}'`).MatchString(out.String()) {
		t.Errorf("next steps:\n%s", out.String())
	}
}
