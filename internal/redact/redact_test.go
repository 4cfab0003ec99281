package redact

import (
	"fmt"
	"testing"
)

type shown struct{}

func (shown) String() string                  { return "plain" }
func (shown) GoString() string                { return "go-syntax" }
func (v shown) Format(f fmt.State, verb rune) { Format(f, verb, v) }

// plain has no GoString: %#v prints its String.
type plain struct{}

func (plain) String() string                  { return "plain" }
func (v plain) Format(f fmt.State, verb rune) { Format(f, verb, v) }

func TestFormat(t *testing.T) {
	for verb, want := range map[string]string{
		"%v": "plain", "%+v": "plain", "%s": "plain", "%d": "plain",
		"%#v": "go-syntax", "%q": `"plain"`,
	} {
		if got := fmt.Sprintf(verb, shown{}); got != want {
			t.Errorf("%s: %q, want %q", verb, got, want)
		}
	}
	if got := fmt.Sprintf("%#v", plain{}); got != "plain" {
		t.Errorf("%%#v without GoString: %q, want String's", got)
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
