package faults

// Mutation tests of the randomized run: each bug of the request path that
// the run covers is put back in, from the test side only (a wrapper around
// the middleware or the handler, the operator's own SQL, a proxy rewriting
// a statement on its way to D1, an option on a side caller's call), and the
// run's invariant checker must report it. Production code has no hook for
// any of them.

import (
	"bufio"
	"bytes"
	"context"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/idem/idemhttp"
)

// The mutants. Each name says what is put back in; mutants lists how, and
// the bug it is.
const (
	mutantFlushStreams       = "tx_flush_streams"
	mutantHijackAllowed      = "tx_hijack_allowed"
	mutantLateAddNotAborted  = "tx_late_add_not_aborted"
	mutantCLIRelease         = "cli_release_backdates_past_retention"
	mutantMultiStatementSent = "multi_statement_sql_sent"
	mutantWriteResent        = "write_resent_after_commit"
	mutantRawFirstHeaders    = "first_response_headers_not_as_stored"
	mutantMergeKeyFields     = "two_key_fields_merged"
)

// mutants is the list the mutation test runs: a small run with the bug put
// back in must break the invariant want, and the same run without it must
// break none.
var mutants = []struct {
	name    string
	finding string // the bug put back in, as a failure names it
	how     string // how the bug is put back in
	cfg     func(c runConfig) runConfig
	want    string
}{
	{mutantFlushStreams, "a flush with Tx statements queued streams the response and the statements are never sent",
		"a writer between the middleware and the handler streams the response on a flush whatever the Tx holds (with Content-Length, so the client gets all of it), then aborts the handler, so the middleware releases the key and never sends the Tx",
		func(c runConfig) runConfig { c.Modes = []string{modeFlush}; return c }, invNo2xx},
	{mutantHijackAllowed, "a hijack with Tx statements queued is allowed and the statements are never sent",
		"the same writer lets the handler hijack the connection with Tx statements queued; the handler answers 201 on the raw connection, and the middleware releases the key without sending the Tx",
		func(c runConfig) runConfig { c.Modes = []string{modeHijack}; return c }, invNo2xx},
	{mutantLateAddNotAborted, "a Tx.Add refused after the response streamed does not abort the handler",
		"a wrapper outside the middleware swallows the abort the middleware raises when the handler's Tx.Add was refused after a flush, so the streamed 201 completes normally although its write was never queued",
		func(c runConfig) runConfig { c.Modes = []string{modeLateAdd}; return c }, invNo2xx},
	{mutantCLIRelease, "a release (the CLI's) that sets updated_at back past the retention lets the sweep delete the row, so a generation is granted twice",
		"the operator releases pending keys with a statement of its own that sets updated_at back max(1 h, 2 TTL), so the next sweep deletes the row and a retry claims the key afresh at generation 1 while its owner is alive",
		func(c runConfig) runConfig { c.Operator, c.Slow = true, true; return c }, invGeneration},
	{mutantMultiStatementSent, "multi-statement SQL sent in a shared batch fails the other callers' statements",
		"a proxy in front of D1 turns a side caller's one-statement SQL into \"...; SELECT 2\" as if d1client had let it through, in calls coalesced with the ledger's and other callers' statements",
		func(c runConfig) runConfig { c.Side = true; return c }, invInnocent},
	{mutantWriteResent, "a write taken for a read is resent after its commit",
		"side writes whose SQL a whitespace classifier took for reads (WITH ... INSERT, INSERT/**/INTO) are sent with d1client.Idempotent(), which lets d1client resend them, while their calls fail with 500 after the commit",
		func(c runConfig) runConfig { c.Side, c.SideFaults = true, true; return c }, invInnocent},
	{mutantRawFirstHeaders, "the first response's header bytes differ from the replay's",
		"a wrapper outside the middleware puts the handler's raw Location (a byte 0xE9, not UTF-8) back on the first response, which the stored row and every replay carry as U+FFFD",
		func(c runConfig) runConfig { c.Modes, c.Latin1 = []string{modePlain}, true; return c }, invReplay},
	{mutantMergeKeyFields, "two Idempotency-Key fields are merged into one key",
		"a wrapper outside the middleware joins two Idempotency-Key fields into one (\"k, k~2\"), so the request is keyed and executed instead of refused",
		func(c runConfig) runConfig { c.TwoKeys, c.AllTwoKeys = true, true; return c }, invAnswers},
}

