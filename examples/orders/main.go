// Command orders serves the example orders API (see package ordersapi) with
// Idempotency-Key protection from d1idem.
//
// Against a real D1 database, it reads the conventional environment:
//
//	CLOUDFLARE_ACCOUNT_ID, CLOUDFLARE_API_TOKEN, D1_DATABASE_ID
//	CLOUDFLARE_API_BASE_URL or CLOUDFLARE_BASE_URL (optional)
//
//	go run ./examples/orders --addr 127.0.0.1:8080
//
// With --local DIR it runs on the embedded d1local instead, keeping its
// database under DIR (.d1idem, where the demo and the CLI's --local look),
// and needs no Cloudflare account:
//
//	go run ./examples/orders --local .d1idem
//	curl -i -X POST localhost:8080/v1/orders -H 'Authorization: Bearer tok_alice' \
//	     -H 'Idempotency-Key: 8e03978e-40d5-43e8-bc93-6894a57f9324' \
//	     -H 'Content-Type: application/json' -d '{"sku":"tea","qty":2}'
//	go run ./cmd/d1idem keys list --local .d1idem
//
// With --demo-headers it stages what operators rehearse: a request with
// "X-Demo-Stall: 60s" takes a minute (its key stays in progress, renewed),
// and one with "X-Demo-Crash: 1" makes the process exit mid-request, its
// key claimed and renewed by nobody, as a crashed server leaves it
// (docs/operators.md walks through it).
//
// GET /metrics serves the ledger's and the D1 client's OpenTelemetry
// metrics for Prometheus, through the OpenTelemetry Prometheus exporter
// (docs/observability.md). Every --stats-interval the API counts the
// ledger's rows (Admin.Stats, one read-only D1 call), for the gauges of
// stuck keys and the sweep backlog that docs/operators.md alerts on.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1client/budget"
	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/examples/orders/ordersapi"
	"github.com/d1idem/d1idem/idem"
)

// crashStatus is the exit status of a staged crash.
const crashStatus = 3

// flags are the command's flags.
type flags struct {
	addr, local    string
	ttl, heartbeat time.Duration
	statsInterval  time.Duration
	demoHeaders    bool
}

func main() {
	var f flags
	flag.StringVar(&f.addr, "addr", "127.0.0.1:8080", "address to serve the API on")
	flag.StringVar(&f.local, "local", "", "run on the embedded d1local, keeping the database under this directory ("+d1local.LocalDir+" is where the demo and the CLI look)")
	flag.DurationVar(&f.ttl, "ttl", 0, "the ledger's pending TTL (default 30s)")
	flag.DurationVar(&f.heartbeat, "heartbeat", 0, "how often a running request renews its key (default TTL/3)")
	flag.DurationVar(&f.statsInterval, "stats-interval", time.Minute, "how often to count the ledger's rows for the stuck-key and backlog gauges of /metrics (one D1 call each time; 0: never)")
	flag.BoolVar(&f.demoHeaders, "demo-headers", false, "honour X-Demo-Stall: DURATION (a slow request) and X-Demo-Crash: 1 (the process exits mid-request)")
	flag.Parse()
	if err := run(f); err != nil {
		fmt.Fprintln(os.Stderr, "orders:", err)
		os.Exit(1)
	}
}

func run(f flags) error {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	mp, metricsHandler, err := newMetrics()
	if err != nil {
		return err
	}
	defer mp.Shutdown(context.Background())
	db, where, inspect, closeDB, err := openDB(f.local, log, mp)
	if err != nil {
		return err
	}
	defer closeDB()
	if err := ordersapi.EnsureSchema(ctx, db); err != nil {
		return err
	}
	ledger, err := idem.New(db, idem.Config{Logger: log, TTL: f.ttl, Heartbeat: f.heartbeat, MeterProvider: mp})
	if err != nil {
		return err
	}
	if err := ledger.Check(ctx); err != nil { // fail at boot, not at the first request
		return err
	}
	if f.statsInterval > 0 {
		go countRows(ctx, ledger, f.statsInterval, log)
	}
	cfg := ordersapi.Config{Ledger: ledger, DB: db}
	if f.demoHeaders {
		cfg.DelayHeader, cfg.CrashHeader = "X-Demo-Stall", "X-Demo-Crash"
		cfg.Crash = func() {
			log.Warn("X-Demo-Crash: exiting mid-request, as a crashed server would", "status", crashStatus)
			os.Exit(crashStatus)
		}
	}
	api, err := ordersapi.New(cfg)
	if err != nil {
		return err
	}
	h := http.NewServeMux()
	h.Handle("GET /metrics", metricsHandler)
	h.Handle("/", api)
	ln, err := net.Listen("tcp", f.addr)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "orders API on http://%s (POST /v1/orders, GET /v1/orders/{id}, GET /metrics)\n", ln.Addr())
	fmt.Fprintf(os.Stderr, "its ledger and orders are in %s; look at the ledger with:\n  %s\n", where, inspect)
	return serve(ctx, ln, h)
}

