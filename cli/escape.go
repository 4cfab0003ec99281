package cli

import "github.com/d1idem/d1idem/internal/textsafe"

// Terminal-safe output. A value the CLI read (from the ledger, a database,
// D1's answers) may hold any UTF-8, and a terminal obeys the control
// characters it gets: ESC sequences retitle the window, clear the screen or
// rewrite what was printed. So nothing the CLI prints of such a value
// reaches the terminal raw unless it is printable, by the rule of package
// textsafe, which the console shares: display for a value in a table or a
// field (Go-quoted when not plain), escapeText for free text (errors,
// lines, cells), shellQuote for a value in a command printed to be pasted,
// textsafe.JSON for every JSON the CLI prints.

func display(s string) string    { return textsafe.Display(s) }
func escapeText(s string) string { return textsafe.Escape(s) }

// shellQuote is textsafe.ShellQuote. A NUL byte cannot be in an argument:
// see principalArg.
func shellQuote(s string) string { return textsafe.ShellQuote(s) }
