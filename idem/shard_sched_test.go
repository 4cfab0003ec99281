package idem_test

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// shardSched runs a randomized shard run one step at a time, in fake time
// (inside a testing/synctest bubble). Every D1 call of the run's actors
// waits at a gate (gateTransport) until the scheduler takes it, with the
// fault it chooses; every sleep and client timeout of the actors, and the
// latency of a call, is an event the scheduler fires. Before each step it
// waits until every goroutine of the bubble is blocked, so a step (a call
// and what its caller does until it blocks again, or an event and what it
// wakes) runs alone, and the run is its sequence of steps: the schedule.
//
// Recording, the scheduler picks each step among those ready, and each
// call's fault, with its seeded generator; fake time moves on, a quantum at
// a time, only when no step is ready. Replaying, it takes them from a
// recorded schedule, and records a divergence at the first step the run
// does not offer at the recorded time (then goes on recording, so that the
// run ends). Actors are named by their context (withActor), calls by their
// actor, home and bytes, so a schedule names each step the same way in
// every run that makes the same calls.
//
// What keeps a run the same from one time to the next: the seeded choices;
// fake time; every actor's start, sleep and timeout an event, so that no two
// actors run at once; the ledgers' clients bypassing group commit (solo),
// which would hand several callers their answers at once; D1 retries whose
// random backoff ends within the quantum (shardRetry); and homes named h0,
// h1, ... whatever the databases' IDs, so that every principal routes the
// same way.
type shardSched struct {
	rng     *rand.Rand
	script  []shardStep // replaying: the schedule; nil when recording
	next    int         // the script's next step
	rate    float64     // the share of calls faulted while faults are on
	quantum time.Duration
	// prefer, if set, chooses a step among ready before the generator
	// does: "" leaves it to the generator, "-" lets time move on.
	prefer func(steps []shardStep, ready []string) string

	mu       sync.Mutex
	active   bool // between run's start and end; calls pass straight through otherwise
	faultsOn bool
	start    time.Time
	calls    map[string]*gateCall   // waiting to be taken
	events   map[string]*shardEvent // sleeps, timeouts, latencies
	seen     map[string]int         // how many names were given with each prefix
	steps    []shardStep
	faults   map[string]int // injected, by kind
	diverged string         // the first divergence from the script
}

// shardStep is one step of a schedule: at a fake time (milliseconds since
// the run's start), a call taken (with its fault) or an event fired.
type shardStep struct {
	At    int64  `json:"at"`
	Do    string `json:"do"`
	Fault string `json:"fault,omitempty"`
}

// gateCall is a call waiting at the gate.
type gateCall struct {
	exempt bool            // never faulted: the checker's and the adversary's own calls
	taken  chan shardFault // receives the call's fault when it is taken
}

// shardEvent fires at due (since the run's start).
type shardEvent struct {
	due  time.Duration
	fire func()
}

func newShardSched(seed uint64, rate float64, script []shardStep) *shardSched {
	return &shardSched{rng: rand.New(rand.NewPCG(seed, 0x5c4ed)), script: script, rate: rate, quantum: time.Millisecond,
		calls: map[string]*gateCall{}, events: map[string]*shardEvent{}, seen: map[string]int{}, faults: map[string]int{}}
}

// shardRunLimit bounds a run's fake time.
const shardRunLimit = 30 * time.Minute

// run runs fn, and every goroutine it starts, step by step, until fn returns.
func (s *shardSched) run(fn func()) {
	s.mu.Lock()
	if s.start.IsZero() {
		s.start = time.Now()
	}
	s.active = true
	s.mu.Unlock()
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	for {
		synctest.Wait()
		select {
		case <-done:
			s.mu.Lock()
			s.active = false
			s.mu.Unlock()
			return
		default:
		}
		if !s.step() {
			if time.Since(s.start) > shardRunLimit {
				panic(fmt.Sprintf("shard run: still going after %s of fake time: an actor never ends", shardRunLimit))
			}
			time.Sleep(s.quantum)
		}
	}
}

// now is the fake time since the run's start, with s.mu held.
func (s *shardSched) now() time.Duration { return time.Since(s.start) }

// name returns prefix@n, n counting the names given with prefix, with s.mu held.
func (s *shardSched) name(prefix string) string {
	n := s.seen[prefix]
	s.seen[prefix]++
	return fmt.Sprintf("%s@%d", prefix, n)
}

