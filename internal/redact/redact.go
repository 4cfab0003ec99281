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

// Format writes v for a fmt.Formatter from v's own String and GoString,
// which must not show a token: GoString for %#v when v has one, String
// quoted for %q, and String for every other verb.
func Format(f fmt.State, verb rune, v fmt.Stringer) {
	if gs, ok := v.(fmt.GoStringer); ok && verb == 'v' && f.Flag('#') {
		io.WriteString(f, gs.GoString())
		return
	}
	s := v.String()
	if verb == 'q' {
		s = strconv.Quote(s)
	}
	io.WriteString(f, s)
}
