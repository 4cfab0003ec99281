package d1client

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/d1idem/d1idem/d1client/budget"
)

// refDecode is a reference response decoder in several passes: the
// envelope into raw messages, then the result array, then each
// statement's results, then each cell. The one-pass
// decoder must agree with it on every body (FuzzDecoderMatchesReference).
func refDecode(body []byte, n int) ([]Result, string) {
	var env struct {
		Success  *bool           `json:"success"`
		Errors   []ErrorDetail   `json:"errors"`
		Messages json.RawMessage `json:"messages"`
		Result   json.RawMessage `json:"result"`
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if err := dec.Decode(&env); err != nil || env.Success == nil && env.Result == nil && env.Errors == nil {
		return nil, "non-JSON"
	}
	if env.Success == nil || !*env.Success {
		return nil, "envelope"
	}
	var raws []struct {
		Results json.RawMessage `json:"results"`
		Success *bool           `json:"success"`
		Meta    refMeta         `json:"meta"`
	}
	if err := json.Unmarshal(env.Result, &raws); err != nil {
		return nil, "envelope"
	}
	if len(raws) != n {
		return nil, "result count"
	}
	out := make([]Result, n)
	for i, rr := range raws {
		if rr.Success != nil && !*rr.Success {
			return nil, "envelope"
		}
		res := Result{Meta: Meta(rr.Meta)}
		b := bytes.TrimSpace(rr.Results)
		if len(b) == 0 || bytes.Equal(b, []byte("null")) || bytes.Equal(b, []byte("[]")) {
			out[i] = res
			continue
		}
		var table struct {
			Columns []string            `json:"columns"`
			Rows    [][]json.RawMessage `json:"rows"`
		}
		if b[0] == '[' {
			cols, rows, err := decodeObjects(b)
			if err != nil {
				return nil, "envelope"
			}
			table.Columns, table.Rows = cols, rows
		} else if err := json.Unmarshal(b, &table); err != nil {
			return nil, "envelope"
		}
		res.Columns = table.Columns
		if len(table.Rows) > 0 {
			res.Rows = make([]Row, len(table.Rows))
		}
		for r, cells := range table.Rows {
			if len(cells) != len(res.Columns) {
				return nil, "envelope"
			}
			row := make(Row, len(cells))
			for j, cell := range cells {
				v, err := refValue(cell)
				if err != nil {
					return nil, "envelope"
				}
				row[j] = v
			}
			res.Rows[r] = row
		}
		out[i] = res
	}
	return out, ""
}

func refValue(raw json.RawMessage) (Value, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return Value{}, fmt.Errorf("empty cell")
	}
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
			return Value{}, err
		}
		b := make([]byte, len(nums))
		for i, n := range nums {
			x, err := strconv.ParseUint(string(n), 10, 8)
			if err != nil {
				return Value{}, err
			}
			b[i] = byte(x)
		}
		return BlobValue(b), nil
	case c == '{':
		return TextValue(string(raw)), nil
	}
	if i, err := strconv.ParseInt(string(raw), 10, 64); err == nil {
		return IntValue(i), nil
	}
	f, err := strconv.ParseFloat(string(raw), 64)
	return RealValue(f), err
}

// refMeta is Meta decoded through json.Number, as before.
type refMeta Meta