// step takes one ready step, if there is one, and reports whether it did.
func (s *shardSched) step() bool {
	s.mu.Lock()
	now := s.now()
	var ready []string
	for id := range s.calls {
		ready = append(ready, "call "+id)
	}
	for name, e := range s.events {
		if e.due <= now {
			ready = append(ready, name)
		}
	}
	slices.Sort(ready)
	do, fault, ok := s.choose(now, ready)
	if !ok {
		s.mu.Unlock()
		return false
	}
	s.steps = append(s.steps, shardStep{At: now.Milliseconds(), Do: do, Fault: fault.String()})
	var fire func()
	if id, isCall := strings.CutPrefix(do, "call "); isCall {
		c := s.calls[id]
		delete(s.calls, id)
		if fault.kind != "" {
			s.faults[fault.kind]++
		}
		if fault.latency > 0 {
			// The call goes after its latency, unless its caller gives up first.
			run := fault
			run.latency = 0
			s.events["run "+id] = &shardEvent{due: now + fault.latency, fire: func() { c.taken <- run }}
		} else {
			c.taken <- fault
		}
	} else {
		fire = s.events[do].fire
		delete(s.events, do)
	}
	s.mu.Unlock()
	if fire != nil {
		fire()
	}
	return true
}

// choose returns the step to take among ready (sorted) and, for a call,
// its fault: the script's next step when replaying, else a random one.
func (s *shardSched) choose(now time.Duration, ready []string) (string, shardFault, bool) {
	if s.script != nil && s.diverged == "" {
		at := now.Milliseconds()
		switch {
		case s.next == len(s.script) && len(ready) > 0:
			s.diverged = fmt.Sprintf("after the schedule's last step, the run offers %d more: %s", len(ready), shorten(ready))
		case s.next == len(s.script):
			return "", shardFault{}, false
		case len(ready) == 0 && s.script[s.next].At > at:
			return "", shardFault{}, false // time moves on
		case s.script[s.next].At != at || !slices.Contains(ready, s.script[s.next].Do):
			st := s.script[s.next]
			s.diverged = fmt.Sprintf("step %d: the schedule takes %q at %d ms, the run offers %s at %d ms", s.next, st.Do, st.At, shorten(ready), at)
		default:
			st := s.script[s.next]
			s.next++
			f, err := parseShardFault(st.Fault)
			if err != nil {
				s.diverged = fmt.Sprintf("step %d: %v", s.next-1, err)
			}
			return st.Do, f, true
		}
	}
	if s.prefer != nil {
		switch do := s.prefer(s.steps, ready); do {
		case "-":
			return "", shardFault{}, false
		case "":
		default:
			return do, shardFault{}, true
		}
	}
	if len(ready) == 0 {
		return "", shardFault{}, false
	}
	do := ready[s.rng.IntN(len(ready))]
	id, isCall := strings.CutPrefix(do, "call ")
	if !isCall {
		return do, shardFault{}, true
	}
	return do, s.fault(s.calls[id].exempt), true
}

// fault chooses a call's fault: while faults are on, errors before and
// after the commit, lost answers and latency at rate; and some latency
// anyway, so that calls overlap in time.
func (s *shardSched) fault(exempt bool) shardFault {
	if exempt || !s.faultsOn || s.rng.Float64() >= s.rate {
		if s.rng.IntN(5) == 0 {
			return shardFault{latency: time.Duration(1+s.rng.IntN(3)) * time.Millisecond}
		}
		return shardFault{}
	}
	kinds := []string{"internal", "internal+commit", "badgateway", "badgateway+commit", "overloaded", "lost", "latency"}
	f := shardFault{kind: kinds[s.rng.IntN(len(kinds))]}
	if f.kind == "latency" {
		f.latency = time.Duration(5+s.rng.IntN(40)) * time.Millisecond
	}
	return f
}

func shorten(ready []string) string {
	if len(ready) > 8 {
		return fmt.Sprintf("%q and %d more", ready[:8], len(ready)-8)
	}
	return fmt.Sprintf("%q", ready)
}

// setFaults turns fault injection on or off.
func (s *shardSched) setFaults(on bool) {
	s.mu.Lock()
	s.faultsOn = on
	s.mu.Unlock()
}

