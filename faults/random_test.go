package faults

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1client/budget"
	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/idem/idemhttp"
)

var (
	flagSeed     = flag.Int64("faults.seed", 0, "seed of the randomized run (0: $FAULTS_SEED, else the time)")
	flagLong     = flag.Bool("faults.long", false, "also run the long randomized runs (d1local and the bridge)")
	flagClients  = flag.Int("faults.clients", 0, "clients (N) of a long run; 0 keeps its default")
	flagKeys     = flag.Int("faults.keys", 0, "keys per client per round (M) of a long run; 0 keeps its default")
	flagDuration = flag.Duration("faults.duration", 0, "duration of a long run; 0 keeps its default (10m)")
)

// runConfig sizes one randomized run.
type runConfig struct {
	Seed     int64
	Clients  int           // N concurrent clients
	Keys     int           // M keys per client per round
	Duration time.Duration // rounds of fresh keys are started until it has passed; 0: one round
	TTL      time.Duration
	// NoFaults turns the random D1 faults off (the handler's plans still
	// apply).
	NoFaults bool
	// Direct makes the handler write its business row with its own D1 call
	// instead of through idemhttp.Tx: the spec's non-transactional completion,
	// the broken variant the checks must catch.
	Direct bool
	// OnBridge runs against the bridge in workerd instead of d1local.
	OnBridge bool

	// The model's further paths (the short, long and bridge runs take them
	// all, see withAll):
	//
	// Operator: an operator releases keys through the admin API, with and
	// without Force (pending keys, stuck keys, completed keys), and sweeps,
	// while completions piggyback sweeps too; rows aged past the retention
	// are planted for the sweeps to find.
	Operator bool
	// Side: callers that share the instances' D1 clients send echo reads,
	// writes and multi-statement SQL, coalesced with the ledger's traffic.
	Side bool
	// Starved: a third instance whose D1 client has a tiny request budget
	// and meets 971 blocks, so completions find the client blocked between
	// the two round trips (the budget itself keeps a call for them).
	Starved bool
	// Steady: a fourth instance under steady open-loop load, on a budget
	// paced as Cloudflare's default whose window fills within the run,
	// with handlers of half the TTL and heartbeats: no completion of it may
	// be starved of budget (its calls meet no random fault).
	Steady bool
	// TwoKeys: some requests carry two Idempotency-Key fields (every key
	// sends one with AllTwoKeys).
	TwoKeys, AllTwoKeys bool
	// Slow makes every execution take 3/4 of a TTL.
	Slow bool

	// Modes, if set, are the only ways a key's first execution answers (the
	// later ones answer plainly).
	Modes []string
	// Latin1 gives every 201's Location a byte that is not UTF-8 (otherwise
	// some of them).
	Latin1 bool
	// SideFaults injects, with the random faults off, a 500 after the
	// commit on every other call carrying only side writes.
	SideFaults bool
	// Mutant names a bug put back in for the run (see mutants_test.go); ""
	// for none.
	Mutant string
}

// withAll turns every further path of the model on.
func (c runConfig) withAll() runConfig {
	c.Operator, c.Side, c.Starved, c.Steady, c.TwoKeys = true, true, true, true, true
	return c
}

// maxLease is every ledger's MaxLease in a run, and retention the shortest
// Retention that validation accepts with it.
func (c runConfig) maxLease() time.Duration  { return 3 * c.TTL }
func (c runConfig) retention() time.Duration { return c.maxLease() + c.TTL + idem.RetentionMargin }

// ledgerConfig is the configuration of every ledger of a run.
func (c runConfig) ledgerConfig(heartbeat time.Duration) idem.Config {
	return idem.Config{TTL: c.TTL, Heartbeat: heartbeat, SweepInterval: 500 * time.Millisecond,
		MaxLease: c.maxLease(), Retention: c.retention()}
}

// seed returns the seed to use: -faults.seed, else $FAULTS_SEED, else the
// time.
func seed(t testing.TB) int64 {
	if *flagSeed != 0 {
		return *flagSeed
	}
	if s := os.Getenv("FAULTS_SEED"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatalf("FAULTS_SEED=%q: %v", s, err)
		}
		return n
	}
	return time.Now().UnixNano() % 1_000_000_000
}

// rngFor derives a generator from the seed and a label, so every decision
// of the plan is a pure function of (seed, what it decides).
func rngFor(seed int64, label ...any) *rand.Rand {
	h := fnv.New64a()
	fmt.Fprint(h, label...)
	return rand.New(rand.NewPCG(uint64(seed), h.Sum64()))
}

// keyPlan is what one client does with one key.
type keyPlan struct {
	Client   int
	Key      pk
	Body     string
	Invalid  bool // the handler answers 422 (stored and replayed, no business write)
	Abandon  bool // the client sends once and never retries
	Dup      bool // a concurrent duplicate is sent too
	DupDelay time.Duration
	// DupAfterClaim counts DupDelay from the key's claim, not the start.
	DupAfterClaim bool
	Replays       int
	FirstInst     string // instance of the first attempt ("" random)
	Patient       bool   // the first attempt waits out even a slow owner
	TwoKeys       bool   // a request with two Idempotency-Key fields goes first
	rng           *rand.Rand
	dupRng        *rand.Rand
	forcedExec    *execPlan // the first execution's plan, when forced
}

// The ways an execution answers (execPlan.Mode). Each queues its business
// write on idemhttp.Tx first, except lateAdd.
const (
	modePlain   = "plain"    // writes its 201 and returns
	modeFlush   = "flush"    // flushes half-way through its 201: held until the Tx commits
	modeHijack  = "hijack"   // tries to hijack the connection: refused, so it answers normally
	modeLateAdd = "late_add" // flushes first (the response streams), then queues: Add fails, the response is aborted
)

// execPlan is what one execution of the handler does.
type execPlan struct {
	Delay time.Duration
	// Outlive makes the execution work until its key is taken over (at
	// most 15 s), instead of for Delay: the slow owner of a takeover,
	// however fast the machine.
	Outlive bool
	Panic   string // "", "early" (before queueing the write) or "late" (after)
	Mode    string
	Latin1  bool // the Location of its 201 holds a byte that is not UTF-8
}

func (p execPlan) String() string {
	s := p.Delay.Round(time.Millisecond).String()
	if p.Outlive {
		s = "until_taken_over"
	}
	if p.Panic != "" {
		s += "+panic_" + p.Panic
	}
	if p.Mode != modePlain {
		s += "+" + p.Mode
	}
	if p.Latin1 {
		s += "+latin1"
	}
	return s
}

// latin1Suffix ends the Location of a Latin1 execution: "café" with é as
// the byte 0xE9, which is not UTF-8 (stored and replayed as U+FFFD).
const latin1Suffix = "/caf\xe9"

