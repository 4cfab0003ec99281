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
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/examples/orders/ordersapi"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/internal/embedded"
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
		if err := os.MkdirAll(*local, 0o755); err != nil {
			return err
		}
		srv, err := embedded.Start(d1local.Config{Dir: *local}, "")
		if err != nil {
			return err
		}
		defer srv.Close()
		if db, err = srv.Client("orders"); err != nil {
			return err
		}
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
