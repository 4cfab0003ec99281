package d1local

import (
	"encoding/json"
	"fmt"
	"reflect"
	"testing"
)

// requestSeeds are request bodies of every shape, for the fuzz targets and
// the tests: the common ones decodeFast reads and the unusual ones it
// leaves to encoding/json.
var requestSeeds = []string{
	// The common shapes.
	`{"sql":"SELECT 1"}`,
	`{"sql":"SELECT ?, ?","params":[1,"a"]}`,
	`{"params":[1,"a"],"sql":"SELECT ?, ?"}`,
	`{"sql":"SELECT 1","params":[]}`,
	`{"sql":""}`,
	`{"sql":"","params":[]}`,
	`{"batch":[]}`,
	`{"batch":[{"sql":"SELECT 1"}]}`,
	`{"batch":[{"sql":"SELECT 1","params":[]}]}`,
	`{"batch":[{"params":[true,false,null],"sql":"SELECT ?, ?, ?"}]}`,
	`{"batch":[{"sql":"INSERT INTO t VALUES (?)","params":[null]},{"sql":"SELECT * FROM t"}]}`,
	`{"batch":[{"sql":"SELECT ?","params":[1]},{"sql":"SELECT ?","params":[2]},{"sql":"SELECT ?","params":["3"]}]}`,
	`{"batch":[{"sql":"SELECT ?","params":[1]},{"sql":"SELECT 2"},{"sql":"SELECT ?","params":[3]}]}`,
	" \t\r\n{ \t\r\n\"sql\" \t\r\n: \t\r\n\"SELECT ?\" \t\r\n, \"params\" : [ 1 , \"a\" , true , false , null ] \t\r\n} \t\r\n",
	` { "batch" : [ { "sql" : "SELECT 1" , "params" : [ ] } , { "sql":"SELECT 2" } ] } `,
	`{"sql":"CREATE TRIGGER x AFTER INSERT ON t BEGIN SELECT 1; SELECT 2; END; SELECT 3"}`,
	`{"sql":"SELECT 'a;b' -- c;\n; /* ; */ SELECT \"x;y\""}`,
	`{"sql":"SELECT 1;;"}`,
	`{"sql":"SELECT 1; -- note"}`,
	`{"sql":";SELECT 1"}`,
	`{"sql":"  \n "}`,
	// Escapes and Unicode.
	`{"sql":"SELECT \"a\\\"b\", '\\\\', '\/', '\b\f\n\r\t'"}`,
	`{"sql":"SELECT ?","params":["\u00e9\u4e2d\u0000\u001f\u007f\uFFFF\uabcd\u0041"]}`,
	`{"sql":"SELECT 'é', '中', '😀'","params":["é中😀", "\u00e9"]}`,
	`{"s\u0071l":"SELECT 1"}`,
	`{"sql":"SELECT ?","params":["\ud83d\ude00"]}`,
	`{"sql":"SELECT ?","params":["\ud83d"]}`,
	`{"sql":"SELECT ?","params":["\ude00x"]}`,
	`{"sql":"SELECT ?","params":["\u12"]}`,
	`{"sql":"SELECT ?","params":["\u12G4"]}`,
	`{"sql":"SELECT ?","params":["\x"]}`,
	"{\"sql\":\"SELECT ?\",\"params\":[\"\xff\"]}",
	"{\"sql\":\"SELECT '\xc3'\"}",
	"{\"sql\":\"SELECT '\xc3\\n\xa9'\"}",
	"{\"sql\":\"SELECT '\xed\xa0\x80'\"}",
	"{\"sql\":\"SELECT\t1\"}",
	"{\"sql\":\"SELECT 1\x00\"}",
	`{"sql":"SELECT '` + "\u2028\u2029" + `'"}`,
	// Numbers.
	`{"sql":"SELECT ?","params":[-0]}`,
	`{"sql":"SELECT ?","params":[0, -0.0, 1.0, 1.5e3, 1E+2, 1e-2, -1.25E-7]}`,
	`{"sql":"SELECT ?","params":[1e400, -1e400, 1e-400]}`,
	`{"sql":"SELECT ?","params":[9007199254740993, 123456789012345678901234567890, -9223372036854775809]}`,
	`{"sql":"SELECT ?","params":[01]}`,
	`{"sql":"SELECT ?","params":[-]}`,
	`{"sql":"SELECT ?","params":[1.]}`,
	`{"sql":"SELECT ?","params":[.5]}`,
	`{"sql":"SELECT ?","params":[1e]}`,
	`{"sql":"SELECT ?","params":[+1]}`,
	`{"sql":"SELECT ?","params":[0x10]}`,
	`{"sql":"SELECT ?","params":[NaN, Infinity]}`,
	`{"sql":"SELECT ?","params":[1 2]}`,
	// Values for the general path.
	`{"sql":"SELECT ?","params":[[1,2,255]]}`,
	`{"sql":"SELECT ?","params":[[]]}`,
	`{"sql":"SELECT ?","params":[{"a":1}]}`,
	`{"sql":"SELECT ?","params":[true, 1e400]}`,
	`{"sql":"SELECT ?","params":[tru]}`,
	`{"sql":"SELECT ?","params":[nul]}`,
	`{"sql":"SELECT ?","params":[truex]}`,
	`{"sql":"SELECT ?","params":[1,]}`,
	`{"sql":"SELECT ?","params":[,1]}`,
	`{"sql":"SELECT ?","params":null}`,
	`{"sql":"SELECT ?","params":"a"}`,
	`{"sql":"SELECT ?","params":{}}`,
	`{"sql":null}`,
	`{"sql":1}`,
	`{"sql":["SELECT 1"]}`,
	`{"batch":null}`,
	`{"batch":{}}`,
	`{"batch":[null]}`,
	`{"batch":[{}]}`,
	`{"batch":[{"params":[1]}]}`,
	`{"batch":[{"sql":null}]}`,
	`{"batch":[{"sql":"SELECT 1","sql":"SELECT 2"}]}`,
	`{"batch":[{"sql":"SELECT 1","params":[1],"params":[2]}]}`,
	`{"batch":[{"sql":"SELECT 1","batch":[]}]}`,
	`{"batch":[{"sql":"SELECT 1","other":1}]}`,
	`{"batch":[{"SQL":"SELECT 1"}]}`,
	`{"batch":[["SELECT 1"]]}`,
	`{"batch":[{"sql":"SELECT 1"},]}`,
	`{"batch":[],"batch":[]}`,
	`{"batch":[{"sql":"SELECT 1"}],"params":[]}`,
	`{"batch":[{"sql":"SELECT 1"}],"sql":"SELECT 2"}`,
	`{"sql":"SELECT 1","batch":[]}`,
	`{"sql":"SELECT 1","batch":null}`,
	`{"sql":"SELECT 1","sql":"SELECT 2"}`,
	`{"sql":"SELECT ?","params":[1],"params":[2]}`,
	`{"SQL":"SELECT 1"}`,
	`{"Sql":"SELECT 1"}`,
	`{"PARAMS":[1],"sql":"SELECT ?"}`,
	`{"Batch":[]}`,
	`{"ſql":"SELECT 1"}`,
	`{"sql":"SELECT 1","other":true}`,
	`{"sql":"SELECT 1","":1}`,
	`{"params":[1]}`,
	`{}`,
	`[]`,
	`[1,2]`,
	`null`,
	`"sql"`,
	``,
	` `,
	`{`,
	`{"sql"`,
	`{"sql":`,
	`{"sql":"SELECT 1"`,
	`{"sql":"SELECT 1",}`,
	`{"sql" "SELECT 1"}`,
	`{'sql':'SELECT 1'}`,
	`{"sql":"SELECT 1"} trailing`,
	`{"sql":"SELECT 1"}{}`,
	`{"sql":"SELECT 1"}]`,
	`{"sql":"SELECT 1"} ` + "\x00",
	"\ufeff{\"sql\":\"SELECT 1\"}",
	`{"sql":"SELECT ?1, ?100, ?101","params":[1]}`,
}

