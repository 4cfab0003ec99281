package cli

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/d1idem/d1idem/d1local"
)

func localCommand() *cli.Command {
	return &cli.Command{
		Name:  "local",
		Usage: "run d1local, a D1-compatible REST server on SQLite",
		Description: `d1local serves D1's REST API on SQLite, with D1's envelope, errors, limits and
authorizer: a local D1 for development and tests, with no Cloudflare account,
that wrangler's d1 commands accept. Every other command reaches it with --local DIR (in process)
or --base-url (a running server).

   d1idem local serve --dir ./.d1idem --addr 127.0.0.1:8787`,
		Subcommands: []*cli.Command{{
			Name:  "serve",
			Usage: "serve the D1 REST API on a local address",
			Description: `Serves D1's REST API (query, raw, import, export, database list, get, create
and delete, token verification and account lookup), one SQLite file per database
ID under --dir (in memory without it). Point any D1 REST client, or wrangler, at
it:

   d1idem local serve --dir ./.d1idem --addr 127.0.0.1:8787
   export CLOUDFLARE_BASE_URL=http://127.0.0.1:8787/client/v4       # d1idem, cloudflare-go
   export CLOUDFLARE_API_BASE_URL=http://127.0.0.1:8787/client/v4   # wrangler
   wrangler d1 execute DB --remote --file schema.sql

On any address but a loopback one (0.0.0.0 in a container, say) it refuses to
start without --token: it runs any SQL for anyone who can reach it.
--budget 1200/300s plays Cloudflare's account API limit (off by default).
Stop it with Ctrl-C.`,
			Flags: []cli.Flag{
				&cli.StringFlag{Name: "dir", Usage: "keep databases under `DIR` (default: in memory)"},
				&cli.StringFlag{Name: "addr", Value: "127.0.0.1:8787", Usage: "listen `ADDRESS`"},
				&cli.StringFlag{Name: "token", EnvVars: []string{"D1LOCAL_TOKEN"}, Usage: "require this bearer token (403 code 10000 otherwise); needed off loopback"},
				&cli.BoolFlag{Name: "no-auto-create", Usage: "create no database on first use (404 code 7404 instead) and no --dir: it must exist"},
				&cli.StringFlag{Name: "budget", Value: "off", Usage: "the account's API budget, `CALLS/WINDOW` such as 1200/300s: 429 code 971 for 300 s once spent"},
			},
			Action: serveLocal,
		}},
	}
}

func serveLocal(c *cli.Context) error {
	if c.Args().Present() {
		return usagef("local serve takes no arguments (got %q)", c.Args().First())
	}
	budget, err := d1local.ParseBudget(c.String("budget"))
	if err != nil {
		return usagef("--budget: %v", err)
	}
	dir := c.String("dir")
	if dir != "" && !c.Bool("no-auto-create") {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("--dir %s: %w", dir, err)
		}
	}
	log := slog.New(slog.NewTextHandler(c.App.ErrWriter, nil))
	srv, err := d1local.New(d1local.Config{Dir: dir, Token: c.String("token"), NoAutoCreate: c.Bool("no-auto-create"),
		Budget: budget, Logger: log})
	if err != nil {
		return err
	}
	defer srv.Close()
	ln, err := net.Listen("tcp", c.String("addr"))
	if err != nil {
		return fmt.Errorf("listening on %s: %w", c.String("addr"), err)
	}
	if tcp, ok := ln.Addr().(*net.TCPAddr); (!ok || !tcp.IP.IsLoopback()) && c.String("token") == "" {
		ln.Close()
		return usagef("--addr %s is not a loopback address: anyone who can reach it could run any SQL; pass --token (or set D1LOCAL_TOKEN)", c.String("addr"))
	}
	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second}
	where := dir
	if where == "" {
		where = "memory"
	}
	fmt.Fprintf(c.App.Writer, "d1local serving http://%s (databases in %s); API base URL http://%s/client/v4\n", ln.Addr(), where, ln.Addr())
	fmt.Fprintf(c.App.Writer, "look at a ledger here: d1idem keys list --base-url http://%s/client/v4 --account-id local --api-token %s --database-id ID\n",
		ln.Addr(), cmp.Or(tokenHint(c.String("token")), "local"))
	done := make(chan error, 1)
	go func() { done <- hs.Serve(ln) }()
	select {
	case err := <-done:
		return err
	case <-c.Context.Done():
	}
	_ = hs.Close()
	if err := <-done; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// tokenHint stands for a required token in a hint, which never shows it.
func tokenHint(token string) string {
	if token == "" {
		return ""
	}
	return "$D1LOCAL_TOKEN"
}
