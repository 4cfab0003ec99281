package jsonscan

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestSpaceAndPunctuation(t *testing.T) {
	s := Scanner{Data: []byte(" \t\r\n{ }x")}
	if s.End() {
		t.Fatal("End before the object")
	}
	if s.Pos != 4 {
		t.Fatalf("End skipped to %d, want 4", s.Pos)
	}
	if s.Eat('}') || s.Pos != 4 {
		t.Fatalf("Eat('}') took '{' (Pos %d)", s.Pos)
	}
	if !s.Eat('{') || s.Peek() != '}' || !s.Eat('}') {
		t.Fatal("Eat/Peek did not read { }")
	}
	if s.Peek() != 'x' || s.End() {
		t.Fatal("x is not white space")
	}
	s.Pos++
	if s.Peek() != 0 || !s.End() || s.Eat('}') {
		t.Fatal("at the end Peek is 0, End true, and nothing is eaten")
	}
	// A form feed and a vertical tab are not JSON white space.
	for _, c := range []string{"\f", "\v", "\u00a0"} {
		s := Scanner{Data: []byte(c)}
		if s.End() {
			t.Errorf("%q taken for white space", c)
		}
	}
}

func TestLiteral(t *testing.T) {
	for _, tc := range []struct {
		in, word string
		ok       bool
		pos      int
	}{
		{"null", "null", true, 4},
		{"  true,", "true", true, 6},
		{"false]", "false", true, 5},
		{"nul", "null", false, 0},
		{"", "true", false, 0},
		{"True", "true", false, 0},
		{"nullx", "null", true, 4}, // what follows is the caller's
		{"fals", "false", false, 0},
	} {
		s := Scanner{Data: []byte(tc.in)}
		if ok := s.Literal(tc.word); ok != tc.ok || ok && s.Pos != tc.pos {
			t.Errorf("Literal(%q) on %q = %v at %d, want %v at %d", tc.word, tc.in, ok, s.Pos, tc.ok, tc.pos)
		}
	}
}

func TestArray(t *testing.T) {
	for _, tc := range []struct {
		in   string
		ok   bool
		read int // calls of elem
	}{
		{"[]", true, 0},
		{" [ ] ", true, 0},
		{"[null]", true, 1},
		{"[null, null ,null]", true, 3},
		{"[null,]", false, 2},
		{"[,null]", false, 1},
		{"[null null]", false, 1},
		{"[null", false, 1},
		{"[", false, 1},
		{"null", false, 0},
	} {
		s := Scanner{Data: []byte(tc.in)}
		read := 0
		ok := s.Array(func() bool {
			read++
			return s.Literal("null")
		})
		if ok != tc.ok || read != tc.read {
			t.Errorf("Array on %q = %v after %d elements, want %v after %d", tc.in, ok, read, tc.ok, tc.read)
		}
		if ok && !s.End() {
			t.Errorf("Array on %q left %q", tc.in, s.Data[s.Pos:])
		}
	}
}

func TestObject(t *testing.T) {
	for _, tc := range []struct {
		in   string
		ok   bool
		keys string // the keys member was called with
	}{
		{"{}", true, ""},
		{` { } `, true, ""},
		{`{"a":null}`, true, "a"},
		{`{ "a" : null , "b\u0063":null}`, true, "a,bc"},
		{`{"a":null,}`, false, "a"},
		{`{,"a":null}`, false, ""},
		{`{"a" null}`, false, ""},
		{`{"a":null "b":null}`, false, "a"},
		{`{a:null}`, false, ""},
		{`{"a":null`, false, "a"},
		{`{"a":1}`, false, "a"}, // member refuses the value
		{"{", false, ""},
		{"[]", false, ""},
	} {
		s := Scanner{Data: []byte(tc.in)}
		var keys []string
		ok := s.Object(func(key []byte) bool {
			keys = append(keys, string(key))
			return s.Literal("null")
		})
		if got := strings.Join(keys, ","); ok != tc.ok || got != tc.keys {
			t.Errorf("Object on %q = %v with keys %q, want %v with %q", tc.in, ok, got, tc.ok, tc.keys)
		}
		if ok && !s.End() {
			t.Errorf("Object on %q left %q", tc.in, s.Data[s.Pos:])
		}
	}
}