// injected says how many faults of each kind were injected.
func (s *shardSched) injected() (n int, kinds string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for k, v := range s.faults {
		n += v
		out = append(out, fmt.Sprintf("%s %d", k, v))
	}
	slices.Sort(out)
	return n, strings.Join(out, ", ")
}

// event registers fire as the event prefix@n, due after d; it returns the
// event's name, or "" outside a run.
func (s *shardSched) event(prefix string, d time.Duration, fire func()) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.active {
		return ""
	}
	name := s.name(prefix)
	s.events[name] = &shardEvent{due: s.now() + d, fire: fire}
	return name
}

// sleep is time.Sleep for the actor of ctx, as an event of the schedule.
func (s *shardSched) sleep(ctx context.Context, d time.Duration) {
	woken := make(chan struct{})
	if s.event("wake "+actorOf(ctx, "?"), d, func() { close(woken) }) == "" {
		time.Sleep(d)
		return
	}
	<-woken
}

// spawn runs fn(ctx) in a goroutine of wg that starts when the scheduler
// says, so that its start is a step too: an actor started beside another
// that runs on would otherwise race it.
func (s *shardSched) spawn(wg *sync.WaitGroup, ctx context.Context, fn func(ctx context.Context)) {
	wg.Go(func() {
		s.sleep(ctx, 0)
		fn(ctx)
	})
}

// withTimeout is context.WithTimeout, its expiry an event of the schedule.
func (s *shardSched) withTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	parent := ctx
	ctx, cancel := context.WithCancel(ctx)
	name := s.event("timeout "+actorOf(ctx, "?"), d, cancel)
	if name == "" {
		cancel()
		return context.WithTimeout(parent, d)
	}
	return ctx, func() {
		s.mu.Lock()
		delete(s.events, name)
		s.mu.Unlock()
		cancel()
	}
}

// gate makes a call wait until the scheduler takes it, and returns its
// fault; outside a run it returns at once. A caller that gives up (ctx)
// withdraws the call, during its latency too.
func (s *shardSched) gate(ctx context.Context, actor, home string, body []byte, exempt bool) (shardFault, error) {
	s.mu.Lock()
	if !s.active {
		s.mu.Unlock()
		return shardFault{}, nil
	}
	sum := sha256.Sum256(body)
	id := s.name(fmt.Sprintf("%s %s %x", actor, home, sum[:4]))
	c := &gateCall{exempt: exempt, taken: make(chan shardFault, 1)}
	s.calls[id] = c
	s.mu.Unlock()
	select {
	case f := <-c.taken:
		return f, nil
	case <-ctx.Done():
	}
	s.mu.Lock()
	delete(s.calls, id)
	delete(s.events, "run "+id)
	s.mu.Unlock()
	return shardFault{}, ctx.Err()
}

// shardFault is what happens to one call.
type shardFault struct {
	kind    string        // "" (none), "internal", "internal+commit", "badgateway", "badgateway+commit", "overloaded", "lost", "latency"
	latency time.Duration // before the call goes
}

func (f shardFault) String() string {
	switch {
	case f.latency > 0:
		return fmt.Sprintf("%s %s", cmp.Or(f.kind, "delay"), f.latency)
	default:
		return f.kind
	}
}

func parseShardFault(s string) (shardFault, error) {
	kind, lat, hasLat := strings.Cut(s, " ")
	f := shardFault{kind: kind}
	if kind == "delay" {
		f.kind = ""
	}
	if hasLat {
		d, err := time.ParseDuration(lat)
		if err != nil {
			return shardFault{}, fmt.Errorf("fault %q: %v", s, err)
		}
		f.latency = d
	}
	return f, nil
}

