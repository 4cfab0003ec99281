package ordersdemo

import (
	"bytes"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/d1idem/d1idem/d1local/d1localtest"
	"github.com/d1idem/d1idem/examples/orders/ordersapi"
	"github.com/d1idem/d1idem/idem"
)

// The orders API keeps every promise of the story, step by step.
func TestOrdersAPIKeepsItsPromises(t *testing.T) {
	srv := d1localtest.New(t)
	if err := ordersapi.EnsureSchema(t.Context(), srv.Client); err != nil {
		t.Fatal(err)
	}
	ledger, err := idem.New(srv.Client, idem.Config{TTL: time.Second, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	api, err := ordersapi.New(ordersapi.Config{Ledger: ledger, DB: srv.Client, DelayHeader: "X-Stall"})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(api)
	defer ts.Close()
	var out bytes.Buffer
	s := New(Config{BaseURL: ts.URL, DB: srv.Client, Ledger: ledger, StallHeader: "X-Stall", Out: &out})
	if err := s.Play(t.Context()); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if err := s.Report(t.Context()); err != nil {
		t.Fatal(err)
	}
	if len(s.Broken()) > 0 || strings.Count(out.String(), "\n      ok: ") != 11 || !strings.Contains(out.String(), "STORED RESPONSE") {
		t.Errorf("broken: %q\n%s", s.Broken(), out.String())
	}
}

// An API without the middleware breaks the promises, and the story says
// which.
func TestUnprotectedAPIBreaksThem(t *testing.T) {
	srv := d1localtest.New(t)
	if err := ordersapi.EnsureSchema(t.Context(), srv.Client); err != nil {
		t.Fatal(err)
	}
	ledger, err := idem.New(srv.Client, idem.Config{TTL: time.Second, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if d, err := time.ParseDuration(r.Header.Get("X-Stall")); err == nil {
			time.Sleep(d)
		}
		if _, err := srv.Client.Query(r.Context(), "INSERT INTO orders (id, principal, sku, qty, idempotency_key, created_at) VALUES (?, 'p', 'tea', 1, ?, 0)",
			time.Now().String()+r.RemoteAddr, r.Header.Get("Idempotency-Key")); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	defer ts.Close()
	var out bytes.Buffer
	s := New(Config{BaseURL: ts.URL, DB: srv.Client, Ledger: ledger, StallHeader: "X-Stall", Out: &out})
	if err := s.Play(t.Context()); err != nil {
		t.Fatal(err)
	}
	if len(s.Broken()) == 0 || !strings.Contains(out.String(), "BROKEN: ") {
		t.Errorf("no promise broken:\n%s", out.String())
	}
}

// Every TTL the story takes leaves its slowest request time to finish.
func TestClientTimeout(t *testing.T) {
	for _, ttl := range []time.Duration{500 * time.Millisecond, 2 * time.Second, 30 * time.Second, MaxTTL} {
		if stall := slowStall(ttl); clientTimeout(ttl) < stall+10*time.Second {
			t.Errorf("TTL %v: the client gives up after %v, before the slow request's %v stall and a margin", ttl, clientTimeout(ttl), stall)
		}
	}
	for d, want := range map[time.Duration]string{850 * time.Millisecond: "850ms", 2200 * time.Millisecond: "2s", 90 * time.Second: "1m30s", 5 * time.Minute: "5m"} {
		if got := duration(d); got != want {
			t.Errorf("duration(%v) = %q, want %q", d, got, want)
		}
	}
}
