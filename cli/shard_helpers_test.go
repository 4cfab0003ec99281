package cli

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/internal/d1test"
)

// fakeClock is a clock the tests move by hand: the CLI's (options.now) and
// the application's ledgers' (idem.Config.Clock) at once.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// shardEnv is a ledger across several databases of one backend: the CLI
// reaches them as Cloudflare databases (--base-url), and the application
// through sharded ledgers with a Home for each.
type shardEnv struct {
	b   *d1test.Backend
	ids []string
	clk *fakeClock
	// fault, if set, chooses the faults of the calls (d1local only; see
	// newLocalShardEnv).
	fault atomic.Pointer[d1local.FaultFunc]
}

// newShardEnv returns n empty databases of b: on d1local named ledger-a,
// ledger-b, ...; on workerd, the next of its pool.
func newShardEnv(t testing.TB, b *d1test.Backend, n int) *shardEnv {
	e := &shardEnv{b: b, clk: &fakeClock{t: testNow}}
	for i := range n {
		if b.Name == d1test.NameLocal {
			e.ids = append(e.ids, fmt.Sprintf("ledger-%c", 'a'+i))
		} else {
			e.ids = append(e.ids, b.NewDatabase(t).ID)
		}
	}
	return e
}

// newLocalShardEnv is newShardEnv on a d1local of its own, whose calls
// e.fault may fail.
func newLocalShardEnv(t testing.TB, n int) *shardEnv {
	var e *shardEnv
	b := d1test.LocalConfig(t, d1local.Config{Faults: func(r d1local.Request) d1local.Fault {
		if f := e.fault.Load(); f != nil {
			return (*f)(r)
		}
		return d1local.Fault{}
	}})
	e = newShardEnv(t, b, n)
	return e
}

// failing makes the calls to database id fail (500), all of them or, with
// writes, those that write; nothing fails after heal.
func (e *shardEnv) failing(id string, writes bool) (heal func()) {
	f := d1local.FaultFunc(func(r d1local.Request) d1local.Fault {
		if r.DatabaseID == id && (!writes || strings.HasPrefix(strings.Join(r.Statements, ";"), "INSERT")) {
			return d1local.Fault{Internal: true}
		}
		return d1local.Fault{}
	})
	e.fault.Store(&f)
	return func() { e.fault.Store(nil) }
}

// opts are the CLI's options: the fake clock, and few fast retries.
func (e *shardEnv) opts() *options {
	return &options{now: e.clk.Now, clientMods: []func(*d1client.Config){func(c *d1client.Config) {
		c.Retry = d1client.RetryPolicy{MaxAttempts: 2, BaseDelay: time.Millisecond, MaxDelay: 4 * time.Millisecond}
	}}}
}

// args is a command line on the first n databases.
func (e *shardEnv) args(n int, args ...string) []string {
	token := e.b.Token
	if token == "" {
		token = "tok_test"
	}
	args = append(args, "--base-url", e.b.BaseURL, "--account-id", e.b.AccountID, "--api-token", token)
	for _, id := range e.ids[:n] {
		args = append(args, "--database-id", id)
	}
	return args
}

// hint is how a command suggested on the first n databases repeats the
// connection flags: all but the token.
func (e *shardEnv) hint(n int) string {
	h := " --base-url " + e.b.BaseURL + " --account-id " + e.b.AccountID + ` --api-token "$CLOUDFLARE_API_TOKEN"`
	for _, id := range e.ids[:n] {
		h += " --database-id " + id
	}
	return h
}

// run runs the CLI on the first n databases.
func (e *shardEnv) run(t testing.TB, n int, args ...string) result {
	t.Helper()
	return runCLI(t, e.opts(), e.args(n, args...)...)
}

// must runs the CLI on the first n databases and fails t unless it exits 0.
func (e *shardEnv) must(t testing.TB, n int, args ...string) result {
	t.Helper()
	r := e.run(t, n, args...)
	if r.code != 0 {
		t.Fatalf("d1idem %v: %s", args, r)
	}
	return r
}

// client is a client of one database, as the application has it.
func (e *shardEnv) client(t testing.TB, id string) *d1client.Client {
	return e.b.Database(id).Client(t)
}

// ledger is an application replica: a sharded ledger with a Home for every
// database, on the fake clock.
func (e *shardEnv) ledger(t testing.TB) *idem.Ledger {
	t.Helper()
	var homes []idem.Home
	for _, id := range e.ids {
		homes = append(homes, idem.Home{DB: e.client(t, id)})
	}
	l, err := idem.NewSharded(homes, idem.Config{Clock: e.clk.Now, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// serve executes and completes a request with this key for each principal,
// stepping the clock by step after each.
func (e *shardEnv) serve(t testing.TB, l *idem.Ledger, key string, step time.Duration, principals ...string) {
	t.Helper()
	ctx := context.Background()
	for _, p := range principals {
		d, err := l.Begin(ctx, p, key, "fp-"+key)
		if err != nil || d.Outcome != idem.Execute {
			t.Fatalf("Begin(%s, %s) = %v, %v", p, key, d.Outcome, err)
		}
		body := fmt.Sprintf(`{"principal":%q,"key":%q}`, p, key)
		if _, err := l.Complete(ctx, d.Reservation, idem.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(body)}); err != nil {
			t.Fatal(err)
		}
		e.clk.Advance(step)
	}
}

// principals are acct_1 ... acct_n.
func principals(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("acct_%d", i+1)
	}
	return out
}

// moved returns the first principal acct_<i> that a ring of the first n
// databases and one of all of them route to different homes.
func (e *shardEnv) moved(t testing.TB, n int) string {
	t.Helper()
	return e.movedBetween(t, n, len(e.ids))
}

// movedBetween returns the first principal acct_<i> that a ring of the
// first n databases and one of the first m route to different homes.
func (e *shardEnv) movedBetween(t testing.TB, n, m int) string {
	t.Helper()
	for i := 1; i < 10000; i++ {
		p := fmt.Sprintf("acct_%d", i)
		if idem.Rendezvous(p, e.ids[:n]) != idem.Rendezvous(p, e.ids[:m]) {
			return p
		}
	}
	t.Fatal("no principal moves")
	return ""
}
