package d1client

import (
	"bytes"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// fastEnvelope decodes a response body in the shape D1 answers a successful
// call with, in one pass over the bytes, into env, exactly as
// json.Unmarshal would. It gives up (false) on anything else: an error
// body, a body without "success", a key it does not know spelled like one it does, a repeated key,
// the /query form of results, a blob, a cell or meta value of an unusual
// type, a surrogate escape, bytes that are not UTF-8, or JSON that is not
// valid; the caller then decodes with encoding/json, which says what is
// wrong. n is the number of results expected.
func fastEnvelope(body []byte, n int, env *envelope) bool {
	d := fastDecoder{b: body}
	ok := d.envelope(n, env) && d.end() && env.Success != unset
	if !ok {
		*env = envelope{}
	}
	return ok
}

type fastDecoder struct {
	b      []byte
	i      int
	recent [16]string // strings read lately, for intern: a ring
	seen   int        // strings written to recent
}

func (d *fastDecoder) ws() {
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
func (d *fastDecoder) end() bool {
	d.ws()
	return d.i == len(d.b)
}

// peek returns the next byte after white space, or 0 at the end.
func (d *fastDecoder) peek() byte {
	d.ws()
	if d.i < len(d.b) {
		return d.b[d.i]
	}
	return 0
}

// eat consumes c, the next byte after white space.
func (d *fastDecoder) eat(c byte) bool {
	if d.peek() != c {
		return false
	}
	d.i++
	return true
}

// literal consumes the literal word (null, true, false).
func (d *fastDecoder) literal(word string) bool {
	d.ws()
	if !bytes.HasPrefix(d.b[d.i:], []byte(word)) {
		return false
	}
	d.i += len(word)
	return true
}

// object reads an object, calling member for each key; member reads the
// value. Keys must be distinct and none may match a known key other than
// by exact spelling: encoding/json matches keys regardless of case.
func (d *fastDecoder) object(known []string, member func(key string) bool) bool {
	if !d.eat('{') {
		return false
	}
	var seen uint64
	if d.eat('}') {
		return true
	}
	for {
		key, ok := d.strBytes()
		if !ok || !d.eat(':') {
			return false
		}
		idx := knownIndex(known, key)
		if idx < 0 && foldsToKnown(known, key) {
			return false
		}
		if idx >= 0 {
			if seen&(1<<idx) != 0 {
				return false
			}
			seen |= 1 << idx
			if !member(known[idx]) {
				return false
			}
		} else if !d.skip() {
			return false
		}
		if d.eat('}') {
			return true
		}
		if !d.eat(',') {
			return false
		}
	}
}

// knownIndex returns the index of key in known, or -1.
func knownIndex(known []string, key []byte) int {
	for j, k := range known {
		if string(key) == k {
			return j
		}
	}
	return -1
}

// foldsToKnown reports whether key matches a known key regardless of case,
// as encoding/json would match it. A key spelled exactly like one is never
// asked about: known keys differ by more than case.
func foldsToKnown(known []string, key []byte) bool {
	for _, k := range known {
		if bytes.EqualFold(key, []byte(k)) {
			return true
		}
	}
	return false
}

// array reads an array, calling elem for each element.
func (d *fastDecoder) array(elem func() bool) bool {
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

// str reads a string. It gives up on a surrogate escape and on bytes that
// are not UTF-8, which encoding/json would replace.
func (d *fastDecoder) str() (string, bool) {
	b, ok := d.strBytes()
	return string(b), ok
}

// strBytes reads a string as str does, without copying it when it holds no
// escape: the bytes are then the body's own, not to be changed.
func (d *fastDecoder) strBytes() ([]byte, bool) {
	if !d.eat('"') {
		return nil, false
	}
	start := d.i
	for j := start; j < len(d.b); j++ {
		switch c := d.b[j]; {
		case c == '"':
			raw := d.b[start:j]
			if !utf8.Valid(raw) {
				return nil, false
			}
			d.i = j + 1
			return raw, true
		case c == '\\':
			return d.escaped(start)
		case c < 0x20:
			return nil, false
		}
	}
	return nil, false
}

// escaped reads the rest of a string that holds escapes, from its start.
func (d *fastDecoder) escaped(start int) ([]byte, bool) {
	out := make([]byte, 0, 64)
	j := start
	for j < len(d.b) {
		c := d.b[j]
		switch {
		case c == '"':
			if !utf8.Valid(out) {
				return nil, false
			}
			d.i = j + 1
			return out, true
		case c < 0x20:
			return nil, false
		case c != '\\':
			out = append(out, c)
			j++
			continue
		}
		if j+1 >= len(d.b) {
			return nil, false
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
			if j+6 > len(d.b) {
				return nil, false
			}
			r, err := strconv.ParseUint(string(d.b[j+2:j+6]), 16, 32)
			if err != nil || utf16.IsSurrogate(rune(r)) {
				return nil, false
			}
			out = utf8.AppendRune(out, rune(r))
			j += 4
		default:
			return nil, false
		}
		j += 2
	}
	return nil, false
}

// number reads a number, checking it is written as JSON writes numbers.
func (d *fastDecoder) number() ([]byte, bool) {
	d.ws()
	b, start, j := d.b, d.i, d.i
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
	d.i = j
	return b[start:j], true
}

// digits returns the index of the first byte at or after j in b that is not
// an ASCII digit.
func digits(b []byte, j int) int {
	for j < len(b) && b[j] >= '0' && b[j] <= '9' {
		j++
	}
	return j
}

// skip reads any value and drops it.
func (d *fastDecoder) skip() bool {
	switch d.peek() {
	case '{':
		return d.object(nil, nil)
	case '[':
		return d.array(d.skip)
	case '"':
		_, ok := d.str()
		return ok
	case 't':
		return d.literal("true")
	case 'f':
		return d.literal("false")
	case 'n':
		return d.literal("null")
	default:
		_, ok := d.number()
		return ok
	}
}

// boolean reads true, false or null.
func (d *fastDecoder) boolean(p *optBool) bool {
	switch {
	case d.literal("true"):
		*p = isTrue
	case d.literal("false"):
		*p = isFalse
	default:
		return d.literal("null")
	}
	return true
}

// intern reads a string, reusing the one it read last with the same
// bytes: the column names and meta of a batch's results repeat.
func (d *fastDecoder) intern() (string, bool) {
	if d.peek() != '"' {
		return "", false
	}
	if end := bytes.IndexByte(d.b[d.i+1:], '"'); end >= 0 {
		raw := d.b[d.i+1 : d.i+1+end]
		if bytes.IndexByte(raw, '\\') < 0 { // an escape is read properly below
			for _, s := range d.recent[:min(d.seen, len(d.recent))] {
				if string(raw) == s {
					d.i += end + 2
					return s, true
				}
			}
		}
	}
	s, ok := d.str()
	if ok {
		d.recent[d.seen%len(d.recent)] = s
		d.seen++
	}
	return s, ok
}

var (
	envelopeKeys = []string{"success", "errors", "result"}
	resultKeys   = []string{"results", "success", "meta"}
	tableKeys    = []string{"columns", "rows"}
	metaKeys     = []string{"changes", "last_row_id", "changed_db", "duration", "rows_read", "rows_written",
		"size_after", "served_by", "served_by_colo", "served_by_region", "served_by_primary", "total_attempts"}
)

func (d *fastDecoder) envelope(n int, env *envelope) bool {
	return d.object(envelopeKeys, func(key string) bool {
		switch key {
		case "success":
			return d.peek() != 'n' && d.boolean(&env.Success)
		case "errors":
			// Only an empty array: error bodies take the general path.
			env.Errors = []ErrorDetail{}
			return d.eat('[') && d.eat(']')
		default: // result
			if d.peek() != '[' {
				return false
			}
			env.Result.present = true
			env.Result.items = make([]rawResult, 0, n)
			return d.array(func() bool {
				env.Result.items = append(env.Result.items, rawResult{})
				return d.result(&env.Result.items[len(env.Result.items)-1])
			})
		}
	})
}

func (d *fastDecoder) result(r *rawResult) bool {
	return d.object(resultKeys, func(key string) bool {
		switch key {
		case "results":
			return d.table(&r.Results)
		case "success":
			return d.boolean(&r.Success)
		default: // meta
			if d.literal("null") {
				return true
			}
			return d.meta(&r.Meta)
		}
	})
}

// table reads a statement's results: null, [], or {"columns","rows"}.
func (d *fastDecoder) table(t *rawTable) bool {
	switch d.peek() {
	case 'n':
		return d.literal("null")
	case '[':
		d.i++
		return d.eat(']') // the /query form takes the general path
	case '{':
	default:
		return false
	}
	var columns []string
	var rows []Row
	ok := d.object(tableKeys, func(key string) bool {
		if d.literal("null") {
			return true
		}
		if key == "columns" {
			columns = make([]string, 0, 8)
			return d.array(func() bool {
				s, ok := d.intern()
				columns = append(columns, s)
				return ok
			})
		}
		rows = []Row{}
		return d.array(func() bool {
			row := make(Row, 0, len(columns))
			ok := d.array(func() bool {
				v, ok := d.cell()
				row = append(row, v)
				return ok
			})
			rows = append(rows, row)
			return ok
		})
	})
	if !ok {
		return false
	}
	for _, row := range rows {
		if len(row) != len(columns) {
			return false // the general path words the error
		}
	}
	t.columns = columns
	if len(rows) > 0 {
		t.rows = rows
	}
	return true
}

// cell reads one value of a row as decodeValue would.
func (d *fastDecoder) cell() (Value, bool) {
	switch d.peek() {
	case 'n':
		return Value{}, d.literal("null")
	case 't':
		return IntValue(1), d.literal("true")
	case 'f':
		return IntValue(0), d.literal("false")
	case '"':
		s, ok := d.str()
		return TextValue(s), ok
	case '[', '{':
		return Value{}, false // blobs and objects take the general path
	}
	num, ok := d.number()
	if !ok {
		return Value{}, false
	}
	v, err := decodeNumber(num)
	return v, err == nil
}

// meta reads a statement's meta into w as metaWire's decoding would.
func (d *fastDecoder) meta(w *metaWire) bool {
	return d.object(metaKeys, func(key string) bool {
		if d.literal("null") {
			return true
		}
		switch key {
		case "changed_db", "served_by_primary":
			var b optBool
			if !d.boolean(&b) {
				return false
			}
			if key == "changed_db" {
				w.ChangedDB = b == isTrue
			} else {
				w.ServedByPrimary = b == isTrue
			}
			return true
		case "served_by", "served_by_colo", "served_by_region":
			s, ok := d.intern()
			switch key {
			case "served_by":
				w.ServedBy = s
			case "served_by_colo":
				w.ServedByColo = s
			default:
				w.ServedByRegion = s
			}
			return ok
		}
		num, ok := d.number()
		if !ok {
			return false
		}
		var m metaNumber
		if m.UnmarshalJSON(num) != nil {
			return false
		}
		switch key {
		case "changes":
			w.Changes = m
		case "last_row_id":
			w.LastRowID = m
		case "duration":
			w.Duration = m
		case "rows_read":
			w.RowsRead = m
		case "rows_written":
			w.RowsWritten = m
		case "size_after":
			w.SizeAfter = m
		default:
			w.TotalAttempts = m
		}
		return true
	})
}
