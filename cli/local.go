package cli

import (
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
		Description: `d1local serves D1's REST API (query and raw) on SQLite, with D1's envelope,
errors, limits and authorizer: a local D1 for development and tests, with no
Cloudflare account. Every other command reaches it with --local DIR (in process)
or --base-url (a running server).

   d1idem local serve --dir ./.d1idem --addr 127.0.0.1:8787`,
		Subcommands: []*cli.Command{{
			Name:  "serve",
			Usage: "serve the D1 REST API (query and raw) on a local address",
			Description: `Serves POST /accounts/{account}/d1/database/{db}/query and /raw, one SQLite
file per database ID under --dir (in memory without it). Point any D1 REST client
at it:

   d1idem local serve --dir ./.d1idem --addr 127.0.0.1:8787
   export CLOUDFLARE_BASE_URL=http://127.0.0.1:8787

Stop it with Ctrl-C.`,
			Flags: []cli.Flag{
				&cli.StringFlag{Name: "dir", Usage: "keep databases under `DIR` (default: in memory)"},
				&cli.StringFlag{Name: "addr", Value: "127.0.0.1:8787", Usage: "listen `ADDRESS`"},
				&cli.StringFlag{Name: "token", EnvVars: []string{"D1LOCAL_TOKEN"}, Usage: "require this bearer token (403 code 10000 otherwise)"},
				&cli.BoolFlag{Name: "no-auto-create", Usage: "answer 404 (code 7404) for unknown databases instead of creating them"},
			},
			Action: serveLocal,
		}},
	}
}

func serveLocal(c *cli.Context) error {
	if c.Args().Present() {
		return usagef("local serve takes no arguments (got %q)", c.Args().First())
	}
	dir := c.String("dir")
	if dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("--dir %s: %w", dir, err)
		}
	}
	log := slog.New(slog.NewTextHandler(c.App.ErrWriter, nil))
	srv, err := d1local.New(d1local.Config{Dir: dir, Token: c.String("token"), NoAutoCreate: c.Bool("no-auto-create"), Logger: log})
	if err != nil {
		return err
	}
	defer srv.Close()
	ln, err := net.Listen("tcp", c.String("addr"))
	if err != nil {
		return fmt.Errorf("listening on %s: %w", c.String("addr"), err)
	}
	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second}
	where := dir
	if where == "" {
		where = "memory"
	}
	fmt.Fprintf(c.App.Writer, "d1local serving http://%s (databases in %s)\n", ln.Addr(), where)
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