// stringCases are JSON strings with what StringBytes reads of them: want,
// or a give-up where ok is false.
var stringCases = []struct {
	in   string
	want string
	ok   bool
}{
	{`""`, "", true},
	{`"abc"`, "abc", true},
	{` "abc" ,`, "abc", true},
	{`"a long string, more than eight bytes"`, "a long string, more than eight bytes", true},
	{`"é€😀"`, "é€😀", true},
	{`"\"\\\/\b\f\n\r\t"`, "\"\\/\b\f\n\r\t", true},
	{`"x\u0000y"`, "x\x00y", true},
	{`"\u00e9\u20AC\uffff"`, "é€\uffff", true},
	{`"plain bytes, then \n an escape, then plain again"`, "plain bytes, then \n an escape, then plain again", true},
	{`"\u0041\u0042"`, "AB", true},
	{`"\\u0041"`, `\u0041`, true},
	// Surrogates, paired or not: encoding/json pairs or replaces them.
	{`"\ud83d\ude00"`, "", false},
	{`"\ud800"`, "", false},
	{`"\uDFFF"`, "", false},
	{`"a\udc00b"`, "", false},
	// Bytes that are not UTF-8, which encoding/json replaces.
	{"\"\xff\"", "", false},
	{"\"abc\xc3\"", "", false},
	{"\"\xed\xa0\x80\"", "", false}, // a surrogate in UTF-8
	{"\"\\n\xff\"", "", false},
	{"\"\xc3\\n\xa9\"", "", false}, // an escape splitting a rune
	// Not a JSON string.
	{"\"a\nb\"", "", false},
	{"\"\x00\"", "", false},
	{"\"\x1f\"", "", false},
	{"\"\\n\x01\"", "", false},
	{`"abc`, "", false},
	{`"abc\"`, "", false},
	{`"\`, "", false},
	{`"\x41"`, "", false},
	{`"\U0041"`, "", false},
	{`"\u004"`, "", false},
	{`"\u00g1"`, "", false},
	{`"\u+041"`, "", false},
	{`"\u 041"`, "", false},
	{`"\u`, "", false},
	{`'a'`, "", false},
	{`abc`, "", false},
	{``, "", false},
}

func TestStringBytes(t *testing.T) {
	for _, tc := range stringCases {
		s := Scanner{Data: []byte(tc.in)}
		got, ok := s.StringBytes()
		if ok != tc.ok || string(got) != tc.want {
			t.Errorf("StringBytes on %q = %q, %v; want %q, %v", tc.in, got, ok, tc.want, tc.ok)
			continue
		}
		if ok {
			// Pos is just after the closing quote.
			if rest := strings.TrimSpace(tc.in[s.Pos:]); tc.in[s.Pos-1] != '"' || rest != "" && rest != "," {
				t.Errorf("StringBytes on %q stopped at %d", tc.in, s.Pos)
			}
			var ref string
			text := tc.in[:s.Pos]
			if err := json.Unmarshal([]byte(text), &ref); err != nil || ref != tc.want {
				t.Errorf("encoding/json reads %q as %q, %v", text, ref, err)
			}
		}
		sv := Scanner{Data: []byte(tc.in)}
		if str, ok := sv.StringValue(); ok != tc.ok || str != tc.want || sv.Pos != s.Pos && ok {
			t.Errorf("StringValue on %q = %q, %v", tc.in, str, ok)
		}
	}
}

// TestStringBytesOwnership: a string without escapes is Data's own bytes;
// one with escapes is the scratch buffer's, reused by the next.
func TestStringBytesOwnership(t *testing.T) {
	s := Scanner{Data: []byte(`["plain", "a\tb", "c\nd"]`)}
	s.Eat('[')
	plain, _ := s.StringBytes()
	if &plain[0] != &s.Data[2] {
		t.Error("a plain string was copied")
	}
	s.Eat(',')
	first, _ := s.StringBytes()
	firstStart := &first[0]
	s.Eat(',')
	second, ok := s.StringBytes()
	if !ok || string(second) != "c\nd" {
		t.Fatalf("second = %q, %v", second, ok)
	}
	if &second[0] != firstStart {
		t.Error("the scratch buffer was not reused")
	}
	if n := testing.AllocsPerRun(100, func() {
		s.Pos = 10
		s.StringBytes()
	}); n != 0 {
		t.Errorf("an escaped string allocates %v times once the buffer is grown", n)
	}
}

// TestPlainRun: plainRun stops at the first quote, backslash or control
// character, wherever it is in the eight bytes it looks at at once.
func TestPlainRun(t *testing.T) {
	for _, stop := range []byte{'"', '\\', 0, '\n', 0x1f} {
		for n := range 20 {
			for at := range n + 1 {
				b := []byte(strings.Repeat("a\x7f é!", n)[:n])
				want := n
				if at < n {
					b[at], want = stop, at
				}
				for from := range min(at, 3) + 1 {
					if got := plainRun(b, from); got != want {
						t.Fatalf("plainRun(%q, %d) = %d, want %d", b, from, got, want)
					}
				}
			}
		}
	}
	// Bytes at and above 0x80 and just above 0x20 stand for themselves.
	b := []byte{0x20, 0x21, 0x23, 0x5b, 0x5d, 0x7f, 0x80, 0xfe, 0xff}
	if got := plainRun(b, 0); got != len(b) {
		t.Errorf("plainRun(%q) = %d", b, got)
	}
}

func TestHex4(t *testing.T) {
	for in, want := range map[string]rune{"0000": 0, "00e9": 0xe9, "ABCD": 0xabcd, "abcd": 0xabcd, "FfFf": 0xffff, "12345": 0x1234} {
		if r, ok := hex4([]byte(in)); !ok || r != want {
			t.Errorf("hex4(%q) = %#x, %v, want %#x", in, r, ok, want)
		}
	}
	for _, in := range []string{"", "123", "12g4", "+123", "0x12", " 123", "12_3"} {
		if r, ok := hex4([]byte(in)); ok {
			t.Errorf("hex4(%q) = %#x, want a give-up", in, r)
		}
	}
}

func TestNumber(t *testing.T) {
	for _, tc := range []struct {
		in, want string // want: the text read
		ok       bool
	}{
		{"0", "0", true},
		{"-0", "-0", true},
		{"7", "7", true},
		{" \n-12 ", "-12", true},
		{"123456789012345678901234567890", "123456789012345678901234567890", true},
		{"-9223372036854775809", "-9223372036854775809", true},
		{"1.5", "1.5", true},
		{"0.000", "0.000", true},
		{"1e400", "1e400", true}, // out of float64's range: the caller's to judge
		{"1E+2", "1E+2", true},
		{"1e-07", "1e-07", true},
		{"-0.5e-3,", "-0.5e-3", true},
		{"1]", "1", true},
		// A number stops where its grammar does: the rest is the caller's.
		{"01", "0", true},
		{"-01", "-0", true},
		{"0x1", "0", true},
		{"1.5.5", "1.5", true},
		// Not a number.
		{"", "", false},
		{"-", "", false},
		{"+1", "", false},
		{".5", "", false},
		{"-.5", "", false},
		{"1.", "", false},
		{"1.e5", "", false},
		{"1e", "", false},
		{"1e+", "", false},
		{"1E-", "", false},
		{"NaN", "", false},
		{"Infinity", "", false},
		{"-Infinity", "", false},
		{"- 1", "", false},
		{`"1"`, "", false},
	} {
		s := Scanner{Data: []byte(tc.in)}
		got, ok := s.Number()
		if ok != tc.ok || string(got) != tc.want {
			t.Errorf("Number on %q = %q, %v; want %q, %v", tc.in, got, ok, tc.want, tc.ok)
			continue
		}
		if !ok {
			continue
		}
		if s.Pos != strings.Index(tc.in, tc.want)+len(tc.want) {
			t.Errorf("Number on %q stopped at %d", tc.in, s.Pos)
		}
		if !json.Valid(got) {
			t.Errorf("encoding/json refuses %q", got)
		}
	}
}

// FuzzStringMatchesEncodingJSON: StringBytes reads what encoding/json reads,
// or gives up, only where the text is no JSON string or encoding/json
// would change it (a surrogate escape, bytes that are not UTF-8).
func FuzzStringMatchesEncodingJSON(f *testing.F) {
	for _, tc := range stringCases {
		f.Add(tc.in)
	}
	f.Fuzz(func(t *testing.T, in string) {
		s := Scanner{Data: []byte(in)}
		got, ok := s.StringBytes()
		var ref string
		refErr := json.Unmarshal([]byte(in), &ref)
		whole := ok && s.End()
		switch {
		case whole && refErr != nil:
			t.Fatalf("StringBytes reads %q as %q; encoding/json refuses it: %v", in, got, refErr)
		case whole && string(got) != ref:
			t.Fatalf("StringBytes reads %q as %q; encoding/json as %q", in, got, ref)
		case !ok && refErr == nil && strings.HasPrefix(strings.TrimLeft(in, " \t\r\n"), `"`) &&
			utf8.ValidString(in) && !strings.Contains(strings.ToLower(in), `\ud`):
			t.Fatalf("StringBytes gives up on %q; encoding/json reads %q", in, ref)
		}
	})
}

// FuzzNumberMatchesEncodingJSON: Number reads the whole of a text exactly
// when encoding/json takes it for a number.
func FuzzNumberMatchesEncodingJSON(f *testing.F) {
	for _, in := range []string{"0", "-0", "1e400", "01", "1.", ".5", "-", "1e", "123456789012345678901234567890", "-1.5E+07"} {
		f.Add(in)
	}
	f.Fuzz(func(t *testing.T, in string) {
		s := Scanner{Data: []byte(in)}
		_, ok := s.Number()
		whole := ok && s.End()
		first := strings.TrimLeft(in, " \t\r\n")
		refOK := json.Valid([]byte(in)) && first != "" && (first[0] == '-' || first[0] >= '0' && first[0] <= '9')
		if whole != refOK {
			t.Fatalf("Number reads all of %q: %v; encoding/json takes it for a number: %v", in, whole, refOK)
		}
	})
}
