package d1client_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1client/budget"
	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/internal/d1test"
	"github.com/d1idem/d1idem/internal/oteltest"
)

var ctx = context.Background()

// callLog is a d1local hook recording the statement count of each call.
type callLog struct {
	mu    sync.Mutex
	sizes []int
	delay time.Duration
}

func (c *callLog) hook(r d1local.Request) d1local.Fault {
	c.mu.Lock()
	c.sizes = append(c.sizes, len(r.Statements))
	c.mu.Unlock()
	return d1local.Fault{Latency: c.delay}
}

func (c *callLog) calls() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]int(nil), c.sizes...)
}

func newTable(t *testing.T, db *d1client.Client) {
	t.Helper()
	if _, err := db.Query(ctx, "CREATE TABLE t (k TEXT PRIMARY KEY, v INTEGER NOT NULL)"); err != nil {
		t.Fatal(err)
	}
}

// Concurrent coalesced calls share D1 calls, and each caller gets exactly
// its own results.
func TestCoalescedCallsShareBatchesAndKeepTheirResults(t *testing.T) {
	log := &callLog{delay: 5 * time.Millisecond}
	b := d1test.LocalConfig(t, d1local.Config{Faults: log.hook})
	db := b.NewClient(t, func(c *d1client.Config) { c.Coalesce = d1client.CoalesceConfig{MaxInFlight: 2, MaxStatements: 40} })
	newTable(t, db)
	before := len(log.calls())
	const n = 200
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("k%03d", i)
			res, err := db.Exec(ctx, []d1client.Statement{
				d1client.Statement{SQL: "INSERT INTO t (k, v) VALUES (?, ?) ON CONFLICT (k) DO NOTHING RETURNING k, v", Params: []any{key, i}},
				d1client.Statement{SQL: "SELECT v * 2 FROM t WHERE k = ?", Params: []any{key}},
			}, d1client.Coalesce(), d1client.Idempotent())
			if err != nil {
				errs <- err
				return
			}
			var k string
			var v, double int64
			if err := res[0].Rows[0].Scan(&k, &v); err != nil || k != key || v != int64(i) {
				errs <- fmt.Errorf("caller %d got %s=%d (%v)", i, k, v, err)
			}
			if err := res[1].Rows[0].Scan(&double); err != nil || double != int64(2*i) {
				errs <- fmt.Errorf("caller %d got double %d (%v)", i, double, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	sizes := log.calls()[before:]
	total := 0
	for _, s := range sizes {
		if s > 40 {
			t.Errorf("a call carried %d statements, over MaxStatements 40", s)
		}
		total += s
	}
	if total != 2*n {
		t.Errorf("%d statements sent, want %d", total, 2*n)
	}
	if len(sizes) >= n/2 {
		t.Errorf("%d calls for %d concurrent callers: not coalesced", len(sizes), n)
	}
	t.Logf("%d callers, %d calls, sizes %v", n, len(sizes), sizes)
}

// When idle, the batcher sends at once: the longest window never delays a
// lone caller (ten calls that each waited it would take 10 s).
func TestCoalescerNeverWaitsWhenIdle(t *testing.T) {
	db := d1test.Local(t).NewClient(t, func(c *d1client.Config) { c.Coalesce = d1client.CoalesceConfig{Window: time.Second} })
	c, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for i := 0; i < 10; i++ {
		_, err := db.Exec(c, []d1client.Statement{{SQL: "SELECT ?", Params: []any{i}}}, d1client.Coalesce())
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
}

// A transient failure of a shared call reaches every caller with its cause:
// idempotent callers retry and succeed, the others get the ambiguous error.
func TestSharedBatchTransientFailure(t *testing.T) {
	b := d1test.Local(t)
	db := b.NewClient(t, func(c *d1client.Config) {
		c.Retry = d1client.RetryPolicy{BaseDelay: time.Millisecond, MaxDelay: 2 * time.Millisecond}
	})
	newTable(t, db)
	b.Local.Inject(d1local.Fault{Internal: true, AfterCommit: true})
	_, err := db.Exec(ctx, []d1client.Statement{{SQL: "INSERT INTO t (k, v) VALUES ('a', 1)"}}, d1client.Coalesce())
	var e *d1client.Error
	if !errors.Is(err, d1client.ErrTransient) || !errors.As(err, &e) || !e.Ambiguous {
		t.Fatalf("non-idempotent write: %v", err)
	}
	// It did commit: ambiguous means exactly that.
	res, _ := db.Query(ctx, "SELECT count(*) FROM t")
	if n, _ := res.Rows[0][0].Int64(); n != 1 {
		t.Fatalf("%d rows", n)
	}
	b.Local.Inject(d1local.Fault{Internal: true})
	_, err = db.Exec(ctx, []d1client.Statement{{SQL: "INSERT INTO t (k, v) VALUES ('b', 2) ON CONFLICT DO NOTHING"}}, d1client.Coalesce(), d1client.Idempotent())
	if err != nil {
		t.Fatalf("idempotent write: %v", err)
	}
}

// Under a tight budget, waiting callers pile into fewer, larger calls, and
// the budget is never exceeded.
func TestBudgetPressureGrowsBatches(t *testing.T) {
	log := &callLog{}
	b := d1test.LocalConfig(t, d1local.Config{Faults: log.hook})
	tight := budget.New(3, 200*time.Millisecond)
	db := b.NewClient(t, func(c *d1client.Config) { c.Budget = tight })
	var calls atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for i := 0; i < 60; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := db.Exec(ctx, []d1client.Statement{{SQL: "SELECT ?", Params: []any{i}}}, d1client.Coalesce()); err != nil {
				t.Error(err)
			}
			calls.Add(1)
		}()
	}
	wg.Wait()
	sent := db.Stats().Calls
	elapsed := time.Since(start)
	if max := int64(tight.Calls()) * (int64(elapsed/tight.Per()) + 1); sent > max {
		t.Errorf("%d calls in %v exceeds the budget of %s", sent, elapsed, tight)
	}
	if sent >= 20 {
		t.Errorf("%d calls for 60 callers under budget pressure", sent)
	}
}

// Calls without Coalesce() never share a batch.
func TestUncoalescedCallsTravelAlone(t *testing.T) {
	log := &callLog{delay: 10 * time.Millisecond}
	db := d1test.LocalConfig(t, d1local.Config{Faults: log.hook}).NewClient(t)
	var wg sync.WaitGroup
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = db.Exec(ctx, []d1client.Statement{{SQL: "SELECT ?", Params: []any{i}}})
		}()
	}
	wg.Wait()
	for _, s := range log.calls() {
		if s != 1 {
			t.Fatalf("an uncoalesced statement shared a call: %v", log.calls())
		}
	}
}

