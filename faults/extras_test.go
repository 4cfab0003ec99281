package faults

// The randomized run's further actors: an operator working through the
// admin API, side callers sharing the instances' D1 clients, and the rows
// planted past the retention for the sweeps to find.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/idem"
)

// startExtras starts the operator and the side callers the run asks for;
// stop ends them and waits for their calls to return.
func (run *randomRun) startExtras() (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	if run.cfg.Operator {
		wg.Add(1)
		go func() { defer wg.Done(); run.operate(done) }()
	}
	if run.cfg.Side {
		wg.Add(1)
		go func() { defer wg.Done(); run.sideTraffic(done) }()
	}
	return func() { close(done); wg.Wait() }
}

// opRec is one action of the operator.
type opRec struct {
	At   time.Duration // since the run's start
	Kind string        // see operate
	Key  pk
	Gen  int64 // the generation released
	// Released reports the release; Before is the row's status as the
	// release read it, in the same transaction.
	Released bool
	Before   idem.Status
	Deleted  int64 // rows a sweep deleted
	Err      string
}

func (run *randomRun) recordOp(op opRec) {
	op.At = time.Since(run.start)
	run.mu.Lock()
	run.ops = append(run.ops, op)
	run.mu.Unlock()
}

// operate is the operator: every 40-120 ms it sweeps (Admin.Sweep),
// releases the stuck keys Admin.List lists (without Force; once: a key it
// released stays stuck until its client returns), or looks at a
// recent key (Admin.Get) and releases it: a pending one with or without
// Force ("release_force", "release"), a completed one with Force, which
// forgets its response ("forget"), or without, which must be refused
// ("release_completed"). Every release that lands is followed by a sweep:
// a release that set updated_at back past the retention would have that
// sweep delete the row, and a retry claim the key afresh at a generation
// its owner may still write with (mutantCLIRelease). Its calls are never
// faulted. Its first look at a pending key and at a completed key always
// forces, so every run has both.
func (run *randomRun) operate(done <-chan struct{}) {
	db := run.w.client(func(c *d1client.Config) { c.AccountID = operatorAccount })
	l, err := idem.New(db, run.cfg.ledgerConfig(-1))
	if err != nil {
		run.t.Errorf("the operator's ledger: %v", err)
		return
	}
	admin := l.Admin()
	rng := rngFor(run.cfg.Seed, "operator")
	forced, forgot := false, false
	mine := map[string]bool{} // rows at a generation a release of ours made: stuck until their client returns
	releaseStuck := func(ctx context.Context, k pk, gen int64) {
		if !mine[genKey(k, gen)] && run.release(ctx, admin, db, "release_stuck", k, gen, false) {
			mine[genKey(k, gen+1)] = true
		}
	}
	for {
		select {
		case <-done:
			return
		case <-time.After(time.Duration(40+rng.IntN(80)) * time.Millisecond):
		}
		ctx, cancel := context.WithTimeout(bg, 10*time.Second)
		switch u := rng.Float64(); {
		case u < 0.15:
			n, err := admin.Sweep(ctx)
			run.recordOp(opRec{Kind: "sweep", Deleted: n, Err: errString(err)})
		case u < 0.30:
			stuck, err := admin.List(ctx, idem.ListOptions{Status: idem.StatusPending, OlderThan: run.cfg.TTL, Limit: 5})
			if err != nil {
				run.recordOp(opRec{Kind: "stuck", Err: err.Error()})
				break
			}
			for _, k := range stuck.Keys {
				releaseStuck(ctx, pk{k.Principal, k.Key}, k.Generation)
			}
		default:
			k, ok := run.recentKey(rng)
			if !ok {
				break
			}
			rec, err := admin.Get(ctx, k.P, k.K)
			if err != nil {
				break // not claimed yet
			}
			switch rec.Status {
			case idem.StatusPending:
				if !forced || rng.Float64() < 0.5 {
					forced = run.release(ctx, admin, db, "release_force", k, rec.Generation, true) || forced
				} else {
					run.release(ctx, admin, db, "release", k, rec.Generation, false)
				}
			case idem.StatusCompleted:
				if !forgot || rng.Float64() < 0.15 {
					forgot = run.release(ctx, admin, db, "forget", k, rec.Generation, true) || forgot
				} else {
					run.release(ctx, admin, db, "release_completed", k, rec.Generation, false)
				}
			}
		}
		cancel()
	}
}

// recentKey picks one of the last 64 keys the clients started.
func (run *randomRun) recentKey(rng *rand.Rand) (pk, bool) {
	run.mu.Lock()
	defer run.mu.Unlock()
	if len(run.keys) == 0 {
		return pk{}, false
	}
	n := min(64, len(run.keys))
	return run.keys[len(run.keys)-n+rng.IntN(n)], true
}

