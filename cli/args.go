package cli

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/d1idem/d1idem/internal/human"
)

// rewriteArgs returns args as urfave/cli should parse them. urfave/cli reads
// a flag only at the level that defines it, so flags given before the
// command ("d1idem --local DIR stats") move to just after the command path
// ("d1idem stats --local DIR"), and "help PATH" becomes "PATH --help". It
// stops reading flags at the first argument, so a command's arguments move
// after its flags ("bridge init DIR --database X" is "bridge init
// --database X DIR"). A word that is not a command stops the walk; the
// command above it then reports it.
func rewriteArgs(app *cli.App, args []string) []string {
	if len(args) < 2 {
		return args
	}
	kinds := flagKinds(app)
	var path, hoisted []string
	cmds, help, leaf, rest := app.Commands, false, false, args[1:]
	for len(rest) > 0 && rest[0] != "--" && !leaf {
		tok := rest[0]
		if isFlag(tok) {
			n := flagWidth(tok, rest, kinds)
			hoisted, rest = append(hoisted, rest[:n]...), rest[n:]
			continue
		}
		if (tok == "help" || tok == "h") && !help {
			help, rest = true, rest[1:]
			continue
		}
		cmd := findCommand(cmds, tok)
		if cmd == nil {
			break // an unknown command: the group above reports it
		}
		path, cmds, rest = append(path, tok), cmd.Subcommands, rest[1:]
		leaf = len(cmds) == 0
	}
	out := append([]string{args[0]}, path...)
	if !leaf {
		// What is left goes first, for the group's action to see an
		// unknown command before any flag.
		out, rest = append(out, rest...), nil
	}
	out = append(out, hoisted...)
	if help {
		out = append(out, "--help")
	}
	return append(out, flagsFirst(rest, kinds)...)
}

// flagsFirst returns a command's arguments with its flags (and their
// values) first, in their order, then the other arguments; from "--" on,
// everything is left as it is.
func flagsFirst(rest []string, kinds map[string]bool) []string {
	var flags, others []string
	for len(rest) > 0 && rest[0] != "--" {
		if !isFlag(rest[0]) {
			others, rest = append(others, rest[0]), rest[1:]
			continue
		}
		n := flagWidth(rest[0], rest, kinds)
		flags, rest = append(flags, rest[:n]...), rest[n:]
	}
	return append(append(flags, others...), rest...)
}

// isFlag reports whether an argument is a flag ("-x", "--name", "--name=v").
func isFlag(arg string) bool { return len(arg) > 1 && arg[0] == '-' && arg != "--" }

// flagName returns a flag argument's name and whether it carries its value ("--name=value").
func flagName(arg string) (string, bool) {
	name := strings.TrimLeft(arg, "-")
	if i := strings.IndexByte(name, '='); i >= 0 {
		return name[:i], true
	}
	return name, false
}

// flagWidth is how many arguments the flag at rest[0] spans: two when it
// takes a value given separately, else one.
func flagWidth(arg string, rest []string, kinds map[string]bool) int {
	name, inline := flagName(arg)
	if takesValue := kinds[name]; takesValue && !inline && len(rest) > 1 {
		return 2
	}
	return 1
}

// flagKinds maps every flag name of the app and its commands to whether it
// takes a value (every flag but the boolean ones). A name means the same
// kind of flag in every command (TestFlagKindsAgree).
func flagKinds(app *cli.App) map[string]bool {
	kinds := map[string]bool{}
	var walk func([]cli.Flag, []*cli.Command)
	walk = func(flags []cli.Flag, cmds []*cli.Command) {
		for _, f := range flags {
			_, isBool := f.(*cli.BoolFlag)
			for _, n := range f.Names() {
				kinds[n] = !isBool
			}
		}
		for _, c := range cmds {
			walk(c.Flags, c.Subcommands)
		}
	}
	walk(app.Flags, app.Commands)
	return kinds
}

func findCommand(cmds []*cli.Command, name string) *cli.Command {
	for _, c := range cmds {
		if c.HasName(name) {
			return c
		}
	}
	return nil
}

// wantsJSON reports whether args ask for JSON output: a --json flag before
// "--" that is not another flag's value. Errors are then JSON too, even
// those found before the flags were parsed.
func wantsJSON(app *cli.App, args []string) bool {
	kinds := flagKinds(app)
	for i := 1; i < len(args) && args[i] != "--"; i++ {
		if !isFlag(args[i]) {
			continue
		}
		name, inline := flagName(args[i])
		if name == flagJSON {
			if !inline {
				return true
			}
			v, err := strconv.ParseBool(args[i][strings.IndexByte(args[i], '=')+1:])
			return err == nil && v
		}
		i += flagWidth(args[i], args[i:], kinds) - 1
	}
	return false
}

