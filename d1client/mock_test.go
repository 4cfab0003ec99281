package d1client

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/jarcoal/httpmock"

	"github.com/d1idem/d1idem/d1client/budget"
)

const (
	testAccount  = "0123456789abcdef0123456789abcdef"
	testDatabase = "6b4c8e3e-0000-4000-8000-000000000000"
	testToken    = "tok_SECRET_5f2b9c1e7a44d0"
	testBaseURL  = "https://api.cloudflare.test/client/v4"
	rawURL       = testBaseURL + "/accounts/" + testAccount + "/d1/database/" + testDatabase + "/raw"
)

// fixture reads a recorded D1 response from testdata/d1/<name>.http (a raw
// HTTP/1.1 response, status line and headers included).
func fixture(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "testdata", "d1", name+".http"))
	if err != nil {
		t.Fatalf("fixture %s: %v", name, err)
	}
	return b
}

// replay returns an httpmock responder that answers with the recorded
// response, parsed afresh for each request.
func replay(t testing.TB, name string) httpmock.Responder {
	raw := fixture(t, name)
	return func(req *http.Request) (*http.Response, error) {
		res, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(raw)), req)
		if err != nil {
			return nil, err
		}
		body, err := io.ReadAll(res.Body)
		if err != nil {
			return nil, err
		}
		res.Body = io.NopCloser(bytes.NewReader(body))
		res.ContentLength = int64(len(body))
		return res, nil
	}
}

// sequence answers successive requests with successive responders; the last
// one repeats.
func sequence(rs ...httpmock.Responder) httpmock.Responder {
	var mu sync.Mutex
	i := 0
	return func(req *http.Request) (*http.Response, error) {
		mu.Lock()
		r := rs[min(i, len(rs)-1)]
		i++
		mu.Unlock()
		return r(req)
	}
}

// mockClient returns a Client whose HTTP goes to an httpmock transport that
// answers the /raw URL with responder.
func mockClient(t testing.TB, responder httpmock.Responder, mod ...func(*Config)) (*Client, *httpmock.MockTransport) {
	t.Helper()
	tr := httpmock.NewMockTransport()
	tr.RegisterResponder(http.MethodPost, rawURL, responder)
	cfg := Config{
		BaseURL:    testBaseURL,
		APIToken:   testToken,
		AccountID:  testAccount,
		DatabaseID: testDatabase,
		HTTPClient: &http.Client{Transport: tr},
		Budget:     budget.Unlimited(),
		Retry:      RetryPolicy{BaseDelay: 1e6, MaxDelay: 4e6}, // 1 ms, 4 ms: fast tests
	}
	for _, m := range mod {
		m(&cfg)
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c, tr
}

// newTestAccount returns an Account of b; in a synctest bubble, make it
// inside the test's bubble.
func newTestAccount(t testing.TB, b budget.Budget) *budget.Account {
	t.Helper()
	a, err := budget.NewAccount(b)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// rateHeaders are Cloudflare's rate-limit headers: r calls left of the
// account's, the window resetting in t seconds, and a policy of q calls per
// w seconds when q is positive.
func rateHeaders(r, t, q, w int) http.Header {
	h := http.Header{}
	h.Set("Ratelimit", fmt.Sprintf(`"default";r=%d;t=%d`, r, t))
	if q > 0 {
		h.Set("Ratelimit-Policy", fmt.Sprintf(`"burst";q=%d;w=%d`, q, w))
	}
	return h
}
