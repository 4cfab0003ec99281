package idem

import (
	"strings"
	"testing"
)

func TestCursor(t *testing.T) {
	c := cursor{UpdatedAt: 1767225600123, Principal: "acct \"42\"", Key: "k/1 2"}
	tok := c.encode()
	if tok != c.encode() {
		t.Fatal("encoding is not stable")
	}
	back, err := decodeCursor(tok)
	if err != nil || back != c {
		t.Fatalf("round trip: %+v, %v", back, err)
	}
	bad := []string{"", "v1", "v2." + strings.TrimPrefix(tok, "v1."), tok + "x", tok[:len(tok)-1] + "0",
		strings.Replace(tok, ".", ".A", 1), "v1.WzEsMiwzXQ.00000000", "v1.!!!.00000000"}
	// A well-formed token with a wrong shape inside.
	for _, payload := range []string{`[1,"a"]`, `{"a":1}`, `[1.5,"a","b"]`, `["1","a","b"]`} {
		bad = append(bad, cursorToken([]byte(payload)))
	}
	for _, b := range bad {
		if _, err := decodeCursor(b); err != ErrBadCursor {
			t.Errorf("decodeCursor(%q) = %v, want ErrBadCursor", b, err)
		}
	}
}