// Replicas and clients racing on one account with d1local playing
// Cloudflare's budget: pacing from the Ratelimit headers alone keeps every
// call inside the account's limit (never a 971), completions (Priority)
// always land, and new work is only ever turned away with ErrBudget and a
// Retry-After.
func TestAccountBudgetIsNeverExceeded(t *testing.T) {
	const limit, window = 40, 2 * time.Second
	b := d1test.LocalConfig(t, d1local.Config{RateLimit: d1local.RateLimit{Limit: limit, Window: window}})
	shared, err := budget.NewAccount(budget.Unlimited())
	if err != nil {
		t.Fatal(err)
	}
	useShared := func(c *d1client.Config) { c.Budget, c.Account = budget.Budget{}, shared }
	clients := []*d1client.Client{
		b.NewClient(t, useShared), // two databases on one Account
		b.NewClient(t, useShared),
		b.NewClient(t), // two more replicas, each with its own Account
		b.NewClient(t),
	}
	for _, db := range clients {
		newTable(t, db)
	}
	var served, shed, slow atomic.Int64
	stop := time.Now().Add(window + window/2)
	var wg sync.WaitGroup
	for w := range 32 {
		db := clients[w%len(clients)]
		wg.Go(func() {
			for i := 0; time.Now().Before(stop); i++ {
				key := fmt.Sprintf("w%d-%d", w, i)
				cctx, cancel := context.WithTimeout(ctx, time.Second)
				_, err := db.Exec(cctx, []d1client.Statement{{SQL: "INSERT INTO t (k, v) VALUES (?, 0) ON CONFLICT DO NOTHING", Params: []any{key}}},
					d1client.Coalesce(), d1client.Idempotent())
				cancel()
				var e *d1client.Error
				switch {
				case errors.Is(err, d1client.ErrBudget):
					shed.Add(1)
					if !errors.As(err, &e) || e.RetryAfter <= 0 {
						t.Errorf("ErrBudget without Retry-After: %v", err)
						return
					}
					time.Sleep(e.RetryAfter / 4)
					continue
				case errors.Is(err, d1client.ErrTransport):
					slow.Add(1) // the deadline struck in flight: a slow machine
					continue
				case err != nil:
					t.Errorf("claim: %v", err)
					return
				}
				pctx, cancel := context.WithTimeout(ctx, 10*window)
				_, err = db.Exec(pctx, []d1client.Statement{{SQL: "UPDATE t SET v = 1 WHERE k = ?", Params: []any{key}}},
					d1client.Coalesce(), d1client.Idempotent(), d1client.Priority())
				cancel()
				if err != nil {
					t.Errorf("completion: %v", err)
					return
				}
				served.Add(1)
			}
		})
	}
	wg.Wait()
	var calls int64
	for _, db := range clients {
		calls += db.Stats().Calls
	}
	st := shared.State()
	t.Logf("%d served, %d shed, %d timed out in flight, %d calls; the shared account last saw %d remaining (seen %v)",
		served.Load(), shed.Load(), slow.Load(), calls, st.Remaining, st.Seen.Format(time.StampMilli))
	if served.Load() == 0 || st.Seen.IsZero() {
		t.Error("nothing was served, or no Ratelimit header seen")
	}
}

