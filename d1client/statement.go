package d1client

import (
	"database/sql/driver"
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Limits D1 enforces per statement, checked before anything is sent.
const (
	// MaxParams is D1's limit of bound parameters per statement.
	MaxParams = 100
	// MaxSQLBytes is D1's limit on the length of one statement's SQL.
	MaxSQLBytes = 100_000
	// maxSafeInteger is 2^53, the largest magnitude a JavaScript number
	// holds exactly. D1's service path is JavaScript.
	maxSafeInteger = 1 << 53
)

// Statement is one SQL statement and its positional parameters (anonymous
// "?" or ordered "?NNN"; D1 has no named parameters). Exec refuses SQL that
// holds several statements.
type Statement struct {
	SQL    string
	Params []any
}

// encodeParam turns one Go value into the JSON D1 binds the way the caller
// means it. The rules, decided deliberately:
//
//   - nil, and nil pointers, become null (SQL NULL).
//   - bool becomes 0 or 1: D1 has no boolean type and the REST API's handling
//     of JSON true/false is undocumented.
//   - Integers with |v| <= 2^53 travel as JSON numbers. Larger ones travel as
//     decimal strings: D1's service is JavaScript, where a JSON number is a
//     double and 2^53+1 silently becomes 2^53. A string arrives exactly, and
//     SQLite's INTEGER affinity converts it back to the exact int64 when it is
//     stored in or compared with an INTEGER column. (Outside an INTEGER
//     column it stays TEXT; say CAST(? AS INTEGER) there.) uint64 values above
//     MaxInt64 are refused: SQLite cannot hold them as integers.
//   - Floats travel as JSON numbers; NaN and ±Inf are refused (JSON has no
//     spelling for them). Note that D1 binds every JSON number as REAL.
//   - Strings travel as JSON strings and must be valid UTF-8: JSON would
//     silently replace invalid bytes with U+FFFD.
//   - []byte is refused: JSON has no binary type and D1's handling of byte
//     arrays over REST is unverified. Bind hex text and write unhex(?) in SQL.
//   - time.Time is refused: D1 has no time type, and any implicit format
//     would be a silent choice. Bind t.UnixMilli() or t.Format(time.RFC3339Nano).
//   - json.Number is sent as written, after validation.
//   - driver.Valuer values are converted with Value first; named types with
//     a basic underlying kind (type UserID int64) encode as that kind.
func encodeParam(v any) (json.RawMessage, error) {
	switch x := v.(type) {
	case nil:
		return json.RawMessage("null"), nil
	case bool:
		if x {
			return json.RawMessage("1"), nil
		}
		return json.RawMessage("0"), nil
	case string:
		return encodeString(x)
	case int:
		return encodeInt(int64(x)), nil
	case int64:
		return encodeInt(x), nil
	case int32:
		return encodeInt(int64(x)), nil
	case float64:
		return encodeFloat(x)
	case json.Number:
		if _, err := strconv.ParseFloat(string(x), 64); err != nil {
			return nil, fmt.Errorf("json.Number %q is not a number", string(x))
		}
		return json.RawMessage(x), nil
	case []byte:
		return nil, fmt.Errorf("[]byte cannot travel in D1's JSON API: bind hex.EncodeToString(b) and write unhex(?) in the SQL")
	case time.Time:
		return nil, fmt.Errorf("time.Time has no D1 type: bind t.UnixMilli() (INTEGER) or t.Format(time.RFC3339Nano) (TEXT) explicitly")
	case driver.Valuer:
		dv, err := x.Value()
		if err != nil {
			return nil, fmt.Errorf("driver.Valuer %T: %w", v, err)
		}
		if _, again := dv.(driver.Valuer); again {
			return nil, fmt.Errorf("driver.Valuer %T returned another Valuer", v)
		}
		return encodeParam(dv)
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Pointer:
		if rv.IsNil() {
			return json.RawMessage("null"), nil
		}
		return encodeParam(rv.Elem().Interface())
	case reflect.Bool:
		return encodeParam(rv.Bool())
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return encodeInt(rv.Int()), nil
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		u := rv.Uint()
		if u > math.MaxInt64 {
			return nil, fmt.Errorf("unsigned integer %d exceeds SQLite's int64 range", u)
		}
		return encodeInt(int64(u)), nil
	case reflect.Float32, reflect.Float64:
		return encodeFloat(rv.Float())
	case reflect.String:
		return encodeString(rv.String())
	case reflect.Slice:
		if rv.Type().Elem().Kind() == reflect.Uint8 {
			return encodeParam(rv.Bytes())
		}
	}
	return nil, fmt.Errorf("unsupported parameter type %T: use nil, bool, an integer, a float, a string or json.Number", v)
}

func encodeInt(i int64) json.RawMessage {
	if i >= -maxSafeInteger && i <= maxSafeInteger {
		return strconv.AppendInt(nil, i, 10)
	}
	return strconv.AppendQuote(nil, strconv.FormatInt(i, 10))
}

func encodeFloat(f float64) (json.RawMessage, error) {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return nil, fmt.Errorf("float %v has no JSON encoding", f)
	}
	return strconv.AppendFloat(nil, f, 'g', -1, 64), nil
}

func encodeString(s string) (json.RawMessage, error) {
	if !utf8.ValidString(s) {
		return nil, fmt.Errorf("string parameter is not valid UTF-8 (JSON would replace the invalid bytes): bind hex text with unhex(?) for binary data")
	}
	return json.Marshal(s)
}

// wireStatement is a statement as it travels: {"sql": ..., "params": [...]}.
type wireStatement struct {
	SQL    string            `json:"sql"`
	Params []json.RawMessage `json:"params,omitempty"`
}

// encode validates the statement against D1's limits and encodes its
// parameters. index is its position in the call, for the error message.
func (s Statement) encode(index int) (wireStatement, error) {
	if strings.TrimSpace(s.SQL) == "" {
		return wireStatement{}, fmt.Errorf("statement %d: empty SQL", index)
	}
	if n := len(s.SQL); n > MaxSQLBytes {
		return wireStatement{}, fmt.Errorf("statement %d: SQL is %d bytes; D1 allows at most %d per statement", index, n, MaxSQLBytes)
	}
	if n := len(s.Params); n > MaxParams {
		return wireStatement{}, fmt.Errorf("statement %d: %d parameters; D1 allows at most %d per statement", index, n, MaxParams)
	}
	w := wireStatement{SQL: s.SQL}
	if len(s.Params) > 0 {
		w.Params = make([]json.RawMessage, len(s.Params))
		for i, p := range s.Params {
			raw, err := encodeParam(p)
			if err != nil {
				return wireStatement{}, fmt.Errorf("statement %d, parameter %d: %w", index, i+1, err)
			}
			w.Params[i] = raw
		}
	}
	return w, nil
}

// redacted describes the statement for an error message: its SQL, shortened,
// and the number of parameters, never their values.
func (s Statement) redacted() string {
	sql := strings.Join(strings.Fields(s.SQL), " ")
	const max = 160
	if len(sql) > max {
		cut := max
		for cut > 0 && !utf8.RuneStart(sql[cut]) {
			cut--
		}
		sql = sql[:cut] + "…"
	}
	if n := len(s.Params); n > 0 {
		return fmt.Sprintf("%s (%d params redacted)", sql, n)
	}
	return sql
}
