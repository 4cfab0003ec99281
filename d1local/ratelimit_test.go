package d1local

import (
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// testClock is a clock tests move by hand.
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func newTestClock() *testClock {
	return &testClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *testClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// wantBudget checks a response's rate-limit headers.
func wantBudget(t *testing.T, r response, ratelimit, policy, retryAfter string) {
	t.Helper()
	if got := r.header.Get("Ratelimit"); got != ratelimit {
		t.Errorf("Ratelimit = %q, want %q (status %d)", got, ratelimit, r.status)
	}
	if got := r.header.Get("Ratelimit-Policy"); got != policy {
		t.Errorf("Ratelimit-Policy = %q, want %q", got, policy)
	}
	if got := r.header.Get("Retry-After"); got != retryAfter {
		t.Errorf("Retry-After = %q, want %q", got, retryAfter)
	}
}

func TestBudget(t *testing.T) {
	clock := newTestClock()
	h := newHarness(t, Config{RateLimit: RateLimit{Limit: 3, Window: 10 * time.Second, Block: 30 * time.Second}, Now: clock.Now})
	const policy = `"burst";q=3;w=10`

	r := h.post(t, "a", "query", q("CREATE TABLE t (x)"))
	wantBudget(t, r, `"default";r=2;t=10`, policy, "")
	clock.Advance(4 * time.Second)
	r = h.post(t, "b", "raw", q("SELECT 1"))
	wantBudget(t, r, `"default";r=1;t=6`, policy, "")

	// Calls that are not the account's (an unknown route, a presigned
	// link) are not counted, but carry the headers.
	r = h.do(t, "GET", "/zones", nil)
	wantBudget(t, r, `"default";r=1;t=6`, policy, "")

	clock.Advance(500 * time.Millisecond)
	r = h.do(t, "GET", "/accounts/acc/d1/database", nil) // any endpoint counts
	wantBudget(t, r, `"default";r=0;t=6`, policy, "")
	if r.status != http.StatusOK {
		t.Fatalf("list: %d %s", r.status, r.body)
	}

	// The fourth call in the window is refused, and starts the block.
	r = h.post(t, "a", "query", q("INSERT INTO t VALUES (1)"))
	checkError(t, r, 429, 971)
	if r.env.Errors[0].Message != "Please wait and consider throttling your request speed" {
		t.Errorf("message %q", r.env.Errors[0].Message)
	}
	wantBudget(t, r, `"default";r=0;t=30`, policy, "30")
	clock.Advance(29*time.Second + 100*time.Millisecond)
	r = h.do(t, "GET", "/memberships", nil)
	checkError(t, r, 429, 971)
	wantBudget(t, r, `"default";r=0;t=1`, policy, "1")

	// After the block, a new window.
	clock.Advance(900 * time.Millisecond)
	r = h.post(t, "a", "query", q("SELECT count(*) AS n FROM t"))
	wantBudget(t, r, `"default";r=2;t=10`, policy, "")
	if got := string(r.results[0].Results); got != `[{"n":0}]` {
		t.Errorf("the refused INSERT ran: %s", got)
	}
	// A window ends on its own.
	clock.Advance(10 * time.Second)
	r = h.post(t, "a", "query", q("SELECT 1"))
	wantBudget(t, r, `"default";r=2;t=10`, policy, "")
}

func TestBudgetIgnoresRejectedTokens(t *testing.T) {
	clock := newTestClock()
	h := newHarness(t, Config{Token: "tok", RateLimit: RateLimit{Limit: 2, Window: time.Minute}, Now: clock.Now})
	for range 5 {
		checkError(t, h.post(t, "a", "query", q("SELECT 1"), "Authorization", "Bearer wrong"), 403, 10000)
	}
	r := h.post(t, "a", "query", q("SELECT 1"), "Authorization", "Bearer tok")
	wantBudget(t, r, `"default";r=1;t=60`, `"burst";q=2;w=60`, "")
	h.post(t, "a", "query", q("SELECT 1"), "Authorization", "Bearer tok")
	r = h.post(t, "a", "query", q("SELECT 1"), "Authorization", "Bearer tok")
	checkError(t, r, 429, 971)
	wantBudget(t, r, `"default";r=0;t=300`, `"burst";q=2;w=60`, "300") // the default block
}

func TestNoBudgetNoHeaders(t *testing.T) {
	h := newHarness(t, Config{})
	r := h.post(t, "a", "query", q("SELECT 1"))
	wantBudget(t, r, "", "", "")
}

// TestBudgetIsAccountWide: clients racing on many databases share one
// budget; exactly Limit calls get through.
func TestBudgetIsAccountWide(t *testing.T) {
	clock := newTestClock()
	const limit, callers = 40, 160
	h := newHarness(t, Config{RateLimit: RateLimit{Limit: limit, Window: time.Minute}, Now: clock.Now})
	statuses := make(chan int, callers)
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			db := []string{"a", "b", "c", "d"}[i%4]
			resp, err := http.Post(h.url+"/accounts/acc/d1/database/"+db+"/raw", "application/json",
				strings.NewReader(`{"sql":"SELECT 1"}`))
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
			statuses <- resp.StatusCode
		})
	}
	wg.Wait()
	close(statuses)
	count := map[int]int{}
	for s := range statuses {
		count[s]++
	}
	if count[200] != limit || count[429] != callers-limit {
		t.Errorf("statuses %v, want %d × 200 and %d × 429", count, limit, callers-limit)
	}
}