// randomRun is one randomized run in progress.
type randomRun struct {
	t     *testing.T
	cfg   runConfig
	w     *world
	start time.Time
	insts map[string]*stack

	mu                 sync.Mutex
	plans              map[pk]*keyPlan
	keys               []pk
	execN              map[pk]int
	requests           []reqRec
	execs              []execRec
	ops                []opRec   // the operator's actions
	side               []sideRec // the side callers' calls
	last971            time.Time
	lastC971           time.Time
	inflight           atomic.Int64
	starvedClaims      atomic.Int64 // claim calls of the starved instance
	starvedCompletions atomic.Int64 // its completion calls
	steadyMaxRTT       atomic.Int64 // the steady instance's longest smoothed round trip, in ns
	monitored          atomic.Int64 // violations seen by the monitor during the run
	fencedOut          atomic.Bool  // a completion was fenced out (see fencedOutSeen)
}

const (
	instNoHeartbeat = "A" // heartbeats off: slow handlers are taken over
	instHeartbeat   = "B" // heartbeats on: slow handlers keep their key
	instStarved     = "C" // heartbeats off, a tiny D1 budget and 971 blocks
	instSteady      = "D" // heartbeats on, steady load on a budget whose window fills
)

// The starved instance's D1 budget: one call in 4 s for claims, and the
// one d1client keeps of every window for completions, so that a completion
// never finds the budget empty: it is starved by a 971 instead.
var starvedBudget = budget.New(2, 4*time.Second)

// The steady instance's budget, its load and its handlers: Cloudflare's
// pace (4 calls a second) in a window of 5 s, which 10 requests a second
// fill within the short run, handlers of half the TTL. Claims can wait 10 s
// for a call (the middleware's Timeout), completions about 2 s: once the
// window is full, only the debt the budget keeps for admitted claims saves
// their completions.
var (
	steadyBudget = budget.New(20, 5*time.Second)
	steadyRate   = 10.0
)

// steadyClient is the client number of the steady load's keys.
const steadyClient = -2

// runRandomized runs the workload and returns its observations.
func runRandomized(t *testing.T, cfg runConfig) (*observations, *randomRun) {
	t.Helper()
	w := newWorldFor(t, cfg.OnBridge)
	run := &randomRun{t: t, cfg: cfg, w: w, plans: map[pk]*keyPlan{}, execN: map[pk]int{}, insts: map[string]*stack{}}
	// The retention is the shortest validation accepts.
	short := cfg.ledgerConfig(-1)
	short.Retention -= time.Millisecond
	if _, err := idem.New(w.admin, short); err == nil {
		t.Fatalf("validation accepted Retention %v with MaxLease %v and TTL %v", short.Retention, short.MaxLease, short.TTL)
	}
	names := []string{instNoHeartbeat, instHeartbeat}
	if cfg.Starved {
		names = append(names, instStarved)
	}
	if cfg.Steady {
		names = append(names, instSteady)
	}
	for _, name := range names {
		hb := time.Duration(-1)
		if name == instHeartbeat || name == instSteady {
			hb = cfg.TTL / 3
		}
		sp := stackSpec{cfg: cfg.ledgerConfig(hb), outer: run.outer, inner: run.inner,
			mk: func(db *d1client.Client) http.Handler { return &randHandler{run: run, inst: name, db: db} }}
		switch name {
		case instStarved:
			sp.mods = append(sp.mods, func(c *d1client.Config) { c.Budget, c.AccountID = starvedBudget, starvedAccount })
		case instSteady:
			sp.mods = append(sp.mods, func(c *d1client.Config) { c.Budget, c.AccountID = steadyBudget, steadyAccount })
		}
		if cfg.Mutant == mutantMultiStatementSent {
			sp.mods = append(sp.mods, w.splittingTransport)
		}
		run.insts[name] = w.newStackSpec(sp)
	}
	if cfg.Operator {
		run.plantAgedRows()
	}
	run.start = time.Now()
	run.lastC971 = run.start // the starved instance's first claims meet its budget, not a 971
	// D1's time of the run's start: d1local reads this process's clock; the
	// bridge's is measured, within half the best round trip.
	d1Start, skew := run.start.UnixMilli(), int64(0)
	if cfg.OnBridge {
		d1Start, skew = w.d1Offset(run.start)
	}
	switch {
	case cfg.SideFaults:
		w.setPolicy(sideWriteFaults())
	case !cfg.NoFaults:
		w.setPolicy(run.fault)
	}
	stopMonitor := run.monitor()
	stopExtras := run.startExtras()

	var wg sync.WaitGroup
	if cfg.Starved {
		wg.Add(1)
		go func() { defer wg.Done(); run.doOp(run.plan(0, -1, 0)) }()
	}
	deadline := run.start.Add(cfg.Duration)
	clientsDone := make(chan struct{})
	if cfg.Steady {
		wg.Add(1)
		go func() { defer wg.Done(); run.steadyLoad(deadline, clientsDone) }()
	}
	var clients sync.WaitGroup
	for c := 0; c < cfg.Clients; c++ {
		clients.Add(1)
		go func() {
			defer clients.Done()
			for round := 0; round == 0 || time.Now().Before(deadline); round++ {
				for j := 0; j < cfg.Keys; j++ {
					run.doOp(run.plan(round, c, j))
				}
			}
		}()
	}
	clients.Wait()
	close(clientsDone)
	wg.Wait()
	stopExtras()
	// Let every abandoned handler and its completion finish.
	until(t, 30*time.Second, 20*time.Millisecond, "the servers to go idle", func() bool { return run.inflight.Load() == 0 })
	w.setPolicy(nil)
	stopMonitor()

	o := &observations{Seed: cfg.Seed, Abandoned: map[pk]bool{}, Start: d1Start, Skew: skew, Transactional: !cfg.Direct,
		Window: cfg.retention().Milliseconds(), Retention: cfg.retention().Milliseconds()}
	run.mu.Lock()
	o.Keys = append(o.Keys, run.keys...)
	for k, p := range run.plans {
		if p.Abandon {
			o.Abandoned[k] = true
		}
	}
	o.Requests = append(o.Requests, run.requests...)
	o.Execs = append(o.Execs, run.execs...)
	o.Ops = append(o.Ops, run.ops...)
	o.Side = append(o.Side, run.side...)
	run.mu.Unlock()
	o.Rows = w.rows()
	o.Business = w.business()
	o.Completions = w.completions()
	o.Events = w.events()
	o.SideRows = w.sideWrites()
	o.Faulted, o.MultiSQL = w.sideSnapshot()
	for _, s := range run.insts {
		s.logs.mu.Lock()
		o.Logs = append(o.Logs, s.logs.recs...)
		s.logs.mu.Unlock()
	}
	return o, run
}