// suggest returns the name among those of items (commands or flags)
// closest to a mistyped one ("kyes": "keys", "stat": "stats", "aply":
// "apply"), or "" when none is close: at most one edit (two for names of
// five letters or more), an adjacent swap counting as one.
func suggest[T interface{ Names() []string }](name string, items []T) string {
	best, bestDist := "", 3
	for _, it := range items {
		for _, n := range it.Names() {
			if d := editDistance(name, n); d <= 1+min(len(n)/5, 1) && d < bestDist {
				best, bestDist = n, d
			}
		}
	}
	return best
}

// editDistance is the optimal string alignment distance of a and b:
// insertions, deletions, substitutions and swaps of adjacent letters.
func editDistance(a, b string) int {
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}

// The errors of Go's flag package, which urfave/cli passes on: they name
// a flag with one dash and give no valid value.
var (
	undefinedFlagError = regexp.MustCompile(`^flag provided but not defined: -+(.+)$`)
	missingValueError  = regexp.MustCompile(`^flag needs an argument: -+(.+)$`)
	invalidValueError  = regexp.MustCompile(`^invalid (boolean )?value (".*") for (?:flag )?-+([^:]+): (.*)$`)
)

// flagError rewrites an error of Go's flag package about one of flags:
// the flag as it is typed, with two dashes, what is wrong with the value,
// and a valid example. Other errors are returned as they are.
func flagError(err error, flags []cli.Flag) string {
	msg := err.Error()
	if m := undefinedFlagError.FindStringSubmatch(msg); m != nil {
		if s := suggest(m[1], flags); s != "" {
			return fmt.Sprintf("unknown flag --%s (did you mean --%s?)", m[1], s)
		}
		return fmt.Sprintf("unknown flag --%s", m[1])
	}
	if m := missingValueError.FindStringSubmatch(msg); m != nil {
		return fmt.Sprintf("--%s needs a value, such as %s", m[1], flagExample(m[1], flags))
	}
	if m := invalidValueError.FindStringSubmatch(msg); m != nil {
		name, value := m[3], m[2]
		if m[1] != "" {
			return fmt.Sprintf("--%s takes no value (got %s): give --%[1]s alone, or leave it out", name, value)
		}
		return fmt.Sprintf("--%s %s is %s; give it as %s", name, value, whatsWrong(name, m[4], flags), flagExample(name, flags))
	}
	return msg
}

// findFlag returns the flag of flags with this name, or nil.
func findFlag(name string, flags []cli.Flag) cli.Flag {
	for _, f := range flags {
		for _, n := range f.Names() {
			if n == name {
				return f
			}
		}
	}
	return nil
}

// whatsWrong says why the flag's parser refused a value ("parse error",
// "value out of range").
func whatsWrong(name, cause string, flags []cli.Flag) string {
	if strings.Contains(cause, "out of range") {
		return "out of range"
	}
	switch findFlag(name, flags).(type) {
	case *cli.DurationFlag:
		return "not a duration (a number with its unit: ms, s, m or h)"
	case *cli.IntFlag, *cli.Int64Flag, requiredInt64Flag:
		return "not a whole number"
	}
	return "not a value it takes (" + cause + ")"
}

// flagExample is the flag with a value it takes: its default when it has
// one, else one of its kind ("--older-than 10m", "--generation 1"), else
// the placeholder of its help ("--principal PRINCIPAL").
func flagExample(name string, flags []cli.Flag) string {
	value := "VALUE"
	switch f := findFlag(name, flags).(type) {
	case *cli.DurationFlag:
		value = human.Arg(positiveOr(f.Value, 10*time.Minute))
	case *cli.IntFlag:
		value = strconv.Itoa(positiveOr(f.Value, 1))
	case *cli.Int64Flag:
		value = strconv.FormatInt(positiveOr(f.Value, 1), 10)
	case requiredInt64Flag:
		value = strconv.FormatInt(positiveOr(f.Value, 1), 10)
	case cli.DocGenerationFlag:
		if p, _ := unquotedPlaceholder(f.GetUsage()); p != "" {
			value = p
		}
	}
	return "--" + name + " " + value
}

// positiveOr returns v, or def when v is zero or less.
func positiveOr[T int | int64 | time.Duration](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
}

// unquotedPlaceholder is the placeholder of a flag's usage: its first
// back-quoted word, as urfave/cli's help shows it.
func unquotedPlaceholder(usage string) (string, bool) {
	_, rest, ok := strings.Cut(usage, "`")
	if !ok {
		return "", false
	}
	p, _, ok := strings.Cut(rest, "`")
	return p, ok
}

// requiredInt64Flag is an Int64Flag the command cannot do without: its
// help shows no default (it has none).
type requiredInt64Flag struct{ *cli.Int64Flag }

// GetDefaultText is "": a required flag has no default to show.
func (requiredInt64Flag) GetDefaultText() string { return "" }

// String is the flag's line of help, without a default.
func (f requiredInt64Flag) String() string { return cli.FlagStringer(f) }