// FuzzRequestDecoderMatchesReference: whatever decodeFast accepts, it
// decodes as decodeJSON does, and decodeBody, with a cache or without, gives
// decodeJSON's result or error, the second time as the first. Besides the
// body itself, it tries the body as the text of a string, as params and as
// a batch entry, which the fast path accepts more often.
func FuzzRequestDecoderMatchesReference(f *testing.F) {
	for _, s := range requestSeeds {
		f.Add([]byte(s))
	}
	for _, s := range []string{`a\"b\u00e9\n`, `é\t`, `1, "a\u0041", -0.5e-3, true`, `"SELECT ?", "params": [null]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		s := string(body)
		for _, b := range []string{
			s,
			`{"sql":"` + s + `"}`,
			`{"sql":"SELECT ?","params":[` + s + `]}`,
			`{"batch":[{"sql":` + s + `},{"sql":"SELECT 1"}]}`,
		} {
			checkDecoders(t, []byte(b))
		}
	})
}

// checkDecoders fails t unless decodeFast and decodeBody decode body as
// decodeJSON does.
func checkDecoders(t *testing.T, body []byte) {
	t.Helper()
	want, wantErr := decodeJSON(body, nil)
	if got, ok := decodeFast(body, nil); ok {
		if wantErr != nil {
			t.Fatalf("decodeFast accepted %q, which decodeJSON refuses: %v", body, wantErr)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("decodeFast(%q)\n got %#v\nwant %#v", body, got, want)
		}
	}
	cache := newSplitCache()
	for _, c := range []*splitCache{nil, cache, cache} {
		got, err := decodeBody(body, c)
		if fmt.Sprint(err) != fmt.Sprint(wantErr) {
			t.Fatalf("decodeBody(%q) error %v, want %v", body, err, wantErr)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("decodeBody(%q)\n got %#v\nwant %#v", body, got, want)
		}
	}
}

// TestDecodeFastShapes: decodeFast reads the common shapes and leaves the
// rest to decodeJSON.
func TestDecodeFastShapes(t *testing.T) {
	accepted := []string{
		`{"sql":"SELECT 1"}`,
		`{"sql":"SELECT ?","params":[1,"a",true,false,null,-0,1e400,1.0]}`,
		`{"params":[],"sql":""}`,
		`{"batch":[]}`,
		`{"batch":[{"sql":"SELECT 1"},{"params":["\u00e9\n\"\\\/"],"sql":"SELECT ?"}]}`,
		` { "s\u0071l" : "SELECT 1" } `,
	}
	for _, body := range accepted {
		want, err := decodeJSON([]byte(body), nil)
		if err != nil {
			t.Fatalf("decodeJSON(%q): %v", body, err)
		}
		got, ok := decodeFast([]byte(body), nil)
		if !ok {
			t.Errorf("decodeFast gave up on %q", body)
		} else if !reflect.DeepEqual(got, want) {
			t.Errorf("decodeFast(%q)\n got %#v\nwant %#v", body, got, want)
		}
	}
	fallBack := []string{
		`{"SQL":"SELECT 1"}`,
		`{"sql":"SELECT 1","Params":[]}`,
		`{"bAtch":[]}`,
		`{"ſql":"SELECT 1"}`,
		`{"sql":"SELECT 1","sql":"SELECT 1"}`,
		`{"batch":[{"sql":"SELECT 1","params":[],"params":[]}]}`,
		`{"sql":"SELECT 1","x":1}`,
		`{"sql":"SELECT ?","params":[[1,2,255]]}`,
		`{"sql":"SELECT ?","params":[{"a":1}]}`,
		`{"sql":"SELECT ?","params":["\ud83d\ude00"]}`,
		"{\"sql\":\"SELECT '\xff'\"}",
		`{"sql":"SELECT ?","params":[01]}`,
		`{"sql":"SELECT 1"} x`,
		`{"sql":null}`,
		`{"sql":"SELECT 1","params":null}`,
		`{"batch":null}`,
		`{"batch":[null]}`,
		`{"batch":[{}]}`,
		`{"sql":"SELECT 1","batch":[]}`,
		`{"batch":[],"params":[]}`,
		`{}`,
	}
	for _, body := range fallBack {
		if got, ok := decodeFast([]byte(body), nil); ok {
			t.Errorf("decodeFast accepted %q: %#v", body, got)
		}
	}
}

// TestDecodeBodyFallBack: bodies decodeFast leaves to encoding/json decode
// as before, blobs and objects among the params included, and errors read
// as before.
func TestDecodeBodyFallBack(t *testing.T) {
	got, err := decodeBody([]byte(`{"sql":"SELECT ?, ?","params":[[1,2,255],{"a":1}]}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []any{[]any{json.Number("1"), json.Number("2"), json.Number("255")}, map[string]any{"a": json.Number("1")}}
	if len(got) != 1 || !reflect.DeepEqual(got[0].params, want) {
		t.Fatalf("params = %#v, want %#v", got, want)
	}
	got, err = decodeBody([]byte(`{"SQL":"SELECT 1"}`), nil)
	if err != nil || len(got) != 1 || got[0].sql != "SELECT 1" {
		t.Fatalf(`{"SQL":...} = %#v, %v`, got, err)
	}
	for body, want := range map[string]string{
		`{"sql":"SELECT 1","batch":[]}`: `request body must hold either "sql" (with "params") or "batch", not both`,
		`{"params":[]}`:                 `request body must hold "sql" or "batch"`,
		`{"batch":[{}]}`:                `batch entry 0 has no "sql"`,
		`{"sql":"SELECT 1"} x`:          "malformed JSON in request body: data after the JSON value",
	} {
		if _, err := decodeBody([]byte(body), nil); err == nil || err.Error() != want {
			t.Errorf("decodeBody(%q) error = %v, want %s", body, err, want)
		}
	}
}