// newMetrics returns a MeterProvider whose metrics the returned handler
// serves for Prometheus: OpenTelemetry's Prometheus exporter, on a registry
// of its own (with the Go runtime's and the process's collectors).
func newMetrics() (*sdkmetric.MeterProvider, http.Handler, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	exp, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, nil, err
	}
	return sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp)), promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), nil
}

// countRows counts the ledger's rows every interval until ctx ends:
// Admin.Stats records them in the d1idem.keys, d1idem.keys.stuck and
// d1idem.sweep.backlog gauges. Run it in one replica only.
func countRows(ctx context.Context, ledger *idem.Ledger, every time.Duration, log *slog.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if _, err := ledger.Admin().Stats(ctx); err != nil && ctx.Err() == nil {
			log.Warn("counting the ledger's rows for /metrics failed", "error", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// serve serves h on ln until ctx ends, then shuts down gracefully.
func serve(ctx context.Context, ln net.Listener, h http.Handler) error {
	server := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = server.Shutdown(sctx)
	}()
	if err := server.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// openDB returns the D1 database: the embedded d1local's under dir, or
// Cloudflare's from the environment; where it is, and the CLI command that
// shows its ledger.
func openDB(dir string, log *slog.Logger, mp metric.MeterProvider) (db *d1client.Client, where, inspect string, stop func(), err error) {
	if dir != "" {
		db, stop, err = startLocal(dir, mp)
		where = fmt.Sprintf("local database %q under %s", d1local.LocalDatabaseID, dir)
		return db, where, "go run ./cmd/d1idem keys list --local " + dir, stop, err
	}
	cfg := d1client.Config{
		APIToken:   os.Getenv("CLOUDFLARE_API_TOKEN"),
		AccountID:  os.Getenv("CLOUDFLARE_ACCOUNT_ID"),
		DatabaseID: os.Getenv("D1_DATABASE_ID"),
		Logger:     log,
		// The client's metrics: D1 calls, their latency, the API budget.
		MeterProvider: mp,
	}
	if cfg.APIToken == "" || cfg.AccountID == "" || cfg.DatabaseID == "" {
		return nil, "", "", nil, errors.New("set CLOUDFLARE_ACCOUNT_ID, CLOUDFLARE_API_TOKEN and D1_DATABASE_ID, or pass --local DIR for the embedded d1local")
	}
	db, err = d1client.New(cfg)
	where = "D1 database " + cfg.DatabaseID
	return db, where, "d1idem keys list --database-id " + cfg.DatabaseID, func() {}, err
}

// startLocal serves d1local, the D1-compatible server on SQLite, on a
// loopback port with its databases under dir, and returns a client of its
// database d1local.LocalDatabaseID and a function that stops the server.
func startLocal(dir string, mp metric.MeterProvider) (*d1client.Client, func(), error) {
	d1, err := d1local.New(d1local.Config{Dir: dir})
	if err != nil {
		return nil, nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		_ = d1.Close()
		return nil, nil, err
	}
	hs := &http.Server{Handler: d1, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = hs.Serve(ln) }()
	stop := func() {
		_ = hs.Close()
		_ = d1.Close()
	}
	// d1local checks neither the account ID nor, without a token, the token,
	// and has no API budget to respect.
	db, err := d1client.New(d1client.Config{BaseURL: "http://" + ln.Addr().String(), AccountID: d1local.DefaultAccountID,
		DatabaseID: d1local.LocalDatabaseID, Budget: budget.Unlimited(), MeterProvider: mp})
	if err != nil {
		stop()
		return nil, nil, err
	}
	return db, stop, nil
}