// steadyLoad sends the steady instance a fresh key every 1/steadyRate s,
// whatever the answers, until the run's deadline has passed and the
// clients are done (the short run: until they are), each once: an
// open-loop client that does not retry.
func (run *randomRun) steadyLoad(deadline time.Time, clientsDone <-chan struct{}) {
	var wg sync.WaitGroup
	defer wg.Wait()
	tick := time.NewTicker(time.Duration(float64(time.Second) / steadyRate))
	defer tick.Stop()
	for j := 0; ; j++ {
		select {
		case <-clientsDone:
			if !time.Now().Before(deadline) {
				return
			}
		default:
		}
		p := run.plan(0, steadyClient, j)
		wg.Go(func() { run.doOp(p) })
		<-tick.C
		if rtt := int64(run.insts[instSteady].db.Account().RoundTrip()); rtt > run.steadyMaxRTT.Load() {
			run.steadyMaxRTT.Store(rtt)
		}
	}
}

// d1Offset returns D1's clock at the local time at, and its uncertainty in
// ms: the read with the shortest round trip of three, taken at its
// midpoint.
func (w *world) d1Offset(at time.Time) (ms, skew int64) {
	w.t.Helper()
	best := time.Duration(1 << 62)
	for i := 0; i < 3; i++ {
		t0 := time.Now()
		d := w.d1Now()
		rt := time.Since(t0)
		if rt < best {
			mid := t0.Add(rt / 2)
			best, ms = rt, d-mid.Sub(at).Milliseconds()
		}
	}
	return ms, best.Milliseconds()/2 + 1
}

// monitor checks the audit for violations while the run goes on: a
// completed row changed, or a row deleted inside the retention.
func (run *randomRun) monitor() (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-done:
				return
			case <-time.After(300 * time.Millisecond):
			}
			ctx, cancel := context.WithTimeout(bg, 5*time.Second)
			res, err := run.w.admin.Exec(ctx, []d1client.Statement{{SQL: adminMark + `SELECT count(*) FROM audit_events
WHERE kind = 'completed_row_updated' OR (kind IN ('completed_row_deleted', 'pending_row_deleted') AND at - extra < ?)`,
				Params: []any{run.cfg.retention().Milliseconds()}}})
			cancel()
			if err == nil {
				n, _ := res[0].Rows[0][0].Int64()
				run.monitored.Store(n)
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}

// plan makes (once) the plan of client c's j-th key of a round. Client -1
// is the starved instance's: one key, in round 0.
func (run *randomRun) plan(round, c, j int) *keyPlan {
	k := pk{fmt.Sprintf("acct%d", (c+4)%4), fmt.Sprintf("r%d-c%02d-k%02d", round, c, j)}
	if c == steadyClient {
		k.K = fmt.Sprintf("steady-k%05d", j)
	}
	rng := rngFor(run.cfg.Seed, "key", k.P, k.K)
	p := &keyPlan{Client: c, Key: k, rng: rng, dupRng: rngFor(run.cfg.Seed, "dup", k.P, k.K)}
	p.Body = fmt.Sprintf(`{"sku":"s%d","qty":%d}`, rng.IntN(1000), 1+rng.IntN(9))
	p.Invalid = rng.Float64() < 0.08
	p.Abandon = rng.Float64() < 0.06
	p.Dup = rng.Float64() < 0.15
	p.DupDelay = time.Duration(rng.IntN(60)) * time.Millisecond
	p.Replays = rng.IntN(3)
	p.TwoKeys = run.cfg.TwoKeys && (rng.Float64() < 0.04 || run.cfg.AllTwoKeys)
	// Forced plans make the run's coverage certain, whatever the seed: in
	// round 0, three slow first executions on the heartbeat-less instance
	// (takeovers and fenced-out completions; one of them with a client that
	// waits for it), a late and an early panic, and one execution of each
	// way of answering.
	if round == 0 && j == 0 {
		forced := func(e execPlan) {
			p.Invalid, p.Abandon = false, false
			if e.Mode == "" {
				e.Mode = run.defaultMode()
			}
			p.forcedExec = &e
		}
		switch c {
		case 0, 1, 2:
			forced(execPlan{Outlive: true})
			p.FirstInst = instNoHeartbeat
			if c == 0 {
				// The client waits for the slow owner while a duplicate,
				// sent 1.5 TTL after the claim, takes the key over: the
				// old owner's answer reaches it.
				p.Patient, p.Dup, p.DupAfterClaim, p.DupDelay = true, true, true, run.cfg.TTL*3/2
			}
		case 3:
			forced(execPlan{Panic: "late"})
		case 4:
			forced(execPlan{Panic: "early"})
		case 5, 6, 7, 8:
			if run.cfg.Modes == nil && !run.cfg.Direct {
				forced([]execPlan{{Mode: modeFlush}, {Mode: modeHijack}, {Mode: modeLateAdd}, {Mode: modePlain, Latin1: true}}[c-5])
				p.FirstInst = instNoHeartbeat
			}
		case 9:
			p.TwoKeys = run.cfg.TwoKeys
		}
	} else if (c == 1 || c == 2) && !run.fencedOutSeen() {
		// Until a completion has been fenced out (a loaded machine can
		// make the forced ones of round 0 miss their completion's
		// deadline), each further key of clients 1 and 2 is another slow
		// owner on the heartbeat-less instance.
		p.Invalid, p.Abandon, p.Dup, p.TwoKeys = false, false, false, false
		p.forcedExec = &execPlan{Outlive: true, Mode: run.defaultMode()}
		p.FirstInst = instNoHeartbeat
	}
	if c == steadyClient {
		// Sent once, whatever the answer, to the steady instance, patient;
		// its handler takes half the TTL.
		p.Invalid, p.Dup, p.TwoKeys, p.Replays = false, false, false, 0
		p.Abandon, p.Patient, p.FirstInst = true, true, instSteady
		p.forcedExec = &execPlan{Delay: run.cfg.TTL / 2, Mode: modePlain}
	} else if c < 0 {
		// The starved instance's first claim takes its one call (this one,
		// or another made at the same moment, which then waits for the
		// next): its completion meets a 971 (see fault).
		p.Invalid, p.Abandon, p.Dup, p.TwoKeys = false, false, false, false
		p.forcedExec = &execPlan{Mode: run.defaultMode()}
		p.FirstInst, p.Patient = instStarved, true
	}
	run.mu.Lock()
	run.plans[k] = p
	run.keys = append(run.keys, k)
	run.mu.Unlock()
	return p
}

// fencedOutSeen reports whether any instance has logged a fenced-out
// completion yet.
func (run *randomRun) fencedOutSeen() bool {
	if run.fencedOut.Load() {
		return true
	}
	for _, st := range run.insts {
		if len(st.logs.find("fenced out")) > 0 {
			run.fencedOut.Store(true)
			return true
		}
	}
	return false
}

// defaultMode is the mode of a forced plan: the only mode when Modes has
// one, else modePlain.
func (run *randomRun) defaultMode() string {
	if len(run.cfg.Modes) == 1 {
		return run.cfg.Modes[0]
	}
	return modePlain
}

