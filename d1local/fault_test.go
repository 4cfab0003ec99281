package d1local

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestFaults(t *testing.T) {
	tests := []struct {
		name      string
		fault     Fault
		status    int // 0: the connection is dropped
		code      int // 0: not a JSON error
		committed bool
		check     func(t *testing.T, r response)
	}{
		{name: "zero fault", fault: Fault{}, status: 200, committed: true},
		{name: "rate limit", fault: Fault{RateLimit: true}, status: 429, code: 971, check: func(t *testing.T, r response) {
			if r.env.Errors[0].Message != "Please wait and consider throttling your request speed" {
				t.Errorf("message %q", r.env.Errors[0].Message)
			}
			if got := r.header.Get("Retry-After"); got != "300" {
				t.Errorf("Retry-After = %q, want 300", got)
			}
		}},
		{name: "rate limit with RetryAfter", fault: Fault{RateLimit: true, RetryAfter: 1500 * time.Millisecond}, status: 429, code: 971,
			check: func(t *testing.T, r response) {
				if got := r.header.Get("Retry-After"); got != "2" {
					t.Errorf("Retry-After = %q, want 2", got)
				}
			}},
		{name: "rate limit ignores AfterCommit", fault: Fault{RateLimit: true, AfterCommit: true}, status: 429, code: 971},
		{name: "overloaded", fault: Fault{Overloaded: true}, status: 429, code: 7500, check: func(t *testing.T, r response) {
			if r.env.Errors[0].Message != "D1 DB is overloaded. Requests queued for too long." {
				t.Errorf("message %q", r.env.Errors[0].Message)
			}
		}},
		{name: "overloaded after commit", fault: Fault{Overloaded: true, AfterCommit: true}, status: 429, code: 7500, committed: true},
		{name: "internal", fault: Fault{Internal: true}, status: 500, code: 7500, check: func(t *testing.T, r response) {
			if msg := r.env.Errors[0].Message; !strings.HasPrefix(msg, "internal error; reference = ") || len(msg) < 35 {
				t.Errorf("message %q", msg)
			}
			if string(r.env.Result) != "null" {
				t.Errorf("result = %s", r.env.Result)
			}
		}},
		{name: "internal after commit", fault: Fault{Internal: true, AfterCommit: true}, status: 500, code: 7500, committed: true},
		{name: "bad gateway", fault: Fault{BadGateway: true}, status: 502, check: func(t *testing.T, r response) {
			if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "text/html") {
				t.Errorf("Content-Type = %q", ct)
			}
			if !strings.Contains(string(r.body), "<title>502 Bad Gateway</title>") {
				t.Errorf("body %s", r.body)
			}
		}},
		{name: "bad gateway after commit", fault: Fault{BadGateway: true, AfterCommit: true}, status: 502, committed: true},
		{name: "lose response", fault: Fault{LoseResponse: true}, status: 0, committed: true},
		{name: "lose response wins over an error", fault: Fault{LoseResponse: true, Internal: true}, status: 0, committed: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, Config{})
			h.exec(t, "db", "CREATE TABLE t (x TEXT)")
			h.srv.Inject(tt.fault)
			body := batch(q("INSERT INTO t VALUES (?)", "written"), q("SELECT count(*) AS n FROM t"))
			if tt.status == 0 {
				data, _ := json.Marshal(body)
				resp, err := http.Post(h.url+"/accounts/acc/d1/database/db/query", "application/json", strings.NewReader(string(data)))
				if err == nil {
					resp.Body.Close()
					t.Fatalf("got an answer (%d), want a connection error", resp.StatusCode)
				}
			} else {
				r := h.post(t, "db", "query", body)
				switch {
				case tt.code != 0:
					checkError(t, r, tt.status, tt.code)
				case r.status != tt.status:
					t.Fatalf("status %d, want %d: %s", r.status, tt.status, r.body)
				}
				if tt.check != nil {
					tt.check(t, r)
				}
			}
			want := `[{"n":0}]`
			if tt.committed {
				want = `[{"n":1}]`
			}
			if got := h.rows(t, "db", q("SELECT count(*) AS n FROM t")); got != want {
				t.Errorf("rows after the fault = %s, want %s", got, want)
			}
		})
	}
}

