package idem_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/idem/idemhttp"
	"github.com/d1idem/d1idem/internal/d1test"
)

var (
	shardSeed       = flag.Uint64("shard.seed", 0, "seed of TestShardGrowthRandomized and TestShardGrowthRandomizedWorkerd (0: a random one, logged)")
	shardReplayFlag = flag.String("shard.replay", "", "a schedule a failed TestShardGrowthRandomized(Workerd) run wrote: replay that run exactly")
)

// checkMarker marks the checker's and the adversary's own statements, which
// no fault touches.
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

// shardDatabases makes n databases of b with the schema and the audit
// tables, and returns their IDs in the order of the homes h0, h1, ...
func shardDatabases(t testing.TB, b *d1test.Backend, n int) []string {
	t.Helper()
	var ids []string
	for range n {
		db := b.NewClientSchema(t)
		var stmts []d1client.Statement
		for _, s := range shardAudit {
			stmts = append(stmts, d1client.Statement{SQL: s})
		}
		if _, err := db.Exec(bg, stmts); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, db.DatabaseID())
	}
	return ids
}

// offsetClock is the (fake) clock moved on by jumps: the ledgers' injected
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

// shardRun is one randomized run, inside a synctest bubble: replicas
// (sharded ledgers, each with its own clients, behind the middleware)
// serving clients while an operator grows the ring 2 -> 3 -> 5 and the
// replicas learn each version whenever they happen to, every D1 call and
// every wait a step of the scheduler s. The homes are h0 ... h4, whatever
// the databases' IDs, so that a seed or a schedule routes every principal
// the same way in every run.
type shardRun struct {
	t     testing.TB
	rng   *rand.Rand // the plan's; used by the run's goroutine only
	s     *shardSched
	b     *d1test.Backend
	inner http.RoundTripper // to the backend, for the run's clients
	homes []string          // h0 ... h4
	dbOf  map[string]string // home -> database ID
	c     *cluster          // the checker's: its clients, not scheduled, by home
	clk   *offsetClock
	cfg   idem.Config
	op    *idem.Ledger // the operator's

	replicas []http.Handler
	ledgers  []*idem.Ledger

	principals []string
	execs      atomic.Int64
	inflight   sync.WaitGroup // requests inside a replica

	// The adversary's: its clients, a replica given the databases under
	// the wrong home IDs (it must serve nothing), the ledger's statement
	// texts it forges with, and what it did and caused.
	adv         map[string]*d1client.Client
	reader      *idem.Ledger // a replica of the adversary's, which reads the rings it forges
	wrong       http.Handler
	wrongServed atomic.Int64 // answers of the wrong replica that were not refusals
	ledgerTexts []string
	forgeries   atomic.Int64
	refusals    atomic.Int64 // the replicas' refusals of the rings

	mu        sync.Mutex
	answers   []shardAnswer
	opLog     []string
	learned   []string // "replica <i>: <ring>", each ring a replica adopted
	conflicts []string // each conflicting ring written, and what became of it
	bad       []string // violations seen during the rounds
}

// learnLog records the rings a replica adopts (the ledger logs each) and
// its refusals of the rings.
type learnLog struct {
	r       *shardRun
	replica int
}

func (h learnLog) Enabled(context.Context, slog.Level) bool { return true }
func (h learnLog) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h learnLog) WithGroup(string) slog.Handler            { return h }
func (h learnLog) Handle(_ context.Context, rec slog.Record) error {
	if strings.HasPrefix(rec.Message, "idem: the databases' rings or identities conflict") {
		h.r.refusals.Add(1)
	}
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
	// adversary forges the ring rows with the ledger's own statements,
	// writes conflicting rings for a while, and runs a replica given the
	// databases under the wrong home IDs, which clients also call.
	adversary bool
	rate      float64 // the share of D1 calls faulted
}

// shardRetry is the run's D1 retries: a backoff within the scheduler's
// quantum, so that the retries' random jitter never changes the schedule.
func shardRetry(c *d1client.Config) {
	c.Retry = d1client.RetryPolicy{MaxAttempts: 3, BaseDelay: time.Millisecond, MaxDelay: time.Millisecond}
}

// newShardRun prepares a run in the current bubble on the databases ids
// of b (shardDatabases), the first two in version 1 of the ring.
func newShardRun(t testing.TB, b *d1test.Backend, ids []string, seed uint64, plan shardPlan, script []shardStep) *shardRun {
	r := &shardRun{t: t, rng: rand.New(rand.NewPCG(seed, seed^0x5eed)), s: newShardSched(seed, plan.rate, script), b: b,
		dbOf: map[string]string{}, clk: &offsetClock{}, adv: map[string]*d1client.Client{}}
	r.inner = b.HTTPClient.Transport
	if b.Name == d1test.NameWorkerd {
		// No idle connection may outlive a step: the bubble waits for it.
		r.inner = &http.Transport{DisableKeepAlives: true}
	}
	r.c = &cluster{dbs: map[string]*d1client.Client{}}
	for i, id := range ids {
		h := fmt.Sprint("h", i)
		r.homes, r.dbOf[h] = append(r.homes, h), id
		r.c.ids, r.c.dbs[h] = append(r.c.ids, h), r.client(h, "")
		r.adv[h] = r.client(h, "adv")
	}
	r.cfg = idem.Config{Clock: r.clk.Now, TTL: 400 * time.Millisecond, SweepInterval: 200 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler)}
	if _, err := r.sharded("op", r.cfg, r.homes[:2]...).Admin().InitRing(bg); err != nil {
		t.Fatal(err)
	}
	r.op = r.sharded("op", r.cfg)
	for i := range plan.principals {
		r.principals = append(r.principals, fmt.Sprint("acct-", i))
	}
	for i := range plan.replicas {
		// Each replica has its own clients, as a process of its own would.
		cfg := r.cfg
		cfg.Logger = slog.New(learnLog{r, i})
		l := r.sharded(fmt.Sprint("replica ", i), cfg)
		h := idemhttp.Must(l, idemhttp.Options{Principal: bearer, Timeout: 3 * time.Second})(http.HandlerFunc(r.handle))
		if plan.broken && i == 0 {
			h = r.brokenReplica()
		}
		r.replicas = append(r.replicas, h)
		r.ledgers = append(r.ledgers, l)
	}
	if plan.adversary {
		cfg := r.cfg
		cfg.Logger = slog.New(learnLog{r, -1})
		r.reader = r.sharded("adv", cfg)
		r.startWrongReplica()
		// Every statement of the ledger but the sweep, whose retention is
		// a parameter: a negative one deletes every key, as a holder of a
		// ledger-only secret may (TestLedgerStatementsNeverWriteRingRows
		// shows that it still spares the ring and identity rows).
		for _, sql := range shippedLedgerStatements(t) {
			if !strings.Contains(sql, "WHERE rowid IN") {
				r.ledgerTexts = append(r.ledgerTexts, sql)
			}
		}
	}
	return r
}

