// Package redact holds what d1client and d1local share to print a
// configuration without its token.
package redact

import (
	"fmt"
	"io"
	"strconv"
)

// Redacted stands for a token wherever one would be printed.
const Redacted = "[REDACTED]"

// Token returns what is printed for token: Redacted, or "" when none is set.
func Token(token string) string {
	if token == "" {
		return ""
	}
	return Redacted
}

// Format writes a value for a fmt.Formatter: gs for %#v, s quoted for %q,
// and s for every other verb. s and gs are the value's String and GoString,
// already redacted.
func Format(f fmt.State, verb rune, s, gs string) {
	switch {
	case verb == 'v' && f.Flag('#'):
		io.WriteString(f, gs)
	case verb == 'q':
		io.WriteString(f, strconv.Quote(s))
	default:
		io.WriteString(f, s)
	}
}