// execPlanFor decides what the n-th execution of a key does.
func (run *randomRun) execPlanFor(k pk, n int) execPlan {
	run.mu.Lock()
	p := run.plans[k]
	run.mu.Unlock()
	if n == 1 && p != nil && p.forcedExec != nil {
		return *p.forcedExec
	}
	rng := rngFor(run.cfg.Seed, "exec", k.P, k.K, n)
	var e execPlan
	switch u := rng.Float64(); {
	case u < 0.70:
		e.Delay = time.Duration(rng.IntN(20)) * time.Millisecond
	case u < 0.90:
		e.Delay = time.Duration(20+rng.IntN(130)) * time.Millisecond
	default: // beyond the TTL
		e.Delay = run.cfg.TTL*13/10 + time.Duration(rng.Int64N(int64(run.cfg.TTL)))
	}
	switch u := rng.Float64(); {
	case u < 0.025:
		e.Panic = "early"
	case u < 0.05:
		e.Panic = "late"
	}
	switch u := rng.Float64(); {
	case run.cfg.Direct:
		e.Mode = modePlain
	case run.cfg.Modes != nil && n == 1:
		e.Mode = run.cfg.Modes[rng.IntN(len(run.cfg.Modes))]
	case run.cfg.Modes != nil:
		e.Mode = modePlain
	case u < 0.10:
		e.Mode = modeFlush
	case u < 0.18:
		e.Mode = modeHijack
	case u < 0.23:
		e.Mode = modeLateAdd
	default:
		e.Mode = modePlain
	}
	e.Latin1 = run.cfg.Latin1 || rng.Float64() < 0.15
	if run.cfg.Slow {
		e.Delay = run.cfg.TTL * 3 / 4
	}
	return e
}

// doOp drives one key: the client's attempts until a final answer (unless
// it abandons), a concurrent duplicate if planned, and replay checks. Like
// a real client, it doubles its timeout (up to 16 times) after each attempt
// that timed out, so a loaded machine slows the run down instead of
// starving every attempt.
func (run *randomRun) doOp(p *keyPlan) {
	if p.TwoKeys {
		run.send(p, "twokeys", 1, p.rng, 1)
	}
	var wg sync.WaitGroup
	if p.Dup {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for end := time.Now().Add(30 * time.Second); p.DupAfterClaim && run.generationOf(p.Key) == 0 && time.Now().Before(end); {
				time.Sleep(10 * time.Millisecond)
			}
			time.Sleep(p.DupDelay)
			run.send(p, "dup", 1, p.dupRng, 1)
		}()
	}
	scale := 1
	next := func(r reqRec) {
		if strings.Contains(r.Err, "deadline exceeded") {
			scale = min(2*scale, 16)
		}
	}
	opDeadline := time.Now().Add(60 * time.Second)
	settled := false
	for attempt := 1; time.Now().Before(opDeadline); attempt++ {
		r := run.send(p, "op", attempt, p.rng, scale)
		if r.final() {
			settled = true
			break
		}
		if p.Abandon {
			break
		}
		next(r)
		run.backoff(r, p.rng)
	}
	for i := 0; settled && i < p.Replays; i++ {
		time.Sleep(time.Duration(p.rng.IntN(150)) * time.Millisecond)
		for attempt := 1; time.Now().Before(opDeadline.Add(30 * time.Second)); attempt++ {
			r := run.send(p, "replay", attempt, p.rng, scale)
			if r.final() {
				break
			}
			next(r)
			run.backoff(r, p.rng)
		}
	}
	wg.Wait()
}

func (run *randomRun) backoff(r reqRec, rng *rand.Rand) {
	d := 50 + rng.IntN(100)
	if r.Status == http.StatusConflict {
		d = 80 + rng.IntN(120)
	}
	time.Sleep(time.Duration(d) * time.Millisecond)
}

// send makes one request, with a client timeout of scale times 2 TTLs +
// 300 ms (a handler slower than that is given up on and retried, as a real
// client would); duplicates wait longer. Role "twokeys" sends the key
// twice, as k and k~2, in two Idempotency-Key fields.
func (run *randomRun) send(p *keyPlan, role string, attempt int, rng *rand.Rand, scale int) reqRec {
	inst := instNoHeartbeat
	switch n := rng.IntN(40); {
	case n == 39 && run.cfg.Starved:
		inst = instStarved // rarely: its claims wait up to 4 s for its budget
	case n%2 == 1:
		inst = instHeartbeat
	}
	if role == "op" && attempt == 1 && p.FirstInst != "" {
		inst = p.FirstInst
	}
	timeout := time.Duration(scale) * (run.cfg.TTL*2 + 300*time.Millisecond)
	if role == "dup" || role == "op" && attempt == 1 && p.Patient {
		// Duplicates are patient: they wait out even a slow owner, so
		// answers of superseded owners reach some client.
		timeout = 30 * time.Second
	}
	ctx, cancel := context.WithTimeout(bg, timeout)
	defer cancel()
	keys := []string{p.Key.K}
	if role == "twokeys" {
		keys = append(keys, p.Key.K+"~2")
	}
	a := postKeys(ctx, run.insts[inst].srv.URL, p.Key.P, keys, p.Body)
	r := reqRec{Client: p.Client, Key: p.Key, Role: role, Attempt: attempt, Instance: inst,
		Start: a.Start.Sub(run.start), End: a.End.Sub(run.start), Status: a.Status, Body: a.Body}
	if a.Err != nil {
		r.Err = a.Err.Error()
		r.Status, r.Body = 0, ""
	} else {
		r.Replayed = a.replayed()
		r.Code = a.code()
		r.CT, r.Loc = a.Header.Get("Content-Type"), a.Header.Get("Location")
	}
	run.mu.Lock()
	run.requests = append(run.requests, r)
	run.mu.Unlock()
	return r
}

// warmUpCalls are the first D1 calls of a run, which are never faulted.
const warmUpCalls = 30

// requiredFaults are the faults the run must inject on both round trips;
// the policy forces any still missing once the run is under way.
var requiredFaults = []d1local.Fault{
	{LoseResponse: true},
	{Internal: true}, {Internal: true, AfterCommit: true},
	{Overloaded: true}, {Overloaded: true, AfterCommit: true},
	{BadGateway: true}, {BadGateway: true, AfterCommit: true},
	{RateLimit: true, RetryAfter: time.Second},
	{Latency: 30 * time.Millisecond},
}