func TestLatencyFault(t *testing.T) {
	h := newHarness(t, Config{})
	h.exec(t, "db", "CREATE TABLE t (x)")
	const latency = 150 * time.Millisecond
	h.srv.Inject(Fault{Latency: latency})
	start := time.Now()
	h.ok(t, "db", q("INSERT INTO t VALUES (1)"))
	if d := time.Since(start); d < latency {
		t.Errorf("answered after %v, want at least %v", d, latency)
	}

	// A client that gives up during the latency: nothing is executed.
	h.srv.Inject(Fault{Latency: 10 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	data, _ := json.Marshal(q("INSERT INTO t VALUES (2)"))
	req, _ := http.NewRequestWithContext(ctx, "POST", h.url+"/accounts/acc/d1/database/db/query", strings.NewReader(string(data)))
	start = time.Now()
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		t.Fatal("got an answer, want the client's timeout")
	}
	if got := h.rows(t, "db", q("SELECT group_concat(x) AS xs FROM t")); got != `[{"xs":"1"}]` {
		t.Errorf("rows = %s: the abandoned request ran", got)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("the abandoned request held the server for %v", d)
	}
}

// A Busy call holds its database: a call to the same database that arrives
// meanwhile runs after it, and a call to another database does not wait.
func TestBusyFaultHoldsItsDatabase(t *testing.T) {
	const busy = 2 * time.Second
	h := newHarness(t, Config{Faults: func(r Request) Fault {
		if r.DatabaseID == "slow" && strings.Contains(r.Statements[0], "'first'") {
			return Fault{Busy: busy}
		}
		return Fault{}
	}})
	h.exec(t, "slow", "CREATE TABLE t (x TEXT)")
	h.exec(t, "other", "CREATE TABLE t (x TEXT)")
	start := time.Now()
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.ok(t, "slow", q("INSERT INTO t VALUES ('first')"))
	}()
	// Wait until the first call holds the database: it is then asleep
	// inside it, and nothing else of "slow" can run.
	d, err := h.srv.database("slow", false)
	if err != nil {
		t.Fatal(err)
	}
	for len(d.lock) == 0 {
		time.Sleep(time.Millisecond)
	}
	h.ok(t, "other", q("INSERT INTO t VALUES ('meanwhile')"))
	select {
	case <-done:
		t.Fatal("the busy call finished before a call to another database")
	default:
	}
	h.ok(t, "slow", q("INSERT INTO t VALUES ('second')"))
	if d := time.Since(start); d < busy {
		t.Errorf("the second call to the busy database answered after %v, before the first had held it for %v", d, busy)
	}
	<-done
	if got := h.rows(t, "slow", q("SELECT group_concat(x) AS xs FROM t")); got != `[{"xs":"first,second"}]` {
		t.Errorf("rows = %s, want the busy call's first", got)
	}
}

func TestInjectIsFIFOAndBeforeTheHook(t *testing.T) {
	var mu sync.Mutex
	var seen []Request
	h := newHarness(t, Config{Faults: func(r Request) Fault {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, r)
		if strings.Contains(strings.Join(r.Statements, " "), "'hook-fault'") {
			return Fault{Internal: true}
		}
		return Fault{}
	}})
	h.srv.Inject(Fault{Internal: true}, Fault{}, Fault{RateLimit: true})
	want := []int{500, 200, 429, 200, 500}
	bodies := []any{
		q("SELECT 1"),
		q("SELECT 2"),
		q("SELECT 3"),
		batch(q("SELECT ?", "a"), q("SELECT 4; SELECT 5")),
		q("SELECT 'hook-fault'"),
	}
	for i, body := range bodies {
		endpoint := "query"
		if i == 3 {
			endpoint = "raw"
		}
		r := h.post(t, "fault-db", endpoint, body)
		if r.status != want[i] {
			t.Errorf("request %d: status %d, want %d: %s", i+1, r.status, want[i], r.body)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 2 {
		t.Fatalf("hook saw %d requests, want 2 (queued faults come first): %+v", len(seen), seen)
	}
	got := seen[0]
	if got.AccountID != "acc" || got.DatabaseID != "fault-db" || got.Endpoint != "raw" || got.Seq != 4 ||
		!slices.Equal(got.Statements, []string{"SELECT ?", "SELECT 4", "SELECT 5"}) {
		t.Errorf("hook saw %+v", got)
	}
	if seen[1].Seq != 5 || seen[1].Endpoint != "query" {
		t.Errorf("hook saw %+v", seen[1])
	}
	if n := h.srv.Calls(); n != 5 {
		t.Errorf("Calls() = %d, want 5", n)
	}
}

func TestFaultsOnlyApplyToCalls(t *testing.T) {
	h := newHarness(t, Config{Token: "tok"})
	h.srv.Inject(Fault{Internal: true})
	// Neither an unknown route, nor a rejected token, nor a malformed body
	// takes the queued fault.
	checkError(t, h.do(t, "POST", "/nowhere", q("SELECT 1")), 404, 7000)
	checkError(t, h.post(t, "db", "query", q("SELECT 1")), 403, 10000)
	checkError(t, h.post(t, "db", "query", "{", "Authorization", "Bearer tok"), 400, 7400)
	checkError(t, h.post(t, "db", "query", q("SELECT 1"), "Authorization", "Bearer tok"), 500, 7500)
	if r := h.post(t, "db", "query", q("SELECT 1"), "Authorization", "Bearer tok"); r.status != 200 {
		t.Errorf("status %d after the fault was used: %s", r.status, r.body)
	}
}

func TestFaultIsZero(t *testing.T) {
	if !(Fault{}).IsZero() {
		t.Error("zero Fault is not IsZero")
	}
	for _, f := range []Fault{{Latency: 1}, {Busy: 1}, {LoseResponse: true}, {RateLimit: true}, {RetryAfter: 1},
		{Overloaded: true}, {Internal: true}, {BadGateway: true}, {AfterCommit: true}} {
		if f.IsZero() {
			t.Errorf("%+v is IsZero", f)
		}
	}
}
