package d1local

import (
	"math"
	"slices"
	"strconv"
	"unicode/utf8"

	"github.com/d1idem/d1idem/internal/jsonstr"
)

// This file writes results the way D1, a JavaScript service, serializes
// them with JSON.stringify: numbers as JavaScript numbers, strings with
// JSON.stringify's escapes, BLOBs as arrays of byte values, and /query rows
// as JavaScript objects.

// appendJSONString appends s as a JSON string, escaping like
// JSON.stringify: '"', '\\' and control characters, nothing else (no HTML
// escapes). Invalid UTF-8 becomes U+FFFD, as it does when SQLite text
// becomes a JavaScript string.
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' && c < utf8.RuneSelf {
			i++
			continue
		}
		if c >= utf8.RuneSelf {
			r, size := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && size == 1 {
				b = append(b, s[start:i]...)
				b = append(b, "\ufffd"...)
				i += size
				start = i
				continue
			}
			i += size
			continue
		}
		b = append(b, s[start:i]...)
		b = jsonstr.AppendEscaped(b, c)
		i++
		start = i
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// appendJSNumber appends f as JSON.stringify does: NaN and ±Infinity as null.
func appendJSNumber(b []byte, f float64) []byte {
	switch a := math.Abs(f); {
	case math.IsNaN(f) || math.IsInf(f, 0):
		return append(b, "null"...)
	case f == 0:
		return append(b, '0') // -0 too
	case a >= 1e-6 && a < 1e21:
		// JavaScript writes these in plain notation, with the shortest
		// digits that read back as f: Go's 'f' format with precision -1.
		return strconv.AppendFloat(b, f, 'f', -1, 64)
	}
	return append(b, jsNumber(f)...)
}

// appendJSInteger appends an SQLite INTEGER as D1 returns it: D1 converts
// results to JavaScript numbers, so integers beyond ±2^53 come back rounded
// to the nearest float64 (9223372036854775807 becomes 9223372036854776000).
func appendJSInteger(b []byte, v int64) []byte {
	if v >= -maxSafeInteger && v <= maxSafeInteger {
		return strconv.AppendInt(b, v, 10)
	}
	return appendJSNumber(b, float64(v))
}

// appendValue appends one SQLite value: INTEGER as a JavaScript number,
// REAL likewise, TEXT as a string, BLOB as an array of byte values, NULL as
// null.
func appendValue(b []byte, v any) []byte {
	switch v := v.(type) {
	case int64:
		return appendJSInteger(b, v)
	case float64:
		return appendJSNumber(b, v)
	case string:
		return appendJSONString(b, v)
	case []byte:
		b = append(b, '[')
		for i, c := range v {
			if i > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendUint(b, uint64(c), 10)
		}
		return append(b, ']')
	default:
		return append(b, "null"...)
	}
}

// objectLayout is how the columns of a result map onto a JavaScript object:
// keys in the object's property order, and for each the column whose value
// it holds.
type objectLayout struct {
	keys []string
	cols []int
}

// newObjectLayout builds the layout of a row object with the given column
// names, as JavaScript builds it property by property: a repeated name
// keeps its first position and takes its last value, and names that are
// array indices ("0", "1", "42") come first, in numeric order.
func newObjectLayout(columns []string) objectLayout {
	var l objectLayout
	pos := make(map[string]int, len(columns))
	for i, name := range columns {
		if p, ok := pos[name]; ok {
			l.cols[p] = i
			continue
		}
		pos[name] = len(l.keys)
		l.keys = append(l.keys, name)
		l.cols = append(l.cols, i)
	}
	order := make([]int, len(l.keys))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		ia, aok := arrayIndex(l.keys[a])
		ib, bok := arrayIndex(l.keys[b])
		switch {
		case aok && bok:
			return cmpUint(ia, ib)
		case aok:
			return -1
		case bok:
			return 1
		}
		return 0
	})
	sorted := objectLayout{keys: make([]string, len(order)), cols: make([]int, len(order))}
	for i, o := range order {
		sorted.keys[i], sorted.cols[i] = l.keys[o], l.cols[o]
	}
	return sorted
}

func cmpUint(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// arrayIndex reports whether a property name is a JavaScript array index:
// the canonical decimal form of an integer below 2^32-1.
func arrayIndex(name string) (uint64, bool) {
	if name == "" || len(name) > 10 || (name[0] == '0' && len(name) > 1) {
		return 0, false
	}
	for i := 0; i < len(name); i++ {
		if name[i] < '0' || name[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseUint(name, 10, 64)
	if err != nil || n >= 1<<32-1 {
		return 0, false
	}
	return n, true
}

// objectEncoder writes rows as the /query endpoint does, an array of
// objects, and keeps the layout and encoded keys of the last column names
// it saw for the next result: the statements of a batch often share them.
type objectEncoder struct {
	columns []string
	cols    []int
	keys    [][]byte // each key's JSON and a colon
}

func (e *objectEncoder) append(b []byte, columns []string, rows [][]any) []byte {
	if len(rows) == 0 {
		return append(b, "[]"...)
	}
	if e.keys == nil || !slices.Equal(e.columns, columns) {
		layout := newObjectLayout(columns)
		e.columns, e.cols = columns, layout.cols
		e.keys = make([][]byte, len(layout.keys))
		for i, k := range layout.keys {
			e.keys[i] = append(appendJSONString(nil, k), ':')
		}
	}
	b = append(b, '[')
	for r, row := range rows {
		if r > 0 {
			b = append(b, ',')
		}
		b = append(b, '{')
		for i, col := range e.cols {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, e.keys[i]...)
			b = appendValue(b, row[col])
		}
		b = append(b, '}')
	}
	return append(b, ']')
}

// appendRaw appends rows as the /raw endpoint does: the column names, in
// order and with duplicates, and one array of values per row.
func appendRaw(b []byte, columns []string, rows [][]any) []byte {
	b = append(b, `{"columns":[`...)
	for i, c := range columns {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendJSONString(b, c)
	}
	b = append(b, `],"rows":[`...)
	for r, row := range rows {
		if r > 0 {
			b = append(b, ',')
		}
		b = append(b, '[')
		for i, v := range row {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendValue(b, v)
		}
		b = append(b, ']')
	}
	return append(b, "]}"...)
}
