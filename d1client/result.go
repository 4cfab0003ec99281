package d1client

import (
	"bytes"
	"database/sql"
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
)

// Type is the type of a decoded value.
type Type uint8

// The value types D1's JSON can express.
const (
	Null Type = iota
	Integer
	Real
	Text
	Blob
)

var typeNames = [...]string{Null: "null", Integer: "integer", Real: "real", Text: "text", Blob: "blob"}

// String returns the type's name: "null", "integer", "real", "text" or "blob".
func (t Type) String() string {
	if int(t) < len(typeNames) {
		return typeNames[t]
	}
	return "unknown"
}

// Value is one cell of a result, decoded exactly from D1's JSON: an integer
// literal that fits int64 is an Integer, any other number a Real, a string
// Text, null Null, an array of byte values a Blob, true/false Integer 1/0.
// D1 formats numbers through JavaScript, so an integer above 2^53 arrives
// rounded (select CAST(x AS TEXT) to read it exactly) and a REAL 1.0
// arrives as 1, an Integer.
type Value struct {
	typ Type
	i   int64
	f   float64
	s   string // Text, or the bytes of a Blob
}

// Type returns the value's type.
func (v Value) Type() Type { return v.typ }

// IsNull reports whether the value is SQL NULL.
func (v Value) IsNull() bool { return v.typ == Null }

// Int64 returns an Integer value, or a Real with an exact integral value.
func (v Value) Int64() (int64, bool) {
	switch v.typ {
	case Integer:
		return v.i, true
	case Real:
		if v.f == math.Trunc(v.f) && v.f >= math.MinInt64 && v.f < math.MaxInt64 {
			return int64(v.f), true
		}
	}
	return 0, false
}

// Float64 returns a numeric value as float64.
func (v Value) Float64() (float64, bool) {
	switch v.typ {
	case Integer:
		return float64(v.i), true
	case Real:
		return v.f, true
	}
	return 0, false
}

// Text returns a Text value.
func (v Value) Text() (string, bool) {
	if v.typ == Text {
		return v.s, true
	}
	return "", false
}

// Bytes returns a Blob's bytes, or a Text value's bytes.
func (v Value) Bytes() ([]byte, bool) {
	if v.typ == Blob || v.typ == Text {
		return []byte(v.s), true
	}
	return nil, false
}

// Any returns the value as nil, int64, float64, string or []byte.
func (v Value) Any() any {
	switch v.typ {
	case Integer:
		return v.i
	case Real:
		return v.f
	case Text:
		return v.s
	case Blob:
		return []byte(v.s)
	}
	return nil
}

// String formats the value for display; NULL prints as "NULL".
func (v Value) String() string {
	switch v.typ {
	case Null:
		return "NULL"
	case Integer:
		return strconv.FormatInt(v.i, 10)
	case Real:
		return strconv.FormatFloat(v.f, 'g', -1, 64)
	case Blob:
		return fmt.Sprintf("x'%x'", v.s)
	}
	return v.s
}

// MarshalJSON encodes the value as D1 would.
func (v Value) MarshalJSON() ([]byte, error) {
	switch v.typ {
	case Null:
		return []byte("null"), nil
	case Integer:
		return strconv.AppendInt(nil, v.i, 10), nil
	case Real:
		return appendFloat(nil, v.f)
	case Blob:
		b := []byte(v.s)
		ints := make([]int, len(b))
		for i, c := range b {
			ints[i] = int(c)
		}
		return json.Marshal(ints)
	}
	return json.Marshal(v.s)
}

// IntValue, RealValue, TextValue and BlobValue construct values, mainly for
// tests and for comparing results; the zero Value is NULL.
func IntValue(i int64) Value    { return Value{typ: Integer, i: i} }
func RealValue(f float64) Value { return Value{typ: Real, f: f} }
func TextValue(s string) Value  { return Value{typ: Text, s: s} }
func BlobValue(b []byte) Value  { return Value{typ: Blob, s: string(b)} }

