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

	"github.com/d1idem/d1idem/internal/jsonstr"
)

// Limits D1 enforces per statement, checked before anything is sent.
const (
	MaxParams   = 100     // bound parameters per statement
	MaxSQLBytes = 100_000 // bytes of one statement's SQL

	maxSafeInteger = 1 << 53 // the largest magnitude a JavaScript number holds exactly
)

// Statement is one SQL statement and its positional parameters (anonymous
// "?" or ordered "?NNN"; D1 has no named parameters). Exec refuses SQL that
// holds several statements.
type Statement struct {
	SQL    string
	Params []any
}

// appendParam appends the JSON D1 binds v as. D1 has no boolean, time or
// binary type, and reads numbers as JavaScript doubles: integers beyond
// 2^53 travel as decimal strings, which INTEGER affinity converts back
// exactly. A driver.Valuer is converted first; pointers and named types
// encode as what they point to or their underlying kind.
func appendParam(dst []byte, v any) ([]byte, error) {
	switch x := v.(type) {
	case nil:
		return append(dst, "null"...), nil
	case json.Number:
		if _, err := strconv.ParseFloat(string(x), 64); err != nil {
			return nil, fmt.Errorf("json.Number %q is not a number", string(x))
		}
		return append(dst, x...), nil
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
		return appendParam(dst, dv)
	}
	switch rv := reflect.ValueOf(v); rv.Kind() {
	case reflect.Pointer:
		if rv.IsNil() {
			return append(dst, "null"...), nil
		}
		return appendParam(dst, rv.Elem().Interface())
	case reflect.Bool:
		if rv.Bool() {
			return append(dst, '1'), nil
		}
		return append(dst, '0'), nil
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return appendInt(dst, rv.Int()), nil
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		if u := rv.Uint(); u <= math.MaxInt64 {
			return appendInt(dst, int64(u)), nil
		}
		return nil, fmt.Errorf("unsigned integer %d exceeds SQLite's int64 range", rv.Uint())
	case reflect.Float32, reflect.Float64:
		return appendFloat(dst, rv.Float())
	case reflect.String:
		if s := rv.String(); utf8.ValidString(s) {
			return appendJSONString(dst, s), nil
		}
		return nil, fmt.Errorf("string parameter is not valid UTF-8 (JSON would replace the invalid bytes): bind hex text with unhex(?) for binary data")
	case reflect.Slice:
		if rv.Type().Elem().Kind() == reflect.Uint8 {
			return nil, fmt.Errorf("[]byte cannot travel in D1's JSON API: bind hex.EncodeToString(b) and write unhex(?) in the SQL")
		}
	}
	return nil, fmt.Errorf("unsupported parameter type %T: use nil, bool, an integer, a float, a string or json.Number", v)
}

func appendInt(dst []byte, i int64) []byte {
	if i >= -maxSafeInteger && i <= maxSafeInteger {
		return strconv.AppendInt(dst, i, 10)
	}
	return append(strconv.AppendInt(append(dst, '"'), i, 10), '"')
}

func appendFloat(dst []byte, f float64) ([]byte, error) {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return nil, fmt.Errorf("float %v has no JSON encoding", f)
	}
	return strconv.AppendFloat(dst, f, 'g', -1, 64), nil
}

// appendJSONString appends s, valid UTF-8, as a JSON string as encoding/json
// does with SetEscapeHTML(false): an HTML body does not grow sixfold.
func appendJSONString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		if b := s[i]; b < 0x20 || b == '"' || b == '\\' {
			dst = jsonstr.AppendEscaped(append(dst, s[start:i]...), b)
			start = i + 1
		} else if b == 0xE2 && i+2 < len(s) && s[i+1] == 0x80 && s[i+2]&^1 == 0xA8 { // U+2028 or U+2029
			dst = append(append(dst, s[start:i]...), `\u202`...)
			dst = append(dst, "89"[s[i+2]&1])
			i += 2
			start = i + 1
		}
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// wireStatement is a statement's JSON encoding, {"sql":"...","params":[...]}.
type wireStatement []byte

// encode checks the statement against D1's limits and encodes it; index is
// its position in the call.
func (s Statement) encode(index int) (wireStatement, error) {
	if strings.TrimSpace(s.SQL) == "" {
		return nil, fmt.Errorf("statement %d: empty SQL", index)
	}
	// D1 measures the SQL decoded, not its JSON encoding.
	if n := len(s.SQL); n > MaxSQLBytes {
		return nil, fmt.Errorf("statement %d: SQL is %d bytes; D1 allows at most %d per statement", index, n, MaxSQLBytes)
	}
	if n := len(s.Params); n > MaxParams {
		return nil, fmt.Errorf("statement %d: %d parameters; D1 allows at most %d per statement", index, n, MaxParams)
	}
	size := len(s.SQL) + 24
	for _, p := range s.Params {
		if str, ok := p.(string); ok {
			size += len(str) + 3
		} else {
			size += 8
		}
	}
	w := make([]byte, 0, size)
	w = append(w, `{"sql":`...)
	w = appendJSONString(w, s.SQL)
	if len(s.Params) > 0 {
		w = append(w, `,"params":[`...)
		for i, p := range s.Params {
			if i > 0 {
				w = append(w, ',')
			}
			var err error
			if w, err = appendParam(w, p); err != nil {
				return nil, fmt.Errorf("statement %d, parameter %d: %w", index, i+1, err)
			}
		}
		w = append(w, ']')
	}
	return append(w, '}'), nil
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
