// Package cli is the d1idem command line: schema management for CI, key
// inspection and release for operators, sweeping and stats, a standalone
// d1local server, and the demo. cmd/d1idem is its thin main.
//
// Output is an aligned table for people and, with --json, JSON with stable
// field names for scripts. Errors are one line on stderr; the exit status is
// 1 for errors and 2 for usage errors. The API token is never printed.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/d1idem/d1idem/d1client"
)

// Exit statuses.
const (
	ExitOK    = 0
	ExitError = 1
	ExitUsage = 2
)

// usageError marks an error as the caller's misuse of the command line.
type usageError struct{ err error }

func (u usageError) Error() string { return u.err.Error() }
func (u usageError) Unwrap() error { return u.err }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// Run runs the command line with args (args[0] is the program name) and
// returns the exit status. Nothing here calls os.Exit.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return run(ctx, New(stdout, stderr), args, stderr)
}

// run runs app and turns its error into one line on stderr and an exit
// status.
func run(ctx context.Context, app *cli.App, args []string, stderr io.Writer) int {
	err := app.RunContext(ctx, args)
	if err == nil {
		return ExitOK
	}
	var exit cli.ExitCoder
	if errors.As(err, &exit) && exit.ExitCode() == ExitOK {
		return ExitOK
	}
	code := ExitError
	var ue usageError
	if errors.As(err, &ue) || strings.HasPrefix(err.Error(), "Required flag") || strings.HasPrefix(err.Error(), "flag provided but not defined") ||
		strings.HasPrefix(err.Error(), "No help topic for") {
		code = ExitUsage
	} else if errors.As(err, &exit) {
		code = exit.ExitCode()
	}
	fmt.Fprintln(stderr, "d1idem: "+oneLine(describe(err)))
	return code
}

// oneLine keeps an error to one line: operators grep logs, and scripts read
// the first line.
func oneLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		rest := strings.Count(s[i:], "\n")
		s = s[:i] + fmt.Sprintf(" (+%d more lines; use --json for details)", rest)
	}
	return s
}

// options are the seams the tests use. The zero value is what the command
// line runs with; nothing here is package-level state.
type options struct {
	// clientMods adjust the configuration of every Cloudflare (non --local)
	// client: tests give an httpmock transport and a fast retry policy.
	clientMods []func(*d1client.Config)
	// now, if set, is the clock for ages and cutoffs. When nil, D1's own
	// clock is used (unixepoch in SQL), the clock the ledger uses by default.
	now func() time.Time
	// isTerminal reports whether a writer is a terminal; nil means isatty on
	// an *os.File.
	isTerminal func(io.Writer) bool
	// budgetWindow is the window of --max-calls; 0 means 5 minutes, the
	// window of Cloudflare's API limit.
	budgetWindow time.Duration
}

// New returns the d1idem application writing to stdout and stderr.
func New(stdout, stderr io.Writer) *cli.App {
	return newApp(stdout, stderr, &options{})
}

// newApp is New with test seams.
func newApp(stdout, stderr io.Writer, o *options) *cli.App {
	app := &cli.App{
		Name:  "d1idem",
		Usage: "operate the d1idem Idempotency-Key ledger on Cloudflare D1",
		Description: `d1idem keeps Stripe-style Idempotency-Key records in a D1 table (the spec's
idempotency_keys). This tool applies and verifies that table's schema, shows and
releases keys, sweeps expired rows, reports stats, serves a local D1 (d1local),
and plays a demo.

Connect to D1 the way wrangler does, with --account-id, --api-token and
--database-id (or CLOUDFLARE_ACCOUNT_ID, CLOUDFLARE_API_TOKEN, D1_DATABASE_ID),
or --database NAME from the wrangler config (wrangler.json, wrangler.jsonc or
wrangler.toml; --env NAME for one of its environments). Use --local DIR for the
embedded d1local instead; no Cloudflare account is needed then.`,
		Writer:               stdout,
		ErrWriter:            stderr,
		HideVersion:          true,
		EnableBashCompletion: false,
		Commands: []*cli.Command{
			schemaCommand(o),
			keysCommand(o),
			sweepCommand(o),
			statsCommand(o),
			localCommand(),
			demoCommand(),
		},
		// Errors are printed once, by Run; nothing here exits the process.
		ExitErrHandler: func(*cli.Context, error) {},
		OnUsageError: func(_ *cli.Context, err error, _ bool) error {
			return usageError{err}
		},
		Action: helpOrUnknown,
	}
	// A bad flag value in any subcommand is a usage error (exit 2), reported
	// on one line, rather than urfave/cli's help dump on stdout.
	markUsageErrors(app.Commands)
	return app
}

func markUsageErrors(cmds []*cli.Command) {
	for _, cmd := range cmds {
		if cmd.OnUsageError == nil {
			cmd.OnUsageError = func(c *cli.Context, err error, _ bool) error {
				path := commandPath(c)
				return usagef("%s: %v; see 'd1idem %s --help'", path, err, path)
			}
		}
		if len(cmd.Subcommands) > 0 && cmd.Action == nil {
			cmd.Action = helpOrUnknown
		}
		markUsageErrors(cmd.Subcommands)
	}
}

// helpOrUnknown is the action of the app and of commands that only group
// subcommands: help without arguments, a usage error for an unknown command.
func helpOrUnknown(c *cli.Context) error {
	if c.Args().Present() {
		path := strings.TrimSpace("d1idem " + commandPath(c))
		return usagef("unknown command %q; see '%s --help'", c.Args().First(), path)
	}
	if c.Command != nil && c.Command.Name != "" && c.Command.Name != c.App.Name {
		return cli.ShowSubcommandHelp(c)
	}
	return cli.ShowAppHelp(c)
}

// commandPath is the command's name below the app: "keys list".
func commandPath(c *cli.Context) string {
	var names []string
	for _, x := range c.Lineage() {
		if x.Command != nil && x.Command.Name != "" && x.Command.Name != c.App.Name {
			names = append([]string{x.Command.Name}, names...)
		}
	}
	return strings.Join(names, " ")
}
