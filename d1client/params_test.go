package d1client

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jarcoal/httpmock"

	"github.com/d1idem/d1idem/d1client/budget"
)

type userID int64
type label string

func TestEncodeParam(t *testing.T) {
	s := "ptr"
	var nilPtr *int64
	tests := []struct {
		name    string
		in      any
		want    string // JSON; empty when an error is expected
		wantErr string
	}{
		{"nil", nil, "null", ""},
		{"nil pointer", nilPtr, "null", ""},
		{"true", true, "1", ""},
		{"false", false, "0", ""},
		{"int", 42, "42", ""},
		{"negative", int64(-7), "-7", ""},
		{"2^53 stays a number", int64(1 << 53), "9007199254740992", ""},
		{"-2^53 stays a number", int64(-(1 << 53)), "-9007199254740992", ""},
		{"2^53+1 travels as a string", int64(1<<53 + 1), `"9007199254740993"`, ""},
		{"-2^53-1 travels as a string", int64(-(1 << 53) - 1), `"-9007199254740993"`, ""},
		{"max int64", int64(math.MaxInt64), `"9223372036854775807"`, ""},
		{"min int64", int64(math.MinInt64), `"-9223372036854775808"`, ""},
		{"uint8", uint8(200), "200", ""},
		{"uint64 in range", uint64(1 << 60), `"1152921504606846976"`, ""},
		{"uint64 too big", uint64(math.MaxUint64), "", "exceeds SQLite's int64 range"},
		{"named int", userID(12), "12", ""},
		{"float", 1.5, "1.5", ""},
		{"float32", float32(0.25), "0.25", ""},
		{"whole float", 2.0, "2", ""},
		{"NaN", math.NaN(), "", "no JSON encoding"},
		{"Inf", math.Inf(1), "", "no JSON encoding"},
		{"string", "héllo \"x\"", `"héllo \"x\""`, ""},
		{"named string", label("a"), `"a"`, ""},
		{"pointer", &s, `"ptr"`, ""},
		{"invalid UTF-8", "a\xffb", "", "not valid UTF-8"},
		{"json.Number", json.Number("12.5e3"), "12.5e3", ""},
		{"bad json.Number", json.Number("12x"), "", "not a number"},
		{"sql.NullString valid", sql.NullString{String: "v", Valid: true}, `"v"`, ""},
		{"sql.NullInt64 null", sql.NullInt64{}, "null", ""},
		{"bytes", []byte{1, 2}, "", "unhex(?)"},
		{"json.RawMessage", json.RawMessage(`{}`), "", "unhex(?)"},
		{"time", time.Unix(0, 0), "", "t.UnixMilli()"},
		{"struct", struct{}{}, "", "unsupported parameter type"},
		{"map", map[string]int{}, "", "unsupported parameter type"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := appendParam(nil, tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tc.want {
				t.Errorf("got %s, want %s", got, tc.want)
			}
		})
	}
}

// The encoded parameters reach the wire exactly, in the single and batch
// forms.
func TestRequestBodyOnTheWire(t *testing.T) {
	var bodies []string
	responder := func(req *http.Request) (*http.Response, error) {
		b, _ := io.ReadAll(req.Body)
		bodies = append(bodies, string(b))
		if req.Header.Get("Authorization") != "Bearer "+testToken || !strings.HasPrefix(req.Header.Get("Content-Type"), "application/json") {
			return httpmock.NewStringResponse(400, "bad headers"), nil
		}
		n := strings.Count(string(b), `"sql"`)
		return httpmock.NewStringResponse(200, okResults(n)), nil
	}
	c, _ := mockClient(t, responder)
	ctx := context.Background()
	if _, err := c.Query(ctx, "SELECT ?, ?, ?, ?", int64(1<<53+1), nil, true, "x"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, []Statement{{SQL: "SELECT 1"}, {SQL: "SELECT ?", Params: []any{2.5}}}); err != nil {
		t.Fatal(err)
	}
	want := []string{
		`{"sql":"SELECT ?, ?, ?, ?","params":["9007199254740993",null,1,"x"]}`,
		`{"batch":[{"sql":"SELECT 1"},{"sql":"SELECT ?","params":[2.5]}]}`,
	}
	for i := range want {
		if bodies[i] != want[i] {
			t.Errorf("body %d = %s\nwant %s", i, bodies[i], want[i])
		}
	}
}