// Each bug of mutants, put back in, is reported by the run's invariant
// checker; the same run without it passes.
// (TestRandomizedCatchesNonTransactionalVariant does the same for a
// handler writing outside idemhttp.Tx.)
func TestRandomizedCatchesReintroducedBugs(t *testing.T) {
	t.Parallel()
	s := seed(t)
	for _, m := range mutants {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			base := m.cfg(runConfig{Seed: s, Clients: 4, Keys: 3, TTL: 400 * time.Millisecond, NoFaults: true})
			t.Run("caught", func(t *testing.T) {
				cfg := base
				cfg.Mutant = m.name
				start := time.Now()
				o, run := runRandomized(t, cfg)
				_, res := verify(t, cfg, o, run, time.Since(start))
				var caught []violation
				for _, v := range res.Violations {
					if v.Invariant == m.want {
						caught = append(caught, v)
					}
				}
				if len(caught) == 0 {
					t.Fatalf("bug %q, put back in (%s), was not caught: no violation of %q (violations: %+v)", m.finding, m.how, m.want, res.Violations)
				}
				t.Logf("caught, as it must be: [%s] %s: %s", caught[0].Invariant, caught[0].Key, caught[0].Detail)
			})
			t.Run("control", func(t *testing.T) {
				cfg := base
				start := time.Now()
				o, run := runRandomized(t, cfg)
				verify(t, cfg, o, run, time.Since(start))
			})
		})
	}
}

// mutantState is what the mutants' wrappers share about one request. The
// handler runs in the goroutine of the wrappers around it.
type mutantState struct {
	real        http.ResponseWriter // the connection's writer, outside the middleware
	rawLocation string              // the handler's Location as it wrote it
	lateAdd     bool                // the handler's Tx.Add was refused after a flush
}

type mutantKey struct{}

// lateAddRefused tells the mutantLateAddNotAborted wrapper that the
// handler's Tx.Add was refused.
func lateAddRefused(ctx context.Context) {
	if ms, ok := ctx.Value(mutantKey{}).(*mutantState); ok {
		ms.lateAdd = true
	}
}

// outer wraps the middleware of every instance: it counts the requests in
// flight and, in a mutant's run, puts the mutant's outer part in.
func (run *randomRun) outer(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		run.inflight.Add(1)
		defer run.inflight.Add(-1)
		if run.cfg.Mutant == "" {
			h.ServeHTTP(w, r)
			return
		}
		ms := &mutantState{real: w}
		r = r.WithContext(context.WithValue(r.Context(), mutantKey{}, ms))
		switch run.cfg.Mutant {
		case mutantMergeKeyFields:
			if vs := r.Header.Values(idemhttp.HeaderKey); len(vs) > 1 {
				r.Header.Set(idemhttp.HeaderKey, strings.Join(vs, ", "))
			}
		case mutantLateAddNotAborted:
			defer func() {
				if v := recover(); v != nil {
					if v == http.ErrAbortHandler && ms.lateAdd {
						return // the streamed response completes as if all were well
					}
					panic(v)
				}
			}()
		case mutantRawFirstHeaders:
			w = &rawHeaderWriter{ResponseWriter: w, ms: ms}
		}
		h.ServeHTTP(w, r)
	})
}

// inner wraps the handler of every instance, inside the middleware: in a
// mutant's run it puts the mutant's inner part in.
func (run *randomRun) inner(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ms, _ := r.Context().Value(mutantKey{}).(*mutantState)
		switch {
		case ms == nil:
		case run.cfg.Mutant == mutantFlushStreams || run.cfg.Mutant == mutantHijackAllowed:
			pw := &bugWriter{capture: w, real: ms.real}
			h.ServeHTTP(pw, r)
			pw.finish()
			return
		case run.cfg.Mutant == mutantRawFirstHeaders:
			defer func() { ms.rawLocation = w.Header().Get("Location") }()
		}
		h.ServeHTTP(w, r)
	})
}