// decodeValue decodes one JSON cell exactly, as encoding/json hands it
// over: valid, without surrounding white space.
func decodeValue(raw json.RawMessage) (Value, error) {
	switch c := raw[0]; {
	case c == 'n':
		return Value{}, nil
	case c == 't':
		return IntValue(1), nil
	case c == 'f':
		return IntValue(0), nil
	case c == '"':
		var s string
		err := json.Unmarshal(raw, &s)
		return TextValue(s), err
	case c == '[':
		var nums []json.Number
		if err := json.Unmarshal(raw, &nums); err != nil {
			return Value{}, fmt.Errorf("blob cell: %w", err)
		}
		b := make([]byte, len(nums))
		for i, n := range nums {
			x, err := strconv.ParseUint(string(n), 10, 8)
			if err != nil {
				return Value{}, fmt.Errorf("blob cell: byte %d is %s", i, n)
			}
			b[i] = byte(x)
		}
		return BlobValue(b), nil
	case c == '{':
		return TextValue(string(raw)), nil
	default:
		return decodeNumber(raw)
	}
}

func decodeNumber(b []byte) (Value, error) {
	if i, ok := parseInt(b); ok {
		return IntValue(i), nil
	}
	f, err := strconv.ParseFloat(string(b), 64)
	if err != nil {
		return Value{}, fmt.Errorf("cell %q is not a JSON value", b)
	}
	return RealValue(f), nil
}

// Row is one result row, its values in column order.
type Row []Value

// Scan copies the row's values into dest, one per column. Each destination
// may be *any, *Value, *int64, *int, *float64, *string, *bool, *[]byte, a
// pointer to a pointer of those (nil for NULL), or an sql.Scanner such as
// *sql.NullString. NULL into a non-nullable destination, or a value that
// does not convert exactly, is an error.
func (r Row) Scan(dest ...any) error {
	if len(dest) != len(r) {
		return fmt.Errorf("d1client: Scan: %d destinations for %d columns", len(dest), len(r))
	}
	for i, d := range dest {
		if err := scanValue(r[i], d); err != nil {
			return fmt.Errorf("d1client: Scan column %d: %w", i, err)
		}
	}
	return nil
}

func scanValue(v Value, dest any) error {
	switch d := dest.(type) {
	case *any:
		*d = v.Any()
		return nil
	case *Value:
		*d = v
		return nil
	case sql.Scanner:
		return d.Scan(v.Any())
	case *[]byte:
		b, ok := v.Bytes()
		if !ok && v.typ != Null {
			return fmt.Errorf("%s value cannot be scanned into *[]byte", v.typ)
		}
		*d = b
		return nil
	}
	if p := reflect.ValueOf(dest); p.Kind() == reflect.Pointer && p.Elem().Kind() == reflect.Pointer {
		if v.typ == Null {
			p.Elem().SetZero()
			return nil
		}
		x := reflect.New(p.Elem().Type().Elem())
		if err := scanValue(v, x.Interface()); err != nil {
			return err
		}
		p.Elem().Set(x)
		return nil
	}
	if v.typ == Null {
		return fmt.Errorf("NULL cannot be stored in %T; scan into a pointer to a pointer or an sql.Null type", dest)
	}
	switch d := dest.(type) {
	case *int64:
		i, ok := v.Int64()
		if !ok {
			return fmt.Errorf("%s value %s is not an integer", v.typ, v)
		}
		*d = i
	case *int:
		i, ok := v.Int64()
		if !ok || int64(int(i)) != i {
			return fmt.Errorf("%s value %s does not fit int", v.typ, v)
		}
		*d = int(i)
	case *float64:
		f, ok := v.Float64()
		if !ok {
			return fmt.Errorf("%s value is not numeric", v.typ)
		}
		*d = f
	case *string:
		if v.typ == Blob {
			return fmt.Errorf("%s value cannot be scanned into *string", v.typ)
		}
		*d = v.String()
	case *bool:
		i, ok := v.Int64()
		if !ok || (i != 0 && i != 1) {
			return fmt.Errorf("%s value %s is not a boolean 0/1", v.typ, v)
		}
		*d = i == 1
	default:
		return fmt.Errorf("unsupported Scan destination %T", dest)
	}
	return nil
}