// client is a client of home h's database whose calls are steps of the
// run (unless owner is ""), for the actor owner when their context names
// none.
func (r *shardRun) client(h, owner string) *d1client.Client {
	var rt http.RoundTripper = r.inner
	if owner != "" {
		rt = &gateTransport{s: r.s, home: h, owner: owner, inner: r.inner}
	}
	return r.b.Database(r.dbOf[h]).Client(r.t, shardRetry, func(c *d1client.Config) { c.HTTPClient = &http.Client{Transport: rt} })
}

// solo is a client that sends every call alone, group commit's included:
// group commit hands a call's callers their answers at once, and they would
// race on, so a schedule could not say which goes first.
type solo struct{ c *d1client.Client }

func (s solo) Exec(ctx context.Context, stmts []d1client.Statement, opts ...d1client.ExecOption) ([]d1client.Result, error) {
	return s.c.Exec(ctx, stmts, slices.DeleteFunc(slices.Clone(opts), isCoalesce)...)
}

// coalesceFunc names d1client.Coalesce's function, or a copy of it where
// the compiler inlined Coalesce ("idem.(*Ledger).claimAt.Coalesce.func1",
// "idem.(*shards).load.func1.Coalesce.1"). If it ever misses one, the gate
// says so (viaGroupCommit).
var coalesceFunc = regexp.MustCompile(`\.Coalesce\.(func)?\d+$`)

// isCoalesce says whether o is d1client.Coalesce().
func isCoalesce(o d1client.ExecOption) bool {
	return coalesceFunc.MatchString(runtime.FuncForPC(reflect.ValueOf(o).Pointer()).Name())
}

// sharded is a sharded ledger on the homes given (all by default), its
// calls made by owner.
func (r *shardRun) sharded(owner string, cfg idem.Config, homes ...string) *idem.Ledger {
	if len(homes) == 0 {
		homes = r.homes
	}
	var hs []idem.Home
	for _, h := range homes {
		hs = append(hs, idem.Home{ID: h, DB: solo{r.client(h, owner)}})
	}
	l, err := idem.NewSharded(hs, cfg)
	if err != nil {
		r.t.Fatal(err)
	}
	return l
}

// brokenReplica is a replica that ignores the ring: it routes every
// principal by the ring recorded now, for good, to a ledger of that one
// database, which claims without a guard.
func (r *shardRun) brokenReplica() http.Handler {
	ring := mustRing(r.t, r.op)
	byHome := map[string]http.Handler{}
	for _, h := range ring.Homes {
		l := newLedger(r.t, solo{r.client(h, "replica 0")}, r.cfg)
		byHome[h] = idemhttp.Must(l, idemhttp.Options{Principal: bearer, Timeout: 3 * time.Second})(http.HandlerFunc(r.handle))
	}
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		p, _ := bearer(req)
		byHome[ring.Home(p)].ServeHTTP(w, req)
	})
}

// startWrongReplica makes a replica whose Homes give every database under
// another's ID, and the second one under two IDs (through Executors, which
// NewSharded cannot tell apart by address): every home it routes to is
// another database than its ID says, so it must refuse every request.
func (r *shardRun) startWrongReplica() {
	n := len(r.homes)
	var homes []idem.Home
	for i, h := range r.homes {
		db := r.homes[(i+1)%n]
		if i == n-1 {
			db = r.homes[1]
		}
		homes = append(homes, idem.Home{ID: h, DB: solo{r.client(db, "wrong")}})
	}
	l, err := idem.NewSharded(homes, r.cfg)
	if err != nil {
		r.t.Fatal(err)
	}
	r.wrong = idemhttp.Must(l, idemhttp.Options{Principal: bearer, Timeout: 3 * time.Second})(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.wrongServed.Add(1)
		r.handle(w, req)
	}))
}

// adversaryViolations are the adversary's violations found at the end of
// a run: the replica given the databases under the wrong home IDs served
// requests. A conflicting ring is judged when it is written (forge): a
// replica that reads it while another database contradicts it must refuse
// it, but the operator's newer ring may replace it before any replica
// reads it.
func (r *shardRun) adversaryViolations() []string {
	if n := r.wrongServed.Load(); n > 0 {
		return []string{fmt.Sprintf("the replica given the databases under the wrong home IDs served %d requests", n)}
	}
	return nil
}