func okResults(n int) string {
	parts := make([]string, n)
	for i := range parts {
		parts[i] = `{"results":{"columns":[],"rows":[]},"success":true,"meta":{}}`
	}
	return `{"result":[` + strings.Join(parts, ",") + `],"success":true,"errors":[],"messages":[]}`
}

// Limits and bad parameters are refused before anything is sent.
func TestClientSideLimits(t *testing.T) {
	params := func(n int) []any {
		p := make([]any, n)
		for i := range p {
			p[i] = i
		}
		return p
	}
	tests := []struct {
		name    string
		stmts   []Statement
		wantErr string
	}{
		{"no statements", nil, "no statements"},
		{"empty SQL", []Statement{{SQL: "  "}}, "empty SQL"},
		{"101 parameters", []Statement{{SQL: "SELECT 1", Params: params(101)}}, "101 parameters; D1 allows at most 100"},
		{"SQL over 100,000 bytes", []Statement{{SQL: "SELECT '" + strings.Repeat("x", MaxSQLBytes) + "'"}}, "D1 allows at most 100000 per statement"},
		{"second statement bad", []Statement{{SQL: "SELECT 1"}, {SQL: "SELECT ?", Params: []any{[]byte("x")}}}, "statement 2, parameter 1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, tr := mockClient(t, httpmock.NewStringResponder(200, okResults(1)))
			_, err := c.Exec(context.Background(), tc.stmts)
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err = %v, want ErrInvalid containing %q", err, tc.wantErr)
			}
			if n := tr.GetTotalCallCount(); n != 0 {
				t.Errorf("%d calls sent, want 0", n)
			}
		})
	}
	// Exactly at the limits is fine.
	c, tr := mockClient(t, httpmock.NewStringResponder(200, okResults(1)))
	if _, err := c.Exec(context.Background(), []Statement{{SQL: "SELECT 1", Params: params(100)}}); err != nil {
		t.Fatal(err)
	}
	if tr.GetTotalCallCount() != 1 {
		t.Fatal("100 parameters were not sent")
	}
}