// fault is the run's D1 fault policy: no fault on the first warmUpCalls
// calls, then a pure function of (seed, call number) except for a little
// state: a 971 (which blocks the instance's client for a second) is not
// repeated within 3 s, and a required fault not yet seen on a round trip is
// forced on one of its calls. The starved instance's claims also meet a
// 971 every 2.5 s, so its completions in flight find its client blocked.
func (run *randomRun) fault(req d1local.Request, c calls) d1local.Fault {
	rt := c.roundTrip()
	if rt == "other" {
		return d1local.Fault{} // the broken variant's direct business writes
	}
	if req.AccountID == steadyAccount {
		return d1local.Fault{} // the budget is what the steady instance meets
	}
	starved := req.AccountID == starvedAccount
	if starved && (c.complete || c.guard) && run.starvedCompletions.Add(1) == 1 {
		// The budget lets a completion through (it keeps a call for
		// completions): the first meets the account's 971, in the opening
		// burst too, since the starved instance's calls are its own.
		return d1local.Fault{RateLimit: true, RetryAfter: 1500 * time.Millisecond}
	}
	if req.Seq <= warmUpCalls {
		// The opening burst of claims travels in one or two coalesced
		// calls; a fault there would defeat the forced plans of every
		// client at once.
		return d1local.Fault{}
	}
	if starved && c.claim && run.starvedClaims.Add(1) == 1 {
		return d1local.Fault{} // the forced plan's claim, whose completion must starve
	}
	if starved && c.claim && run.mayC971() {
		return d1local.Fault{RateLimit: true, RetryAfter: 1500 * time.Millisecond}
	}
	if !starved && (rt == "claim" || rt == "completion") && req.Seq > 60 && req.Seq%5 == 0 {
		if f, ok := run.requiredFault(rt); ok {
			return f
		}
	}
	return run.randomFault(req.Seq, rt, starved)
}

// requiredFault is the first required fault not yet seen on round trip rt,
// if there is one that may be injected now.
func (run *randomRun) requiredFault(rt string) (d1local.Fault, bool) {
	for _, f := range requiredFaults {
		if run.w.injectedAt(faultName(f)+"@"+rt) == 0 && (!f.RateLimit || run.may971()) {
			return f, true
		}
	}
	return d1local.Fault{}, false
}

// randomFault is the random part of the policy for call number seq on
// round trip rt: a pure function of (seed, seq), but for the spacing of
// 971s.
func (run *randomRun) randomFault(seq int64, rt string, starved bool) d1local.Fault {
	rng := rngFor(run.cfg.Seed, "fault", seq)
	var f d1local.Fault
	switch u := rng.Float64(); {
	case u < 0.06:
		f.Latency = time.Duration(5+rng.IntN(55)) * time.Millisecond
	case u < 0.11:
		f.LoseResponse = true
	case u < 0.135:
		f.Internal = true
	case u < 0.16:
		f.Internal, f.AfterCommit = true, true
	case u < 0.175:
		f.Overloaded = true
	case u < 0.19:
		f.Overloaded, f.AfterCommit = true, true
	case u < 0.21:
		f.BadGateway = true
	case u < 0.23:
		f.BadGateway, f.AfterCommit = true, true
	case u < 0.235:
		// A 971 blocks the instance's client, so they are spaced out; keep
		// the room for the round trips that still need one.
		if !starved && run.random971Allowed(rt) && run.may971() {
			f.RateLimit, f.RetryAfter = true, time.Second
		}
	}
	if !f.IsZero() && f.Latency == 0 && rng.Float64() < 0.3 {
		f.Latency = time.Duration(5+rng.IntN(40)) * time.Millisecond
	}
	return f
}

// random971Allowed reports whether the random policy may spend the 971
// window on round trip rt: only on a required round trip, and, while one of
// them still lacks its 971, only on that one.
func (run *randomRun) random971Allowed(rt string) bool {
	if rt != "claim" && rt != "completion" {
		return false
	}
	name := faultName(d1local.Fault{RateLimit: true})
	missing := func(site string) bool { return run.w.injectedAt(name+"@"+site) == 0 }
	if missing("claim") || missing("completion") {
		return missing(rt)
	}
	return true
}

// may971 reports (and records) whether a 971 may be injected now.
func (run *randomRun) may971() bool {
	run.mu.Lock()
	defer run.mu.Unlock()
	if time.Since(run.last971) < 3*time.Second {
		return false
	}
	run.last971 = time.Now()
	return true
}

// mayC971 is may971 for the starved instance.
func (run *randomRun) mayC971() bool {
	run.mu.Lock()
	defer run.mu.Unlock()
	if time.Since(run.lastC971) < 2500*time.Millisecond {
		return false
	}
	run.lastC971 = time.Now()
	return true
}

// randHandler is the randomized run's handler: it follows the execution's
// plan (delay, panic, way of answering), commits one business row through
// idemhttp.Tx (or, in the Direct variant, with its own D1 call), and answers 201
// naming this execution; for an invalid key it answers 422 with no write.
type randHandler struct {
	run  *randomRun
	inst string
	db   *d1client.Client
}

func (h *randHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	run := h.run
	principal, _ := bearer(r)
	k := pk{principal, r.Header.Get(idemhttp.HeaderKey)}
	run.mu.Lock()
	run.execN[k]++
	n := run.execN[k]
	invalid := run.plans[k] != nil && run.plans[k].Invalid
	run.mu.Unlock()
	plan := run.execPlanFor(k, n)
	exec := fmt.Sprintf("%s#%d%s", k.K, n, h.inst)
	rec := execRec{Key: k, Exec: exec, Instance: h.inst, Start: time.Since(run.start), Plan: plan.String()}
	defer func() {
		rec.End = time.Since(run.start)
		if v := recover(); v != nil {
			if rec.Outcome == "" {
				rec.Outcome = "panic"
			}
			run.recordExec(rec)
			panic(v)
		}
		run.recordExec(rec)
	}()
	body, _ := io.ReadAll(r.Body)
	if invalid {
		rec.Outcome = "422"
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnprocessableEntity)
		fmt.Fprintf(w, `{"error":"invalid_order","exec":%q}`, exec)
		return
	}
	if plan.Panic == "early" {
		panic(http.ErrAbortHandler)
	}
	insert := d1client.Statement{SQL: `INSERT INTO business (principal, key, exec_id, at) VALUES (?, ?, ?, ?)`,
		Params: []any{k.P, k.K, exec, time.Now().UnixMilli()}}
	suffix := ""
	if plan.Latin1 {
		suffix = latin1Suffix
	}
	created := createdBody(exec, k.K, string(body))
	tx, _ := idemhttp.TxFromContext(r.Context())
	if plan.Mode == modeLateAdd && !run.cfg.Direct {
		// The response streams before the write is queued: the Add is
		// refused, and the middleware aborts the response.
		run.work(r.Context(), k, plan, &rec)
		setCreatedHeaders(w.Header(), exec, suffix)
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(created[:len(created)/2])
		_ = http.NewResponseController(w).Flush()
		if err := tx.Add(insert); errors.Is(err, idemhttp.ErrTxClosed) {
			rec.Outcome = "late_add_refused"
			lateAddRefused(r.Context())
		} else {
			rec.Outcome = fmt.Sprintf("late_add_accepted(%v)", err)
		}
		_, _ = w.Write(created[len(created)/2:])
		return
	}
	if !run.cfg.Direct {
		if err := tx.Add(insert); err != nil {
			rec.Outcome = "add_failed: " + err.Error()
			panic(http.ErrAbortHandler)
		}
	}
	run.work(r.Context(), k, plan, &rec)
	if plan.Panic == "late" {
		panic(http.ErrAbortHandler)
	}
	if run.cfg.Direct {
		if _, err := h.db.Exec(context.WithoutCancel(r.Context()), []d1client.Statement{insert}); err != nil {
			rec.Outcome = "direct_write_failed"
			panic(http.ErrAbortHandler)
		}
	}
	switch plan.Mode {
	case modeHijack:
		// Refused while the write is queued; answered normally then.
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err == nil {
			rec.Outcome = "hijacked"
			h := http.Header{}
			setCreatedHeaders(h, exec, suffix)
			fmt.Fprintf(brw, "HTTP/1.1 201 Created\r\nContent-Type: %s\r\nLocation: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
				h.Get("Content-Type"), h.Get("Location"), len(created), created)
			_ = brw.Flush()
			_ = conn.Close()
			return
		}
		rec.Outcome = "201_hijack_refused"
		setCreatedHeaders(w.Header(), exec, suffix)
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(created)
	case modeFlush:
		// Held while the write is queued: sent after the commit.
		rec.Outcome = "201_flushed"
		setCreatedHeaders(w.Header(), exec, suffix)
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(created[:len(created)/2])
		if err := http.NewResponseController(w).Flush(); err != nil {
			rec.Outcome = "flush_failed: " + err.Error()
		}
		_, _ = w.Write(created[len(created)/2:])
	default:
		rec.Outcome = "201"
		setCreatedHeaders(w.Header(), exec, suffix)
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(created)
	}
}