func (m *refMeta) UnmarshalJSON(data []byte) error {
	if bytes.Equal(bytes.TrimSpace(data), []byte("null")) {
		*m = refMeta{}
		return nil
	}
	var tagged struct {
		Changes         json.Number `json:"changes"`
		LastRowID       json.Number `json:"last_row_id"`
		ChangedDB       bool        `json:"changed_db"`
		Duration        json.Number `json:"duration"`
		RowsRead        json.Number `json:"rows_read"`
		RowsWritten     json.Number `json:"rows_written"`
		SizeAfter       json.Number `json:"size_after"`
		ServedBy        string      `json:"served_by"`
		ServedByColo    string      `json:"served_by_colo"`
		ServedByRegion  string      `json:"served_by_region"`
		ServedByPrimary bool        `json:"served_by_primary"`
		TotalAttempts   json.Number `json:"total_attempts"`
	}
	if err := json.Unmarshal(data, &tagged); err != nil {
		return err
	}
	num := func(n json.Number) int64 {
		if n == "" {
			return 0
		}
		if i, err := n.Int64(); err == nil {
			return i
		}
		f, _ := n.Float64()
		return int64(f)
	}
	*m = refMeta{
		Changes: num(tagged.Changes), LastRowID: num(tagged.LastRowID), ChangedDB: tagged.ChangedDB,
		RowsRead: num(tagged.RowsRead), RowsWritten: num(tagged.RowsWritten), SizeAfter: num(tagged.SizeAfter),
		ServedBy: tagged.ServedBy, ServedByColo: tagged.ServedByColo, ServedByRegion: tagged.ServedByRegion,
		ServedByPrimary: tagged.ServedByPrimary, TotalAttempts: num(tagged.TotalAttempts),
	}
	if tagged.Duration != "" {
		m.Duration, _ = tagged.Duration.Float64()
	}
	return nil
}

// kindName names a decoding outcome as refDecode does.
func kindName(e *Error) string {
	switch {
	case e == nil:
		return ""
	case e.kind == kindNonJSON:
		return "non-JSON"
	case e.kind == kindResultCount:
		return "result count"
	}
	return "envelope"
}

// The one-pass decoder decodes every 200 body exactly as the former
// four-pass one did, or fails the same way. The one intended difference: a
// body with anything but white space after the envelope is not JSON.
func FuzzDecoderMatchesReference(f *testing.F) {
	for _, seed := range decoderSeeds {
		f.Add([]byte(seed), 1)
		f.Add([]byte(seed), 2)
	}
	c, err := New(Config{AccountID: "acct", DatabaseID: "db", BaseURL: "http://127.0.0.1:1", Budget: budget.Unlimited()})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body []byte, n int) {
		if n < 1 || n > 4 || !json.Valid(body) {
			return
		}
		want, wantKind := refDecode(body, n)
		got, e := c.classify(200, http.Header{}, body, n)
		if kindName(e) != wantKind {
			t.Fatalf("outcome %q (%v), reference %q", kindName(e), e, wantKind)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("results differ:\n got %#v\nwant %#v", got, want)
		}
	})
}

var decoderSeeds = []string{
	`{"success":true,"errors":[],"messages":[],"result":[{"results":{"columns":["generation"],"rows":[[1]]},"success":true,"meta":{"served_by":"d1local","duration":0.05,"changes":1,"last_row_id":12,"changed_db":true,"size_after":20480,"rows_read":1,"rows_written":2}},{"results":{"columns":["fingerprint","status","response_body"],"rows":[["fp","completed","{\"id\":\"ord_1\"}\u00e9\/"]]},"success":true,"meta":{"served_by":"d1local","served_by_primary":null,"changed_db":false}}]}`,
	`{"success":true,"result":[{"results":{"columns":["a","a"],"rows":[[1,2],[3,4]]},"meta":{"served_by":"x"}},{"results":{"columns":["a"],"rows":[]},"meta":{"served_by":"x\"y"}}]}`,
	`{"result":[{"results":{"columns":["a","a","b"],"rows":[[1,-0,"x\u00e9\"\\"],[null,1.5,[1,2,255]],[true,false,{"k":1}],[9223372036854775808,1e3,""]]},"success":true,"meta":{"changes":1.0,"duration":0.25,"last_row_id":"7","rows_read":null}}],"success":true,"errors":[]}`,
	`{"result":[{"results":[{"a":1,"b":"x"},{"a":3,"b":null}],"success":true,"meta":null}],"success":true}`,
	`{"result":[{"results":[{"a":1},{"b":3}]}],"success":true}`,
	`{"result":[{"results":{"columns":["a"],"rows":[[1,2]]}}],"success":true}`,
	`{"result":[{"results":{"columns":["a"],"rows":[[[256]]]}}],"success":true}`,
	`{"result":[{"results":null,"success":true},{"results":[],"meta":{}}],"success":true}`,
	`{"result":[{"success":false}],"success":true}`,
	`{"result":{},"success":true}`,
	`{"result":[{"meta":{"changes":true}}],"success":true}`,
	`{"result":[{"meta":{"changes":"x"}}],"success":true}`,
	`{"result":[{"results":"no"}],"success":true}`,
	`{"result":null,"success":true}`,
	`{"success":false,"errors":[{"code":7500,"message":"x"}]}`,
	`{"errors":"x"}`,
	`[]`,
	`{}`,
	`{"Result":[{"Results":{"Columns":["a"],"Rows":[["\ud83d\ude00"]]},"Success":true}],"SUCCESS":true}`,
}

