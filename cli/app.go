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

	"github.com/urfave/cli/v2"
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
	app := New(stdout, stderr)
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
	if errors.As(err, &ue) || strings.HasPrefix(err.Error(), "Required flag") || strings.HasPrefix(err.Error(), "flag provided but not defined") {
		code = ExitUsage
	} else if errors.As(err, &exit) {
		code = exit.ExitCode()
	}
	fmt.Fprintln(stderr, "d1idem: "+oneLine(err.Error()))
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

// New returns the d1idem application writing to stdout and stderr.
func New(stdout, stderr io.Writer) *cli.App {
	return &cli.App{
		Name:  "d1idem",
		Usage: "operate the d1idem Idempotency-Key ledger on Cloudflare D1",
		Description: `d1idem keeps Stripe-style Idempotency-Key records in a D1 table (the spec's
idempotency_keys). This tool applies and verifies that table's schema, shows and
releases keys, sweeps expired rows, reports stats, serves a local D1 (d1local),
and plays a demo.

Connect to D1 the way wrangler does, with --account-id, --api-token and
--database-id (or CLOUDFLARE_ACCOUNT_ID, CLOUDFLARE_API_TOKEN, D1_DATABASE_ID),
or --database NAME from wrangler.toml / wrangler.jsonc. Use --local DIR for the
embedded d1local instead; no Cloudflare account is needed then.`,
		Writer:               stdout,
		ErrWriter:            stderr,
		HideVersion:          true,
		EnableBashCompletion: false,
		Commands: []*cli.Command{
			schemaCommand(),
			keysCommand(),
			sweepCommand(),
			statsCommand(),
			localCommand(),
			demoCommand(),
		},
		// Errors are printed once, by Run; nothing here exits the process.
		ExitErrHandler: func(*cli.Context, error) {},
		OnUsageError: func(_ *cli.Context, err error, _ bool) error {
			return usageError{err}
		},
		CommandNotFound: func(c *cli.Context, name string) {
			fmt.Fprintf(c.App.ErrWriter, "d1idem: unknown command %q; see 'd1idem --help'\n", name)
		},
	}
}
