package idem_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
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

var shardSeed = flag.Uint64("shard.seed", 0, "seed of TestShardGrowthRandomized (0: a random one, logged)")

// checkMarker marks the checker's own reads, which no fault touches.
const checkMarker = "/* shard-check */ "

// shardAudit is what each test database holds besides the ledger: the
// handlers' business table (no unique key, so a second write shows) and
// an audit of every insert, completion and deletion of a key row, written
// by triggers in the transaction that makes them.
var shardAudit = []string{
	"CREATE TABLE biz (principal TEXT NOT NULL, key TEXT NOT NULL, exec TEXT NOT NULL)",
	"CREATE TABLE audit (principal TEXT NOT NULL, key TEXT NOT NULL, kind TEXT NOT NULL, generation INTEGER NOT NULL)",
	`CREATE TRIGGER audit_insert AFTER INSERT ON idempotency_keys WHEN NEW.principal <> ''
BEGIN INSERT INTO audit VALUES (NEW.principal, NEW.key, 'insert', NEW.generation); END`,
	`CREATE TRIGGER audit_complete AFTER UPDATE OF status ON idempotency_keys
WHEN OLD.status = 'pending' AND NEW.status = 'completed'
BEGIN INSERT INTO audit VALUES (NEW.principal, NEW.key, 'complete', NEW.generation); END`,
	`CREATE TRIGGER audit_delete AFTER DELETE ON idempotency_keys WHEN OLD.principal <> ''
BEGIN INSERT INTO audit VALUES (OLD.principal, OLD.key, 'delete_' || OLD.status, OLD.generation); END`,
}

// shardFaults chooses a random fault for each D1 call while on: errors
// before and after the commit, lost answers, latency. The checker's reads
// are never faulted, nor is anything while off.
type shardFaults struct {
	on       atomic.Bool
	injected atomic.Int64
	mu       sync.Mutex
	rng      *rand.Rand
	rate     float64
}

func (f *shardFaults) fault(r d1local.Request) d1local.Fault {
	if !f.on.Load() || strings.HasPrefix(r.Statements[0], checkMarker) {
		return d1local.Fault{}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.rng.Float64() >= f.rate {
		return d1local.Fault{}
	}
	f.injected.Add(1)
	switch f.rng.IntN(7) {
	case 0:
		return d1local.Fault{Internal: true}
	case 1:
		return d1local.Fault{Internal: true, AfterCommit: true}
	case 2:
		return d1local.Fault{BadGateway: true}
	case 3:
		return d1local.Fault{BadGateway: true, AfterCommit: true}
	case 4:
		return d1local.Fault{Overloaded: true}
	case 5:
		return d1local.Fault{LoseResponse: true}
	}
	return d1local.Fault{Latency: time.Duration(5+f.rng.IntN(40)) * time.Millisecond}
}

// offsetClock is the wall clock moved on by jumps: the ledgers' injected
// clock, so that the test can let two retention windows pass.
type offsetClock struct{ off atomic.Int64 }

func (c *offsetClock) Now() time.Time       { return time.Now().Add(time.Duration(c.off.Load())) }
func (c *offsetClock) Jump(d time.Duration) { c.off.Add(int64(d)) }

// shardAnswer is one HTTP answer a client saw.
type shardAnswer struct {
	principal, key string
	status         int
	replayed       bool
	body           string
}

// shardRun is one randomized run: replicas (sharded ledgers, each with its
// own clients, behind the middleware) serving clients while an operator
// grows the ring 2 -> 3 -> 5 and the replicas learn each version whenever
// they happen to.
type shardRun struct {
	t        *testing.T
	rng      *rand.Rand // the plan's; used by the run's goroutine only
	b        *d1test.Backend
	c        *cluster
	clk      *offsetClock
	cfg      idem.Config
	op       *idem.Ledger
	replicas []*httptest.Server
	ledgers  []*idem.Ledger

	principals []string
	execs      atomic.Int64
	inflight   sync.WaitGroup // requests inside a replica

	mu      sync.Mutex
	answers []shardAnswer
	opLog   []string
	learned []string // "replica <i>: <ring>", each ring a replica adopted
}

// learnLog records the rings a replica adopts (the ledger logs each).
type learnLog struct {
	r       *shardRun
	replica int
}

func (h learnLog) Enabled(context.Context, slog.Level) bool { return true }
func (h learnLog) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h learnLog) WithGroup(string) slog.Handler            { return h }
func (h learnLog) Handle(_ context.Context, rec slog.Record) error {
	if rec.Message != "idem: routing by a new ring" {
		return nil
	}
	var version int64
	var phase string
	rec.Attrs(func(a slog.Attr) bool {
		switch a.Key {
		case "version":
			version = a.Value.Int64()
		case "phase":
			phase = a.Value.String()
		}
		return true
	})
	h.r.mu.Lock()
	h.r.learned = append(h.r.learned, fmt.Sprintf("replica %d: v%d %s", h.replica, version, phase))
	h.r.mu.Unlock()
	return nil
}