func TestDecoderMatchesReference(t *testing.T) {
	c, _ := mockClient(t, ok1(t))
	for _, seed := range decoderSeeds {
		for n := 1; n <= 2; n++ {
			want, wantKind := refDecode([]byte(seed), n)
			got, e := c.classify(200, http.Header{}, []byte(seed), n)
			if kindName(e) != wantKind || !reflect.DeepEqual(got, want) {
				t.Errorf("%s (n=%d): got %#v, %v; reference %#v, %q", strings.TrimSpace(seed), n, got, e, want, wantKind)
			}
		}
	}
}

// TestMetaNumberMatchesParseFloat: meta's numbers have exactly the values
// ParseFloat and ParseInt give them, the integer exact where ParseInt reads
// it.
func TestMetaNumberMatchesParseFloat(t *testing.T) {
	for _, num := range []string{
		"0", "7", "-1", "42", "8192", "1700000000000", "9007199254740993", // 2^53+1: the float rounds
		"999999999999999999", "-999999999999999999", "1234567890123456789", "9223372036854775808", "1.5", "1e3",
	} {
		var got metaNumber
		err := got.UnmarshalJSON([]byte(num))
		f, _ := strconv.ParseFloat(num, 64)
		i, ierr := strconv.ParseInt(num, 10, 64)
		want := metaNumber{i: int64(f), f: f}
		if ierr == nil {
			want.i = i
		}
		if err != nil || got != want {
			t.Errorf("%s: %+v (%v), want %+v", num, got, err, want)
		}
	}
	for _, num := range []string{"-", "", "x"} {
		var m metaNumber
		if err := m.UnmarshalJSON([]byte(num)); err == nil {
			t.Errorf("%q: read as %+v", num, m)
		}
	}
	// -0 keeps its sign and a quoted integer is read.
	var m metaNumber
	if err := m.UnmarshalJSON([]byte("-0")); err != nil || !math.Signbit(m.f) || m.i != 0 {
		t.Errorf("-0: %+v, %v", m, err)
	}
	if err := m.UnmarshalJSON([]byte(`"12"`)); err != nil || m != (metaNumber{i: 12, f: 12}) {
		t.Errorf(`"12": %+v, %v`, m, err)
	}
}

// TestDeepNestingIsRefused: an answer nesting arrays millions deep where
// the decoder skips a value is refused as encoding/json refuses it, with
// a bounded stack, rather than growing the stack with the body (a fatal
// error past 1 GB).
func TestDeepNestingIsRefused(t *testing.T) {
	c, _ := mockClient(t, ok1(t))
	const depth = 5_000_000
	body := []byte(`{"result":[{"meta":{"x":` + strings.Repeat("[", depth) + strings.Repeat("]", depth) + `}}],"success":true}`)
	if _, e := c.classify(200, http.Header{}, body, 1); e == nil || e.kind != kindNonJSON {
		t.Errorf("classify: %v, want a non-JSON error", e)
	}
}
