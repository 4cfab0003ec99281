// Package jsonscan holds the one set of JSON reading primitives that
// d1client's response decoder and d1local's request decoder share: white
// space, punctuation, literals, strings, numbers, arrays and objects, read
// in one pass over the bytes. Each reads exactly what encoding/json would
// accept and decode to the same value, and gives up (false) on everything
// else, and on what encoding/json would accept only by changing it: a
// surrogate escape, bytes that are not UTF-8. The caller then decodes with
// encoding/json, which says what is wrong.
package jsonscan

import (
	"encoding/binary"
	"math/bits"
	"unicode/utf16"
	"unicode/utf8"
)

// Scanner reads JSON text from Data, from the byte at Pos on. A method
// that gives up leaves Pos anywhere from where it was to where it stopped;
// the caller then gives up too.
type Scanner struct {
	Data []byte // the JSON text, never changed
	Pos  int    // the index in Data of the next byte to read
	buf  []byte // scratch for strings with escapes
}

// SkipSpace skips JSON white space.
func (s *Scanner) SkipSpace() {
	for s.Pos < len(s.Data) {
		switch s.Data[s.Pos] {
		case ' ', '\t', '\n', '\r':
			s.Pos++
		default:
			return
		}
	}
}

// End reports whether only white space is left.
func (s *Scanner) End() bool {
	s.SkipSpace()
	return s.Pos == len(s.Data)
}

// Peek returns the next byte after white space, or 0 at the end.
func (s *Scanner) Peek() byte {
	s.SkipSpace()
	if s.Pos < len(s.Data) {
		return s.Data[s.Pos]
	}
	return 0
}

// Eat consumes c, the next byte after white space, reporting whether it
// was there.
func (s *Scanner) Eat(c byte) bool {
	if s.Peek() != c {
		return false
	}
	s.Pos++
	return true
}

// Literal consumes word (true, false or null), the next bytes after white
// space, reporting whether it was there.
func (s *Scanner) Literal(word string) bool {
	s.SkipSpace()
	if len(s.Data)-s.Pos < len(word) || string(s.Data[s.Pos:s.Pos+len(word)]) != word {
		return false
	}
	s.Pos += len(word)
	return true
}

// Array reads an array, the next value after white space, calling elem to
// read each element.
func (s *Scanner) Array(elem func() bool) bool {
	if !s.Eat('[') {
		return false
	}
	if s.Eat(']') {
		return true
	}
	for {
		if !elem() {
			return false
		}
		if s.Eat(']') {
			return true
		}
		if !s.Eat(',') {
			return false
		}
	}
}

// Object reads an object, the next value after white space, calling member
// with each key to read its value. The key's bytes are valid only until
// member reads further (see StringBytes).
func (s *Scanner) Object(member func(key []byte) bool) bool {
	if !s.Eat('{') {
		return false
	}
	if s.Eat('}') {
		return true
	}
	for {
		key, ok := s.StringBytes()
		if !ok || !s.Eat(':') || !member(key) {
			return false
		}
		if s.Eat('}') {
			return true
		}
		if !s.Eat(',') {
			return false
		}
	}
}

// StringValue reads a string, the next value after white space, as
// StringBytes does, and returns a copy of its text.
func (s *Scanner) StringValue() (string, bool) {
	b, ok := s.StringBytes()
	return string(b), ok
}

// StringBytes reads a string, the next value after white space, and
// returns its text. The bytes are Data's own when the string holds no
// escape, else the scanner's scratch buffer's: either way they are valid
// only until the next call, and not to be changed. It gives up on a
// surrogate escape (\ud800 to \udfff, which encoding/json would pair or
// replace) and on bytes that are not UTF-8 (which it would replace), as
// well as on what is not a JSON string: a control character, an unknown
// escape, a missing closing quote.
func (s *Scanner) StringBytes() ([]byte, bool) {
	if !s.Eat('"') {
		return nil, false
	}
	start := s.Pos
	j := plainRun(s.Data, start)
	if j < len(s.Data) && s.Data[j] == '"' {
		raw := s.Data[start:j]
		if !utf8.Valid(raw) {
			return nil, false
		}
		s.Pos = j + 1
		return raw, true
	}
	return s.escaped(start, j)
}