func TestParseRateLimit(t *testing.T) {
	for in, want := range map[string]RateLimit{
		"":          {},
		"off":       {},
		"1200/300s": CloudflareRateLimit(),
		"600/5m":    {Limit: 600, Window: 5 * time.Minute, Block: 300 * time.Second},
	} {
		got, err := ParseRateLimit(in)
		if err != nil || got != want {
			t.Errorf("ParseRateLimit(%q) = %+v, %v; want %+v", in, got, err, want)
		}
		if again, err := ParseRateLimit(got.String()); err != nil || again != got {
			t.Errorf("ParseRateLimit(%q.String() = %q) = %+v, %v", in, got.String(), again, err)
		}
	}
	for in, want := range map[string]string{
		"1200":              "CALLS a positive integer",
		"x/300s":            "CALLS a positive integer",
		"0/300s":            "CALLS a positive integer",
		"-1/300s":           "CALLS a positive integer",
		"1200/x":            "WINDOW a duration (1s to 24h)",
		"1200/999999999h":   "WINDOW a duration (1s to 24h)", // overflows
		"1200/0s":           "WINDOW a duration of at least 1s",
		"1200/500ms":        "WINDOW a duration of at least 1s",
		"1200/25h":          "WINDOW a duration of at most 24h",
		"1200/2562047h47m1": "WINDOW a duration",
	} {
		if _, err := ParseRateLimit(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseRateLimit(%q) = %v; want %q", in, err, want)
		}
	}
	if b, err := ParseRateLimit("1/24h"); err != nil || b.Window != 24*time.Hour {
		t.Errorf("ParseRateLimit(1/24h) = %+v, %v", b, err)
	}
	if _, err := New(Config{RateLimit: RateLimit{Limit: 1}}); err == nil {
		t.Error("New accepted a Budget without a Window")
	}
	if _, err := New(Config{RateLimit: RateLimit{Limit: 1, Window: 48 * time.Hour}}); err == nil || !strings.Contains(err.Error(), "Window") {
		t.Errorf("New with a 48h Window: %v, want an error", err)
	}
	srv, err := New(Config{RateLimit: RateLimit{Limit: 1, Window: maxRateLimitWindow}})
	if err != nil {
		t.Errorf("New with a 24h Window: %v", err)
	} else {
		srv.Close()
	}
}
