package d1local

import (
	"encoding/json"
	"slices"
	"testing"
)

func TestAppendJSONString(t *testing.T) {
	tests := []struct {
		in, want string
	}{
		{"", `""`},
		{"plain", `"plain"`},
		{`q"b\`, `"q\"b\\"`},
		{"\b\f\n\r\t", `"\b\f\n\r\t"`},
		{"\x00\x01\x1f\x7f", `"\u0000\u0001\u001f` + "\x7f" + `"`},
		{"<&>", `"<&>"`},
		{"\u2028\u2029é😀", "\"\u2028\u2029é😀\""},
		{"bad\xffutf8", "\"bad\ufffdutf8\""},
	}
	for _, tt := range tests {
		got := string(appendJSONString(nil, tt.in))
		if got != tt.want {
			t.Errorf("appendJSONString(%q) = %s, want %s", tt.in, got, tt.want)
		}
		var back string
		if err := json.Unmarshal([]byte(got), &back); err != nil {
			t.Errorf("%s is not JSON: %v", got, err)
		}
	}
}

func TestObjectLayout(t *testing.T) {
	tests := []struct {
		columns []string
		keys    []string
		cols    []int
	}{
		{nil, nil, nil},
		{[]string{"a", "b"}, []string{"a", "b"}, []int{0, 1}},
		{[]string{"a", "b", "a"}, []string{"a", "b"}, []int{2, 1}},
		{[]string{"x", "2", "1", "01", "4294967295", "4294967294", ""}, []string{"1", "2", "4294967294", "x", "01", "4294967295", ""},
			[]int{2, 1, 5, 0, 3, 4, 6}},
	}
	for _, tt := range tests {
		l := newObjectLayout(tt.columns)
		if !slices.Equal(l.keys, tt.keys) || !slices.Equal(l.cols, tt.cols) {
			t.Errorf("newObjectLayout(%q) = %q %v, want %q %v", tt.columns, l.keys, l.cols, tt.keys, tt.cols)
		}
	}
}

func TestAppendValue(t *testing.T) {
	tests := []struct {
		in   any
		want string
	}{
		{nil, "null"},
		{int64(7), "7"},
		{float64(7), "7"},
		{"s", `"s"`},
		{[]byte{}, "[]"},
		{[]byte{0, 1, 255}, "[0,1,255]"},
	}
	for _, tt := range tests {
		if got := string(appendValue(nil, tt.in)); got != tt.want {
			t.Errorf("appendValue(%#v) = %s, want %s", tt.in, got, tt.want)
		}
	}
}

// One objectEncoder writes a batch's results: each as a fresh one alone
// would, whether its columns are those of the result before or not.
func TestObjectEncoderReusesKeysOnlyForTheSameColumns(t *testing.T) {
	results := []struct {
		columns []string
		rows    [][]any
	}{
		{[]string{"a", "b"}, [][]any{{int64(1), "x"}}},
		{[]string{"a", "b"}, [][]any{{int64(2), "y"}, {int64(3), nil}}},
		{[]string{"b", "a"}, [][]any{{"z", int64(4)}}},
		{[]string{"a", "b"}, nil},
		{[]string{"a", "a", "1"}, [][]any{{int64(5), int64(6), "w"}}},
		{[]string{"a"}, [][]any{{1.5}}},
		{[]string{"a", "b"}, [][]any{{int64(7), "v"}}},
	}
	var e objectEncoder
	for i, r := range results {
		got := string(e.append([]byte("x"), r.columns, r.rows))
		want := "x" + string(new(objectEncoder).append(nil, r.columns, r.rows))
		if got != want {
			t.Errorf("result %d: %s, want %s", i, got, want)
		}
	}
	if got := string(new(objectEncoder).append(nil, []string{"a", "a", "1"}, [][]any{{int64(5), int64(6), "w"}})); got != `[{"1":"w","a":6}]` {
		t.Errorf("duplicate and index columns: %s", got)
	}
	if got := string(new(objectEncoder).append(nil, []string{"a"}, nil)); got != `[]` {
		t.Errorf("no rows: %s", got)
	}
}
