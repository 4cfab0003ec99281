package d1local

import (
	"testing"
)

// The request decoder never panics, and whatever it accepts it turns into
// statements whose SQL is non-empty and whose parameter count is within D1's
// limit; everything else is a clean error.
func FuzzRequestDecoder(f *testing.F) {
	for _, s := range []string{
		`{"sql":"SELECT 1"}`,
		`{"sql":"SELECT ?, ?","params":[1,"a"]}`,
		`{"batch":[{"sql":"INSERT INTO t VALUES (?)","params":[null]},{"sql":"SELECT * FROM t"}]}`,
		`{"sql":"CREATE TRIGGER x AFTER INSERT ON t BEGIN SELECT 1; SELECT 2; END; SELECT 3"}`,
		`{"sql":"SELECT 'a;b' -- c;\n; /* ; */ SELECT \"x;y\""}`,
		`{"sql":"SELECT ?","params":[[1,2,255]]}`,
		`{"sql":"SELECT ?","params":[{"a":1}]}`,
		`{"sql":"SELECT ?","params":[true, 1e400]}`,
		`{"batch":[]}`,
		`{"sql":"SELECT 1","batch":[]}`,
		`{"sql":""}`,
		`[1,2]`,
		`{"sql":"SELECT 1"} trailing`,
		`{"sql":"SELECT ?1, ?100, ?101","params":[1]}`,
	} {
		f.Add([]byte(s))
	}
	for _, s := range requestSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		queries, err := decodeBody(body, nil)
		if err != nil {
			return
		}
		stmts, err := compile(queries)
		if err != nil {
			return
		}
		for _, s := range stmts {
			if s.sql == "" {
				t.Fatalf("empty statement from %q", body)
			}
			if len(s.params) > maxParams {
				t.Fatalf("%d parameters accepted from %q", len(s.params), body)
			}
		}
	})
}
