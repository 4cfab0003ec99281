package console

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/d1idem/d1idem/d1client"
)

// recorder keeps the statements a client sends to D1, from its requests'
// bodies, so that a test can ask SQLite how it runs them.
type recorder struct {
	mu    sync.Mutex
	stmts []d1client.Statement
}

// install makes a client's requests go through the recorder.
func (rec *recorder) install(c *d1client.Config) {
	base := http.DefaultTransport
	if c.HTTPClient != nil && c.HTTPClient.Transport != nil {
		base = c.HTTPClient.Transport
	}
	c.HTTPClient = &http.Client{Transport: roundTripper(func(req *http.Request) (*http.Response, error) {
		if req.Body != nil && strings.HasSuffix(req.URL.Path, "/raw") {
			body, err := io.ReadAll(req.Body)
			if err != nil {
				return nil, err
			}
			req.Body = io.NopCloser(bytes.NewReader(body))
			rec.add(body)
		}
		return base.RoundTrip(req)
	})}
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// add records the statements of a /raw body: one, or a batch.
func (rec *recorder) add(body []byte) {
	type wire struct {
		SQL    string `json:"sql"`
		Params []any  `json:"params"`
	}
	var one wire
	var batch struct{ Batch []wire }
	decode := func(v any) error {
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.UseNumber()
		return dec.Decode(v)
	}
	if decode(&batch) != nil || len(batch.Batch) == 0 {
		if decode(&one) != nil {
			panic(fmt.Sprintf("not a /raw body: %s", body))
		}
		batch.Batch = []wire{one}
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for _, w := range batch.Batch {
		params := make([]any, len(w.Params))
		for i, p := range w.Params {
			params[i] = p
			if n, ok := p.(json.Number); ok {
				params[i], _ = n.Int64()
			}
		}
		rec.stmts = append(rec.stmts, d1client.Statement{SQL: w.SQL, Params: params})
	}
}

// take returns the statements recorded since the last take.
func (rec *recorder) take() []d1client.Statement {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	out := rec.stmts
	rec.stmts = nil
	return out
}

// plan is how SQLite runs a statement: the details of EXPLAIN QUERY PLAN.
type plan struct {
	sql   string
	steps []string
}

// scans reports whether the plan reads the ledger table from end to end:
// a SCAN of the table itself. (A SCAN of the table USING INDEX walks an
// index in order, as far as its LIMIT needs.)
func (p plan) scans() bool {
	for _, s := range p.steps {
		if s == "SCAN idempotency_keys" {
			return true
		}
	}
	return false
}

func (p plan) String() string { return p.sql + "\n    => " + strings.Join(p.steps, " | ") }

// explain asks the database how it runs each statement that reads the
// ledger table.
func explain(t testing.TB, db *d1client.Client, stmts []d1client.Statement) []plan {
	t.Helper()
	var out []plan
	for _, st := range stmts {
		if !strings.Contains(st.SQL, "idempotency_keys") || !strings.HasPrefix(strings.TrimSpace(st.SQL), "SELECT") {
			continue
		}
		res, err := db.Query(context.Background(), "EXPLAIN QUERY PLAN "+st.SQL, st.Params...)
		if err != nil {
			t.Fatalf("EXPLAIN QUERY PLAN %s: %v", st.SQL, err)
		}
		p := plan{sql: st.SQL}
		for _, row := range res.Rows {
			var id, parent, unused int64
			var detail string
			if err := row.Scan(&id, &parent, &unused, &detail); err != nil {
				t.Fatal(err)
			}
			p.steps = append(p.steps, detail)
		}
		out = append(out, p)
	}
	return out
}

// TestPagesReadByIndex: the keys pages (first and later), the lookup and
// the release read the ledger through its indexes only, however many rows
// it holds: no statement of theirs scans the table (-v logs each plan). A
// page filtered by status walks the updated_at index until its page is
// full, skipping the rows of the other status (no index holds the status);
// the overview's stuck keys are such a read of the rows older than
// QuietAfter; its counts (the stats of d1idem stats) are the one full read,
// which the page says.
func TestPagesReadByIndex(t *testing.T) {
	rec := &recorder{}
	f := newFixture(t, setup{cfg: Config{AllowRelease: true, Refresh: -1}, client: []func(*d1client.Config){rec.install}})
	for i := range 5 {
		f.clock.Advance(time.Second)
		f.claim(t, fmt.Sprintf("acct_%d", i%2), fmt.Sprintf("k%d", i))
	}
	f.clock.Advance(quiet + time.Second)
	c := client(t)
	first := get(t, c, f.url+"/keys?limit=2")
	m := nextLink.FindStringSubmatch(first.body)
	if m == nil {
		t.Fatal("no next page")
	}
	confirm := get(t, c, f.url+"/release?principal=acct_0&key=k0&generation=1")
	rec.take()
	for _, pg := range []struct {
		name string
		send func() answer
	}{
		{"keys", func() answer { return get(t, c, f.url+"/keys?limit=2") }},
		{"keys, next page", func() answer { return get(t, c, f.url+strings.ReplaceAll(m[1], "&amp;", "&")) }},
		{"keys of a principal", func() answer { return get(t, c, f.url+"/keys?principal=acct_1") }},
		{"keys pending, not updated for 20s", func() answer { return get(t, c, f.url+"/keys?status=pending&older_than=20s") }},
		{"lookup", func() answer { return get(t, c, f.url+"/key?principal=acct_0&key=k2") }},
		{"release confirmation", func() answer { return get(t, c, f.url+"/release?principal=acct_0&key=k0&generation=1") }},
		{"release", func() answer {
			return post(t, c, f.url+"/release", url.Values{"principal": {"acct_0"}, "key": {"k0"}, "generation": {"1"}, "csrf": {csrfOf(t, confirm.body)}})
		}},
	} {
		if a := pg.send(); a.status != 200 {
			t.Fatalf("%s: %d\n%s", pg.name, a.status, a.body)
		}
		plans := explain(t, f.db, rec.take())
		if len(plans) == 0 {
			t.Fatalf("%s read nothing", pg.name)
		}
		for _, p := range plans {
			t.Logf("%s: %s", pg.name, p)
			if p.scans() {
				t.Errorf("%s scans the ledger table:\n%s", pg.name, p)
			}
		}
	}

	get(t, c, f.url+"/")
	stuck := 0
	for _, p := range explain(t, f.db, rec.take()) {
		t.Logf("overview: %s", p)
		switch {
		case strings.Contains(p.sql, "WHERE principal <> '' AND status = ? AND updated_at < ") && strings.HasSuffix(p.sql, "LIMIT ?"):
			stuck++
			if p.scans() || !strings.Contains(strings.Join(p.steps, " "), "USING INDEX idx_idempotency_keys_updated_at (updated_at<?)") {
				t.Errorf("the stuck keys are not read by the updated_at index:\n%s", p)
			}
		case p.scans() && !statsSQL(p.sql):
			t.Errorf("the overview scans the ledger table beyond its stats:\n%s", p)
		}
	}
	if stuck != 1 {
		t.Errorf("the overview read the stuck keys %d times", stuck)
	}
}

// statsSQL reports whether a statement is one of Admin.Overview's, the
// stats of d1idem stats, which count the whole table.
func statsSQL(sql string) bool {
	for _, prefix := range []string{"SELECT status, count(*) FROM idempotency_keys", "SELECT (SELECT count(*) FROM idempotency_keys"} {
		if strings.HasPrefix(sql, prefix) {
			return true
		}
	}
	return strings.HasSuffix(sql, "FROM idempotency_keys WHERE principal <> '' ORDER BY updated_at, principal, key LIMIT 1") // the oldest row
}