// handle is the mutation: a business write through idemhttp.Tx, committed with
// the completion, and an answer naming this execution. Some executions are
// slow (heartbeats keep them), some panic (the reservation is released).
func (r *shardRun) handle(w http.ResponseWriter, req *http.Request) {
	n := r.execs.Add(1)
	exec := fmt.Sprint("e", n)
	principal, _ := bearer(req)
	key := req.Header.Get(idemhttp.HeaderKey)
	tx, _ := idemhttp.TxFromContext(req.Context())
	if err := tx.Add(d1client.Statement{SQL: "INSERT INTO biz (principal, key, exec) VALUES (?, ?, ?)", Params: []any{principal, key, exec}}); err != nil {
		panic(err)
	}
	switch n := n % 23; {
	case n == 0:
		r.s.sleep(req.Context(), 700*time.Millisecond) // longer than the TTL: heartbeats keep it
	case n == 1:
		panic("handler failure")
	case n < 8:
		r.s.sleep(req.Context(), time.Duration(n)*5*time.Millisecond)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"exec":%q,"principal":%q,"key":%q}`, exec, principal, key)
}

// serve sends one request to h in a goroutine of its own, as a server
// would run it, and returns its answer, or the context's error if the
// client gives up first (the request goes on without it).
func (r *shardRun) serve(ctx context.Context, h http.Handler, principal, key string) (*http.Response, error) {
	req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/v1/things", strings.NewReader(`{"n":1}`))
	req.Header.Set("Authorization", "Bearer "+principal)
	req.Header.Set(idemhttp.HeaderKey, key)
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	done := make(chan struct{})
	r.inflight.Add(1)
	go func() {
		defer r.inflight.Done()
		defer close(done)
		defer func() { _ = recover() }() // the handlers' deliberate panics, as net/http's server recovers them
		h.ServeHTTP(rec, req)
	}()
	select {
	case <-done:
	case <-ctx.Done():
	}
	if err := ctx.Err(); err != nil {
		return nil, err // given up, even if the answer came in the same step
	}
	return rec.Result(), nil
}

// send makes one attempt at a replica.
func (r *shardRun) send(ctx context.Context, replica int, principal, key string) (shardAnswer, error) {
	res, err := r.serve(ctx, r.replicas[replica], principal, key)
	if err != nil {
		return shardAnswer{}, err
	}
	var body bytes.Buffer
	_, _ = body.ReadFrom(res.Body)
	a := shardAnswer{principal: principal, key: key, status: res.StatusCode, replayed: res.Header.Get(idemhttp.HeaderReplayed) == "true", body: body.String()}
	r.mu.Lock()
	r.answers = append(r.answers, a)
	r.mu.Unlock()
	return a, nil
}

// sendWrong makes one attempt at the wrong replica, which must refuse it.
func (r *shardRun) sendWrong(ctx context.Context, principal, key string) {
	if res, err := r.serve(ctx, r.wrong, principal, key); err == nil && res.StatusCode != http.StatusServiceUnavailable {
		r.wrongServed.Add(1)
	}
}

// settle sends a key until it is answered 201, to random replicas, at
// most attempts times, as the actor who; some attempts are abandoned by
// the client.
func (r *shardRun) settle(who string, rng *rand.Rand, principal, key string, attempts int, abandon float64) bool {
	for a := range attempts {
		timeout := 5 * time.Second
		if rng.Float64() < abandon {
			timeout = time.Duration(1+rng.IntN(30)) * time.Millisecond
		}
		ctx, cancel := r.s.withTimeout(withActor(bg, fmt.Sprintf("%s #%d", who, a)), timeout)
		if r.wrong != nil && rng.IntN(10) == 0 {
			r.sendWrong(ctx, principal, key)
		}
		ans, err := r.send(ctx, rng.IntN(len(r.replicas)), principal, key)
		cancel()
		if err == nil && ans.status == http.StatusCreated {
			return true
		}
		r.s.sleep(withActor(bg, who), time.Duration(10+rng.IntN(60))*time.Millisecond)
	}
	return false
}

// round runs clients over fresh keys while op changes the ring (fresh keys
// keep coming until op is done), then turns the faults off and settles
// every key. It returns the keys ("principal/key").
func (r *shardRun) round(name string, plan shardPlan, op func(ctx context.Context)) []string {
	perClient := make([][]string, plan.clients)
	quota := (plan.keys + plan.clients - 1) / max(plan.clients, 1)
	advSeed, settleSeed := r.rng.Uint64(), r.rng.Uint64()
	clientSeeds, refreshSeeds := make([]uint64, plan.clients), make([]uint64, len(r.ledgers))
	for i := range clientSeeds {
		clientSeeds[i] = r.rng.Uint64()
	}
	for i := range refreshSeeds {
		refreshSeeds[i] = r.rng.Uint64()
	}
	var keys []string
	r.s.run(func() {
		r.s.setFaults(true)
		var opDone, stop atomic.Bool
		var operator, refreshers, clients sync.WaitGroup
		r.s.spawn(&operator, withActor(bg, "op"), func(ctx context.Context) {
			defer opDone.Store(true)
			if r.ledgerTexts == nil {
				op(ctx)
				return
			}
			var advDone atomic.Bool
			var adv sync.WaitGroup
			r.s.spawn(&adv, withActor(bg, "adv"), func(ctx context.Context) { r.attack(ctx, rand.New(rand.NewPCG(advSeed, 4)), &advDone) })
			op(ctx)
			advDone.Store(true)
			adv.Wait()
		})
		// Replicas learn new rings at random moments besides the refusals
		// that teach them; replica 0 only ever learns from refusals.
		for i := 1; i < len(r.ledgers); i++ {
			r.s.spawn(&refreshers, withActor(bg, fmt.Sprint("refresh ", i)), func(ctx context.Context) {
				rng := rand.New(rand.NewPCG(refreshSeeds[i], 2))
				for r.s.sleep(ctx, time.Duration(rng.IntN(600))*time.Millisecond); !stop.Load(); r.s.sleep(ctx, time.Duration(rng.IntN(600))*time.Millisecond) {
					_, _ = r.ledgers[i].RefreshRing(ctx)
				}
			})
		}
		for c := range plan.clients {
			r.s.spawn(&clients, withActor(bg, fmt.Sprint("client ", c)), func(context.Context) {
				rng := rand.New(rand.NewPCG(clientSeeds[c], uint64(c)))
				var dups sync.WaitGroup
				for i := 0; i < quota || !opDone.Load(); i++ {
					p, key := r.principals[rng.IntN(len(r.principals))], fmt.Sprintf("%s-c%d-k%d", name, c, i)
					perClient[c] = append(perClient[c], p+"/"+key)
					if rng.Float64() < plan.dupRate {
						// A concurrent duplicate to another replica.
						dseed := rng.Uint64()
						r.s.spawn(&dups, withActor(bg, "dup "+key), func(context.Context) {
							r.settle("dup "+key, rand.New(rand.NewPCG(dseed, 1)), p, key, 3, 0.3)
						})
					}
					r.settle(key, rng, p, key, 6, 0.15)
				}
				dups.Wait()
			})
		}
		clients.Wait()
		stop.Store(true)
		refreshers.Wait()
		operator.Wait()
		r.s.setFaults(false)
		r.inflight.Wait()
		// Every key settles once the faults are off.
		keys = slices.Concat(perClient...)
		rng := rand.New(rand.NewPCG(settleSeed, 3))
		for _, k := range keys {
			p, key, _ := strings.Cut(k, "/")
			if !r.settle("settle "+key, rng, p, key, 40, 0) {
				r.violation("%s did not settle", k)
			}
		}
		r.inflight.Wait()
	})
	return keys
}

// violation records a violation seen during a round.
func (r *shardRun) violation(format string, args ...any) {
	r.mu.Lock()
	r.bad = append(r.bad, fmt.Sprintf(format, args...))
	r.mu.Unlock()
}

// attack is the adversary, until done: it sends the ledger's own
// statements at the rows of the empty principal, with parameters drawn
// from the values that name them, and once writes a conflicting ring (a
// ring of the database's epoch with another content) in a database,
// makes a replica read it, and puts the row back.
func (r *shardRun) attack(ctx context.Context, rng *rand.Rand, done *atomic.Bool) {
	conflictAt := rng.IntN(10) // the step at which it writes a conflicting ring
	names := []any{"", "d1idem:ring", "d1idem:home"}
	others := []any{int64(1), int64(2), int64(3), int64(4), int64(5), int64(6), int64(-1e15), int64(1e15), true}
	for step := 0; ; step++ {
		if r.s.sleep(ctx, time.Duration(2+rng.IntN(15))*time.Millisecond); done.Load() {
			return
		}
		if step == conflictAt {
			r.conflict(ctx, rng)
			continue
		}
		db := r.adv[r.homes[rng.IntN(len(r.homes))]]
		sql := r.ledgerTexts[rng.IntN(len(r.ledgerTexts))]
		ps := make([]any, placeholders(sql))
		for i := range ps {
			if rng.IntN(2) == 0 {
				ps[i] = names[rng.IntN(len(names))]
			} else {
				ps[i] = others[rng.IntN(len(others))]
			}
		}
		for _, i := range principalParams(sql) {
			ps[i] = "" // the rows of the empty principal, never a request's
		}
		r.forgeries.Add(1)
		_, _ = db.Exec(ctx, []d1client.Statement{{SQL: checkMarker + sql, Params: ps}})
	}
}

// ringRowAt reads home h's ring row; ok is false if it has none.
func (r *shardRun) ringRowAt(ctx context.Context, h string) (row ringRow, ok bool, err error) {
	res, err := r.adv[h].Query(ctx, checkMarker+"SELECT generation, fingerprint, response_body FROM idempotency_keys WHERE principal = '' AND key = 'd1idem:ring'")
	if err != nil || len(res.Rows) == 0 {
		return ringRow{}, false, err
	}
	err = res.Rows[0].Scan(&row.gen, &row.fp, &row.body)
	return row, err == nil, err
}

// decodeRow reads a ring row's ring, as a replica would.
func decodeRow(row ringRow) (idem.Ring, error) {
	var ring struct {
		Version  int64          `json:"version"`
		Phase    idem.RingPhase `json:"phase"`
		Homes    []string       `json:"homes"`
		Previous []string       `json:"previous"`
	}
	err := json.Unmarshal([]byte(row.body), &ring)
	return idem.Ring{Version: ring.Version, Phase: ring.Phase, Homes: ring.Homes, Previous: ring.Previous}, err
}

// contradicts says whether a ring other than forged is recorded in a
// database besides h: one of forged's epoch, or a newer one, which drops
// the home forged adds. A replica that reads both must refuse them.
func (r *shardRun) contradicts(ctx context.Context, h string, forged ringRow) (bool, error) {
	for _, o := range r.homes {
		if o == h {
			continue
		}
		row, ok, err := r.ringRowAt(ctx, o)
		if err != nil {
			return false, err
		}
		if ok && row.gen >= forged.gen && row.fp != forged.fp {
			return true, nil
		}
	}
	return false, nil
}

// conflict writes, in a database holding a ring, a ring of the same epoch
// with another content (a home added); then has the reader read the rings
// until it refuses them, or the operator's newer ring replaces the forged
// one first; and puts the row back unless the operator has recorded a
// newer ring there meanwhile. A replica that read the forged ring while
// another database held a ring that contradicts it, and did not refuse
// them, is a violation; a forged ring that no replica read is not.
func (r *shardRun) conflict(ctx context.Context, rng *rand.Rand) {
	for _, i := range rng.Perm(len(r.homes)) {
		if r.forge(ctx, rng, r.homes[i]) {
			return
		}
	}
}

// forge is conflict at home h; it reports false if h holds no ring.
func (r *shardRun) forge(ctx context.Context, rng *rand.Rand, h string) bool {
	saved, ok, err := r.ringRowAt(ctx, h)
	if err != nil || !ok {
		return false
	}
	ring, err := decodeRow(saved)
	if err != nil {
		r.violation("the ring row of %s: %v", h, err)
		return true
	}
	ring.Homes = append(ring.Homes, "zz-elsewhere")
	other := forged(ring)
	const swap = "UPDATE idempotency_keys SET fingerprint = ?, response_body = ? WHERE principal = '' AND key = 'd1idem:ring' AND generation = ? AND fingerprint = ?"
	res, err := r.adv[h].Query(ctx, checkMarker+swap, other.fp, other.body, saved.gen, saved.fp)
	if err != nil || res.Meta.Changes != 1 {
		return true
	}
	what := fmt.Sprintf("a conflicting %s at %s", ring, h)
	outcome := r.readConflict(ctx, h, other)
	r.mu.Lock()
	r.conflicts = append(r.conflicts, what+": "+outcome)
	r.mu.Unlock()
	r.s.sleep(ctx, time.Duration(50+rng.IntN(200))*time.Millisecond) // the conflict lasts a while
	if _, err := r.adv[h].Query(ctx, checkMarker+swap, saved.fp, saved.body, saved.gen, other.fp); err != nil {
		r.violation("putting the ring row of %s back: %v", h, err)
	}
	return true
}

// readConflict has the reader, a replica of the adversary's own, read the
// rings, the forged row at h among them, and says what became of it:
// refused, replaced by the operator's newer ring, or never contradicted by
// another database while it lasted (a replica that reads it then takes it
// for the newest ring, as it would any other).
func (r *shardRun) readConflict(ctx context.Context, h string, other ringRow) string {
	for try := 0; try < 40; try++ {
		before, err := r.contradicts(ctx, h, other)
		if err != nil {
			return err.Error()
		}
		_, err = r.reader.RefreshRing(ctx)
		if errors.Is(err, idem.ErrRingConflict) {
			return fmt.Sprintf("refused by the reader (try %d)", try)
		}
		now, ok, qerr := r.ringRowAt(ctx, h)
		switch {
		case qerr != nil:
			return qerr.Error()
		case ok && now.fp == other.fp && before:
			r.violation("the reader read the rings while %s held a conflicting ring and another database a ring that contradicts it, and did not refuse them: %v", h, err)
			return "not refused"
		case ok && now.fp == other.fp:
		case ok && now.gen > other.gen:
			newer, _ := decodeRow(now)
			return fmt.Sprintf("replaced by the operator's %s before the reader read it (try %d)", newer, try)
		default:
			r.violation("the forged ring row of %s was replaced by %v, not by a newer ring", h, now)
			return "replaced by no newer ring"
		}
		r.s.sleep(ctx, 5*time.Millisecond) // until the operator records a ring that contradicts it
	}
	return "no other database held a ring that contradicts it while it lasted"
}

// checkReserved verifies that every database's rows of the empty
// principal are the operator's: completed, never swept, the ring and the
// identity readable and consistent.
func (r *shardRun) checkReserved() []string {
	var out []string
	for _, h := range r.homes {
		res, err := r.c.dbs[h].Query(bg, checkMarker+"SELECT key, status, updated_at, fingerprint FROM idempotency_keys WHERE principal = ''")
		if err != nil {
			r.t.Fatal(err)
		}
		for _, row := range res.Rows {
			var key, status, fp string
			var updated int64
			_ = row.Scan(&key, &status, &updated, &fp)
			switch {
			case key != "d1idem:ring" && key != "d1idem:home":
				out = append(out, fmt.Sprintf("%s: a row (%q, %q) of the empty principal", h, "", key))
			case status != "completed" || updated != 253402300799999:
				out = append(out, fmt.Sprintf("%s: the %s row is %s, updated at %d", h, key, status, updated))
			case key == "d1idem:home" && fp != h:
				out = append(out, fmt.Sprintf("%s: its identity says %s", h, fp))
			}
		}
	}
	l, err := idem.NewSharded(r.checkHomes(), r.cfg)
	if err != nil {
		r.t.Fatal(err)
	}
	st, err := l.Admin().RingStatus(bg)
	if err != nil {
		r.t.Fatal(err)
	}
	for _, h := range st.Homes {
		if h.Err != nil {
			out = append(out, fmt.Sprintf("%s: %v", h.ID, h.Err))
		}
	}
	return out
}

// checkHomes are the homes on the checker's clients.
func (r *shardRun) checkHomes() []idem.Home {
	var hs []idem.Home
	for _, h := range r.homes {
		hs = append(hs, idem.Home{ID: h, DB: r.c.dbs[h]})
	}
	return hs
}

// operate runs an operator action until it succeeds: a failed Grow that
// recorded the change somewhere is finished by AdvanceRing, as the
// procedure says.
func (r *shardRun) operate(ctx context.Context, what string, fn func() (idem.RingStatus, error), done func(idem.RingStatus) bool) {
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
				st, err := r.op.Admin().AdvanceRing(ctx)
				if err == nil || (errors.Is(err, idem.ErrDropNotDue) && allRecorded(st)) {
					return
				}
				log(st, err)
				r.s.sleep(ctx, 20*time.Millisecond)
			}
			break
		}
		r.s.sleep(ctx, 20*time.Millisecond)
	}
	r.violation("%s did not succeed within a minute", what)
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
func (r *shardRun) grow(delay time.Duration, ids ...string) func(context.Context) {
	return func(ctx context.Context) {
		r.s.sleep(ctx, delay)
		r.operate(ctx, "grow", func() (idem.RingStatus, error) { return r.op.Admin().Grow(ctx, ids...) },
			func(st idem.RingStatus) bool {
				return st.Ring.Phase == idem.RingMoving && slices.Contains(st.Ring.Homes, ids[0])
			})
	}
}

// drop is the operator ending a change (its DropAt passed before the round).
func (r *shardRun) drop(delay time.Duration) func(context.Context) {
	return func(ctx context.Context) {
		r.s.sleep(ctx, delay)
		r.operate(ctx, "drop", func() (idem.RingStatus, error) { return r.op.Admin().AdvanceRing(ctx) },
			func(st idem.RingStatus) bool { return st.Ring.Phase == idem.RingStable })
	}
}

// shippedLedgerStatements reads the statement texts a ledger-only bridge
// accepts (bridge/ledger-statements.js).
func shippedLedgerStatements(t testing.TB) []string {
	t.Helper()
	src, err := os.ReadFile(filepath.Join("..", "bridge", "ledger-statements.js"))
	if err != nil {
		t.Fatal(err)
	}
	i := bytes.Index(src, []byte("export default ["))
	if i < 0 {
		t.Fatal("ledger-statements.js has no default export")
	}
	list := bytes.Replace(src[i+len("export default "):], []byte(",\n];"), []byte("\n]"), 1)
	var out []string
	if err := json.Unmarshal(list, &out); err != nil {
		t.Fatalf("ledger-statements.js: %v", err)
	}
	return out
}

// principalParam finds a statement's principal parameter.
var principalParam = regexp.MustCompile(`principal = \?(\d+)`)

// principalParams returns the indexes of a ledger statement's principal
// parameters: those it compares principal with, and the claim's first.
func principalParams(sql string) []int {
	var out []int
	for _, m := range principalParam.FindAllStringSubmatch(sql, -1) {
		n, _ := strconv.Atoi(m[1])
		out = append(out, n-1)
	}
	if strings.HasPrefix(sql, "INSERT INTO idempotency_keys (principal, key, fingerprint, status") {
		out = append(out, 0)
	}
	return out
}

// placeholders returns how many numbered parameters a statement takes.
func placeholders(sql string) int {
	n := 0
	for i := 1; strings.Contains(sql, fmt.Sprintf("?%d", i)); i++ {
		n = i
	}
	return n
}

// checkShards verifies the invariants for keys ("principal/key"), on what
// the databases hold and what the clients saw, and returns the violations.
func checkShards(t testing.TB, c *cluster, answers []shardAnswer, keys []string) []string {
	t.Helper()
	st := readShardStates(t, c, keys)
	var out []string
	bad := func(k, format string, args ...any) { out = append(out, k+": "+fmt.Sprintf(format, args...)) }
	for _, k := range keys {
		st[k].check(k, bad)
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

// shardState is what the databases hold of one key: its business writes,
// its rows, their stored responses, and what the audit saw per database.
type shardState struct {
	biz       []string // "db:exec"
	rows      []string // "db:status"
	bodies    map[string]string
	completed map[string]bool // by database
	inserted  map[string]bool
	movedOut  map[string]bool // deleted while pending
}

// readShardStates reads what every database of c holds of keys
// ("principal/key").
func readShardStates(t testing.TB, c *cluster, keys []string) map[string]*shardState {
	t.Helper()
	st := map[string]*shardState{}
	for _, k := range keys {
		st[k] = &shardState{bodies: map[string]string{}, completed: map[string]bool{}, inserted: map[string]bool{}, movedOut: map[string]bool{}}
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
	return st
}

// check verifies key k's invariants on what the databases hold, and
// reports each violation to bad.
func (s *shardState) check(k string, bad func(k, format string, args ...any)) {
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
	slices.Sort(completed)
	slices.Sort(alive)
	if len(completed) > 1 || len(alive) > 1 || len(s.rows) != 1 {
		bad(k, "claimed in several homes: completed in %v, alive in %v, rows %v", completed, alive, s.rows)
	}
	if len(s.biz) != 1 || len(s.rows) != 1 {
		return
	}
	db, exec, _ := strings.Cut(s.biz[0], ":")
	stored := s.bodies[db]
	if !strings.Contains(stored, fmt.Sprintf(`"exec":%q`, exec)) {
		bad(k, "the stored response %q is not the execution %s that wrote at %s (row in %v)", stored, exec, db, s.rows)
	}
}

// shardOutcome is what a run did and found: its violations, and what
// replays it.
type shardOutcome struct {
	violations []string
	answers    []string // every answer the clients saw, in order
	steps      []shardStep
	diverged   string // replaying: the first step the run did not offer
}

// runShardGrowth grows the ring 2 -> 3 -> 5 under load and faults, in
// three rounds of fresh keys; between rounds the clock jumps two
// retention windows, so that each change's old route can be dropped (in
// the next round, under load). It runs in a synctest bubble of its own,
// on d1local in process or (workerd) on Cloudflare's local D1 through the
// bridge, step by step (shardSched), following script if it is given.
func runShardGrowth(t *testing.T, backend string, seed uint64, plan shardPlan, script []shardStep) shardOutcome {
	var ids []string
	var b *d1test.Backend
	if backend == d1test.NameWorkerd {
		b = d1test.Workerd(t)
		ids = shardDatabases(t, b, 5)
	}
	var out shardOutcome
	synctest.Test(t, func(t *testing.T) {
		if b == nil {
			b = d1test.InProcess(t, d1local.Config{})
			ids = shardDatabases(t, b, 5)
		}
		r := newShardRun(t, b, ids, seed, plan, script)
		out = r.grow3(plan)
		out.steps, out.diverged = r.s.steps, r.s.diverged
		if script != nil && out.diverged == "" && r.s.next != len(script) {
			out.diverged = fmt.Sprintf("the run ended at step %d of the schedule's %d", r.s.next, len(script))
		}
		settleBubble()
	})
	return out
}

// settleBubble lets the goroutines the clients leave behind (group
// commit's runners, which wait a while for callers to come back) end, as
// a bubble's goroutines must before its main one returns: time stops then.
func settleBubble() {
	time.Sleep(time.Minute)
	synctest.Wait()
}

// grow3 is the three rounds of runShardGrowth.
func (r *shardRun) grow3(plan shardPlan) shardOutcome {
	t, h := r.t, r.homes
	jump := 2 * r.op.Config().Retention
	var violations []string
	check := func(keys []string) {
		r.mu.Lock()
		answers := slices.Clone(r.answers)
		r.mu.Unlock()
		violations = append(violations, checkShards(t, r.c, answers, keys)...)
		if plan.adversary {
			violations = append(violations, r.checkReserved()...)
		}
	}
	delay := func() time.Duration { return time.Duration(50+r.rng.IntN(400)) * time.Millisecond }
	// Round 1: 2 databases, grown to 3 in the middle.
	check(r.round("r1", plan, r.grow(delay(), h[2])))
	r.clk.Jump(jump)
	// Round 2: the change to 3 ends, then 3 grow to 5.
	d1, d2 := delay(), delay()
	check(r.round("r2", plan, func(ctx context.Context) {
		r.drop(d1)(ctx)
		r.grow(d2, h[3], h[4])(ctx)
	}))
	r.clk.Jump(jump)
	// Round 3: the change to 5 ends.
	check(r.round("r3", plan, r.drop(delay())))
	final, err := r.op.Ring(bg)
	want := "v3 stable " + fmt.Sprint(h)
	if err != nil || final.String() != want {
		violations = append(violations, fmt.Sprintf("the operator ends at %s (%v), want %s", final, err, want))
	}
	n, kinds := r.s.injected()
	t.Logf("%d answers, %d executions, %d D1 calls and waits scheduled, %d faults (%s); operations:\n%s\nrings adopted:\n%s",
		len(r.answers), r.execs.Load(), len(r.s.steps), n, kinds, strings.Join(r.opLog, "\n"), strings.Join(r.learned, "\n"))
	if plan.adversary {
		t.Logf("adversary: %d forged statements, %d refusals of the rings by the replicas; conflicting rings:\n%s",
			r.forgeries.Load(), r.refusals.Load(), strings.Join(r.conflicts, "\n"))
		violations = append(violations, r.adversaryViolations()...)
	}
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
			violations = append(violations, fmt.Sprintf("replica %d adopted %v, want up to v3 stable", i, got))
		}
	}
	violations = append(r.bad, violations...)
	var answers []string
	for _, a := range r.answers {
		answers = append(answers, fmt.Sprintf("%s/%s %d %v %s", a.principal, a.key, a.status, a.replayed, a.body))
	}
	return shardOutcome{violations: violations, answers: answers}
}

// shardGrowth runs runShardGrowth for test t (a seed of -shard.seed, or a
// random one; or the schedule of -shard.replay), and on a violation writes
// the schedule and says how to replay it.
func shardGrowth(t *testing.T, backend string, plan shardPlan) {
	seed, script := shardSeedFor(t)
	out := runShardGrowth(t, backend, seed, plan, script)
	if out.diverged != "" {
		t.Errorf("the replay diverged from the schedule: %s", out.diverged)
	}
	if len(out.violations) > 0 {
		path := writeShardReplay(t, seed, out.steps)
		t.Errorf("seed %d: %d violations:\n%s\nreplay this run exactly (%d steps) with: go test ./idem -run '^%s$' -shard.replay=%s",
			seed, len(out.violations), strings.Join(out.violations, "\n"), len(out.steps), t.Name(), path)
	}
}

// shardSeedFor returns the run's seed, and the schedule to follow if
// -shard.replay names one for this test.
func shardSeedFor(t *testing.T) (uint64, []shardStep) {
	if *shardReplayFlag != "" {
		rp := readShardReplay(t, *shardReplayFlag)
		if rp.Test != t.Name() {
			t.Skipf("-shard.replay is a schedule of %s", rp.Test)
		}
		t.Logf("replaying the %d steps of %s (seed %d)", len(rp.Steps), *shardReplayFlag, rp.Seed)
		return rp.Seed, rp.Steps
	}
	seed := *shardSeed
	if seed == 0 {
		seed = rand.Uint64() >> 1
	}
	t.Logf("seed %d (rerun with -shard.seed=%d)", seed, seed)
	return seed, nil
}

// The ledger grows from 2 to 3 to 5 databases under concurrent load and
// random D1 faults, with four replicas each learning every ring version
// at its own moment: every key executes exactly once, every replay is
// byte-identical to the stored response, and no key is claimed in two
// homes. The run is a schedule of steps in fake time: a failure writes it,
// and -shard.replay replays it exactly.
func TestShardGrowthRandomized(t *testing.T) {
	plan := shardPlan{replicas: 4, clients: 12, keys: 120, principals: 24, dupRate: 0.3, adversary: true, rate: 0.08}
	if testing.Short() {
		plan.keys = 40
	}
	shardGrowth(t, d1test.NameLocal, plan)
}

// The same on Cloudflare's local D1 (workerd, through the bridge), smaller.
func TestShardGrowthRandomizedWorkerd(t *testing.T) {
	shardGrowth(t, d1test.NameWorkerd, shardPlan{replicas: 3, clients: 6, keys: 36, principals: 12, dupRate: 0.3, adversary: true, rate: 0.05})
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
	good := c.ledger(t, cfg)
	v2 := grown(v1, c.ids[2])
	p := principal(t, func(p string) bool { return v2.PreviousHome(p) != "" })
	// A router that ignores the ring: it keeps routing p by version 1, to
	// a ledger of that one database, which claims without a guard.
	broken := newLedger(t, c.dbs[v1.Home(p)], cfg)
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
		seed, _ := shardSeedFor(t)
		plan := shardPlan{replicas: 2, clients: 8, keys: 60, principals: 16, dupRate: 1, broken: true}
		out := runShardGrowth(t, d1test.NameLocal, seed, plan, nil)
		if len(out.violations) == 0 {
			t.Fatalf("seed %d: a replica ignoring the ring went unnoticed", seed)
		}
		t.Logf("%d violations, as expected; the first: %s", len(out.violations), out.violations[0])
	})
}

// The adversary's checks are not vacuous: a ring row made pending, or an
// identity row naming another home, is reported; and the replica given the
// databases under the wrong home IDs refuses every request.
func TestShardCheckerCatchesForgedRows(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := d1test.InProcess(t, d1local.Config{})
		r := newShardRun(t, b, shardDatabases(t, b, 5), 1, shardPlan{replicas: 1, principals: 1, adversary: true}, nil)
		if v := r.checkReserved(); len(v) > 0 {
			t.Fatalf("violations before any forgery: %v", v)
		}
		r.s.run(func() { r.sendWrong(withActor(bg, "client"), "acct-0", "k") })
		if n := r.wrongServed.Load(); n != 0 {
			t.Errorf("the replica given the databases under the wrong home IDs served %d requests", n)
		}
		if _, err := r.c.dbs["h0"].Query(bg, "UPDATE idempotency_keys SET status = 'pending' WHERE principal = '' AND key = 'd1idem:ring'"); err != nil {
			t.Fatal(err)
		}
		if _, err := r.c.dbs["h1"].Query(bg, "UPDATE idempotency_keys SET fingerprint = 'elsewhere' WHERE principal = '' AND key = 'd1idem:home'"); err != nil {
			t.Fatal(err)
		}
		v := strings.Join(r.checkReserved(), "\n")
		for _, want := range []string{"the d1idem:ring row is pending", "its identity says elsewhere"} {
			if !strings.Contains(v, want) {
				t.Errorf("the checker missed %q; it found:\n%s", want, v)
			}
		}
		settleBubble()
	})
}

// A run's schedule replays it exactly, from the file a failed run writes:
// the same steps, the same answers, the same violations (here those of a
// replica that ignores the ring, so that there are some to reproduce),
// with faults and the adversary; on d1local and on workerd, whose
// databases differ from run to run.
func TestShardReplayReproducesARun(t *testing.T) {
	plan := shardPlan{replicas: 2, clients: 4, keys: 16, principals: 8, dupRate: 0.5, broken: true, adversary: true, rate: 0.08}
	for _, backend := range []string{d1test.NameLocal, d1test.NameWorkerd} {
		t.Run(backend, func(t *testing.T) {
			seed := rand.Uint64() >> 1
			t.Logf("seed %d", seed)
			recorded := runShardGrowth(t, backend, seed, plan, nil)
			if len(recorded.violations) == 0 {
				t.Fatal("the recorded run found no violation to reproduce")
			}
			path := writeShardReplay(t, seed, recorded.steps)
			defer os.Remove(path)
			rp := readShardReplay(t, path)
			replayed := runShardGrowth(t, backend, rp.Seed, plan, rp.Steps)
			if replayed.diverged != "" {
				t.Fatalf("the replay diverged: %s", replayed.diverged)
			}
			if !slices.Equal(replayed.steps, recorded.steps) {
				t.Errorf("the replay took other steps (%d, recorded %d)", len(replayed.steps), len(recorded.steps))
			}
			if !slices.Equal(replayed.answers, recorded.answers) {
				t.Errorf("the replay's clients saw other answers (%d, recorded %d)", len(replayed.answers), len(recorded.answers))
			}
			if !slices.Equal(replayed.violations, recorded.violations) {
				t.Errorf("the replay found other violations:\n%s\nrecorded:\n%s", strings.Join(replayed.violations, "\n"), strings.Join(recorded.violations, "\n"))
			}
			t.Logf("%d steps, %d answers and %d violations reproduced; the first: %s", len(recorded.steps), len(recorded.answers), len(recorded.violations), recorded.violations[0])
		})
	}
}

// A replay says where a run leaves its schedule: here a step no run takes.
func TestShardReplayReportsADivergence(t *testing.T) {
	plan := shardPlan{replicas: 2, clients: 2, keys: 6, principals: 4, rate: 0.08}
	recorded := runShardGrowth(t, d1test.NameLocal, 7, plan, nil)
	steps := slices.Clone(recorded.steps)
	k := len(steps) / 2
	steps[k].Do = "call nobody"
	replayed := runShardGrowth(t, d1test.NameLocal, 7, plan, steps)
	if want := fmt.Sprintf("step %d: the schedule takes \"call nobody\"", k); !strings.HasPrefix(replayed.diverged, want) {
		t.Errorf("diverged: %q, want %q...", replayed.diverged, want)
	}
}

// The forged ring of the adversary can be replaced by the operator's newer
// ring before any replica reads it: then no replica refuses it, and none
// need to. The interleaving that failed a run with "conflicting rings were
// written and no replica refused them": the operator reads every database
// and records the Moving ring again, the adversary forges a conflicting
// Moving ring at the coordinating database, the operator records the Stable
// ring there (over the forged one) and everywhere, and only then does a
// replica read the rings.
func TestShardForgedRingReplacedBeforeRead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := d1test.InProcess(t, d1local.Config{})
		r := newShardRun(t, b, shardDatabases(t, b, 3), 1, shardPlan{replicas: 1, principals: 1, adversary: true}, nil)
		if _, err := r.op.Admin().Grow(bg, "h2"); err != nil {
			t.Fatal(err)
		}
		r.clk.Jump(2 * r.op.Config().Retention)
		r.s.prefer = func(steps []shardStep, ready []string) string {
			op, adv := 0, 0
			for _, st := range steps {
				op += boolInt(strings.HasPrefix(st.Do, "call op "))
				adv += boolInt(strings.HasPrefix(st.Do, "call adv "))
			}
			want := "call op " // AdvanceRing: 3 reads and the Moving ring again at h0
			if op >= 4 && adv < 2 {
				want = "call adv " // the forgery's read and write
			}
			for _, d := range ready {
				if strings.HasPrefix(d, want) {
					return d
				}
			}
			return ""
		}
		r.s.run(func() {
			var actors sync.WaitGroup
			r.s.spawn(&actors, withActor(bg, "op"), func(ctx context.Context) {
				r.operate(ctx, "drop", func() (idem.RingStatus, error) { return r.op.Admin().AdvanceRing(ctx) },
					func(st idem.RingStatus) bool { return st.Ring.Phase == idem.RingStable })
			})
			r.s.spawn(&actors, withActor(bg, "adv"), func(ctx context.Context) { r.forge(ctx, rand.New(rand.NewPCG(1, 2)), "h0") })
			actors.Wait()
		})
		if len(r.conflicts) != 1 || !strings.Contains(r.conflicts[0], "replaced by the operator's v2 stable [h0 h1 h2] before the reader read it (try 0)") {
			t.Fatalf("conflicts %q, want one replaced by the operator's ring before any replica read it; operations:\n%s", r.conflicts, strings.Join(r.opLog, "\n"))
		}
		if n := r.refusals.Load(); n != 0 {
			t.Errorf("%d refusals: a replica read the forged ring", n)
		}
		if v := append(r.bad, r.adversaryViolations()...); len(v) > 0 {
			t.Errorf("violations of a forged ring no replica read: %v", v)
		}
		settleBubble()
	})
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