func TestNewValidatesConfig(t *testing.T) {
	base := Config{AccountID: testAccount, DatabaseID: testDatabase, BaseURL: testBaseURL}
	tests := []struct {
		name string
		mod  func(*Config)
		want string
	}{
		{"missing account", func(c *Config) { c.AccountID = "" }, "account ID is required"},
		{"bad account", func(c *Config) { c.AccountID = "a/../b" }, "not a Cloudflare identifier"},
		{"missing database", func(c *Config) { c.DatabaseID = "" }, "database ID is required"},
		{"bad database", func(c *Config) { c.DatabaseID = "x?y" }, "not a D1 database UUID"},
		{"bad base URL", func(c *Config) { c.BaseURL = "ftp://x" }, "must start with http"},
		{"base URL without a host", func(c *Config) { c.BaseURL = "https:///client/v4/" }, "and name a host"},
		{"base URL with a query", func(c *Config) { c.BaseURL = "http://127.0.0.1:1/?x=1" }, `base URL http://127.0.0.1:1/ must not have a query or fragment`},
		{"base URL with a fragment", func(c *Config) { c.BaseURL = "https://api.example.com/client/v4/#top" }, "must not have a query or fragment"},
		{"base URL with an empty query", func(c *Config) { c.BaseURL = "https://api.example.com/client/v4/?" }, "must not have a query or fragment"},
		{"base URL's password not shown", func(c *Config) { c.BaseURL = "https://u:hunter2@api.example.com/?q" }, "https://:[REDACTED]@api.example.com/ must not have"},
		{"negative attempt timeout", func(c *Config) { c.AttemptTimeout = -time.Second }, "Config.AttemptTimeout is -1s; accepted: 0 (the default, 45s) or 10ms to 10m"},
		{"tiny attempt timeout", func(c *Config) { c.AttemptTimeout = time.Microsecond }, "Config.AttemptTimeout is 1µs"},
		{"huge attempt timeout", func(c *Config) { c.AttemptTimeout = time.Hour }, "Config.AttemptTimeout is 1h0m0s"},
		{"negative attempts", func(c *Config) { c.Retry.MaxAttempts = -1 }, "Config.Retry.MaxAttempts is -1; accepted: 0 (the default, 4) or 1 to 100"},
		{"too many attempts", func(c *Config) { c.Retry.MaxAttempts = 1000 }, "Config.Retry.MaxAttempts is 1000"},
		{"negative base delay", func(c *Config) { c.Retry.BaseDelay = -time.Millisecond }, "Config.Retry.BaseDelay is -1ms; accepted: 0 (the default, 100ms) or 1ms to 1m0s"},
		{"huge max delay", func(c *Config) { c.Retry.MaxDelay = time.Hour }, "Config.Retry.MaxDelay is 1h0m0s; accepted: 0 (the default, 2s) or 1ms to 10m0s"},
		{"max delay under base delay", func(c *Config) { c.Retry.BaseDelay, c.Retry.MaxDelay = time.Second, time.Millisecond }, "Config.Retry.MaxDelay (1ms) is shorter than Config.Retry.BaseDelay (1s)"},
		{"negative max retry after", func(c *Config) { c.Retry.MaxRetryAfter = -time.Second }, "Config.Retry.MaxRetryAfter is -1s; accepted: 0 (the default, 10s) or 1ms to 1h0m0s"},
		{"budget of no calls", func(c *Config) { c.Budget = budget.New(0, time.Second) }, "Config.Budget: 0 calls per 1s; accepted:"},
		{"negative budget", func(c *Config) { c.Budget = budget.New(-1, time.Second) }, "Config.Budget: -1 calls per 1s"},
		{"budget without window", func(c *Config) { c.Budget = budget.New(5, 0) }, "Config.Budget: 5 calls per 0s"},
		{"budget of a week", func(c *Config) { c.Budget = budget.New(5, 7*24*time.Hour) }, "Config.Budget: 5 calls per 168h0m0s; accepted: the zero Budget (1200 calls per 300 s), Unlimited(), or New with 2 to 1000000 calls per 1ms to 24h"},
		{"budget of one call", func(c *Config) { c.Budget = budget.New(1, time.Hour) }, "Config.Budget: 1 calls per 1h0m0s; accepted:"},
		{"burst of none", func(c *Config) { c.Budget = budget.New(10, time.Second).WithBurst(0) }, "Config.Budget: burst is 0; accepted: 1 to 1000 (the default is 10)"},
		{"negative burst", func(c *Config) { c.Budget = budget.Unlimited().WithBurst(-3) }, "Config.Budget: burst is -3"},
		{"reserve of all", func(c *Config) { c.Budget = budget.Budget{}.WithReserve(1) }, "Config.Budget: reserve is 1; accepted: 0.01 to 0.9 (the default is 0.2)"},
		{"no reserve", func(c *Config) { c.Budget = budget.Budget{}.WithReserve(0) }, "Config.Budget: reserve is 0; accepted: 0.01 to 0.9"},
		{"a reserve too small", func(c *Config) { c.Budget = budget.New(10, time.Second).WithBurst(1).WithReserve(0.001) }, "Config.Budget: reserve is 0.001; accepted: 0.01 to 0.9"},
		{"NaN reserve", func(c *Config) { c.Budget = budget.Budget{}.WithReserve(math.NaN()) }, "Config.Budget: reserve is NaN"},
		{"budget and account", func(c *Config) {
			c.Budget = budget.New(5, time.Second)
			c.Account, _ = budget.NewAccount(budget.Budget{})
		}, "Config.Budget and Config.Account are both set: give the Budget to budget.NewAccount"},
		{"long coalesce window", func(c *Config) { c.Coalesce.Window = time.Minute }, "Config.Coalesce.Window is 1m0s; accepted: negative (never wait), 0 (the default: a round trip) or up to 1s"},
		{"negative batch statements", func(c *Config) { c.Coalesce.MaxStatements = -1 }, "Config.Coalesce.MaxStatements is -1; accepted: 0 (the default, 1024) or 1 to 10000"},
		{"tiny batch bytes", func(c *Config) { c.Coalesce.MaxBytes = 100 }, "Config.Coalesce.MaxBytes is 100; accepted: 0 (the default, 2097152) or 1024 to 52428800"},
		{"long queue wait", func(c *Config) { c.Coalesce.MaxQueueWait = 2 * time.Minute }, "Config.Coalesce.MaxQueueWait is 2m0s; accepted: negative (never refuse), 0 (the default: 500ms) or up to 1m"},
		{"too many in flight", func(c *Config) { c.Coalesce.MaxInFlight = 65 }, "Config.Coalesce.MaxInFlight is 65; accepted: 0 (the default, 4) or 1 to 64"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := base
			tc.mod(&cfg)
			_, err := New(cfg)
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrInvalid containing %q", err, tc.want)
			}
		})
	}
	// The bounds themselves, the defaults and the explicit forms are fine.
	for name, mod := range map[string]func(*Config){
		"zero": func(*Config) {},
		"lowest bounds": func(c *Config) {
			c.AttemptTimeout = 10 * time.Millisecond
			c.Retry = RetryPolicy{MaxAttempts: 1, BaseDelay: time.Millisecond, MaxDelay: time.Millisecond, MaxRetryAfter: time.Millisecond}
			c.Budget = budget.New(2, time.Millisecond)
			c.Coalesce = CoalesceConfig{Window: -1, MaxStatements: 1, MaxBytes: 1024, MaxInFlight: 1}
		},
		"highest bounds": func(c *Config) {
			c.AttemptTimeout = 10 * time.Minute
			c.Retry = RetryPolicy{MaxAttempts: 100, BaseDelay: time.Minute, MaxDelay: 10 * time.Minute, MaxRetryAfter: time.Hour}
			c.Budget = budget.New(1_000_000, 24*time.Hour)
			c.Coalesce = CoalesceConfig{Window: time.Second, MaxStatements: 10_000, MaxBytes: 50 << 20, MaxInFlight: 64}
		},
		"explicit forms": func(c *Config) { c.Retry = NoRetry(); c.Budget = budget.Unlimited() },
		"pacing bounds":  func(c *Config) { c.Budget = budget.New(5, time.Second).WithBurst(1).WithReserve(0.9) },
		"pacing bounds, high": func(c *Config) {
			c.Budget = budget.Unlimited().WithBurst(1000).WithReserve(budget.MinReserve)
		},
		"an account": func(c *Config) {
			c.Budget = budget.Budget{}
			c.Account, _ = budget.NewAccount(budget.New(5, time.Second))
		},
		"defaults": func(c *Config) { c.Retry = DefaultRetryPolicy() },
	} {
		cfg := base
		mod(&cfg)
		if _, err := New(cfg); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// A Config without a Budget gets Cloudflare's limit, and the default
// retry policy is a fresh value each time.
func TestConfigDefaults(t *testing.T) {
	c, _ := mockClient(t, ok1(t), func(c *Config) { c.Budget = budget.Budget{} })
	if b := c.Account().Budget(); b.Calls() != 1200 || b.Per() != 300*time.Second {
		t.Errorf("a Config without a Budget gets %v, want Cloudflare's limit", b)
	}
	if p := DefaultRetryPolicy(); p != (RetryPolicy{MaxAttempts: 4, BaseDelay: 100 * time.Millisecond, MaxDelay: 2 * time.Second, MaxRetryAfter: 10 * time.Second}) {
		t.Errorf("DefaultRetryPolicy() = %+v", p)
	}
	p := DefaultRetryPolicy()
	p.MaxAttempts = 99 // a copy: the next caller still gets the defaults
	if DefaultRetryPolicy().MaxAttempts != 4 {
		t.Error("DefaultRetryPolicy() is shared state")
	}
}

// NoRetry makes one attempt, even for a read after a 500.
func TestNoRetry(t *testing.T) {
	c, tr := mockClient(t, sequence(replay(t, "internal_500"), ok1(t)), func(c *Config) { c.Retry = NoRetry() })
	if _, err := c.Exec(context.Background(), readStmt); !errors.Is(err, ErrTransient) || tr.GetTotalCallCount() != 1 {
		t.Fatalf("err = %v after %d calls, want ErrTransient after 1", err, tr.GetTotalCallCount())
	}
}

// CLOUDFLARE_API_BASE_URL (wrangler's) and CLOUDFLARE_BASE_URL
// (cloudflare-go's) both name the base URL; when they disagree, New refuses
// rather than pick one, and Config.BaseURL wins over both.
func TestBaseURLFromEnvironment(t *testing.T) {
	newClient := func(baseURL string) (*Client, error) {
		return New(Config{AccountID: testAccount, DatabaseID: testDatabase, BaseURL: baseURL})
	}
	tests := []struct {
		name, wrangler, cf, configured string
		want                           string // "" for an error
	}{
		{"neither", "", "", "", DefaultBaseURL},
		{"wrangler's only", "http://127.0.0.1:1", "", "", "http://127.0.0.1:1/"},
		{"cloudflare-go's only", "", "http://127.0.0.1:2", "", "http://127.0.0.1:2/"},
		{"both, the same", "http://127.0.0.1:3/", "http://127.0.0.1:3", "", "http://127.0.0.1:3/"},
		{"both, different", "http://127.0.0.1:4", "https://api.cloudflare.com/client/v4", "", ""},
		{"both, different, Config.BaseURL set", "http://127.0.0.1:4", "http://127.0.0.1:5", "http://127.0.0.1:6", "http://127.0.0.1:6/"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(APIBaseURLEnv, tc.wrangler)
			t.Setenv(BaseURLEnv, tc.cf)
			c, err := newClient(tc.configured)
			if tc.want == "" {
				if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "CLOUDFLARE_API_BASE_URL") || !strings.Contains(err.Error(), "CLOUDFLARE_BASE_URL") {
					t.Fatalf("err = %v, want ErrInvalid naming both variables", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.cfg.BaseURL != tc.want {
				t.Errorf("base URL = %q, want %q", c.cfg.BaseURL, tc.want)
			}
		})
	}
}

// Strings travel as encoding/json writes them with SetEscapeHTML(false):
// '<', '>' and '&' as themselves.
func FuzzAppendJSONString(f *testing.F) {
	for _, s := range []string{"", "plain", `<a href="x">&amp;</a>`, "\x00\x01\x1f\x7f\b\f\n\r\t\\\"", "é\u2028\u2029\u2027\u202a€😀", "\xe2\x80"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) {
			return
		}
		var want bytes.Buffer
		enc := json.NewEncoder(&want)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(s); err != nil {
			t.Fatal(err)
		}
		if got := appendJSONString(nil, s); string(got) != strings.TrimSuffix(want.String(), "\n") {
			t.Fatalf("appendJSONString(%q) = %s, encoding/json: %s", s, got, want.String())
		}
	})
}