// plainRun returns the index of the first byte at or after j in b that
// ends a run of a string's bytes that stand for themselves: a quote, a
// backslash or a control character. It looks at eight bytes at a time.
func plainRun(b []byte, j int) int {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	for ; j+8 <= len(b); j += 8 {
		w := binary.LittleEndian.Uint64(b[j:])
		// The high bit of a byte of m is set where w has a byte below
		// 0x20, a quote or a backslash ("Bit Twiddling Hacks": has a
		// byte less than n, has a zero byte). Bits above the first such
		// byte may be set wrongly, never bits below it.
		q, bs := w^(ones*'"'), w^(ones*'\\')
		m := (w-ones*0x20)&^w&highs | (q-ones)&^q&highs | (bs-ones)&^bs&highs
		if m != 0 {
			return j + bits.TrailingZeros64(m)/8
		}
	}
	for j < len(b) && b[j] >= 0x20 && b[j] != '"' && b[j] != '\\' {
		j++
	}
	return j
}

// escaped reads a string that holds an escape, from just after its opening
// quote at start, into the scratch buffer; its first run of plain bytes
// ends at k.
func (s *Scanner) escaped(start, k int) ([]byte, bool) {
	out := s.buf[:0]
	j := start
	for {
		out = append(out, s.Data[j:k]...)
		if k >= len(s.Data) {
			return nil, false
		}
		j = k
		if s.Data[j] == '"' {
			s.buf = out // kept for the next string
			if !utf8.Valid(out) {
				return nil, false
			}
			s.Pos = j + 1
			return out, true
		}
		if s.Data[j] != '\\' || j+1 >= len(s.Data) {
			return nil, false // a control character, or the end
		}
		switch e := s.Data[j+1]; e {
		case '"', '\\', '/':
			out = append(out, e)
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			r, ok := hex4(s.Data[j+2:])
			if !ok || utf16.IsSurrogate(r) {
				return nil, false
			}
			out = utf8.AppendRune(out, r)
			j += 4
		default:
			return nil, false
		}
		j += 2
		k = plainRun(s.Data, j)
	}
}

// hex4 reads the four hexadecimal digits of a \u escape at the start of b.
func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

// Number reads a number, the next value after white space, and returns
// its text, Data's own bytes. It checks the number is written as JSON
// writes numbers (a minus sign, no leading zero, digits on both sides of
// a point, an exponent with digits), and nothing more: its value may be
// out of any type's range. A number is read to its last digit; what
// follows is for the caller to judge.
func (s *Scanner) Number() ([]byte, bool) {
	s.SkipSpace()
	b, start, j := s.Data, s.Pos, s.Pos
	if j < len(b) && b[j] == '-' {
		j++
	}
	switch {
	case j < len(b) && b[j] == '0':
		j++
	case j < len(b) && b[j] >= '1' && b[j] <= '9':
		j = digits(b, j)
	default:
		return nil, false
	}
	if j < len(b) && b[j] == '.' {
		k := digits(b, j+1)
		if k == j+1 {
			return nil, false
		}
		j = k
	}
	if j < len(b) && (b[j] == 'e' || b[j] == 'E') {
		j++
		if j < len(b) && (b[j] == '+' || b[j] == '-') {
			j++
		}
		k := digits(b, j)
		if k == j {
			return nil, false
		}
		j = k
	}
	s.Pos = j
	return b[start:j], true
}

// digits returns the index of the first byte at or after j in b that is
// not an ASCII digit.
func digits(b []byte, j int) int {
	for j < len(b) && b[j] >= '0' && b[j] <= '9' {
		j++
	}
	return j
}