// release releases k at gen through the admin API (or, in the
// mutantCLIRelease run, a pending key with cliRelease, which sets
// updated_at back past the retention) and records it; after a release it
// sweeps.
func (run *randomRun) release(ctx context.Context, admin *idem.Admin, db *d1client.Client, kind string, k pk, gen int64, force bool) bool {
	op := opRec{Kind: kind, Key: k, Gen: gen}
	if run.cfg.Mutant == mutantCLIRelease && kind != "forget" && kind != "release_completed" {
		op.Kind = "cli_" + kind
		op.Released, op.Err = cliRelease(ctx, db, k, gen, run.cfg.TTL, force)
		op.Before = idem.StatusPending
	} else {
		res, err := admin.Release(ctx, k.P, k.K, gen, idem.ReleaseOptions{Force: force})
		op.Released, op.Before, op.Err = res.Released, res.Before.Status, errString(err)
	}
	run.recordOp(op)
	if op.Released {
		// Sweep at once: a released row that a sweep may delete is deleted
		// before its client comes back.
		n, err := admin.Sweep(ctx)
		run.recordOp(opRec{Kind: "sweep", Deleted: n, Err: errString(err)})
	}
	return op.Released
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// agedPrincipal owns the rows planted past (or near) the retention.
const agedPrincipal = "aged"

// plantAgedRows plants rows for the sweeps: 25 last updated more than the
// retention ago (every third one pending, its owner long gone), which the
// sweeps must delete, and 5 last updated 20-25 s short of it, which a
// sweep may delete only once they are past it.
func (run *randomRun) plantAgedRows() {
	ret := run.cfg.retention().Milliseconds()
	var stmts []d1client.Statement
	for i := 0; i < 25; i++ {
		stmts = append(stmts, agedRow(fmt.Sprintf("old-%02d", i), ret+60_000+int64(i)*1000, i%3 == 0))
	}
	for i := 0; i < 5; i++ {
		stmts = append(stmts, agedRow(fmt.Sprintf("young-%02d", i), ret-20_000-int64(i)*1000, false))
	}
	run.w.mustExec(stmts...)
}

func agedRow(key string, ageMS int64, pending bool) d1client.Statement {
	status, respStatus, body, headers := "completed", any(201), any(`{"aged":true}`), any(`{"content-type":"application/json"}`)
	if pending {
		status, respStatus, body, headers = "pending", nil, nil, nil
	}
	return d1client.Statement{SQL: adminMark + `INSERT INTO idempotency_keys
(principal, key, fingerprint, status, generation, response_status, response_body, response_headers, created_at, updated_at)
VALUES (?, ?, 'fp', ?, 1, ?, ?, ?, CAST(unixepoch('subsec') * 1000 AS INTEGER) - ?, CAST(unixepoch('subsec') * 1000 AS INTEGER) - ?)`,
		Params: []any{agedPrincipal, key, status, respStatus, body, headers, ageMS + 1000, ageMS}}
}

// sideRec is one call of a side caller.
type sideRec struct {
	At        time.Duration // since the run's start
	Kind      string        // "echo", "multi" or "write"
	Token     string
	Instance  string // whose D1 client carried it
	Coalesced bool
	SQL       string
	Err       string
	ErrKind   string // the d1client sentinel the error matches (see errKind)
	Ambiguous bool   // the error says the call may have committed
	Timeout   bool   // the error is the call's own deadline (30 s) passing
	Result    string // what an echo read returned
}

// sideShapes are the side writes' statements: writes that a classifier
// splitting on whitespace would take for reads (mutantWriteResent), and
// plainer ones. Each inserts one row with its token.
var sideShapes = []string{
	"WITH v AS (SELECT ? AS x)INSERT INTO side_writes (token) SELECT x FROM v /*%s%s*/",
	"INSERT/**/INTO side_writes (token) VALUES (?) /*%s%s*/",
	"/* a note */ INSERT INTO side_writes (token) VALUES (?) /*%s%s*/",
	"REPLACE INTO side_writes (token) VALUES (?) /*%s%s*/",
}

// sideTraffic runs the side callers: three workers, each sending a burst
// of 1-3 concurrent calls every 10-40 ms on instance A's or B's D1 client,
// the one its ledger uses, and waiting for them (so a slow machine gets
// fewer calls, not a pile of them): echo reads (coalesced with the
// ledger's statements) that must get their own value back, writes
// (coalesced or not) that must run once, and multi-statement SQL sent for
// coalescing, which d1client must refuse before anything is sent.
func (run *randomRun) sideTraffic(done <-chan struct{}) {
	var wg sync.WaitGroup
	defer wg.Wait()
	for worker := 0; worker < 3; worker++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rngFor(run.cfg.Seed, "side", worker)
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				case <-time.After(time.Duration(10+rng.IntN(30)) * time.Millisecond):
				}
				var burst sync.WaitGroup
				for j := 0; j < 1+rng.IntN(3); j++ {
					burst.Add(1)
					go func() {
						defer burst.Done()
						run.sideCall(rngFor(run.cfg.Seed, "sidecall", worker, i, j), fmt.Sprintf("s%d.%d.%d", worker, i, j))
					}()
				}
				burst.Wait()
			}
		}()
	}
}

