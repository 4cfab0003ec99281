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
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/idem/idemhttp"
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

	// The adversary's: a replica given one database under two home IDs
	// (it must serve nothing), the ledger's statement texts it forges
	// with, and what it did and caused.
	wrong       *httptest.Server
	wrongServed atomic.Int64 // answers of the wrong replica that were not refusals
	ledgerTexts []string
	forgeries   atomic.Int64
	conflicts   atomic.Int64 // conflicting rings written
	refusals    atomic.Int64 // the replicas' refusals of the rings

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
	// writes conflicting rings for a while, and runs a replica given one
	// database under two home IDs, which clients also call.
	adversary bool
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
		h := idemhttp.Must(l, idemhttp.Options{Principal: bearer, Timeout: 3 * time.Second})(http.HandlerFunc(r.handle))
		if plan.broken && i == 0 {
			h = r.brokenReplica(fast)
		}
		srv := httptest.NewUnstartedServer(r.wrap(h))
		srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the handlers' deliberate panics
		srv.Start()
		t.Cleanup(srv.Close)
		r.replicas = append(r.replicas, srv)
		r.ledgers = append(r.ledgers, l)
	}
	if plan.adversary {
		r.startWrongReplica(fast)
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

// brokenReplica is a replica that ignores the ring: it routes every
// principal by the ring recorded now, for good, to a ledger of that one
// database, which claims without a guard.
func (r *shardRun) brokenReplica(fast func(*d1client.Config)) http.Handler {
	ring := mustRing(r.t, r.op)
	byHome := map[string]http.Handler{}
	for _, id := range ring.Homes {
		l := newLedger(r.t, r.b.Database(id).Client(r.t, fast), r.cfg)
		byHome[id] = idemhttp.Must(l, idemhttp.Options{Principal: bearer, Timeout: 3 * time.Second})(http.HandlerFunc(r.handle))
	}
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		p, _ := bearer(req)
		byHome[ring.Home(p)].ServeHTTP(w, req)
	})
}

// startWrongReplica runs a replica whose Homes give every database under
// another's ID, and the second one under two IDs (the second time through
// a proxy, so that its address differs): every home it routes to is
// another database than its ID says, so it must refuse every request.
func (r *shardRun) startWrongReplica(fast func(*d1client.Config)) {
	alias := rewriteProxy(r.t, r.b, func(b []byte) []byte { return b })
	n := len(r.c.ids)
	var homes []idem.Home
	for i, id := range r.c.ids {
		db := r.b.Database(r.c.ids[(i+1)%n]).Client(r.t, fast)
		if i == n-1 {
			db = alias.Database(r.c.ids[1]).Client(r.t, fast)
		}
		homes = append(homes, idem.Home{ID: id, DB: db})
	}
	l, err := idem.NewSharded(homes, r.cfg)
	if err != nil {
		r.t.Fatal(err)
	}
	h := idemhttp.Must(l, idemhttp.Options{Principal: bearer, Timeout: 3 * time.Second})(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.wrongServed.Add(1)
		r.handle(w, req)
	}))
	r.wrong = httptest.NewServer(r.wrap(h))
	r.t.Cleanup(r.wrong.Close)
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

// wrap counts the requests inside a replica, so that a round ends only
// when every one of them (abandoned by its client or not) has finished.
func (r *shardRun) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.inflight.Add(1)
		defer r.inflight.Done()
		h.ServeHTTP(w, req)
	})
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
	req.Header.Set(idemhttp.HeaderKey, key)
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
	a := shardAnswer{principal: principal, key: key, status: res.StatusCode, replayed: res.Header.Get(idemhttp.HeaderReplayed) == "true", body: string(body)}
	r.mu.Lock()
	r.answers = append(r.answers, a)
	r.mu.Unlock()
	return a, nil
}

