package d1local_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"

	"github.com/d1idem/d1idem/d1local"
)

// metaField matches a result's meta object.
var metaField = regexp.MustCompile(`,"meta":\{.*?"rows_written":\d+\}`)

func Example() {
	srv, err := d1local.New(d1local.Config{}) // in-memory databases
	if err != nil {
		panic(err)
	}
	defer srv.Close()
	ts := httptest.NewServer(srv)
	defer ts.Close()

	post := func(endpoint, body string) string {
		resp, err := http.Post(ts.URL+"/client/v4/accounts/my-account/d1/database/my-db/"+endpoint,
			"application/json", strings.NewReader(body))
		if err != nil {
			panic(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		// Drop meta, whose duration varies, to keep the output stable.
		return fmt.Sprintf("%d %s", resp.StatusCode, metaField.ReplaceAllString(string(b), ""))
	}

	fmt.Println(post("query", `{"batch":[
		{"sql":"CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)"},
		{"sql":"INSERT INTO notes (body) VALUES (?) RETURNING id","params":["hello"]}]}`))
	fmt.Println(post("raw", `{"sql":"SELECT id, body FROM notes WHERE id = ?","params":[1]}`))
	fmt.Println(post("query", `{"sql":"SELECT * FROM nope"}`))
	// Output:
	// 200 {"result":[{"results":[],"success":true},{"results":[{"id":1}],"success":true}],"success":true,"errors":[],"messages":[]}
	// 200 {"result":[{"results":{"columns":["id","body"],"rows":[[1,"hello"]]},"success":true}],"success":true,"errors":[],"messages":[]}
	// 400 {"result":[],"success":false,"errors":[{"code":7500,"message":"no such table: nope: SQLITE_ERROR"}],"messages":[]}
}
