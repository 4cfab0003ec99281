package d1client

import (
	"bytes"

	"github.com/d1idem/d1idem/internal/jsonscan"
)

// fastEnvelope decodes a successful answer's body into env in one pass,
// exactly as json.Unmarshal would, n results expected. It gives up (false)
// on anything unusual (an error body, a key repeated or spelled in another
// case, the /query form, a blob...), leaving it to encoding/json.
func fastEnvelope(body []byte, n int, env *envelope) bool {
	d := fastDecoder{Scanner: jsonscan.Scanner{Data: body}}
	ok := d.envelope(n, env) && d.End() && env.Success != unset
	if !ok {
		*env = envelope{}
	}
	return ok
}

type fastDecoder struct {
	jsonscan.Scanner
	recent [16]string // strings read lately, for intern: a ring
	seen   int        // strings written to recent
	depth  int        // arrays and objects skip is in
}

// maxSkipDepth bounds the nesting skip reads, as encoding/json does, so
// that the stack does not grow with the body.
const maxSkipDepth = 10_000

// object reads an object, calling member to read the value of each known
// key. Keys must be distinct and spelled exactly: encoding/json would match
// them regardless of case.
func (d *fastDecoder) object(known []string, member func(i int, key string) bool) bool {
	var seen uint64
	return d.Object(func(key []byte) bool {
		for i, k := range known {
			if !bytes.EqualFold(key, []byte(k)) {
				continue
			}
			if string(key) != k || seen&(1<<i) != 0 {
				return false
			}
			seen |= 1 << i
			return member(i, k)
		}
		return d.skip()
	})
}

// skip reads any value and drops it.
func (d *fastDecoder) skip() bool {
	switch c := d.Peek(); c {
	case '{', '[':
		d.depth++
		ok := d.depth <= maxSkipDepth && (c == '{' && d.object(nil, nil) || c == '[' && d.Array(d.skip))
		d.depth--
		return ok
	case '"':
		_, ok := d.StringBytes()
		return ok
	case 't':
		return d.Literal("true")
	case 'f':
		return d.Literal("false")
	case 'n':
		return d.Literal("null")
	default:
		_, ok := d.Number()
		return ok
	}
}

// boolean reads true, false or null.
func (d *fastDecoder) boolean(p *optBool) bool {
	for b, word := range boolWords {
		if d.Literal(word) {
			*p = optBool(b)
			return true
		}
	}
	return false
}

// intern reads a string, reusing a recent one with the same text: the
// column names and meta of a batch's results repeat.
func (d *fastDecoder) intern() (string, bool) {
	b, ok := d.StringBytes()
	if !ok {
		return "", false
	}
	for _, s := range d.recent[:min(d.seen, len(d.recent))] {
		if string(b) == s {
			return s, true
		}
	}
	s := string(b)
	d.recent[d.seen%len(d.recent)] = s
	d.seen++
	return s, true
}

var (
	envelopeKeys = []string{"success", "errors", "result"}
	resultKeys   = []string{"results", "success", "meta"}
	tableKeys    = []string{"columns", "rows"}
	metaKeys     = []string{"changes", "last_row_id", "changed_db", "duration", "rows_read", "rows_written",
		"size_after", "served_by", "served_by_colo", "served_by_region", "served_by_primary", "total_attempts"}
)

func (d *fastDecoder) envelope(n int, env *envelope) bool {
	return d.object(envelopeKeys, func(_ int, key string) bool {
		switch key {
		case "success":
			return d.Peek() != 'n' && d.boolean(&env.Success)
		case "errors":
			env.Errors = []ErrorDetail{} // error bodies take the general path
			return d.Eat('[') && d.Eat(']')
		default: // result
			if d.Peek() != '[' {
				return false
			}
			env.Result.present = true
			env.Result.items = make([]rawResult, 0, n)
			return d.Array(func() bool {
				env.Result.items = append(env.Result.items, rawResult{})
				return d.result(&env.Result.items[len(env.Result.items)-1])
			})
		}
	})
}

func (d *fastDecoder) result(r *rawResult) bool {
	return d.object(resultKeys, func(_ int, key string) bool {
		switch key {
		case "results":
			return d.table(&r.Results)
		case "success":
			return d.boolean(&r.Success)
		default: // meta
			return d.Literal("null") || d.meta(&r.Meta)
		}
	})
}

// table reads a statement's results: null, [], or {"columns","rows"}.
func (d *fastDecoder) table(t *rawTable) bool {
	switch d.Peek() {
	case 'n':
		return d.Literal("null")
	case '[':
		d.Pos++
		return d.Eat(']') // the /query form takes the general path
	case '{':
	default:
		return false
	}
	var columns []string
	var rows []Row
	ok := d.object(tableKeys, func(_ int, key string) bool {
		if d.Literal("null") {
			return true
		}
		if key == "columns" {
			columns = make([]string, 0, 8)
			return d.Array(func() bool {
				s, ok := d.intern()
				columns = append(columns, s)
				return ok
			})
		}
		return d.Array(func() bool {
			row := make(Row, 0, len(columns))
			ok := d.Array(func() bool {
				v, ok := d.cell()
				row = append(row, v)
				return ok
			})
			rows = append(rows, row)
			return ok
		})
	})
	for _, row := range rows {
		ok = ok && len(row) == len(columns) // else the general path words the error
	}
	t.columns, t.rows = columns, rows
	return ok
}

// cell reads one value of a row as decodeValue would.
func (d *fastDecoder) cell() (Value, bool) {
	switch d.Peek() {
	case 'n':
		return Value{}, d.Literal("null")
	case 't':
		return IntValue(1), d.Literal("true")
	case 'f':
		return IntValue(0), d.Literal("false")
	case '"':
		s, ok := d.StringValue()
		return TextValue(s), ok
	case '[', '{':
		return Value{}, false // blobs and objects take the general path
	}
	num, ok := d.Number()
	v, err := decodeNumber(num)
	return v, ok && err == nil
}

// meta reads a statement's meta into w as metaWire's decoding would.
func (d *fastDecoder) meta(w *metaWire) bool {
	return d.object(metaKeys, func(i int, _ string) bool {
		if d.Literal("null") {
			return true
		}
		switch p := w.fields()[i].(type) {
		case *bool:
			*p = d.Literal("true")
			return *p || d.Literal("false")
		case *string:
			s, ok := d.intern()
			*p = s
			return ok
		case *metaNumber:
			num, ok := d.Number()
			return ok && p.UnmarshalJSON(num) == nil
		}
		return false
	})
}

// fields returns pointers to the fields of w, in the order of metaKeys.
func (w *metaWire) fields() [12]any {
	return [...]any{&w.Changes, &w.LastRowID, &w.ChangedDB, &w.Duration, &w.RowsRead, &w.RowsWritten,
		&w.SizeAfter, &w.ServedBy, &w.ServedByColo, &w.ServedByRegion, &w.ServedByPrimary, &w.TotalAttempts}
}
