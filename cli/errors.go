package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/d1idem/d1idem"
	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/internal/textsafe"
)

// usageError marks an error as the caller's misuse of the command line:
// exit status 2. It is set where the misuse is detected, urfave/cli's own
// flag errors included (through OnUsageError).
type usageError struct{ err error }

func (u usageError) Error() string { return u.err.Error() }
func (u usageError) Unwrap() error { return u.err }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// hintedError is an error with advice that only its command can give (a
// flag of its own, say), which describe adds at the end of its line.
type hintedError struct {
	err  error
	hint string
}

func (h hintedError) Error() string { return h.err.Error() }
func (h hintedError) Unwrap() error { return h.err }

// exitCode is the exit status for a command's error.
func exitCode(err error) int {
	var exit cli.ExitCoder
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, new(usageError)):
		return exitUsage
	case errors.As(err, &exit):
		return exit.ExitCode()
	}
	return exitError
}

// report writes err on stderr: "d1idem: ...", or under --json {"error": {...}}.
func report(stderr io.Writer, err error, code int, asJSON bool) {
	msg := describe(err)
	if !asJSON {
		fmt.Fprintln(stderr, "d1idem: "+msg)
		return
	}
	b, _ := json.Marshal(struct {
		Error errorJSON `json:"error"`
	}{errorJSONOf(err, msg, code)})
	fmt.Fprintf(stderr, "%s\n", textsafe.JSON(b))
}

// errorJSON is an error under --json.
type errorJSON struct {
	Message  string   `json:"message"`
	ExitCode int      `json:"exit_code"`
	Usage    bool     `json:"usage"`
	D1       *d1JSON  `json:"d1,omitempty"`
	Missing  *string  `json:"missing_database,omitempty"`
	Have     []string `json:"have,omitempty"`
}

// d1JSON is the D1 failure behind an error.
type d1JSON struct {
	HTTPStatus       int    `json:"http_status"`
	Codes            []int  `json:"codes"`
	Message          string `json:"message"`
	RetryAfterMS     int64  `json:"retry_after_ms,omitempty"`
	MayHaveCommitted bool   `json:"may_have_committed"`
	Attempts         int    `json:"attempts"`
}

func errorJSONOf(err error, msg string, code int) errorJSON {
	out := errorJSON{Message: msg, ExitCode: code, Usage: code == exitUsage}
	var de *d1client.Error
	if errors.As(err, &de) {
		codes := de.Codes
		if codes == nil {
			codes = []int{}
		}
		out.D1 = &d1JSON{HTTPStatus: de.StatusCode, Codes: codes, Message: clip(de.Message), RetryAfterMS: de.RetryAfter.Milliseconds(),
			MayHaveCommitted: de.MayHaveCommitted(), Attempts: de.Attempts}
	}
	var nd *noDatabaseError
	if errors.As(err, &nd) {
		out.Missing, out.Have = &nd.id, nd.have
	}
	return out
}

// describe turns an error into the one line an operator reads on stderr;
// a D1 failure as d1client.Error.Explain says it.
func describe(err error) string {
	line := describeLine(err)
	if h := (hintedError{}); errors.As(err, &h) {
		line += "; " + h.hint
	}
	return line
}

// describeLine is describe without a command's own hint.
func describeLine(err error) string {
	var de *d1client.Error
	if !errors.As(err, &de) || errors.As(err, new(*noDatabaseError)) {
		return collapse(err.Error())
	}
	// The context the command added ("keys get: ..."), without the D1 error.
	prefix := ""
	if full, inner := err.Error(), de.Error(); full != inner && strings.HasSuffix(full, inner) {
		prefix = strings.TrimSuffix(full, inner)
	}
	line := prefix + de.Explain()
	if missingTable(err) && !errors.As(err, new(hintedError)) {
		line += "; " + applyHint("") // conn.named gives the flags
	}
	return collapse(line)
}

// missingTable reports whether err is D1's for a missing ledger table.
func missingTable(err error) bool {
	var de *d1client.Error
	return errors.As(err, &de) && errors.Is(de, d1client.ErrSQL) && strings.Contains(de.Message, "no such table: "+d1idem.Table)
}

// applyHint says to run the schema apply, with these connection flags.
func applyHint(flags string) string {
	return "the ledger table is missing: run 'd1idem schema apply" + flags + "'"
}

// collapse makes s one line safe on a terminal (textsafe.Line), cut to
// maxErrorLine.
func collapse(s string) string { return clip(textsafe.Line(s)) }

// maxErrorLine bounds the text of an error line, in bytes.
const maxErrorLine = 2048

// clip cuts s to at most maxErrorLine bytes, and says how much it left out.
func clip(s string) string {
	p, more := preview(s, maxErrorLine)
	if more == 0 {
		return s
	}
	return fmt.Sprintf("%s... (%d more bytes)", p, more)
}

// configUsage turns an invalid ledger configuration from flags into a
// usage error naming the flag of the field.
func configUsage(err error) error {
	var ce *idem.ConfigError
	if !errors.As(err, &ce) {
		return err
	}
	if flag := map[string]string{"Config.TTL": "--ttl", "Config.Heartbeat": "--heartbeat", "Config.Retention": "--retention", "Config.SweepBatch": "--batch"}[ce.Field]; flag != "" {
		return usagef("%s %s is out of range: %s", flag, ce.Value, ce.Want)
	}
	return err
}

// ledgerErr prefixes an error of the administrative API with the command,
// leaving out the ledger's own prefix before a D1 error.
func ledgerErr(cmd string, err error) error {
	var de *d1client.Error
	if errors.As(err, &de) {
		return fmt.Errorf("%s: %w", cmd, de)
	}
	return fmt.Errorf("%s: %w", cmd, err)
}