// splitMark stands for "; SELECT 2" in the mutantMultiStatementSent run:
// d1client sends it as one statement, and splittingTransport turns it into
// a second statement on the wire.
const splitMark = "/*faults:split*/"

func (run *randomRun) sideCall(rng *rand.Rand, tok string) {
	inst := []string{instNoHeartbeat, instHeartbeat}[rng.IntN(2)]
	rec := sideRec{At: time.Since(run.start), Token: tok, Instance: inst}
	var stmt d1client.Statement
	opts := []d1client.ExecOption{d1client.Coalesce()}
	rec.Coalesced = true
	switch u := rng.Float64(); {
	case u < 0.45:
		rec.Kind = "echo"
		stmt = d1client.Statement{SQL: "SELECT ? AS echo /*" + markEcho + tok + "*/", Params: []any{tok}}
	case u < 0.60:
		rec.Kind = "multi"
		tail := "; SELECT 2"
		if run.cfg.Mutant == mutantMultiStatementSent {
			tail = " " + splitMark
		}
		stmt = d1client.Statement{SQL: fmt.Sprintf("SELECT '%s' AS multi /*%s%s*/%s", tok, markMulti, tok, tail)}
	default:
		rec.Kind = "write"
		stmt = d1client.Statement{SQL: fmt.Sprintf(sideShapes[rng.IntN(len(sideShapes))], markSideWrite, tok), Params: []any{tok}}
		if rng.IntN(2) == 0 {
			opts, rec.Coalesced = nil, false
		}
		if run.cfg.Mutant == mutantWriteResent {
			opts = append(opts, d1client.Idempotent())
		}
	}
	rec.SQL = stmt.SQL
	ctx, cancel := context.WithTimeout(bg, 30*time.Second)
	defer cancel()
	res, err := run.insts[inst].db.Exec(ctx, []d1client.Statement{stmt}, opts...)
	switch {
	case err != nil:
		rec.Err, rec.ErrKind, rec.Timeout = err.Error(), errKind(err), errors.Is(err, context.DeadlineExceeded)
		var de *d1client.Error
		if errors.As(err, &de) {
			rec.Ambiguous = de.Ambiguous
		}
	case rec.Kind == "echo":
		if len(res) == 1 && len(res[0].Rows) == 1 && len(res[0].Rows[0]) == 1 {
			rec.Result, _ = res[0].Rows[0][0].Text()
		} else {
			rec.Result = fmt.Sprintf("<%d results>", len(res))
		}
	}
	run.mu.Lock()
	run.side = append(run.side, rec)
	run.mu.Unlock()
}

// errKind names the d1client sentinel err matches.
func errKind(err error) string {
	for _, s := range []struct {
		name string
		err  error
	}{
		{"invalid", d1client.ErrInvalid}, {"budget", d1client.ErrBudget}, {"rate_limited", d1client.ErrRateLimited}, {"shed", d1client.ErrShed},
		{"result_count", d1client.ErrResultCount}, {"sql", d1client.ErrSQL}, {"transport", d1client.ErrTransport},
		{"transient", d1client.ErrTransient}, {"non_json", d1client.ErrNonJSON}, {"overloaded", d1client.ErrOverloaded},
		{"envelope", d1client.ErrEnvelope}, {"rejected", d1client.ErrRejected},
	} {
		if errors.Is(err, s.err) {
			return s.name
		}
	}
	return "other"
}

// sideWriteFaults is the policy of runs with SideFaults: every other call
// carrying side writes alone fails with a 500 after its commit.
func sideWriteFaults() policy {
	var n atomic.Int64
	return func(_ d1local.Request, c calls) d1local.Fault {
		if c.roundTrip() == "side" && c.sideWrite && !c.echo && !c.multi && n.Add(1)%2 == 1 {
			return d1local.Fault{Internal: true, AfterCommit: true}
		}
		return d1local.Fault{}
	}
}

// splittingTransport makes a client's calls pass through a proxy that
// turns splitMark into "; SELECT 2": multi-statement SQL reaches D1 as if
// d1client had let it through.
func (w *world) splittingTransport(c *d1client.Config) {
	base := http.DefaultTransport
	if c.HTTPClient != nil && c.HTTPClient.Transport != nil {
		base = c.HTTPClient.Transport
	}
	c.HTTPClient = &http.Client{Transport: splitter{base}}
}

type splitter struct{ base http.RoundTripper }

func (s splitter) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body == nil {
		return s.base.RoundTrip(r)
	}
	b, err := io.ReadAll(r.Body)
	_ = r.Body.Close()
	if err != nil {
		return nil, err
	}
	b = bytes.ReplaceAll(b, []byte(splitMark), []byte("; SELECT 2"))
	r2 := r.Clone(r.Context())
	r2.Body, r2.ContentLength = io.NopCloser(bytes.NewReader(b)), int64(len(b))
	r2.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }
	return s.base.RoundTrip(r2)
}
