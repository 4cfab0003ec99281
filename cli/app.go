// Package cli is the d1idem command line: schema management for CI, key
// inspection and release for operators, sweeping and stats, a standalone
// d1local server, the bridge (a Worker serving D1's REST API past the API
// budget: written and deployed), and the demo. cmd/d1idem is its thin main; the command
// line, not this package, is the interface.
//
// Each command group has its file (schema.go, keys.go, sweep.go, stats.go,
// local.go, bridge.go, demo.go), and each command a constructor returning its
// *cli.Command and a function doing its work; the commands' descriptions,
// which their help shows, are the sections of help.txt. The work comes from idem's
// administrative API, package schema or d1local; renderers take plain values
// and write an aligned table for people or, with --json, JSON with stable
// field names for scripts. Errors are one line on stderr (JSON under --json);
// the exit status is 1 for errors and 2 for usage errors. The API token is
// never printed.
package cli

import (
	"context"
	_ "embed"
	"io"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/d1idem/d1idem"
	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/schema"
)

// Exit statuses.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

// Run runs the command line with args (args[0] is the program name) and
// returns the exit status. Nothing here calls os.Exit.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return run(ctx, newApp(stdout, stderr, &options{}), args, stderr)
}

// run runs app with args rewritten as urfave/cli parses them (see
// rewriteArgs) and reports its error on stderr: one line, JSON under --json.
func run(ctx context.Context, app *cli.App, args []string, stderr io.Writer) int {
	args = rewriteArgs(app, args)
	err := app.RunContext(ctx, args)
	code := exitCode(err)
	if code != exitOK {
		report(stderr, err, code, wantsJSON(app, args))
	}
	return code
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
	// ticker, if set, replaces time.NewTicker for stats --watch: it returns
	// the ticks and a function that stops them.
	ticker func(d time.Duration) (<-chan time.Time, func())
}

//go:embed help.txt
var helpText string

// help is the description of the command at path ("d1idem", "keys
// release"): its section of help.txt.
func help(path string) string {
	_, text, _ := strings.Cut(helpText, "\n== "+path+" ==\n")
	text, _, _ = strings.Cut(text, "\n\n== ")
	return strings.ReplaceAll(strings.TrimSuffix(text, "\n"), "{{migration}}", schema.MigrationName)
}

// commands are the command groups, in the order help lists them. A new
// group is one file with one constructor, added here.
func commands(o *options) []*cli.Command {
	return []*cli.Command{
		schemaCommand(o), keysCommand(o), sweepCommand(o), statsCommand(o), ringCommand(o), consoleCommand(o),
		localCommand(), bridgeCommand(), demoCommand(),
	}
}

// newApp is the d1idem application with the test seams o.
func newApp(stdout, stderr io.Writer, o *options) *cli.App {
	app := &cli.App{
		Name:            "d1idem",
		Usage:           "operate the d1idem Idempotency-Key ledger on Cloudflare D1",
		Description:     help("d1idem"),
		Version:         d1idem.Version(),
		Writer:          stdout,
		ErrWriter:       stderr,
		HideHelpCommand: true, // rewriteArgs turns "help PATH" into "PATH --help"
		Commands:        commands(o),
		// Errors are printed once, by run; nothing here exits the process.
		ExitErrHandler: func(*cli.Context, error) {},
		OnUsageError: func(c *cli.Context, err error, _ bool) error {
			return usagef("%s; see 'd1idem --help'", flagError(err, c.App.Flags))
		},
		Action: helpOrUnknown,
	}
	prepare(app.Commands)
	return app
}

// prepare makes every command report a bad flag value as a usage error (exit
// 2, one line) rather than urfave/cli's help dump on stdout, and gives
// commands that only group subcommands their help as their action.
func prepare(cmds []*cli.Command) {
	for _, cmd := range cmds {
		cmd.HideHelpCommand = true
		if cmd.OnUsageError == nil {
			cmd.OnUsageError = func(c *cli.Context, err error, _ bool) error {
				path := commandPath(c)
				return usagef("%s: %s; see 'd1idem %s --help'", path, flagError(err, cmd.Flags), path)
			}
		}
		if len(cmd.Subcommands) > 0 && cmd.Action == nil {
			cmd.Action = helpOrUnknown
		}
		prepare(cmd.Subcommands)
	}
}

// helpOrUnknown is the action of the app and of commands that only group
// subcommands: help without arguments, a usage error naming the closest
// command for an unknown one.
func helpOrUnknown(c *cli.Context) error {
	path, subs := strings.TrimSpace("d1idem "+commandPath(c)), c.App.Commands
	if c.Command != nil && len(c.Command.Subcommands) > 0 {
		subs = c.Command.Subcommands
	}
	name := c.Args().First()
	switch s := suggest(name, subs); {
	case !c.Args().Present() && path == "d1idem":
		return cli.ShowAppHelp(c)
	case !c.Args().Present():
		return cli.ShowSubcommandHelp(c)
	case s != "":
		return usagef("unknown command %q; did you mean '%s %s'? see '%s --help'", name, path, s, path)
	}
	return usagef("unknown command %q; see '%s --help'", name, path)
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
