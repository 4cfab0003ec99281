package redact

import (
	"fmt"
	"testing"
)

type shown struct{}

func (shown) Format(f fmt.State, verb rune) { Format(f, verb, "plain", "go-syntax") }

func TestFormat(t *testing.T) {
	for verb, want := range map[string]string{
		"%v": "plain", "%+v": "plain", "%s": "plain", "%d": "plain",
		"%#v": "go-syntax", "%q": `"plain"`,
	} {
		if got := fmt.Sprintf(verb, shown{}); got != want {
			t.Errorf("%s: %q, want %q", verb, got, want)
		}
	}
}

func TestToken(t *testing.T) {
	if got := Token(""); got != "" {
		t.Errorf("no token: %q, want empty", got)
	}
	if got := Token("secret-token"); got != Redacted {
		t.Errorf("a token: %q, want %q", got, Redacted)
	}
}