// work is the handler's work: it waits for the plan's delay, or, for an
// Outlive plan, until the key's generation moves on. A lost lease (the key
// was taken over, released or unreachable for a TTL) aborts it: the panic
// makes the middleware release the reservation (fenced) instead of storing
// a response. A handler cancelled at MaxLease finishes its work.
func (run *randomRun) work(ctx context.Context, k pk, plan execPlan, rec *execRec) {
	d, gen := plan.Delay, int64(0)
	if plan.Outlive {
		d, gen = 15*time.Second, run.generationOf(k)
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	done := ctx.Done()
	for {
		select {
		case <-timer.C:
			return
		case <-done:
			if errors.Is(context.Cause(ctx), idem.ErrLeaseLost) {
				rec.Outcome = "lease_lost"
				panic(http.ErrAbortHandler)
			}
			done = nil
		case <-time.After(20 * time.Millisecond):
			if plan.Outlive && run.generationOf(k) != gen {
				return
			}
		}
	}
}

// generationOf reads the generation of k's row (0 when it cannot).
func (run *randomRun) generationOf(k pk) int64 {
	ctx, cancel := context.WithTimeout(bg, 5*time.Second)
	defer cancel()
	res, err := run.w.admin.Exec(ctx, []d1client.Statement{{SQL: adminMark + `SELECT generation FROM idempotency_keys WHERE principal = ? AND key = ?`, Params: []any{k.P, k.K}}})
	if err != nil || len(res[0].Rows) == 0 {
		return 0
	}
	g, _ := res[0].Rows[0][0].Int64()
	return g
}

func (run *randomRun) recordExec(e execRec) {
	run.mu.Lock()
	run.execs = append(run.execs, e)
	run.mu.Unlock()
}

// runStats are the run's figures.
type runStats struct {
	Keys, Requests, Execs                    int
	Answers                                  map[string]int
	Outcomes                                 map[string]int
	Takeovers, Releases, Claims, Completions int64
	Forgotten, Deleted                       int64 // completed rows released by the operator; rows swept
	FencedOut, LeaseLost, Replays            int
	Superseded, SupersededTx                 int
	Latin1Stored                             int
	Ops                                      map[string]int
	Side                                     map[string]int
	Starved971, StarvedBudget                int // completions of the starved instance that found its client blocked by a 971, or its budget empty (after D1 failures)
	Steady                                   steadyStats
	Violations, Monitored                    int
	Faults                                   map[string]int
	FaultTotal                               int
}

func (run *randomRun) stats(o *observations, res checkResult) runStats {
	s := runStats{Keys: len(o.Keys), Requests: len(o.Requests), Execs: len(o.Execs),
		Answers: map[string]int{}, Outcomes: map[string]int{}, Ops: map[string]int{}, Side: map[string]int{},
		Faults: run.w.injectedSnapshot(), Replays: res.Replays, Superseded: len(res.Superseded),
		Violations: len(res.Violations), Monitored: int(run.monitored.Load())}
	s.countAnswers(o.Requests)
	for _, e := range o.Execs {
		s.Outcomes[e.Outcome]++
	}
	s.countEvents(o.Events)
	s.Completions = int64(len(o.Completions))
	for _, c := range o.Completions {
		if strings.Contains(deref(c.Hdrs), "/caf\uFFFD") {
			s.Latin1Stored++
		}
	}
	for _, l := range o.Logs {
		switch {
		case strings.Contains(l.Msg, "fenced out"):
			s.FencedOut++
		case strings.Contains(l.Msg, "lease lost"):
			s.LeaseLost++
		}
	}
	if st := run.insts[instStarved]; st != nil {
		s.Starved971, s.StarvedBudget = starved(st, "rate limit"), starved(st, "budget exhausted")
	}
	if st := run.insts[instSteady]; st != nil {
		s.Steady = steadyStats{Calls: st.db.Stats().Calls, MaxRTT: time.Duration(run.steadyMaxRTT.Load()),
			LeaseLost: len(st.logs.find("lease lost")), FencedOut: len(st.logs.find("fenced out"))}
		s.Steady.Starved, s.Steady.FirstStarved = starvedFirst(st, "budget exhausted")
		for _, r := range o.Requests {
			switch {
			case r.Instance != instSteady:
			case r.Status == http.StatusCreated:
				s.Steady.Answered++
			case r.Code == idemhttp.CodeBudgetExhausted || r.Code == idemhttp.CodeLedgerBusy:
				s.Steady.Refused++
			}
		}
	}
	s.countCalls(o.Ops, o.Side)
	for _, r := range res.Superseded {
		if r.Status == http.StatusCreated && !run.cfg.Direct {
			s.SupersededTx++
		}
	}
	for _, n := range s.Faults {
		s.FaultTotal += n
	}
	return s
}

// steadyStats are the figures of the steady instance: answers 201,
// claims turned away by its budget, its D1 calls, and its completions
// starved of budget (which must be none).
type steadyStats struct {
	Answered, Refused, Starved int
	Calls                      int64
	FirstStarved               string        // the first starved completion's log line, if any
	MaxRTT                     time.Duration // the longest smoothed round trip its account measured
	LeaseLost, FencedOut       int           // its reservations whose lease was lost, its completions fenced out
}

// starved counts instance st's completions that were not stored (or, with
// Tx statements, not committed) for an error saying why.
func starved(st *stack, why string) int {
	n, _ := starvedFirst(st, why)
	return n
}

// starvedFirst is starved, with the first such completion's log line.
func starvedFirst(st *stack, why string) (n int, first string) {
	for _, l := range append(st.logs.find("were not committed"), st.logs.find("completion not stored")...) {
		if strings.Contains(l.Attrs["error"], why) {
			if n++; n == 1 {
				first = fmt.Sprintf("%s %v", l.Msg, l.Attrs)
			}
		}
	}
	return n, first
}

// countAnswers counts the clients' answers by status and code.
func (s *runStats) countAnswers(reqs []reqRec) {
	for _, r := range reqs {
		switch {
		case r.Err != "":
			s.Answers["transport_error"]++
		case r.Replayed:
			s.Answers[fmt.Sprintf("%d_replayed", r.Status)]++
		case r.Code != "":
			s.Answers[fmt.Sprintf("%d_%s", r.Status, r.Code)]++
		default:
			s.Answers[strconv.Itoa(r.Status)]++
		}
		if r.Instance == instStarved && r.Err == "" {
			s.Answers["C:"+strconv.Itoa(r.Status)+"_"+r.Code]++
		}
	}
}

// countEvents counts D1's audited events by kind.
func (s *runStats) countEvents(events []event) {
	for _, e := range events {
		switch e.Kind {
		case "takeover":
			s.Takeovers++
		case "released":
			s.Releases++
		case "claim":
			s.Claims++
		case "completed_row_released":
			s.Forgotten++
		case "completed_row_deleted", "pending_row_deleted":
			s.Deleted++
		}
	}
}

// countCalls counts the operator's actions and the side callers' calls by
// kind and result.
func (s *runStats) countCalls(ops []opRec, side []sideRec) {
	for _, op := range ops {
		switch {
		case op.Err != "":
			s.Ops[op.Kind+"_error"]++
		case op.Kind == "sweep":
			s.Ops["sweep"]++
			s.Ops["sweep_deleted"] += int(op.Deleted)
		case op.Released:
			s.Ops[op.Kind+"_released"]++
		default:
			s.Ops[op.Kind+"_refused"]++
		}
	}
	for _, c := range side {
		switch {
		case c.Err == "":
			s.Side[c.Kind+"_ok"]++
		default:
			s.Side[c.Kind+"_"+c.ErrKind]++
		}
	}
}

func (s runStats) report(cfg runConfig, elapsed time.Duration) string {
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d: N=%d clients x M=%d keys, TTL %v, MaxLease %v, retention %v, duration %v (elapsed %v)\n",
		cfg.Seed, cfg.Clients, cfg.Keys, cfg.TTL, cfg.maxLease(), cfg.retention(), cfg.Duration, elapsed.Round(time.Millisecond))
	fmt.Fprintf(&b, "  keys (scenarios) %d, requests %d, handler executions %d %v\n", s.Keys, s.Requests, s.Execs, fmtMap(s.Outcomes))
	fmt.Fprintf(&b, "  answers %v\n", fmtMap(s.Answers))
	fmt.Fprintf(&b, "  D1 audit: claims %d, takeovers %d, releases %d, stored completions %d (Location not UTF-8: %d), completed rows forgotten by the operator %d, rows swept %d; ledger logs: fenced out %d, lease lost %d, completions starved by a 971 %d, of budget after D1 failures %d\n",
		s.Claims, s.Takeovers, s.Releases, s.Completions, s.Latin1Stored, s.Forgotten, s.Deleted, s.FencedOut, s.LeaseLost, s.Starved971, s.StarvedBudget)
	if cfg.Steady {
		fmt.Fprintf(&b, "  steady load (%g/s, budget %v): answered 201 %d, claims turned away %d, D1 calls %d, completions starved of budget %d, leases lost %d, fenced out %d, longest smoothed round trip %v\n",
			steadyRate, steadyBudget, s.Steady.Answered, s.Steady.Refused, s.Steady.Calls, s.Steady.Starved, s.Steady.LeaseLost, s.Steady.FencedOut, s.Steady.MaxRTT.Round(time.Millisecond))
	}
	fmt.Fprintf(&b, "  operator %v\n", fmtMap(s.Ops))
	fmt.Fprintf(&b, "  side callers %v\n", fmtMap(s.Side))
	fmt.Fprintf(&b, "  faults injected %d: %v\n", s.FaultTotal, fmtMap(s.Faults))
	fmt.Fprintf(&b, "  replays compared %d; answers from superseded owners %d (of which 201s whose write was never committed: %d)\n", s.Replays, s.Superseded, s.SupersededTx)
	fmt.Fprintf(&b, "  invariant violations: %d (seen by the monitor during the run: %d)\n", s.Violations, s.Monitored)
	b.WriteString(s.summary(cfg, elapsed))
	return b.String()
}

