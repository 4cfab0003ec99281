package d1client

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/d1idem/d1idem/d1client/budget"
)

// The response decoder never panics: any status and body becomes either
// exactly one decoded Result per statement, rows as wide as their columns,
// or an *Error of a known kind.
func FuzzResponseDecoder(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("..", "testdata", "d1", "*.http"))
	for _, name := range files {
		raw, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		head, body, _ := strings.Cut(string(raw), "\r\n\r\n")
		status := 200
		if fields := strings.Fields(head); len(fields) > 1 {
			if n, err := parseStatus(fields[1]); err == nil {
				status = n
			}
		}
		f.Add(status, []byte(body), 1)
		f.Add(status, []byte(body), 2)
	}
	f.Add(200, []byte(`{"result":[{"results":{"columns":["a"],"rows":[[1],[null],["x"],[[1,2]],[1.5],[true]]},"success":true,"meta":{"changes":1.0}}],"success":true,"errors":[]}`), 1)
	f.Add(200, []byte(`{"result":[{"results":[{"a":1,"b":2},{"a":3,"b":4}],"success":true,"meta":null}],"success":true}`), 1)
	f.Add(200, []byte(`{"result":[{"results":{"columns":["a"],"rows":[[1,2]]}}],"success":true}`), 1)
	c, err := New(Config{AccountID: "acct", DatabaseID: "db", BaseURL: "http://127.0.0.1:1", Budget: budget.Unlimited()})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, status int, body []byte, n int) {
		if n < 1 || n > 8 || status < 100 || status > 599 {
			return
		}
		results, e := c.classify(status, http.Header{}, body, n)
		if e != nil {
			if kindSentinels[e.kind] == nil || e.Error() == "" {
				t.Fatalf("error without a kind: %#v", e)
			}
			return
		}
		if len(results) != n {
			t.Fatalf("%d results for %d statements", len(results), n)
		}
		for _, r := range results {
			for _, row := range r.Rows {
				if len(row) != len(r.Columns) {
					t.Fatalf("row of %d values for %d columns", len(row), len(r.Columns))
				}
			}
		}
	})
}

func parseStatus(s string) (int, error) {
	n := 0
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0, os.ErrInvalid
		}
		n = n*10 + int(c-'0')
	}
	return n, nil
}