// bugWriter puts back in the bugs of mutantFlushStreams and
// mutantHijackAllowed: a flush streams the response whatever the Tx holds,
// and a hijack is allowed; either way the middleware then releases the key,
// and the queued Tx statements are never sent. It holds the
// handler's response and, when the handler returns, sends it itself on a
// flush (with Content-Length: the client gets all of it) and aborts the
// handler so that the middleware releases the key without committing.
// Without a flush or hijack it hands the response to the middleware.
type bugWriter struct {
	capture  http.ResponseWriter // the middleware's writer
	real     http.ResponseWriter // the connection's; its Header is capture's
	status   int
	body     bytes.Buffer
	streamed bool
	hijacked bool
}

func (p *bugWriter) Header() http.Header { return p.capture.Header() }

func (p *bugWriter) WriteHeader(code int) {
	if p.status == 0 {
		p.status = code
	}
}

func (p *bugWriter) Write(b []byte) (int, error) {
	if p.status == 0 {
		p.status = http.StatusOK
	}
	return p.body.Write(b)
}

func (p *bugWriter) Flush() { p.streamed = true }

func (p *bugWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, brw, err := http.NewResponseController(p.real).Hijack()
	p.hijacked = err == nil
	return conn, brw, err
}

func (p *bugWriter) finish() {
	switch {
	case p.hijacked:
		panic(http.ErrAbortHandler)
	case p.streamed:
		p.real.Header().Set("Content-Length", strconv.Itoa(p.body.Len()))
		p.real.WriteHeader(p.status)
		_, _ = p.real.Write(p.body.Bytes())
		_ = http.NewResponseController(p.real).Flush()
		panic(http.ErrAbortHandler)
	}
	if p.status != 0 {
		p.capture.WriteHeader(p.status)
	}
	_, _ = p.capture.Write(p.body.Bytes())
}

// rawHeaderWriter puts the handler's raw Location back on a response that
// is not a replay.
type rawHeaderWriter struct {
	http.ResponseWriter
	ms    *mutantState
	wrote bool
}

func (w *rawHeaderWriter) WriteHeader(code int) {
	if !w.wrote && code >= 200 && w.ms.rawLocation != "" && w.Header().Get("Location") != "" && w.Header().Get(idemhttp.HeaderReplayed) == "" {
		w.Header()["Location"] = []string{w.ms.rawLocation}
	}
	w.wrote = w.wrote || code >= 200
	w.ResponseWriter.WriteHeader(code)
}

func (w *rawHeaderWriter) Write(b []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(b)
}

func (w *rawHeaderWriter) Flush() { _ = http.NewResponseController(w.ResponseWriter).Flush() }

func (w *rawHeaderWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return http.NewResponseController(w.ResponseWriter).Hijack()
}

func (w *rawHeaderWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// cliRelease is a release with the bug of mutantCLIRelease: a statement of
// its own that sets updated_at back max(1 h, 2 TTL), past any retention of
// an hour or less, where the ledger's release sets it back TTL + 1 ms.
func cliRelease(ctx context.Context, db *d1client.Client, k pk, gen int64, ttl time.Duration, force bool) (bool, string) {
	const now = "CAST(unixepoch('subsec') * 1000 AS INTEGER)"
	sql := "UPDATE idempotency_keys SET generation = generation + 1, updated_at = " + now +
		" - ? WHERE principal = ? AND key = ? AND generation = ? AND status = 'pending'"
	params := []any{max(time.Hour, 2*ttl).Milliseconds(), k.P, k.K, gen}
	if !force {
		sql += " AND updated_at < " + now + " - ?"
		params = append(params, ttl.Milliseconds())
	}
	res, err := db.Exec(ctx, []d1client.Statement{{SQL: sql + " RETURNING generation", Params: params}})
	if err != nil {
		return false, err.Error()
	}
	return len(res[0].Rows) == 1, ""
}