// summary is the report in one line, to quote: the backend, the seed, how
// long the run took, and its main counts (faults by kind, every round trip
// together).
func (s runStats) summary(cfg runConfig, elapsed time.Duration) string {
	backend := "d1local"
	if cfg.OnBridge {
		backend = "bridge(workerd)"
	}
	kinds := map[string]int{}
	for k, n := range s.Faults {
		kind, _, _ := strings.Cut(k, "@")
		kinds[kind] += n
	}
	return fmt.Sprintf("SUMMARY backend=%s seed=%d elapsed=%v keys=%d requests=%d executions=%d claims=%d takeovers=%d fenced_out=%d stored_completions=%d replays=%d operator_ops=%d side_calls=%d steady_answered=%d steady_refused=%d steady_starved=%d faults=%d %v violations=%d",
		backend, cfg.Seed, elapsed.Round(time.Second), s.Keys, s.Requests, s.Execs, s.Claims, s.Takeovers, s.FencedOut, s.Completions,
		s.Replays, total(s.Ops)-s.Ops["sweep_deleted"], total(s.Side), s.Steady.Answered, s.Steady.Refused, s.Steady.Starved,
		s.FaultTotal, fmtMap(kinds), s.Violations)
}

func total(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

func fmtMap(m map[string]int) string {
	keys := sortedKeys(m)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%d", k, m[k]))
	}
	return "{" + strings.Join(parts, " ") + "}"
}

// verify checks the invariants, logs the figures, and, unless the run is
// one that must be caught (a mutant or the Direct variant), fails t with
// the seed and each failing key's history on a violation.
func verify(t *testing.T, cfg runConfig, o *observations, run *randomRun, elapsed time.Duration) (runStats, checkResult) {
	t.Helper()
	res := check(o)
	s := run.stats(o, res)
	t.Logf("%s", s.report(cfg, elapsed))
	if len(res.Violations) > 0 && !cfg.Direct && cfg.Mutant == "" {
		byKey := map[pk][]violation{}
		for _, v := range res.Violations {
			byKey[v.Key] = append(byKey[v.Key], v)
		}
		keys := make([]pk, 0, len(byKey))
		for k := range byKey {
			keys = append(keys, k)
		}
		sort.Slice(keys, func(i, j int) bool { return keys[i].String() < keys[j].String() })
		for i, k := range keys {
			if i == 10 {
				t.Errorf("... and %d more keys", len(keys)-10)
				break
			}
			for _, v := range byKey[k] {
				t.Errorf("VIOLATION [%s] %s: %s", v.Invariant, k, v.Detail)
			}
			t.Errorf("%s", o.history(k))
		}
		t.Errorf("reproduce with: go test ./faults -run '%s' -faults.seed=%d", t.Name(), cfg.Seed)
	}
	return s, res
}

