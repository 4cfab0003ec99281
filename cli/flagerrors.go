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
		if s := closestFlag(m[1], flags); s != "" {
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

// closestFlag returns the name among flags' closest to a mistyped one, as
// suggest does for commands, or "".
func closestFlag(name string, flags []cli.Flag) string {
	var names []string
	for _, f := range flags {
		names = append(names, f.Names()...)
	}
	return closestName(name, names)
}

// requiredInt64Flag is an Int64Flag the command cannot do without: its
// help shows no default (it has none).
type requiredInt64Flag struct{ *cli.Int64Flag }

// GetDefaultText is "": a required flag has no default to show.
func (requiredInt64Flag) GetDefaultText() string { return "" }

// String is the flag's line of help, without a default.
func (f requiredInt64Flag) String() string { return cli.FlagStringer(f) }