type shardPlan struct {
	replicas, clients, keys, principals int
	broken                              bool // replica 0 ignores the ring
	dupRate                             float64
}

func newShardRun(t *testing.T, b *d1test.Backend, seed uint64, plan shardPlan) *shardRun {
	r := &shardRun{t: t, rng: rand.New(rand.NewPCG(seed, seed^0x5eed)), b: b, clk: &offsetClock{}}
	r.cfg = idem.Config{Clock: r.clk.Now, TTL: 400 * time.Millisecond, SweepInterval: 200 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler)}
	fast := func(c *d1client.Config) {
		c.Retry = d1client.RetryPolicy{MaxAttempts: 3, BaseDelay: time.Millisecond, MaxDelay: 20 * time.Millisecond}
	}
	r.c = newCluster(t, b, 5, fast)
	for _, id := range r.c.ids {
		var stmts []d1client.Statement
		for _, s := range shardAudit {
			stmts = append(stmts, d1client.Statement{SQL: s})
		}
		if _, err := r.c.dbs[id].Exec(bg, stmts); err != nil {
			t.Fatal(err)
		}
	}
	r.c.initRing(t, r.cfg, r.c.ids[0], r.c.ids[1])
	r.op = r.c.ledger(t, r.cfg)
	for i := range plan.principals {
		r.principals = append(r.principals, fmt.Sprint("acct-", i))
	}
	for i := range plan.replicas {
		// Each replica has its own clients, as a process of its own would.
		var homes []idem.Home
		for _, id := range r.c.ids {
			homes = append(homes, idem.Home{DB: b.Database(id).Client(t, fast)})
		}
		cfg := r.cfg
		cfg.Logger = slog.New(learnLog{r, i})
		l, err := idem.NewSharded(homes, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if plan.broken && i == 0 {
			idem.BreakRouting(l)
			mustRing(t, l) // it keeps version 1
		}
		srv := httptest.NewUnstartedServer(r.wrap(idem.MustMiddleware(l, idem.Options{Principal: bearer, Timeout: 3 * time.Second})(http.HandlerFunc(r.handle))))
		srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the handlers' deliberate panics
		srv.Start()
		t.Cleanup(srv.Close)
		r.replicas = append(r.replicas, srv)
		r.ledgers = append(r.ledgers, l)
	}
	return r
}

// wrap counts the requests inside a replica, so that a round ends only
// when every one of them (abandoned by its client or not) has finished.
func (r *shardRun) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.inflight.Add(1)
		defer r.inflight.Done()
		h.ServeHTTP(w, req)
	})
}