// A 16 KB HTML response stored as a parameter travels as about 16 KB, not
// six times that, and arrives unchanged.
func TestHTMLParameterIsNotEscaped(t *testing.T) {
	html := strings.Repeat(`<p class=x>a &amp; b</p>`+"\n", 16384/24)
	var sent []byte
	c, _ := mockClient(t, func(req *http.Request) (*http.Response, error) {
		sent, _ = io.ReadAll(req.Body)
		return httpmock.NewStringResponse(200, okResults(1)), nil
	})
	if _, err := c.Exec(context.Background(), []Statement{{SQL: "UPDATE t SET body = ? WHERE k = 1", Params: []any{html}}}); err != nil {
		t.Fatal(err)
	}
	// Only the newlines are escaped, one byte each.
	want := len(`{"sql":"UPDATE t SET body = ? WHERE k = 1","params":[""]}`) + len(html) + strings.Count(html, "\n")
	if len(sent) != want {
		t.Errorf("body is %d bytes, want %d", len(sent), want)
	}
	var got struct{ Params []string }
	if err := json.Unmarshal(sent, &got); err != nil || len(got.Params) != 1 || got.Params[0] != html {
		t.Errorf("the parameter did not arrive unchanged (%v)", err)
	}
	legacy, _ := json.Marshal(html)
	t.Logf("16 KB of HTML: %d bytes on the wire; json.Marshal would send %d", len(sent), len(legacy))
}