// Meta is the meta object D1 returns with each statement's result.
type Meta struct {
	Changes         int64   `json:"changes"`        // rows modified, as sqlite3_total_changes() deltas ("rough")
	LastRowID       int64   `json:"last_row_id"`    // last_insert_rowid(); meaningful only after an INSERT with changes > 0
	ChangedDB       bool    `json:"changed_db"`     // whether the database was altered
	Duration        float64 `json:"duration"`       // SQL execution time in milliseconds, without network
	RowsRead        int64   `json:"rows_read"`      // rows read, indexes included (billed)
	RowsWritten     int64   `json:"rows_written"`   // rows written, indexes included (billed)
	SizeAfter       int64   `json:"size_after"`     // database size in bytes after the statement
	ServedBy        string  `json:"served_by"`      // backend that answered, e.g. "v3-prod"
	ServedByColo    string  `json:"served_by_colo"` // three-letter airport code
	ServedByRegion  string  `json:"served_by_region"`
	ServedByPrimary bool    `json:"served_by_primary"`
	TotalAttempts   int64   `json:"total_attempts"` // D1's own retries of read-only queries, where reported
}

// metaWire is Meta as it travels, its numbers decoded by metaNumber.
type metaWire struct {
	Changes         metaNumber `json:"changes"`
	LastRowID       metaNumber `json:"last_row_id"`
	ChangedDB       bool       `json:"changed_db"`
	Duration        metaNumber `json:"duration"`
	RowsRead        metaNumber `json:"rows_read"`
	RowsWritten     metaNumber `json:"rows_written"`
	SizeAfter       metaNumber `json:"size_after"`
	ServedBy        string     `json:"served_by"`
	ServedByColo    string     `json:"served_by_colo"`
	ServedByRegion  string     `json:"served_by_region"`
	ServedByPrimary bool       `json:"served_by_primary"`
	TotalAttempts   metaNumber `json:"total_attempts"`
}

// UnmarshalJSON decodes meta afresh: of a repeated key, the last counts.
func (w *metaWire) UnmarshalJSON(data []byte) error {
	type plain metaWire // without this method
	*w = metaWire{}
	return json.Unmarshal(data, (*plain)(w))
}

func (w *metaWire) meta() Meta {
	return Meta{
		Changes: w.Changes.i, LastRowID: w.LastRowID.i, ChangedDB: w.ChangedDB,
		Duration: w.Duration.f, RowsRead: w.RowsRead.i, RowsWritten: w.RowsWritten.i,
		SizeAfter: w.SizeAfter.i, ServedBy: w.ServedBy, ServedByColo: w.ServedByColo,
		ServedByRegion: w.ServedByRegion, ServedByPrimary: w.ServedByPrimary, TotalAttempts: w.TotalAttempts.i,
	}
}

// metaNumber is a number of meta as an int64, exact when written as an
// integer, and a float64; null is 0, and it may be written as a string.
type metaNumber struct {
	i int64
	f float64
}

func (n *metaNumber) UnmarshalJSON(data []byte) error {
	b := bytes.TrimSpace(data)
	if bytes.Equal(b, []byte("null")) {
		*n = metaNumber{}
		return nil
	}
	if len(b) >= 2 && b[0] == '"' && b[len(b)-1] == '"' {
		b = b[1 : len(b)-1]
	}
	if i, ok := parseInt(b); ok && (i != 0 || b[0] != '-') { // -0 is left to ParseFloat, for its sign
		*n = metaNumber{i: i, f: float64(i)}
		return nil
	}
	f, err := strconv.ParseFloat(string(b), 64)
	if err != nil {
		return fmt.Errorf("meta: %q is not a number", data)
	}
	*n = metaNumber{i: int64(f), f: f}
	return nil
}

// parseInt reads b if it is an integer literal that fits int64, up to 18
// digits faster than strconv (whose failures also allocate).
func parseInt(b []byte) (int64, bool) {
	digits := bytes.TrimPrefix(b, []byte("-"))
	if len(digits) == 0 {
		return 0, false
	}
	var i int64
	for _, c := range digits {
		if c < '0' || c > '9' {
			return 0, false
		}
		i = i*10 + int64(c-'0')
	}
	if len(digits) > 18 { // i may have overflowed
		x, err := strconv.ParseInt(string(b), 10, 64)
		return x, err == nil
	}
	if len(digits) < len(b) {
		i = -i
	}
	return i, true
}

// Result is the outcome of one statement: its columns in order (duplicates
// kept), its rows, and D1's meta.
type Result struct {
	Columns []string
	Rows    []Row
	Meta    Meta
}