// The seeded randomized run: N clients x M keys through the middleware
// over httptest, three instances (heartbeats off, heartbeats on, and one
// starved of D1 budget) sharing one d1local database, random D1 faults on
// every call, handler delays beyond the TTL, panics, flushes and hijacks
// with Tx statements queued, Tx.Add after a flush, header bytes that are
// not UTF-8, concurrent duplicates, two Idempotency-Key fields, abandoned
// requests and replay checks; meanwhile an operator releases keys and
// sweeps under the shortest retention validation accepts, and side callers
// share the ledger's D1 batches. The invariants are checked on what clients
// saw and what D1 holds. It always runs a short, seeded configuration;
// -faults.long adds the long one.
func TestRandomizedFaults(t *testing.T) {
	t.Parallel()
	s := seed(t)
	t.Logf("seed %d (rerun with -faults.seed=%d or FAULTS_SEED=%d)", s, s, s)
	t.Run("short", func(t *testing.T) {
		cfg := runConfig{Seed: s, Clients: 16, Keys: 12, TTL: 400 * time.Millisecond}.withAll()
		start := time.Now()
		o, run := runRandomized(t, cfg)
		st, _ := verify(t, cfg, o, run, time.Since(start))
		requireCoverage(t, cfg, st)
	})
	t.Run("long", func(t *testing.T) {
		runLong(t, runConfig{Seed: s, Clients: 48, Keys: 25, TTL: 500 * time.Millisecond}.withAll())
	})
}

// runLong is the long form of a randomized run: skipped without
// -faults.long, 10 minutes unless -faults.duration says otherwise, resized
// by -faults.clients and -faults.keys.
func runLong(t *testing.T, cfg runConfig) {
	t.Helper()
	if !*flagLong {
		t.Skip("the long run needs -faults.long")
	}
	cfg.Duration = 10 * time.Minute
	if *flagClients > 0 {
		cfg.Clients = *flagClients
	}
	if *flagKeys > 0 {
		cfg.Keys = *flagKeys
	}
	if *flagDuration > 0 {
		cfg.Duration = *flagDuration
	}
	start := time.Now()
	o, run := runRandomized(t, cfg)
	st, _ := verify(t, cfg, o, run, time.Since(start))
	requireCoverage(t, cfg, st)
}

// requireCoverage fails a run that could have passed vacuously: every kind
// of fault on both round trips, takeovers, fenced-out completions, replays,
// releases after panics, and each further path of the model the run takes
// must all have happened.
func requireCoverage(t *testing.T, cfg runConfig, s runStats) {
	t.Helper()
	for _, rt := range []string{"claim", "completion"} {
		for _, f := range requiredFaults {
			if s.Faults[faultName(f)+"@"+rt] == 0 {
				t.Errorf("coverage: no %s fault on the %s", faultName(f), rt)
			}
		}
	}
	checks := []struct {
		what string
		n    int
		on   bool
	}{
		{"takeovers", int(s.Takeovers), true},
		{"fenced-out completions", s.FencedOut, true},
		{"replays compared", s.Replays, true},
		{"releases", int(s.Releases), true},
		{"planned panics", s.Outcomes["panic"], true},
		{"stored completions", int(s.Completions), true},
		{"422 answers", s.Answers["422_invalid_order"], true},
		{"in-progress answers", s.Answers["409_"+idemhttp.CodeKeyInProgress], true},
		{"lost connections", s.Answers["transport_error"], true},
		{"flushes held with Tx statements queued", s.Outcomes["201_flushed"], true},
		{"hijacks refused with Tx statements queued", s.Outcomes["201_hijack_refused"], true},
		{"Tx.Add refused after a flush", s.Outcomes["late_add_refused"], true},
		{"stored Locations that were not UTF-8", s.Latin1Stored, true},
		{"requests with two Idempotency-Key fields refused", s.Answers["400_"+idemhttp.CodeKeyInvalid], cfg.TwoKeys},
		{"operator releases of pending keys", s.Ops["release_released"] + s.Ops["release_stuck_released"], cfg.Operator},
		{"forced operator releases", s.Ops["release_force_released"], cfg.Operator},
		{"completed rows forgotten by the operator", int(s.Forgotten), cfg.Operator},
		{"admin sweeps", s.Ops["sweep"], cfg.Operator},
		{"rows swept", int(s.Deleted), cfg.Operator},
		{"echo reads", s.Side["echo_ok"], cfg.Side},
		{"side writes", s.Side["write_ok"], cfg.Side},
		{"multi-statement SQL refused", s.Side["multi_invalid"], cfg.Side},
		{"side calls faulted", s.Faults["internal500@side"] + s.Faults["internal500+after_commit@side"] + s.Faults["lost_response@side"] +
			s.Faults["badgateway502@side"] + s.Faults["badgateway502+after_commit@side"] + s.Faults["overloaded429@side"] +
			s.Faults["overloaded429+after_commit@side"], cfg.Side && !cfg.NoFaults},
		{"completions starved by a 971", s.Starved971, cfg.Starved && !cfg.NoFaults},
		{"steady-load answers", s.Steady.Answered, cfg.Steady},
		{"steady-load calls past its budget's first window", int(s.Steady.Calls) - steadyBudget.Calls(), cfg.Steady},
	}
	for _, c := range checks {
		if c.on && c.n <= 0 {
			t.Errorf("coverage: no %s in the run", c.what)
		}
	}
	switch {
	case s.Steady.Starved == 0:
	default:
		t.Errorf("the budget lost %d completions of the steady load: admitted claims' completions found no call; the first: %s", s.Steady.Starved, s.Steady.FirstStarved)
	}
}

// The checks catch a real broken variant end to end: the same workload
// with the handler's business write made outside idemhttp.Tx (the spec's
// non-transactional completion) double-writes on every takeover of a slow
// owner, and the exactly-once invariant reports it. Faults are off so the
// forced takeovers happen deterministically.
func TestRandomizedCatchesNonTransactionalVariant(t *testing.T) {
	t.Parallel()
	cfg := runConfig{Seed: seed(t), Clients: 6, Keys: 3, TTL: 400 * time.Millisecond, NoFaults: true, Direct: true}
	start := time.Now()
	o, run := runRandomized(t, cfg)
	s, res := verify(t, cfg, o, run, time.Since(start))
	n := 0
	for _, v := range res.Violations {
		if v.Invariant == invExactlyOnce {
			n++
		}
	}
	if n == 0 || s.Takeovers == 0 {
		t.Fatalf("the non-transactional variant was not caught: %d exactly-once violations, %d takeovers", n, s.Takeovers)
	}
	for _, v := range res.Violations {
		t.Logf("caught, as it must be: [%s] %s: %s", v.Invariant, v.Key, v.Detail)
	}
}
