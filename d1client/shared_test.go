package d1client

import (
	"errors"
	"net"
	"net/http"
	"testing"

	"github.com/jarcoal/httpmock"
)

// Statements and responders the package's tests share.
var (
	readStmt  = []Statement{{SQL: "SELECT v FROM t WHERE k = ?", Params: []any{"k"}}}
	writeStmt = []Statement{{SQL: "INSERT INTO t(k) VALUES (?)", Params: []any{"k"}}}
)

func ok1(t testing.TB) httpmock.Responder { return httpmock.NewStringResponder(200, okResults(1)) }

func dialRefused(*http.Request) (*http.Response, error) {
	return nil, &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
}