// Map returns row i as a map from column name to value. Where names repeat,
// the last column wins, as in D1's /query form.
func (r *Result) Map(i int) map[string]Value {
	m := make(map[string]Value, len(r.Columns))
	for c, name := range r.Columns {
		if c < len(r.Rows[i]) {
			m[name] = r.Rows[i][c]
		}
	}
	return m
}

// resultList is the envelope's result array; it keeps its decoding error,
// so that the rest of the envelope still decodes.
type resultList struct {
	present bool // the envelope has a result, null included
	items   []rawResult
	err     error
}

func (l *resultList) UnmarshalJSON(data []byte) error {
	*l = resultList{present: true} // a repeated key: the last one counts
	if err := json.Unmarshal(data, &l.items); err != nil {
		l.items, l.err = nil, err
	}
	return nil
}

// optBool is a JSON boolean that may be absent or null.
type optBool uint8

const (
	unset optBool = iota // absent, or null
	isFalse
	isTrue
)

var boolWords = [...]string{unset: "null", isFalse: "false", isTrue: "true"}

func (b *optBool) UnmarshalJSON(data []byte) error {
	i := slices.Index(boolWords[:], string(data))
	if i < 0 {
		return fmt.Errorf("%q is not a boolean", data)
	}
	*b = optBool(i)
	return nil
}

// rawResult is one entry of the envelope's result array in /raw form.
type rawResult struct {
	Results rawTable `json:"results"`
	Success optBool  `json:"success"`
	Meta    metaWire `json:"meta"`
}

// rawTable is a statement's results: {"columns":[...],"rows":[[...]]},
// null, missing, or the /query form (objects). It keeps its decoding error.
type rawTable struct {
	columns []string
	rows    []Row
	err     error
}

func (t *rawTable) UnmarshalJSON(data []byte) error {
	t.columns, t.rows, t.err = decodeTable(data) // a repeated key: the last one counts
	return nil
}

// decodeTable decodes a statement's results, valid JSON as encoding/json
// hands it over: without surrounding white space.
func decodeTable(data []byte) ([]string, []Row, error) {
	var table struct {
		Columns []string            `json:"columns"`
		Rows    [][]json.RawMessage `json:"rows"`
	}
	var err error
	if data[0] == '[' {
		table.Columns, table.Rows, err = decodeObjects(data)
	} else {
		err = json.Unmarshal(data, &table) // null leaves table empty
	}
	if err != nil {
		return nil, nil, fmt.Errorf("results are not in /raw form: %w", err)
	}
	var rows []Row
	for i, cells := range table.Rows {
		if len(cells) != len(table.Columns) {
			return nil, nil, fmt.Errorf("row %d has %d cells for %d columns", i, len(cells), len(table.Columns))
		}
		row := make(Row, len(cells))
		for j, cell := range cells {
			if row[j], err = decodeValue(cell); err != nil {
				return nil, nil, fmt.Errorf("row %d, column %d: %w", i, j, err)
			}
		}
		rows = append(rows, row)
	}
	return table.Columns, rows, nil
}

// decodeObjects reads /query-form results, an array of objects, the first
// object's keys in order being the columns. The body is valid JSON: the
// decoder has checked it.
func decodeObjects(body []byte) ([]string, [][]json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.Token() // [
	var cols []string
	var rows [][]json.RawMessage
	for dec.More() {
		if t, _ := dec.Token(); t != json.Delim('{') {
			return nil, nil, fmt.Errorf("row %d is not an object", len(rows))
		}
		var row []json.RawMessage
		for dec.More() {
			t, _ := dec.Token()
			name, _ := t.(string)
			if len(rows) == 0 {
				cols = append(cols, name)
			} else if len(row) >= len(cols) || cols[len(row)] != name {
				return nil, nil, fmt.Errorf("row %d has columns that differ from row 0", len(rows))
			}
			var cell json.RawMessage
			dec.Decode(&cell)
			row = append(row, cell)
		}
		dec.Token() // }
		if len(row) != len(cols) {
			return nil, nil, fmt.Errorf("row %d has %d columns, row 0 has %d", len(rows), len(row), len(cols))
		}
		rows = append(rows, row)
	}
	return cols, rows, nil
}
