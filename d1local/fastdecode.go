package d1local

import (
	"encoding/binary"
	"encoding/json"
	"math/bits"
	"unicode/utf16"
	"unicode/utf8"
)

// decodeFast decodes a request body in the common shape, in one pass over
// its bytes, into what decodeJSON returns for it: {"sql": ..., "params":
// [...]} or {"batch": [{"sql": ..., "params": [...]}, ...]}, whose params
// are strings, numbers, true, false and null. It gives up (false) on
// anything else, and on every body decodeJSON refuses: a key it does not
// know (one spelled in another case included, which encoding/json would
// match), a repeated key, a null where an object, array or string is due,
// a parameter that is an array or an object, a surrogate escape, bytes that
// are not UTF-8, JSON that is not valid, data after the object, a body
// with both "sql" and "batch" or neither, a batch entry without "sql". The
// caller then decodes with decodeJSON, which says what is wrong.
func decodeFast(body []byte, cache *splitCache) ([]parsedQuery, bool) {
	d := reqDecoder{b: body, cache: cache}
	queries, ok := d.body()
	if !ok || !d.end() {
		return nil, false
	}
	return queries, true
}

// reqDecoder reads a request body for decodeFast.
type reqDecoder struct {
	b     []byte
	i     int
	cache *splitCache // nil: none
	buf   []byte      // scratch for strings with escapes
	vals  []param     // scratch for params
	last  splitEntry  // the SQL read last, for a batch that repeats it
	read  bool        // whether last is set
}

// Bits of the keys of a request object, to tell which were read.
const (
	keySQL = 1 << iota
	keyParams
	keyBatch
)

// body reads the request object.
func (d *reqDecoder) body() ([]parsedQuery, bool) {
	var single parsedQuery
	var batch []parsedQuery
	keys, ok := d.object(keySQL|keyParams|keyBatch, func(key int) bool {
		switch key {
		case keySQL:
			return d.sql(&single)
		case keyParams:
			var ok bool
			single.params, ok = d.params()
			return ok
		default:
			var ok bool
			batch, ok = d.batch()
			return ok
		}
	})
	switch {
	case !ok:
		return nil, false
	case keys == keyBatch:
		return batch, true
	case keys&keyBatch == 0 && keys&keySQL != 0:
		return []parsedQuery{single}, true
	}
	return nil, false // an error of decodeJSON's
}

// batch reads the array of a batch, never null.
func (d *reqDecoder) batch() ([]parsedQuery, bool) {
	queries := make([]parsedQuery, 0, 8)
	ok := d.array(func() bool {
		var q parsedQuery
		keys, ok := d.object(keySQL|keyParams, func(key int) bool {
			if key == keySQL {
				return d.sql(&q)
			}
			var ok bool
			q.params, ok = d.params()
			return ok
		})
		queries = append(queries, q)
		return ok && keys&keySQL != 0
	})
	return queries, ok
}

// object reads an object whose keys are among the bits of allowed, each
// at most once, calling member to read each value. It returns the keys
// read.
func (d *reqDecoder) object(allowed int, member func(key int) bool) (int, bool) {
	if !d.eat('{') {
		return 0, false
	}
	seen := 0
	if d.eat('}') {
		return 0, true
	}
	for {
		name, ok := d.strBytes()
		if !ok || !d.eat(':') {
			return 0, false
		}
		key := 0
		switch string(name) {
		case "sql":
			key = keySQL
		case "params":
			key = keyParams
		case "batch":
			key = keyBatch
		}
		if key&allowed == 0 || seen&key != 0 {
			return 0, false
		}
		seen |= key
		if !member(key) {
			return 0, false
		}
		if d.eat('}') {
			return seen, true
		}
		if !d.eat(',') {
			return 0, false
		}
	}
}

// array reads an array, calling elem for each element.
func (d *reqDecoder) array(elem func() bool) bool {
	if !d.eat('[') {
		return false
	}
	if d.eat(']') {
		return true
	}
	for {
		if !elem() {
			return false
		}
		if d.eat(']') {
			return true
		}
		if !d.eat(',') {
			return false
		}
	}
}

// sql reads the SQL of a query, never null, and splits it into q.
func (d *reqDecoder) sql(q *parsedQuery) bool {
	b, ok := d.strBytes()
	if !ok {
		return false
	}
	if !d.read || string(b) != d.last.sql {
		d.last, d.read = d.cache.splitBytes(b), true
	}
	q.sql, q.pieces, q.emptyTail = d.last.sql, d.last.pieces, d.last.emptyTail
	return true
}

