package d1local

import (
	"encoding/json"

	"github.com/d1idem/d1idem/internal/jsonscan"
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
	d := reqDecoder{Scanner: jsonscan.Scanner{Data: body}, cache: cache}
	queries, ok := d.body()
	if !ok || !d.End() {
		return nil, false
	}
	return queries, true
}

// reqDecoder reads a request body for decodeFast.
type reqDecoder struct {
	jsonscan.Scanner
	cache *splitCache // nil: none
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
	ok := d.Array(func() bool {
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
	seen := 0
	ok := d.Object(func(name []byte) bool {
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
			return false
		}
		seen |= key
		return member(key)
	})
	if !ok {
		return 0, false
	}
	return seen, true
}

// sql reads the SQL of a query, never null, and splits it into q.
func (d *reqDecoder) sql(q *parsedQuery) bool {
	b, ok := d.StringBytes()
	if !ok {
		return false
	}
	if !d.read || string(b) != d.last.sql {
		d.last, d.read = d.cache.GetBytes(b, newSplitEntry), true
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
	ok := d.Array(func() bool {
		var p param
		switch d.Peek() {
		case '"':
			start := d.Pos + 1
			b, ok := d.StringBytes()
			if !ok {
				return false
			}
			if end := d.Pos - 1; len(b) == end-start { // no escape, which shortens a string
				p = param{kind: textString, start: start, end: end}
			} else {
				p.val = string(b)
			}
		case 't':
			if !d.Literal("true") {
				return false
			}
			p.val = true
		case 'f':
			if !d.Literal("false") {
				return false
			}
			p.val = false
		case 'n':
			if !d.Literal("null") {
				return false
			}
		default:
			start := d.Pos
			if _, ok := d.Number(); !ok {
				return false
			}
			p = param{kind: textNumber, start: start, end: d.Pos}
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
		text = string(d.Data[lo:hi])
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
	kind       byte // textString or textNumber: the text of d.Data[start:end]; 0: val
	val        any
	start, end int
}

// Kinds of param.
const (
	textString = 1 + iota
	textNumber
)
