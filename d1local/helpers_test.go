package d1local

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// harness is a d1local Server on an httptest server, spoken to in raw
// HTTP and JSON.
type harness struct {
	srv *Server
	url string
}

// newHarness starts a Server with cfg; both stop when the test ends.
func newHarness(t *testing.T, cfg Config) *harness {
	t.Helper()
	srv, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ts := httptest.NewServer(srv)
	t.Cleanup(func() {
		ts.Close()
		if err := srv.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return &harness{srv: srv, url: ts.URL}
}

// envelope is Cloudflare's response envelope.
type envelope struct {
	Result   json.RawMessage `json:"result"`
	Success  *bool           `json:"success"`
	Errors   []apiErr        `json:"errors"`
	Messages json.RawMessage `json:"messages"`
}

type apiErr struct {
	Code       int      `json:"code"`
	Message    string   `json:"message"`
	ErrorChain []apiErr `json:"error_chain"`
}

// queryResult is one entry of "result".
type queryResult struct {
	Results json.RawMessage `json:"results"`
	Success bool            `json:"success"`
	Meta    resultMeta      `json:"meta"`
}

type resultMeta struct {
	ServedBy        string `json:"served_by"`
	ServedByRegion  string `json:"served_by_region"`
	ServedByPrimary *bool  `json:"served_by_primary"`
	Timings         struct {
		SQLDurationMs *json.Number `json:"sql_duration_ms"`
	} `json:"timings"`
	Duration    *json.Number `json:"duration"`
	Changes     *json.Number `json:"changes"`
	LastRowID   *json.Number `json:"last_row_id"`
	ChangedDB   *bool        `json:"changed_db"`
	SizeAfter   *json.Number `json:"size_after"`
	RowsRead    *json.Number `json:"rows_read"`
	RowsWritten *json.Number `json:"rows_written"`
}

// response is one HTTP answer.
type response struct {
	status  int
	header  http.Header
	body    []byte
	env     envelope
	results []queryResult
}

// q builds a single-query body.
func q(sql string, params ...any) map[string]any {
	m := map[string]any{"sql": sql}
	if params != nil {
		m["params"] = params
	}
	return m
}

// batch builds a batch body.
func batch(queries ...map[string]any) map[string]any {
	return map[string]any{"batch": queries}
}

// post sends body (a string is sent verbatim, anything else as JSON) to
// the endpoint of database db of account "acc".
func (h *harness) post(t *testing.T, db, endpoint string, body any, header ...string) response {
	t.Helper()
	return h.do(t, http.MethodPost, "/accounts/acc/d1/database/"+db+"/"+endpoint, body, header...)
}

// do sends a request; header holds name, value pairs.
func (h *harness) do(t *testing.T, method, path string, body any, header ...string) response {
	t.Helper()
	var data []byte
	switch b := body.(type) {
	case nil:
	case string:
		data = []byte(b)
	case []byte:
		data = b
	default:
		var err error
		if data, err = json.Marshal(b); err != nil {
			t.Fatalf("marshal body: %v", err)
		}
	}
	req, err := http.NewRequest(method, h.url+path, bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		if header[i] == "Host" {
			req.Host = header[i+1]
			continue
		}
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read body: %v", err)
	}
	r := response{status: resp.StatusCode, header: resp.Header, body: raw}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		if err := dec.Decode(&r.env); err != nil {
			t.Fatalf("decode envelope %s: %v", raw, err)
		}
		if r.status == http.StatusOK && (strings.HasSuffix(path, "/query") || strings.HasSuffix(path, "/raw")) {
			dec := json.NewDecoder(bytes.NewReader(r.env.Result))
			dec.UseNumber()
			if err := dec.Decode(&r.results); err != nil {
				t.Fatalf("decode results %s: %v", r.env.Result, err)
			}
		}
	}
	return r
}

// ok posts to /query of db and fails the test unless D1 would answer 200.
func (h *harness) ok(t *testing.T, db string, body any) []queryResult {
	t.Helper()
	r := h.post(t, db, "query", body)
	if r.status != http.StatusOK || r.env.Success == nil || !*r.env.Success {
		t.Fatalf("query %v: status %d, body %s", body, r.status, r.body)
	}
	return r.results
}

// exec runs each SQL string as its own request on db.
func (h *harness) exec(t *testing.T, db string, sqls ...string) {
	t.Helper()
	for _, s := range sqls {
		h.ok(t, db, q(s))
	}
}

// rows runs a /query and returns the first result's rows as JSON.
func (h *harness) rows(t *testing.T, db string, body any) string {
	t.Helper()
	res := h.ok(t, db, body)
	return string(res[0].Results)
}

// sqlError posts body to /query of db, checks that it is answered as a D1
// SQL error (400, code 7500, "result": []) and returns the message.
func (h *harness) sqlError(t *testing.T, db string, body any) string {
	t.Helper()
	r := h.post(t, db, "query", body)
	checkError(t, r, http.StatusBadRequest, 7500)
	if string(r.env.Result) != "[]" {
		t.Errorf("SQL error result = %s, want []", r.env.Result)
	}
	return r.env.Errors[0].Message
}

// checkError checks an error envelope's status, code and shape.
func checkError(t *testing.T, r response, status, code int) {
	t.Helper()
	if r.status != status {
		t.Fatalf("status = %d, want %d; body %s", r.status, status, r.body)
	}
	if r.env.Success == nil || *r.env.Success {
		t.Fatalf("success is not false: %s", r.body)
	}
	if len(r.env.Errors) != 1 || r.env.Errors[0].Code != code {
		t.Fatalf("errors = %+v, want one with code %d; body %s", r.env.Errors, code, r.body)
	}
	if string(r.env.Messages) != "[]" {
		t.Errorf("messages = %s, want []", r.env.Messages)
	}
	if !strings.Contains(string(r.body), `"result":`) {
		t.Errorf("no result field: %s", r.body)
	}
}

// openDatabase opens the database stored at path, for tests that use one
// without a server.
func openDatabase(id, path string, h *handles) (*database, error) {
	d := newDatabase(id, path, h)
	if err := d.connect(); err != nil {
		return nil, err
	}
	return d, nil
}

// openFiles reports the database files the server has open now.
func (s *Server) openFiles() int {
	s.mu.Lock()
	h := s.handles
	s.mu.Unlock()
	if h == nil {
		return 0
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.open
}

// isOpen reports whether the server's database id has its connection
// open, waiting until the database is free.
func (s *Server) isOpen(t *testing.T, id string) bool {
	t.Helper()
	s.mu.Lock()
	d := s.dbs[id]
	s.mu.Unlock()
	if d == nil {
		t.Fatalf("database %s is not listed", id)
	}
	d.lock <- struct{}{}
	defer func() { <-d.lock }()
	return d.conn != nil
}
