package cli

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"

	"github.com/urfave/cli/v2"

	"github.com/d1idem/d1idem/d1local"
)

func localCommand() *cli.Command {
	return &cli.Command{
		Name:        "local",
		Usage:       "run d1local, a D1-compatible REST server on SQLite",
		Description: help("local"),
		Subcommands: []*cli.Command{{
			Name:        "serve",
			Usage:       "serve the D1 REST API on a local address",
			Description: help("local serve"),
			Flags: []cli.Flag{
				&cli.StringFlag{Name: "dir", Usage: "keep databases under `DIR` (default: in memory)"},
				&cli.StringFlag{Name: "addr", Value: "127.0.0.1:8787", Usage: "listen `ADDRESS`"},
				&cli.StringFlag{Name: "token", EnvVars: []string{"D1LOCAL_TOKEN"}, Usage: "require this bearer `TOKEN` (403 code 10000 otherwise); needed off loopback"},
				&cli.BoolFlag{Name: "auto-create", Usage: "create a database on its first query, raw, import or export call, which D1 never does (by default only a create call does: 404 code 7404 instead)", DisableDefaultText: true},
				// The default since databases are created only on request;
				// kept for scripts, with its other effect: no --dir is made.
				&cli.BoolFlag{Name: "no-auto-create", Hidden: true, Usage: "create no --dir either: it must exist"},
				&cli.StringFlag{Name: "rate-limit", Value: "off", Usage: "play the account's API rate limit, `CALLS/WINDOW` such as 1200/300s: 429 code 971 for 300 s once spent"},
				// The flag's first name, kept for scripts.
				&cli.StringFlag{Name: "budget", Hidden: true, Usage: "--rate-limit's former name"},
			},
			Action: serveLocal,
		}},
	}
}

func serveLocal(c *cli.Context) error {
	cfg, err := localServeConfig(c)
	if err != nil {
		return err
	}
	addr := c.String("addr")
	if tcp, err := net.ResolveTCPAddr("tcp", addr); err == nil && !tcp.IP.IsLoopback() && cfg.Token == "" {
		return usagef("--addr %s is not a loopback address: anyone who can reach it could run any SQL; pass --token (or set D1LOCAL_TOKEN)", addr)
	}
	l, err := d1local.Listen(cfg, addr)
	if err != nil {
		return err
	}
	renderServing(c.App.Writer, l.Addr.String(), cfg)
	return l.Wait(c.Context)
}

// localServeConfig is the d1local configuration of local serve's flags. It
// makes --dir unless --no-auto-create says it must exist.
func localServeConfig(c *cli.Context) (d1local.Config, error) {
	if c.Args().Present() {
		return d1local.Config{}, usagef("local serve takes no arguments (got %q)", c.Args().First())
	}
	if c.Bool("auto-create") && c.Bool("no-auto-create") {
		return d1local.Config{}, usagef("--auto-create and --no-auto-create contradict each other; pass one")
	}
	name := "rate-limit"
	if c.IsSet("budget") {
		name = "budget"
	}
	limit, err := d1local.ParseRateLimit(c.String(name))
	if err != nil {
		return d1local.Config{}, usagef("--%s: %v", name, err)
	}
	dir := c.String("dir")
	if dir != "" && !c.Bool("no-auto-create") {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return d1local.Config{}, fmt.Errorf("--dir %s: %w", dir, err)
		}
	}
	return d1local.Config{Dir: dir, Token: c.String("token"), NoAutoCreate: !c.Bool("auto-create"), RateLimit: limit,
		Logger: slog.New(slog.NewTextHandler(c.App.ErrWriter, nil))}, nil
}

// renderServing says where the server listens, and how to point d1idem,
// wrangler and a service at it: commands to paste, without the token.
func renderServing(w io.Writer, addr string, cfg d1local.Config) {
	where := cfg.Dir
	if where == "" {
		where = "memory"
	}
	base := "http://" + addr + "/client/v4"
	fmt.Fprintf(w, "d1local serving http://%s (databases in %s); API base URL %s\n", addr, where, base)
	token := "local"
	if cfg.Token != "" {
		token = `"$D1LOCAL_TOKEN"` // a hint never shows the token
	}
	fmt.Fprintf(w, "Point d1idem, wrangler and your service at it (in another shell):\n  export CLOUDFLARE_BASE_URL=%s CLOUDFLARE_API_BASE_URL=%[1]s\n  export CLOUDFLARE_API_TOKEN=%s CLOUDFLARE_ACCOUNT_ID=local\n", base, token)
	create := "only 'd1idem schema apply' or 'wrangler d1 create NAME' creates one"
	if !cfg.NoAutoCreate {
		create = "--auto-create: any call creates one"
	}
	fmt.Fprintf(w, "Then create a ledger's database (%s) and look at it:\n  d1idem schema apply --database-id orders\n  d1idem keys list --database-id orders\n", create)
}
