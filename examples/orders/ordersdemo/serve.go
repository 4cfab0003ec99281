package ordersdemo

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/examples/orders/ordersapi"
	"github.com/d1idem/d1idem/idem"
)

// StallHeader makes the API the story plays against take as long as its
// value ("3s") before it creates the order: the slow request. The example
// API (examples/orders) honours it too, with --demo-headers.
const StallHeader = "X-Demo-Stall"

// NewAPI makes the API a Server serves, on its ledger and database.
type NewAPI func(*idem.Ledger, *d1client.Client) (http.Handler, error)

// API is the example's orders API (package ordersapi), which the story
// plays against: POST /v1/orders, guarded by the idem middleware, its
// INSERT committed with the ledger's completion, slowed by StallHeader.
func API(ledger *idem.Ledger, db *d1client.Client) (http.Handler, error) {
	return ordersapi.New(ordersapi.Config{Ledger: ledger, DB: db, DelayHeader: StallHeader})
}

// Server is an API on a loopback port, with its ledger: what a Story
// plays against.
type Server struct {
	URL    string // the API's base URL
	Ledger *idem.Ledger
	http   *http.Server
}

// Serve creates the orders table on db and serves, on a loopback port, the
// API newAPI makes (API, or a test's) with a ledger on db of this TTL
// whose metrics go to mp (nil: OpenTelemetry's global provider). The
// ledger logs nothing: the story stages a crash and a refused late answer
// on purpose. Close the Server when done.
func Serve(ctx context.Context, db *d1client.Client, ttl time.Duration, mp metric.MeterProvider, newAPI NewAPI) (*Server, error) {
	if err := ordersapi.EnsureSchema(ctx, db); err != nil {
		return nil, err
	}
	ledger, err := idem.New(db, idem.Config{TTL: ttl, Logger: slog.New(slog.DiscardHandler), MeterProvider: mp})
	if err != nil {
		return nil, err
	}
	api, err := newAPI(ledger, db)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &Server{URL: "http://" + ln.Addr().String(), Ledger: ledger, http: &http.Server{Handler: api, ReadHeaderTimeout: 5 * time.Second}}
	go func() { _ = s.http.Serve(ln) }()
	return s, nil
}

// Close stops serving.
func (s *Server) Close() error { return s.http.Close() }

// WriteNextSteps writes what to try after the story: the example API on
// its database under dir (as a shell word), an order sent to it, and the
// ledger's rows.
func WriteNextSteps(w io.Writer, dir string) error {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6], b[8] = b[6]&0x0f|0x40, b[8]&0x3f|0x80 // a version 4 UUID, the usual Idempotency-Key
	h := hex.EncodeToString(b[:])
	_, err := fmt.Fprintf(w, `
Next steps:
  1. Run the example orders API (examples/orders), its database under %[1]s:
       go run ./examples/orders --local %[1]s
  2. Send it an order (run it twice: the second answer is a replay):
       curl -i -X POST localhost:8080/v1/orders -H 'Authorization: Bearer tok_alice' \
         -H 'Idempotency-Key: %[2]s' -H 'Content-Type: application/json' -d '{"sku":"tea","qty":2}'
  3. Look at the ledger's rows:
       go run ./cmd/d1idem keys list --local %[1]s
  Then: README.md to protect your own API, docs/operators.md for a key that is stuck.
`, dir, h[:8]+"-"+h[8:12]+"-"+h[12:16]+"-"+h[16:20]+"-"+h[20:])
	return err
}