// params reads the params of a query, never null: an array of strings,
// numbers, true, false and null. The strings without escapes and the
// numbers share one string, a copy of the array's text, rather than each
// having its own.
func (d *reqDecoder) params() ([]any, bool) {
	d.vals = d.vals[:0]
	lo, hi := -1, -1 // the part of the body the params in text come from
	ok := d.array(func() bool {
		var p param
		switch d.peek() {
		case '"':
			start := d.i + 1
			b, ok := d.strBytes()
			if !ok {
				return false
			}
			if end := d.i - 1; len(b) == end-start { // no escape, which shortens a string
				p = param{kind: textString, start: start, end: end}
			} else {
				p.val = string(b)
			}
		case 't':
			if !d.literal("true") {
				return false
			}
			p.val = true
		case 'f':
			if !d.literal("false") {
				return false
			}
			p.val = false
		case 'n':
			if !d.literal("null") {
				return false
			}
		default:
			start := d.i
			if !d.number() {
				return false
			}
			p = param{kind: textNumber, start: start, end: d.i}
		}
		if p.kind != 0 {
			if lo < 0 {
				lo = p.start
			}
			hi = p.end
		}
		d.vals = append(d.vals, p)
		return true
	})
	if !ok {
		return nil, false
	}
	var text string
	if lo >= 0 {
		text = string(d.b[lo:hi])
	}
	params := make([]any, len(d.vals))
	for i, p := range d.vals {
		switch p.kind {
		case textString:
			params[i] = text[p.start-lo : p.end-lo]
		case textNumber:
			params[i] = json.Number(text[p.start-lo : p.end-lo])
		default:
			params[i] = p.val
		}
	}
	clear(d.vals) // hold no strings past the call
	return params, true
}

// param is a parameter as params reads it: a value, or where its text is
// in the body.
type param struct {
	kind       byte // textString or textNumber: the text of d.b[start:end]; 0: val
	val        any
	start, end int
}

// Kinds of param.
const (
	textString = 1 + iota
	textNumber
)

// ws skips JSON white space.
func (d *reqDecoder) ws() {
	for d.i < len(d.b) {
		switch d.b[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

// end reports whether only white space is left.
func (d *reqDecoder) end() bool {
	d.ws()
	return d.i == len(d.b)
}

// peek returns the next byte after white space, or 0 at the end.
func (d *reqDecoder) peek() byte {
	d.ws()
	if d.i < len(d.b) {
		return d.b[d.i]
	}
	return 0
}

// eat consumes c, the next byte after white space.
func (d *reqDecoder) eat(c byte) bool {
	if d.peek() != c {
		return false
	}
	d.i++
	return true
}

// literal consumes word (true, false or null), the next bytes after white
// space.
func (d *reqDecoder) literal(word string) bool {
	d.ws()
	if len(d.b)-d.i < len(word) || string(d.b[d.i:d.i+len(word)]) != word {
		return false
	}
	d.i += len(word)
	return true
}

// strBytes reads a string, the next value after white space. The bytes it
// returns are the body's own when the string holds no escape, else the
// scratch buffer's: either way they are valid only until the next call,
// and not to be changed. It gives up on a surrogate escape and on bytes
// that are not UTF-8, which encoding/json would replace.
func (d *reqDecoder) strBytes() ([]byte, bool) {
	if !d.eat('"') {
		return nil, false
	}
	start := d.i
	j := plainRun(d.b, start)
	if j < len(d.b) && d.b[j] == '"' {
		raw := d.b[start:j]
		if !utf8.Valid(raw) {
			return nil, false
		}
		d.i = j + 1
		return raw, true
	}
	return d.escaped(start, j)
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
func (d *reqDecoder) escaped(start, k int) ([]byte, bool) {
	out := d.buf[:0]
	j := start
	for {
		out = append(out, d.b[j:k]...)
		if k >= len(d.b) {
			return nil, false
		}
		j = k
		if d.b[j] == '"' {
			d.buf = out // kept for the next string
			if !utf8.Valid(out) {
				return nil, false
			}
			d.i = j + 1
			return out, true
		}
		if d.b[j] != '\\' || j+1 >= len(d.b) {
			return nil, false // a control character, or the end
		}
		switch e := d.b[j+1]; e {
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
			r, ok := hex4(d.b[j+2:])
			if !ok || utf16.IsSurrogate(r) {
				return nil, false
			}
			out = utf8.AppendRune(out, r)
			j += 4
		default:
			return nil, false
		}
		j += 2
		k = plainRun(d.b, j)
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

// number reads a number, the next value after white space, checking it is
// written as JSON writes numbers.
func (d *reqDecoder) number() bool {
	d.ws()
	b, j := d.b, d.i
	if j < len(b) && b[j] == '-' {
		j++
	}
	switch {
	case j < len(b) && b[j] == '0':
		j++
	case j < len(b) && b[j] >= '1' && b[j] <= '9':
		j = digits(b, j)
	default:
		return false
	}
	if j < len(b) && b[j] == '.' {
		k := digits(b, j+1)
		if k == j+1 {
			return false
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
			return false
		}
		j = k
	}
	d.i = j
	return true
}

// digits returns the index of the first byte at or after j in b that is
// not an ASCII digit.
func digits(b []byte, j int) int {
	for j < len(b) && b[j] >= '0' && b[j] <= '9' {
		j++
	}
	return j
}
