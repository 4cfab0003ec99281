package cli

import (
	"errors"
	"fmt"
	"io"
	"log/slog"

	"github.com/urfave/cli/v2"

	"github.com/d1idem/d1idem/console"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/internal/human"
)

const envConsoleToken = "D1IDEM_CONSOLE_TOKEN"

func consoleCommand(o *options) *cli.Command {
	return &cli.Command{
		Name:        "console",
		Usage:       "serve a web console: the ledger at a glance, stuck keys and their release, lookup and paging",
		Description: help("console"),
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "listen", Value: "127.0.0.1:8789", Usage: "listen on `ADDRESS`; any but a loopback one needs --token"},
			&cli.StringFlag{Name: "token", EnvVars: []string{envConsoleToken}, Usage: "require this `TOKEN` of at least 16 characters (never printed): the browser signs in with it, a script sends it as a bearer token"},
			&cli.BoolFlag{Name: "allow-release", Usage: "let operators release the keys whose owner has gone quiet (fenced by generation, after a confirmation); without it the console only reads", DisableDefaultText: true},
			&cli.DurationFlag{Name: "refresh", Value: console.DefaultRefresh, Usage: "refresh the overview every `DURATION` (at least 1s; 0 turns it off): each refresh is 2 D1 calls per database (3 on a ring), and its counts read the whole table"},
			ttlFlag(), heartbeatFlag(),
			&cli.DurationFlag{Name: "retention", Value: idem.DefaultRetention, Usage: "the retention the sweep uses: rows last updated more than `DURATION` ago are its backlog"},
		}, connFlags()...),
		Action: o.console,
	}
}

// console serves the console until the command's context ends (Ctrl-C).
func (o *options) console(c *cli.Context) error {
	cfg, lc, err := consoleConfig(c)
	if err != nil {
		return err
	}
	ln, err := console.Listen(c.String("listen"), cfg.Token)
	if errors.Is(err, console.ErrNotLoopback) {
		err = usagef("--listen %s is not a loopback address: anyone who can reach it could read the ledger; pass --token (or set %s)", c.String("listen"), envConsoleToken)
	}
	if err != nil {
		return err
	}
	defer ln.Close()
	return o.withSet(c, existing, func(s *dbSet) error {
		l, err := o.ledger(s, lc, false)
		if err != nil {
			return err
		}
		if err := l.Check(c.Context); err != nil && !errors.Is(err, idem.ErrNoRing) {
			return ledgerErr("console", err)
		}
		cfg.Ledger, cfg.Where = l, s.where()
		for _, cn := range s.conns {
			cfg.Databases = append(cfg.Databases, console.Database{ID: cn.databaseID, Name: cn.label(), Client: cn.db})
		}
		h, err := console.New(cfg)
		if err != nil {
			return err
		}
		renderConsole(c.App.Writer, ln.Addr().String(), cfg)
		return console.Serve(c.Context, ln, h)
	})
}

// consoleConfig reads the console's flags, and its ledger's.
func consoleConfig(c *cli.Context) (console.Config, idem.Config, error) {
	var lc idem.Config
	err := noArgs(c)
	if err == nil {
		lc, err = keysConfig(c)
	}
	if err == nil {
		lc.Retention, err = positiveDuration(c, "retention")
	}
	cfg := console.Config{AllowRelease: c.Bool("allow-release"), Token: c.String("token"), Refresh: c.Duration("refresh"),
		Logger: slog.New(slog.NewTextHandler(c.App.ErrWriter, nil))}
	switch {
	case err != nil:
		return cfg, lc, err
	case cfg.Refresh == 0:
		cfg.Refresh = -1 // off
	case cfg.Refresh < minWatchInterval:
		return cfg, lc, usagef("--refresh %s is too short: each refresh is 2 D1 calls per database (3 on a ring); use at least %s, or 0 for none", cfg.Refresh, minWatchInterval)
	}
	if n := len(cfg.Token); n > 0 && n < console.MinTokenLength {
		return cfg, lc, usagef("--token is %d characters long: use at least %d (openssl rand -hex 16 makes 32)", n, console.MinTokenLength)
	}
	return cfg, lc, nil
}

// renderConsole says where the console serves, and how to reach it.
func renderConsole(w io.Writer, addr string, cfg console.Config) {
	mode, refresh := "read only: --allow-release lets operators release stuck keys", "the overview refreshes every "+human.Duration(cfg.Refresh)
	if cfg.AllowRelease {
		mode = "releasing keys is on (fenced by generation, after a confirmation)"
	}
	if cfg.Refresh < 0 {
		refresh = "the overview does not refresh by itself"
	}
	fmt.Fprintf(w, "d1idem console serving http://%s/ for the ledger on %s\n%s; %s.\n", addr, cfg.Where, mode, refresh)
	if cfg.Token != "" {
		fmt.Fprintf(w, "Sign in with the token of --token ($%s); scripts send it as \"Authorization: Bearer\".\n", envConsoleToken)
	}
	fmt.Fprintln(w, "Ctrl-C stops it.")
}
