package ordersdemo

import (
	"bytes"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1local/d1localtest"
	"github.com/d1idem/d1idem/idem"
)

// The orders API keeps every promise of the story, step by step.
func TestOrdersAPIKeepsItsPromises(t *testing.T) {
	srv := d1localtest.New(t)
	api, err := Serve(t.Context(), srv.Client, time.Second, nil, API)
	if err != nil {
		t.Fatal(err)
	}
	defer api.Close()
	var out bytes.Buffer
	s := New(Config{BaseURL: api.URL, DB: srv.Client, Ledger: api.Ledger, StallHeader: StallHeader, Out: &out})
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
	unprotected := func(_ *idem.Ledger, db *d1client.Client) (http.Handler, error) {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if d, err := time.ParseDuration(r.Header.Get(StallHeader)); err == nil {
				time.Sleep(d)
			}
			if _, err := db.Query(r.Context(), "INSERT INTO orders (id, principal, sku, qty, idempotency_key, created_at) VALUES (?, 'p', 'tea', 1, ?, 0)",
				time.Now().String()+r.RemoteAddr, r.Header.Get("Idempotency-Key")); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			w.WriteHeader(http.StatusCreated)
		}), nil
	}
	api, err := Serve(t.Context(), srv.Client, time.Second, nil, unprotected)
	if err != nil {
		t.Fatal(err)
	}
	defer api.Close()
	var out bytes.Buffer
	s := New(Config{BaseURL: api.URL, DB: srv.Client, Ledger: api.Ledger, StallHeader: StallHeader, Out: &out})
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