// handle is the mutation: a business write through idem.Tx, committed with
// the completion, and an answer naming this execution. Some executions are
// slow (heartbeats keep them), some panic (the reservation is released).
func (r *shardRun) handle(w http.ResponseWriter, req *http.Request) {
	n := r.execs.Add(1)
	exec := fmt.Sprint("e", n)
	principal, _ := bearer(req)
	key := req.Header.Get(idem.HeaderKey)
	tx, _ := idem.TxFromContext(req.Context())
	if err := tx.Add(d1client.Statement{SQL: "INSERT INTO biz (principal, key, exec) VALUES (?, ?, ?)", Params: []any{principal, key, exec}}); err != nil {
		panic(err)
	}
	switch n := n % 23; {
	case n == 0:
		time.Sleep(700 * time.Millisecond) // longer than the TTL: heartbeats keep it
	case n == 1:
		panic("handler failure")
	case n < 8:
		time.Sleep(time.Duration(n) * 5 * time.Millisecond)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"exec":%q,"principal":%q,"key":%q}`, exec, principal, key)
}

// send makes one attempt at a replica.
func (r *shardRun) send(ctx context.Context, replica int, principal, key string) (shardAnswer, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, r.replicas[replica].URL+"/v1/things", strings.NewReader(`{"n":1}`))
	req.Header.Set("Authorization", "Bearer "+principal)
	req.Header.Set(idem.HeaderKey, key)
	req.Header.Set("Content-Type", "application/json")
	res, err := r.replicas[replica].Client().Do(req)
	if err != nil {
		return shardAnswer{}, err
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		return shardAnswer{}, err
	}
	a := shardAnswer{principal: principal, key: key, status: res.StatusCode, replayed: res.Header.Get(idem.HeaderReplayed) == "true", body: string(body)}
	r.mu.Lock()
	r.answers = append(r.answers, a)
	r.mu.Unlock()
	return a, nil
}

// settle sends a key until it is answered 201, to random replicas, at
// most attempts times; some attempts are abandoned by the client.
func (r *shardRun) settle(rng *rand.Rand, principal, key string, attempts int, abandon float64) bool {
	for range attempts {
		timeout := 5 * time.Second
		if rng.Float64() < abandon {
			timeout = time.Duration(1+rng.IntN(30)) * time.Millisecond
		}
		ctx, cancel := context.WithTimeout(bg, timeout)
		a, err := r.send(ctx, rng.IntN(len(r.replicas)), principal, key)
		cancel()
		if err == nil && a.status == http.StatusCreated {
			return true
		}
		time.Sleep(time.Duration(10+rng.IntN(60)) * time.Millisecond)
	}
	return false
}

// round runs clients over fresh keys while op changes the ring (fresh keys
// keep coming until op is done), then turns the faults off and settles
// every key.
func (r *shardRun) round(name string, plan shardPlan, faults *shardFaults, op func()) []string {
	var keys []string
	var wg sync.WaitGroup
	work := make(chan [2]string)
	for c := range plan.clients {
		seed := r.rng.Uint64()
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(seed, uint64(c)))
			for pk := range work {
				if rng.Float64() < plan.dupRate {
					// A concurrent duplicate to another replica.
					dseed := rng.Uint64()
					wg.Go(func() {
						r.settle(rand.New(rand.NewPCG(dseed, 1)), pk[0], pk[1], 3, 0.3)
					})
				}
				r.settle(rng, pk[0], pk[1], 6, 0.15)
			}
		})
	}
	faults.on.Store(true)
	opDone := make(chan struct{})
	go func() {
		defer close(opDone)
		op()
	}()
	stop := make(chan struct{})
	var refreshers sync.WaitGroup
	// Replicas learn new rings at random moments besides the refusals
	// that teach them; replica 0 only ever learns from refusals.
	for i := 1; i < len(r.ledgers); i++ {
		seed := r.rng.Uint64()
		refreshers.Go(func() {
			rng := rand.New(rand.NewPCG(seed, 2))
			for {
				select {
				case <-stop:
					return
				case <-time.After(time.Duration(rng.IntN(600)) * time.Millisecond):
					_, _ = r.ledgers[i].RefreshRing(bg)
				}
			}
		})
	}
	opRunning := func() bool {
		select {
		case <-opDone:
			return false
		default:
			return true
		}
	}
	for i := 0; i < plan.keys || opRunning(); i++ {
		pk := [2]string{r.principals[r.rng.IntN(len(r.principals))], fmt.Sprintf("%s-k%d", name, i)}
		keys = append(keys, pk[0]+"/"+pk[1])
		work <- pk
	}
	close(work)
	wg.Wait()
	close(stop)
	refreshers.Wait()
	faults.on.Store(false)
	r.inflight.Wait()
	// Every key settles once the faults are off.
	rng := rand.New(rand.NewPCG(r.rng.Uint64(), 3))
	for _, k := range keys {
		p, key, _ := strings.Cut(k, "/")
		if !r.settle(rng, p, key, 40, 0) {
			r.t.Errorf("%s did not settle", k)
		}
	}
	r.inflight.Wait()
	return keys
}

// operate runs an operator action until it succeeds: a failed Grow that
// recorded the change somewhere is finished by AdvanceRing, as the
// procedure says.
func (r *shardRun) operate(what string, fn func() (idem.RingStatus, error), done func(idem.RingStatus) bool) {
	deadline := time.Now().Add(time.Minute)
	log := func(st idem.RingStatus, err error) {
		r.mu.Lock()
		r.opLog = append(r.opLog, fmt.Sprintf("%s: %s, %v", what, st.Ring, err))
		r.mu.Unlock()
	}
	for time.Now().Before(deadline) {
		st, err := fn()
		log(st, err)
		if err == nil || done(st) {
			for time.Now().Before(deadline) {
				st, err := r.op.Admin().AdvanceRing(bg)
				if err == nil || (errors.Is(err, idem.ErrDropNotDue) && allRecorded(st)) {
					return
				}
				log(st, err)
				time.Sleep(20 * time.Millisecond)
			}
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	r.t.Errorf("%s did not succeed within a minute", what)
}

func allRecorded(st idem.RingStatus) bool {
	for _, id := range st.Ring.Homes {
		for _, h := range st.Homes {
			if h.ID == id && (h.Ring == nil || h.Ring.String() != st.Ring.String()) {
				return false
			}
		}
	}
	return true
}

// grow is the operator adding databases at a random moment of the round.
func (r *shardRun) grow(delay time.Duration, ids ...string) func() {
	return func() {
		time.Sleep(delay)
		r.operate("grow", func() (idem.RingStatus, error) { return r.op.Admin().Grow(bg, ids...) },
			func(st idem.RingStatus) bool {
				return st.Ring.Phase == idem.RingMoving && slices.Contains(st.Ring.Homes, ids[0])
			})
	}
}

// drop is the operator ending a change (its DropAt passed before the round).
func (r *shardRun) drop(delay time.Duration) func() {
	return func() {
		time.Sleep(delay)
		r.operate("drop", func() (idem.RingStatus, error) { return r.op.Admin().AdvanceRing(bg) },
			func(st idem.RingStatus) bool { return st.Ring.Phase == idem.RingStable })
	}
}

// checkShards verifies the invariants for keys ("principal/key"), on what
// the databases hold and what the clients saw, and returns the violations.
func checkShards(t testing.TB, c *cluster, answers []shardAnswer, keys []string) []string {
	t.Helper()
	type state struct {
		biz       []string // "db:exec"
		rows      []string // "db:status"
		bodies    map[string]string
		completed map[string]bool // by database
		inserted  map[string]bool
		movedOut  map[string]bool // deleted while pending
	}
	st := map[string]*state{}
	for _, k := range keys {
		st[k] = &state{bodies: map[string]string{}, completed: map[string]bool{}, inserted: map[string]bool{}, movedOut: map[string]bool{}}
	}
	query := func(id, sql string, fn func(r d1client.Row)) {
		res, err := c.dbs[id].Query(bg, checkMarker+sql)
		if err != nil {
			t.Fatalf("checker: %s: %v", id, err)
		}
		for _, row := range res.Rows {
			fn(row)
		}
	}
	for _, id := range c.ids {
		query(id, "SELECT principal, key, exec FROM biz", func(row d1client.Row) {
			var p, k, e string
			_ = row.Scan(&p, &k, &e)
			if s := st[p+"/"+k]; s != nil {
				s.biz = append(s.biz, id+":"+e)
			}
		})
		query(id, "SELECT principal, key, status, coalesce(response_body, '') FROM idempotency_keys WHERE principal <> ''", func(row d1client.Row) {
			var p, k, status, body string
			_ = row.Scan(&p, &k, &status, &body)
			if s := st[p+"/"+k]; s != nil {
				s.rows = append(s.rows, id+":"+status)
				s.bodies[id] = body
			}
		})
		query(id, "SELECT principal, key, kind FROM audit", func(row d1client.Row) {
			var p, k, kind string
			_ = row.Scan(&p, &k, &kind)
			s := st[p+"/"+k]
			switch {
			case s == nil:
			case kind == "insert":
				s.inserted[id] = true
			case kind == "complete":
				s.completed[id] = true
			case kind == "delete_pending":
				s.movedOut[id] = true
			}
		})
	}
	var out []string
	bad := func(k, format string, args ...any) { out = append(out, k+": "+fmt.Sprintf(format, args...)) }
	for _, k := range keys {
		s := st[k]
		// One execution per key.
		if len(s.biz) != 1 {
			bad(k, "executed %d times %v", len(s.biz), s.biz)
		}
		// No key claimed in two homes: completed in one database, and
		// alive (inserted, not moved out) in one.
		var completed, alive []string
		for id := range s.completed {
			completed = append(completed, id)
		}
		for id := range s.inserted {
			if !s.movedOut[id] || s.completed[id] {
				alive = append(alive, id)
			}
		}
		if len(completed) > 1 || len(alive) > 1 || len(s.rows) != 1 {
			bad(k, "claimed in several homes: completed in %v, alive in %v, rows %v", completed, alive, s.rows)
		}
		if len(s.biz) != 1 || len(s.rows) != 1 {
			continue
		}
		db, exec, _ := strings.Cut(s.biz[0], ":")
		stored := s.bodies[db]
		if !strings.Contains(stored, fmt.Sprintf(`"exec":%q`, exec)) {
			bad(k, "the stored response %q is not the execution %s that wrote at %s (row in %v)", stored, exec, db, s.rows)
		}
	}
	// Byte-identical replays, and no 201 from an execution that is not
	// the key's one.
	for _, a := range answers {
		k := a.principal + "/" + a.key
		s := st[k]
		if s == nil || a.status != http.StatusCreated || len(s.biz) != 1 {
			continue
		}
		db, _, _ := strings.Cut(s.biz[0], ":")
		if a.body != s.bodies[db] {
			bad(k, "answered 201 (replayed %v) with %q, the stored response is %q", a.replayed, a.body, s.bodies[db])
		}
	}
	sort.Strings(out)
	return out
}

// runShardGrowth grows the ring 2 -> 3 -> 5 under load and faults, in
// three rounds of fresh keys; between rounds the clock jumps two
// retention windows, so that each change's old route can be dropped (in
// the next round, under load). It returns the violations.
func runShardGrowth(t *testing.T, b *d1test.Backend, faults *shardFaults, seed uint64, plan shardPlan) []string {
	r := newShardRun(t, b, seed, plan)
	faults.rng = rand.New(rand.NewPCG(seed, 0xfa))
	ids := r.c.ids
	jump := 2 * r.op.Config().Retention
	var violations []string
	check := func(keys []string) {
		r.mu.Lock()
		answers := slices.Clone(r.answers)
		r.mu.Unlock()
		violations = append(violations, checkShards(t, r.c, answers, keys)...)
	}
	delay := func() time.Duration { return time.Duration(50+r.rng.IntN(400)) * time.Millisecond }
	// Round 1: 2 databases, grown to 3 in the middle.
	check(r.round("r1", plan, faults, r.grow(delay(), ids[2])))
	r.clk.Jump(jump)
	// Round 2: the change to 3 ends, then 3 grow to 5.
	d1, d2 := delay(), delay()
	check(r.round("r2", plan, faults, func() {
		r.drop(d1)()
		r.grow(d2, ids[3], ids[4])()
	}))
	r.clk.Jump(jump)
	// Round 3: the change to 5 ends.
	check(r.round("r3", plan, faults, r.drop(delay())))
	final, err := r.op.Ring(bg)
	want := "v3 stable " + fmt.Sprint(ids)
	if err != nil || final.String() != want {
		t.Errorf("the operator ends at %s (%v), want %s; operations:\n%s", final, err, want, strings.Join(r.opLog, "\n"))
	}
	t.Logf("seed %d: %d answers, %d executions, %d faults; operations:\n%s\nrings adopted:\n%s", seed, len(r.answers), r.execs.Load(),
		faults.injected.Load(), strings.Join(r.opLog, "\n"), strings.Join(r.learned, "\n"))
	// Each replica learnt every version, replica 0 only from the
	// databases' refusals (it never refreshes on its own).
	for i := range r.ledgers {
		var got []string
		for _, l := range r.learned {
			if rest, ok := strings.CutPrefix(l, fmt.Sprintf("replica %d: ", i)); ok {
				got = append(got, rest)
			}
		}
		if !plan.broken && (len(got) < 3 || got[len(got)-1] != "v3 stable") {
			t.Errorf("replica %d adopted %v, want up to v3 stable", i, got)
		}
	}
	return violations
}

func shardSeedFor(t *testing.T) uint64 {
	seed := *shardSeed
	if seed == 0 {
		seed = rand.Uint64() >> 1
	}
	t.Logf("seed %d (rerun with -shard.seed=%d)", seed, seed)
	return seed
}

// The ledger grows from 2 to 3 to 5 databases under concurrent load and
// random D1 faults, with four replicas each learning every ring version
// at its own moment: every key executes exactly once, every replay is
// byte-identical to the stored response, and no key is claimed in two
// homes.
func TestShardGrowthRandomized(t *testing.T) {
	faults := &shardFaults{rate: 0.08}
	b := d1test.LocalConfig(t, d1local.Config{Faults: faults.fault})
	plan := shardPlan{replicas: 4, clients: 12, keys: 120, principals: 24, dupRate: 0.3}
	if testing.Short() {
		plan.keys = 40
	}
	seed := shardSeedFor(t)
	if v := runShardGrowth(t, b, faults, seed, plan); len(v) > 0 {
		t.Errorf("seed %d: %d violations:\n%s", seed, len(v), strings.Join(v, "\n"))
	}
}

// The same on Cloudflare's local D1 (workerd, through the bridge), smaller,
// with faults injected by a proxy in front of the bridge.
func TestShardGrowthRandomizedWorkerd(t *testing.T) {
	w := d1test.Workerd(t)
	faults := &shardFaults{rate: 0.05}
	b := faultProxy(t, w, faults.fault)
	plan := shardPlan{replicas: 3, clients: 6, keys: 36, principals: 12, dupRate: 0.3}
	seed := shardSeedFor(t)
	if v := runShardGrowth(t, b, faults, seed, plan); len(v) > 0 {
		t.Errorf("seed %d: %d violations:\n%s", seed, len(v), strings.Join(v, "\n"))
	}
}

// The checks are not vacuous: a replica that ignores the ring (it keeps
// version 1 and claims without the guard) executes moved principals' keys
// a second time, and the checker says so. First a deterministic case, then
// the randomized run with such a replica.
func TestShardCheckerCatchesBrokenRouter(t *testing.T) {
	b := d1test.Local(t)
	c := newCluster(t, b, 3)
	for _, id := range c.ids {
		for _, s := range shardAudit {
			if _, err := c.dbs[id].Query(bg, s); err != nil {
				t.Fatal(err)
			}
		}
	}
	clk := newClock()
	cfg := idem.Config{Heartbeat: -1, Clock: clk.Now}
	v1 := c.initRing(t, cfg, c.ids[0], c.ids[1])
	broken, good := c.ledger(t, cfg), c.ledger(t, cfg)
	idem.BreakRouting(broken)
	mustRing(t, broken)
	v2 := grown(v1, c.ids[2])
	p := principal(t, func(p string) bool { return v2.PreviousHome(p) != "" })
	if _, err := good.Admin().Grow(bg, c.ids[2]); err != nil {
		t.Fatal(err)
	}
	var answers []shardAnswer
	run := func(l *idem.Ledger, exec string) {
		d := begin(t, l, p, "k", "fp")
		if d.Outcome != idem.Execute {
			t.Fatalf("%s: %v", exec, d.Outcome)
		}
		body := fmt.Sprintf(`{"exec":%q}`, exec)
		if _, err := l.CompleteTx(bg, d.Reservation, idem.Response{Status: 201, Body: []byte(body)},
			[]d1client.Statement{{SQL: "INSERT INTO biz VALUES (?, ?, ?)", Params: []any{p, "k", exec}}}); err != nil {
			t.Fatal(err)
		}
		answers = append(answers, shardAnswer{principal: p, key: "k", status: 201, body: body})
	}
	run(good, "e1")   // at the new home
	run(broken, "e2") // at the old home, unguarded
	v := checkShards(t, c, answers, []string{p + "/k"})
	for _, want := range []string{"executed 2 times", "claimed in several homes"} {
		if !strings.Contains(strings.Join(v, "\n"), want) {
			t.Errorf("the checker missed %q; it found:\n%s", want, strings.Join(v, "\n"))
		}
	}

	t.Run("randomized", func(t *testing.T) {
		faults := &shardFaults{rate: 0}
		b := d1test.LocalConfig(t, d1local.Config{Faults: faults.fault})
		plan := shardPlan{replicas: 2, clients: 8, keys: 60, principals: 16, dupRate: 1, broken: true}
		seed := shardSeedFor(t)
		v := runShardGrowth(t, b, faults, seed, plan)
		if len(v) == 0 {
			t.Fatalf("seed %d: a replica ignoring the ring went unnoticed", seed)
		}
		t.Logf("%d violations, as expected; the first: %s", len(v), v[0])
	})
}

// faultProxy returns b reached through a proxy that applies hook's faults
// to each query and raw call: errors before or after forwarding it, a lost
// answer, latency.
func faultProxy(t testing.TB, b *d1test.Backend, hook d1local.FaultFunc) *d1test.Backend {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var q struct {
			SQL   *string `json:"sql"`
			Batch []struct {
				SQL string `json:"sql"`
			} `json:"batch"`
		}
		_ = json.Unmarshal(body, &q)
		req := d1local.Request{Statements: []string{""}}
		if q.SQL != nil {
			req.Statements = []string{*q.SQL}
		}
		for i, s := range q.Batch {
			if i == 0 {
				req.Statements = nil
			}
			req.Statements = append(req.Statements, s.SQL)
		}
		f := hook(req)
		time.Sleep(f.Latency)
		errorFault := f.Internal || f.BadGateway || f.Overloaded
		fail := func() {
			switch {
			case f.BadGateway:
				w.Header().Set("Content-Type", "text/html")
				w.WriteHeader(http.StatusBadGateway)
				io.WriteString(w, "<html><head><title>502 Bad Gateway</title></head></html>")
			case f.Overloaded:
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusTooManyRequests)
				io.WriteString(w, `{"result":null,"success":false,"errors":[{"code":7500,"message":"D1 DB is overloaded. Requests queued for too long."}],"messages":[]}`)
			default:
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusInternalServerError)
				io.WriteString(w, `{"result":null,"success":false,"errors":[{"code":7500,"message":"internal error; reference = proxy"}],"messages":[]}`)
			}
		}
		if errorFault && !f.AfterCommit {
			fail()
			return
		}
		fwd, _ := http.NewRequestWithContext(r.Context(), r.Method, b.BaseURL+r.URL.RequestURI(), bytes.NewReader(body))
		fwd.Header = r.Header.Clone()
		res, err := b.HTTPClient.Do(fwd)
		if err != nil {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		data, _ := io.ReadAll(res.Body)
		res.Body.Close()
		switch {
		case f.LoseResponse:
			panic(http.ErrAbortHandler)
		case errorFault:
			fail()
			return
		}
		for k, v := range res.Header {
			w.Header()[k] = v
		}
		w.WriteHeader(res.StatusCode)
		w.Write(data)
	}))
	t.Cleanup(srv.Close)
	pb := *b
	pb.BaseURL = srv.URL
	return &pb
}