// sendWrong makes one attempt at the wrong replica, which must refuse it.
func (r *shardRun) sendWrong(ctx context.Context, principal, key string) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, r.wrong.URL+"/v1/things", strings.NewReader(`{"n":1}`))
	req.Header.Set("Authorization", "Bearer "+principal)
	req.Header.Set(idemhttp.HeaderKey, key)
	req.Header.Set("Content-Type", "application/json")
	res, err := r.wrong.Client().Do(req)
	if err != nil {
		return
	}
	res.Body.Close()
	if res.StatusCode != http.StatusServiceUnavailable {
		r.wrongServed.Add(1)
	}
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
		if r.wrong != nil && rng.IntN(10) == 0 {
			r.sendWrong(ctx, principal, key)
		}
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
	advSeed := r.rng.Uint64()
	go func() {
		defer close(opDone)
		if r.ledgerTexts == nil {
			op()
			return
		}
		var adv sync.WaitGroup
		advDone := make(chan struct{})
		adv.Go(func() { r.attack(rand.New(rand.NewPCG(advSeed, 4)), advDone) })
		op()
		close(advDone)
		adv.Wait()
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

// attack is the adversary, until done: it sends the ledger's own
// statements at the rows of the empty principal, with parameters drawn
// from the values that name them, and once writes a conflicting ring (a
// ring of the database's epoch with another content) in a database,
// makes a replica read it, and puts the row back.
func (r *shardRun) attack(rng *rand.Rand, done chan struct{}) {
	conflictAt := rng.IntN(10) // the step at which it writes a conflicting ring
	names := []any{"", "d1idem:ring", "d1idem:home"}
	others := []any{int64(1), int64(2), int64(3), int64(4), int64(5), int64(6), int64(-1e15), int64(1e15), true}
	for step := 0; ; step++ {
		select {
		case <-done:
			return
		case <-time.After(time.Duration(2+rng.IntN(15)) * time.Millisecond):
		}
		if step == conflictAt {
			r.conflict(rng)
			continue
		}
		db := r.c.dbs[r.c.ids[rng.IntN(len(r.c.ids))]]
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
		_, _ = db.Exec(bg, []d1client.Statement{{SQL: checkMarker + sql, Params: ps}})
	}
}

// conflict writes, in a database holding a ring, a ring of the same epoch
// with another content; makes replica 1 read the rings (it must refuse
// them); and puts the row back unless the operator has recorded a newer
// ring there meanwhile.
func (r *shardRun) conflict(rng *rand.Rand) {
	var db *d1client.Client
	var res *d1client.Result
	for _, i := range rng.Perm(len(r.c.ids)) {
		db = r.c.dbs[r.c.ids[i]]
		var err error
		res, err = db.Query(bg, checkMarker+"SELECT generation, fingerprint, response_body FROM idempotency_keys WHERE principal = '' AND key = 'd1idem:ring'")
		if err != nil {
			r.t.Error(err)
			return
		}
		if len(res.Rows) == 1 {
			break
		}
	}
	var saved ringRow
	if err := res.Rows[0].Scan(&saved.gen, &saved.fp, &saved.body); err != nil {
		r.t.Error(err)
		return
	}
	var ring struct {
		Version  int64          `json:"version"`
		Phase    idem.RingPhase `json:"phase"`
		Homes    []string       `json:"homes"`
		Previous []string       `json:"previous"`
	}
	if err := json.Unmarshal([]byte(saved.body), &ring); err != nil {
		r.t.Error(err)
		return
	}
	other := forged(idem.Ring{Version: ring.Version, Phase: ring.Phase, Homes: append(ring.Homes, "zz-elsewhere"), Previous: ring.Previous})
	res, err := db.Query(bg, checkMarker+"UPDATE idempotency_keys SET fingerprint = ?, response_body = ? WHERE principal = '' AND key = 'd1idem:ring' AND generation = ? AND fingerprint = ?",
		other.fp, other.body, saved.gen, saved.fp)
	if err != nil || res.Meta.Changes != 1 {
		return
	}
	r.conflicts.Add(1)
	// A replica reading the rings now refuses them, unless a fault hides
	// the database or the operator has recorded a newer ring there.
	for try := 0; ; try++ {
		_, err := r.ledgers[1].RefreshRing(bg)
		if errors.Is(err, idem.ErrRingConflict) {
			break
		}
		now, qerr := db.Query(bg, checkMarker+"SELECT count(*) FROM idempotency_keys WHERE principal = '' AND key = 'd1idem:ring' AND fingerprint = ?", other.fp)
		var still int64
		if qerr == nil {
			_ = now.Rows[0].Scan(&still)
		}
		if still == 0 {
			break
		}
		if try == 20 {
			r.t.Errorf("a replica reading a conflicting ring: %v, want ErrRingConflict", err)
			break
		}
	}
	time.Sleep(time.Duration(50+rng.IntN(200)) * time.Millisecond) // the conflict lasts a while
	if _, err := db.Query(bg, checkMarker+"UPDATE idempotency_keys SET fingerprint = ?, response_body = ? WHERE principal = '' AND key = 'd1idem:ring' AND generation = ? AND fingerprint = ?",
		saved.fp, saved.body, saved.gen, other.fp); err != nil {
		r.t.Error(err)
	}
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

// checkReserved verifies that every database's rows of the empty
// principal are the operator's: completed, never swept, the ring and the
// identity readable and consistent.
func (r *shardRun) checkReserved() []string {
	var out []string
	for _, id := range r.c.ids {
		res, err := r.c.dbs[id].Query(bg, checkMarker+"SELECT key, status, updated_at, fingerprint FROM idempotency_keys WHERE principal = ''")
		if err != nil {
			r.t.Fatal(err)
		}
		for _, row := range res.Rows {
			var key, status, fp string
			var updated int64
			_ = row.Scan(&key, &status, &updated, &fp)
			switch {
			case key != "d1idem:ring" && key != "d1idem:home":
				out = append(out, fmt.Sprintf("%s: a row (%q, %q) of the empty principal", id, "", key))
			case status != "completed" || updated != 253402300799999:
				out = append(out, fmt.Sprintf("%s: the %s row is %s, updated at %d", id, key, status, updated))
			case key == "d1idem:home" && fp != id:
				out = append(out, fmt.Sprintf("%s: its identity says %s", id, fp))
			}
		}
	}
	st, err := r.op.Admin().RingStatus(bg)
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
		if plan.adversary {
			violations = append(violations, r.checkReserved()...)
		}
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
	if plan.adversary {
		t.Logf("adversary: %d forged statements, %d conflicting rings written, %d refusals of the rings by the replicas", r.forgeries.Load(), r.conflicts.Load(), r.refusals.Load())
		if n := r.wrongServed.Load(); n > 0 {
			violations = append(violations, fmt.Sprintf("the replica given one database under two home IDs served %d requests", n))
		}
		if r.conflicts.Load() > 0 && r.refusals.Load() == 0 {
			violations = append(violations, "conflicting rings were written and no replica refused them")
		}
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
	plan := shardPlan{replicas: 4, clients: 12, keys: 120, principals: 24, dupRate: 0.3, adversary: true}
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
	plan := shardPlan{replicas: 3, clients: 6, keys: 36, principals: 12, dupRate: 0.3, adversary: true}
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

// The adversary's checks are not vacuous: a ring row made pending, or an
// identity row naming another home, is reported; and the replica given one
// database under two home IDs refuses every request.
func TestShardCheckerCatchesForgedRows(t *testing.T) {
	b := d1test.Local(t)
	r := newShardRun(t, b, 1, shardPlan{replicas: 1, principals: 1, adversary: true})
	if v := r.checkReserved(); len(v) > 0 {
		t.Fatalf("violations before any forgery: %v", v)
	}
	r.sendWrong(bg, "acct-0", "k")
	if n := r.wrongServed.Load(); n != 0 {
		t.Errorf("the replica given one database under two home IDs served %d requests", n)
	}
	db0, db1 := r.c.dbs[r.c.ids[0]], r.c.dbs[r.c.ids[1]]
	if _, err := db0.Query(bg, "UPDATE idempotency_keys SET status = 'pending' WHERE principal = '' AND key = 'd1idem:ring'"); err != nil {
		t.Fatal(err)
	}
	if _, err := db1.Query(bg, "UPDATE idempotency_keys SET fingerprint = 'elsewhere' WHERE principal = '' AND key = 'd1idem:home'"); err != nil {
		t.Fatal(err)
	}
	v := strings.Join(r.checkReserved(), "\n")
	for _, want := range []string{"the d1idem:ring row is pending", "its identity says elsewhere"} {
		if !strings.Contains(v, want) {
			t.Errorf("the checker missed %q; it found:\n%s", want, v)
		}
	}
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