// A call made with Owes is taken only while the budget can keep the calls
// its debt may need: on 10 calls an hour, four claims, each alone, are
// admitted, and the next are refused unsent with ErrBudget and a
// Retry-After, whether coalesced or not; the calls made with Pays, the
// completions, find their calls, and pay the debts.
func TestClaimsOweTheirCompletions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := d1test.InProcess(t, d1local.Config{Faults: func(d1local.Request) d1local.Fault { return d1local.Fault{Latency: 20 * time.Millisecond} }})
		admin := b.NewClient(t)
		newTable(t, admin)
		rec := oteltest.New()
		db := b.Database(admin.DatabaseID()).Client(t, func(c *d1client.Config) {
			c.Budget, c.MeterProvider, c.TracerProvider = budget.New(10, time.Hour), rec.MeterProvider, rec.TracerProvider
		})
		var debts []*budget.Debt
		for i := range 6 {
			d := budget.NewDebt(budget.Terms{Wait: 2 * time.Second})
			opts := []d1client.ExecOption{d1client.Owes(d)}
			if i%2 == 0 {
				opts = append(opts, d1client.Coalesce())
			}
			cctx, cancel := context.WithTimeout(ctx, time.Second)
			_, err := db.Exec(cctx, []d1client.Statement{{SQL: "INSERT INTO t VALUES (?, 1)", Params: []any{fmt.Sprint(i)}}}, opts...)
			cancel()
			var de *d1client.Error
			switch {
			case i < 4 && (err != nil || !d.Admitted()):
				t.Fatalf("claim %d: %v (admitted %v)", i, err, d.Admitted())
			case i >= 4 && (!errors.Is(err, d1client.ErrBudget) || !errors.As(err, &de) || de.RetryAfter <= 0 || d.Admitted()):
				t.Fatalf("claim %d: %v (admitted %v); want ErrBudget with a Retry-After", i, err, d.Admitted())
			}
			debts = append(debts, d)
		}
		if n := rec.Collect(t).Value("d1idem.d1.budget.owed"); n != 4 {
			t.Fatalf("%g debts owed; want 4", n)
		}
		for i, d := range debts[:4] {
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			_, err := db.Exec(cctx, []d1client.Statement{{SQL: "UPDATE t SET v = 2 WHERE k = ?", Params: []any{fmt.Sprint(i)}}},
				d1client.Priority(), d1client.Coalesce(), d1client.Pays(d))
			cancel()
			if err != nil {
				t.Fatalf("completion %d: %v", i, err)
			}
		}
		if n := rec.Collect(t).Value("d1idem.d1.budget.owed"); n != 0 {
			t.Fatalf("%g debts owed after their completions", n)
		}
		time.Sleep(time.Second) // group commit's runner goes idle
	})
}
