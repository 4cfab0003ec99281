package jsonstr

import (
	"encoding/json"
	"testing"
)

// TestAppendEscapedMatchesEncodingJSON checks every byte the escape is for
// against encoding/json's spelling.
func TestAppendEscapedMatchesEncodingJSON(t *testing.T) {
	for c := 0; c < 0x20; c++ {
		check(t, byte(c))
	}
	check(t, '"')
	check(t, '\\')
}

func check(t *testing.T, c byte) {
	t.Helper()
	want, err := json.Marshal(string([]byte{c}))
	if err != nil {
		t.Fatal(err)
	}
	got := append([]byte{'"'}, AppendEscaped(nil, c)...)
	got = append(got, '"')
	if string(got) != string(want) {
		t.Errorf("byte %#x: got %s, encoding/json %s", c, got, want)
	}
}