// apply sends req through inner with the fault: an error answer instead
// of the call or after it (the call committed), or the answer lost.
func (f shardFault) apply(req *http.Request, inner http.RoundTripper) (*http.Response, error) {
	kind, afterCommit := strings.CutSuffix(f.kind, "+commit")
	failing := kind == "internal" || kind == "badgateway" || kind == "overloaded"
	if failing && !afterCommit {
		return faultAnswer(req, kind), nil
	}
	res, err := inner.RoundTrip(req)
	if err != nil || !failing && kind != "lost" {
		return res, err
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if kind == "lost" {
		return nil, errors.New("shard fault: the connection dropped after the call ran")
	}
	return faultAnswer(req, kind), nil
}

// faultAnswer is D1's answer for an error fault: a 500, Cloudflare's HTML
// 502, or a 429 overloaded.
func faultAnswer(req *http.Request, kind string) *http.Response {
	status, ctype, body := http.StatusInternalServerError, "application/json",
		`{"result":null,"success":false,"errors":[{"code":7500,"message":"internal error; reference = shard-fault"}],"messages":[]}`
	switch kind {
	case "badgateway":
		status, ctype, body = http.StatusBadGateway, "text/html", "<html><head><title>502 Bad Gateway</title></head></html>"
	case "overloaded":
		status, body = http.StatusTooManyRequests, `{"result":null,"success":false,"errors":[{"code":7500,"message":"D1 DB is overloaded. Requests queued for too long."}],"messages":[]}`
	}
	return &http.Response{StatusCode: status, Status: http.StatusText(status), Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{"Content-Type": {ctype}}, Body: io.NopCloser(strings.NewReader(body)), ContentLength: int64(len(body)), Request: req}
}

// gateTransport is the transport of a run's D1 clients: each call waits
// at the scheduler's gate, then goes to inner with its fault.
type gateTransport struct {
	s     *shardSched
	home  string // the home whose database the client reaches
	owner string // the actor of calls whose context names none
	inner http.RoundTripper
}

func (g *gateTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	body, err := io.ReadAll(req.Body)
	req.Body.Close()
	if err != nil {
		return nil, err
	}
	req = req.Clone(req.Context())
	req.Body = io.NopCloser(bytes.NewReader(body))
	if viaGroupCommit() {
		return nil, errors.New("shard run: a call went through group commit, whose callers the schedule cannot order: give the ledgers solo clients")
	}
	actor := actorOf(req.Context(), g.owner)
	exempt := bytes.Contains(body, []byte(checkMarker)) || strings.HasPrefix(actor, "adv")
	f, err := g.s.gate(req.Context(), actor, g.home, body, exempt)
	if err != nil {
		return nil, err
	}
	return f.apply(req, g.inner)
}

// viaGroupCommit says whether the calling goroutine is a runner of
// d1client's group commit.
func viaGroupCommit() bool {
	pcs := make([]uintptr, 64)
	frames := runtime.CallersFrames(pcs[:runtime.Callers(2, pcs)])
	for {
		f, more := frames.Next()
		if strings.Contains(f.Function, "d1client.(*batcher)") {
			return true
		}
		if !more {
			return false
		}
	}
}

// actorKey is the context key of an actor's name.
type actorKey struct{}

// withActor names the actor of ctx's calls, sleeps and timeouts.
func withActor(ctx context.Context, name string) context.Context {
	return context.WithValue(ctx, actorKey{}, name)
}

func actorOf(ctx context.Context, def string) string {
	if name, ok := ctx.Value(actorKey{}).(string); ok {
		return name
	}
	return def
}

// shardReplay is the file a failed run writes: what replays it exactly.
type shardReplay struct {
	Test  string      `json:"test"`
	Seed  uint64      `json:"seed"`
	Steps []shardStep `json:"steps"`
}

// writeShardReplay writes the run's schedule to a file and returns its path.
func writeShardReplay(t testing.TB, seed uint64, steps []shardStep) string {
	t.Helper()
	name := strings.NewReplacer("/", "_", " ", "_").Replace(t.Name())
	f, err := os.CreateTemp("", fmt.Sprintf("d1idem-%s-%d-*.json", name, seed))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w := bufio.NewWriter(f)
	head, _ := json.Marshal(struct {
		Test string `json:"test"`
		Seed uint64 `json:"seed"`
	}{t.Name(), seed})
	fmt.Fprintf(w, "%s,\"steps\":[\n", head[:len(head)-1])
	for i, st := range steps {
		line, _ := json.Marshal(st)
		sep := ",\n"
		if i == len(steps)-1 {
			sep = "\n"
		}
		fmt.Fprintf(w, "%s%s", line, sep)
	}
	fmt.Fprintf(w, "]}\n")
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	return f.Name()
}

// readShardReplay reads a schedule writeShardReplay wrote.
func readShardReplay(t testing.TB, path string) shardReplay {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var r shardReplay
	if err := json.Unmarshal(data, &r); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return r
}
