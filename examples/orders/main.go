// Command orders serves the example orders API (see package ordersapi) with
// Idempotency-Key protection from d1idem.
//
// Against a real D1 database, it reads the conventional environment:
//
//	CLOUDFLARE_ACCOUNT_ID, CLOUDFLARE_API_TOKEN, D1_DATABASE_ID
//	CLOUDFLARE_BASE_URL (optional; cloudflare-go's own variable)
//
//	go run ./examples/orders --addr 127.0.0.1:8080
//
// With --local DIR it runs on the embedded d1local instead, keeping the
// database under DIR, and needs no Cloudflare account:
//
//	go run ./examples/orders --local ./.d1idem
//	curl -i -X POST localhost:8080/v1/orders -H 'Authorization: Bearer tok_alice' \
//	     -H 'Idempotency-Key: 8e03978e-40d5-43e8-bc93-6894a57f9324' \
//	     -H 'Content-Type: application/json' -d '{"sku":"tea","qty":2}'
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

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/examples/orders/ordersapi"
	"github.com/d1idem/d1idem/idem"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "orders:", err)
		os.Exit(1)
	}
}

func run() error {
	addr := flag.String("addr", "127.0.0.1:8080", "address to serve the API on")
	local := flag.String("local", "", "run on the embedded d1local, keeping the database under this directory")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	var db *d1client.Client
	if *local != "" {
		var stopLocal func()
		var err error
		if db, stopLocal, err = startLocal(*local); err != nil {
			return err
		}
		defer stopLocal()
		log.Info("using the embedded d1local", "dir", *local)
	} else {
		cfg := d1client.Config{
			APIToken:   os.Getenv("CLOUDFLARE_API_TOKEN"),
			AccountID:  os.Getenv("CLOUDFLARE_ACCOUNT_ID"),
			DatabaseID: os.Getenv("D1_DATABASE_ID"),
			Logger:     log,
		}
		if cfg.APIToken == "" || cfg.AccountID == "" || cfg.DatabaseID == "" {
			return errors.New("set CLOUDFLARE_ACCOUNT_ID, CLOUDFLARE_API_TOKEN and D1_DATABASE_ID, or pass --local DIR for the embedded d1local")
		}
		var err error
		if db, err = d1client.New(cfg); err != nil {
			return err
		}
	}

	if err := ordersapi.EnsureSchema(ctx, db); err != nil {
		return err
	}
	ledger, err := idem.New(db, idem.Config{Logger: log})
	if err != nil {
		return err
	}
	h, err := ordersapi.New(ordersapi.Config{Ledger: ledger, DB: db})
	if err != nil {
		return err
	}
	server := &http.Server{Addr: *addr, Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = server.Shutdown(sctx)
	}()
	log.Info("serving the orders API", "addr", *addr)
	if err := server.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// startLocal serves d1local, the D1-compatible server on SQLite, on a
// loopback port with its databases under dir, and returns a client of its
// database "orders" and a function that stops the server.
func startLocal(dir string) (*d1client.Client, func(), error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, nil, err
	}
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
	db, err := d1client.New(d1client.Config{BaseURL: "http://" + ln.Addr().String(), AccountID: "local", DatabaseID: "orders",
		Budget: d1client.UnlimitedBudget()})
	if err != nil {
		stop()
		return nil, nil, err
	}
	return db, stop, nil
}
