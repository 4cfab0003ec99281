package d1local

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// wireQuery is one query of a request body: {"sql": ..., "params": [...]}.
type wireQuery struct {
	SQL    *string `json:"sql"`
	Params []any   `json:"params"`
}

// wireBody is a request body: a single query, or {"batch": [...]}.
type wireBody struct {
	wireQuery
	Batch []wireQuery `json:"batch"`
}

// parsedQuery is a query split into its statements, parameters not yet
// converted.
type parsedQuery struct {
	pieces    []piece
	emptyTail bool // see splitSQL
	sql       string
	params    []any
}

// decodeBody parses a request body, splitting its SQL with cache (nil:
// none). Errors are malformed requests (7400). A body in the common shape
// is read by decodeFast, any other by decodeJSON: the result is the same.
func decodeBody(body []byte, cache *splitCache) ([]parsedQuery, error) {
	if queries, ok := decodeFast(body, cache); ok {
		return queries, nil
	}
	return decodeJSON(body, cache)
}

// decodeJSON parses a request body with encoding/json, splitting its SQL
// with cache (nil: none).
func decodeJSON(body []byte, cache *splitCache) ([]parsedQuery, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var wb wireBody
	if err := dec.Decode(&wb); err != nil {
		return nil, fmt.Errorf("malformed JSON in request body: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("malformed JSON in request body: data after the JSON value")
	}
	var queries []wireQuery
	switch {
	case wb.Batch != nil && (wb.SQL != nil || wb.Params != nil):
		return nil, errors.New(`request body must hold either "sql" (with "params") or "batch", not both`)
	case wb.Batch != nil:
		queries = wb.Batch
	case wb.SQL != nil:
		queries = []wireQuery{wb.wireQuery}
	default:
		return nil, errors.New(`request body must hold "sql" or "batch"`)
	}
	parsed := make([]parsedQuery, len(queries))
	for i, q := range queries {
		if q.SQL == nil {
			return nil, fmt.Errorf(`batch entry %d has no "sql"`, i)
		}
		e := cache.Get(*q.SQL, newSplitEntry)
		parsed[i] = parsedQuery{pieces: e.pieces, emptyTail: e.emptyTail, sql: e.sql, params: q.Params}
	}
	return parsed, nil
}

// statementTexts lists the SQL of every statement of the queries.
func statementTexts(queries []parsedQuery) []string {
	var out []string
	for _, q := range queries {
		for _, p := range q.pieces {
			out = append(out, p.sql)
		}
	}
	return out
}

// compile checks the queries against D1's request rules and converts their
// parameters. Errors are *sqlError: D1 answers them as SQL errors.
func compile(queries []parsedQuery) ([]statement, error) {
	if len(queries) == 0 {
		return nil, &sqlError{msg: "No SQL statements detected."}
	}
	var stmts []statement
	for _, q := range queries {
		if len(q.pieces) == 0 {
			if strings.TrimSpace(q.sql) == "" {
				return nil, &sqlError{msg: "No SQL statements detected."}
			}
			return nil, &sqlError{msg: "SQL code did not contain a statement."}
		}
		if (len(q.pieces) > 1 || q.emptyTail) && len(q.params) > 0 {
			return nil, &sqlError{msg: "params cannot be bound to multiple statements: " +
				"send each statement with its params as an entry of a batch"}
		}
		if len(q.params) > maxParams {
			return nil, &sqlError{msg: fmt.Sprintf("too many SQL variables: %d parameters bound, "+
				"D1 allows at most %d per statement: SQLITE_ERROR", len(q.params), maxParams)}
		}
		params := make([]any, len(q.params))
		for i, p := range q.params {
			v, err := bindValue(p)
			if err != nil {
				return nil, err
			}
			params[i] = v
		}
		for _, p := range q.pieces {
			if len(p.sql) > maxSQLLength {
				return nil, &sqlError{msg: fmt.Sprintf("statement too long: %d bytes, "+
					"D1 allows at most %d per statement: SQLITE_TOOBIG", len(p.sql), maxSQLLength)}
			}
			stmts = append(stmts, statement{sql: p.sql, keyword: p.keyword, params: params})
		}
		if q.emptyTail && len(q.pieces) == 1 {
			// One statement goes to SQLite as it is, and workerd fails on
			// what follows its ';' when that is not a statement: compile
			// an empty one, which fails the same way once the statement
			// has run. Several statements are split as the REST API
			// splits them, dropping empty ones.
			stmts = append(stmts, statement{sql: ";"})
		}
	}
	return stmts, nil
}

// bindValue converts a JSON parameter to the value D1 binds, as D1's
// JavaScript does: every number is a double (REAL), even 42; a string is
// TEXT; null is NULL; true and false are the doubles 1 and 0; an array of
// integers 0..255 is a BLOB. Anything else is a D1_TYPE_ERROR.
func bindValue(p any) (any, error) {
	switch v := p.(type) {
	case nil:
		return nil, nil
	case string:
		return v, nil
	case bool:
		if v {
			return 1.0, nil
		}
		return 0.0, nil
	case json.Number:
		// Out-of-range literals round to ±Inf or 0, as in JavaScript.
		f, err := strconv.ParseFloat(string(v), 64)
		if err != nil && !errors.Is(err, strconv.ErrRange) {
			return nil, typeError(p)
		}
		return f, nil
	case []any:
		blob := make([]byte, len(v))
		for i, e := range v {
			n, ok := e.(json.Number)
			if !ok {
				return nil, typeError(p)
			}
			b, err := strconv.ParseUint(string(n), 10, 8)
			if err != nil {
				return nil, typeError(p)
			}
			blob[i] = byte(b)
		}
		return blob, nil
	default:
		return nil, typeError(p)
	}
}

// typeError is D1's error for a parameter it cannot bind.
func typeError(p any) error {
	return &sqlError{msg: fmt.Sprintf("D1_TYPE_ERROR: Type 'object' not supported for value '%s'", jsString(p))}
}

// jsString converts a decoded JSON value to a string as JavaScript's
// String() does: an object is "[object Object]" and an array its elements
// joined with ",".
func jsString(v any) string {
	switch v := v.(type) {
	case nil:
		return "null"
	case string:
		return v
	case bool:
		return strconv.FormatBool(v)
	case json.Number:
		f, _ := strconv.ParseFloat(string(v), 64)
		return jsNumber(f)
	case []any:
		parts := make([]string, len(v))
		for i, e := range v {
			if e != nil {
				parts[i] = jsString(e)
			}
		}
		return strings.Join(parts, ",")
	default:
		return "[object Object]"
	}
}
