package idem

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1client/budget"
)

const (
	minCompletionWindow = 2 * time.Second        // completion retries get at least this long
	minRetryAfter       = 100 * time.Millisecond // the least wait for a young owner to finish
	defaultHandlerTime  = time.Second            // the handler time estimated before any was measured
	logKeyPrefix        = 16                     // characters of a key shown in logs
	hashPrefix          = 12                     // hex digits of a SHA-256 shown in logs
	releaseTimeout      = 5 * time.Second        // bound on a release made while unwinding
)

// Ledger is the spec's claim-before-mutate ledger on D1, safe for concurrent use. A first
// execution costs 2 D1 calls (Begin, Complete); a replay, reuse or in-progress answer 1.
type Ledger struct {
	cfg Config
	sql ledgerSQL
	tel *telemetry

	single *home // the database of a ledger made by New; nil if sharded
	shards *shards
	cache  *replayCache // nil when off

	handlerTime durationEstimate // from claim to stored completion
}

// home is one database of the ledger, with its own sweep schedule.
type home struct {
	id string
	db d1client.Executor

	mu        sync.Mutex
	lastSweep time.Time // when the last sweep was sent; zero: sweep next
}

// New returns a Ledger keeping its rows in db, whose table must exist (d1idem.Schema).
func New(db d1client.Executor, cfg Config) (*Ledger, error) {
	if db == nil {
		return nil, errors.New("idem: nil D1 client")
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Ledger{cfg: cfg, sql: buildSQL(cfg.Clock != nil), single: &home{id: databaseID(db), db: db},
		tel: newTelemetry(cfg.MeterProvider), cache: newReplayCache(cfg.ReplayCache)}, nil
}

// databaseID returns the ID of db's database if it says (a Client does).
func databaseID(db d1client.Executor) string {
	if d, ok := db.(interface{ DatabaseID() string }); ok {
		return d.DatabaseID()
	}
	return ""
}

func (l *Ledger) log() *slog.Logger { return cmp.Or(l.cfg.Logger, slog.Default()) }

// Config returns the ledger's configuration with defaults filled in (header lists copied).
func (l *Ledger) Config() Config {
	c := l.cfg
	c.FingerprintHeaders = slices.Clone(c.FingerprintHeaders)
	c.ReplayableHeaders = slices.Clone(c.ReplayableHeaders)
	return c
}

// Outcome is the decision Begin reaches for a request.
type Outcome int

// The outcomes of Begin, exactly one per request.
const (
	Execute    Outcome = iota + 1 // run the mutation, then Complete or Release
	Replay                        // the key completed: send Decision.Response
	Reused                        // another request used the key: reject
	InProgress                    // pending and alive: 409 with Retry-After
	Retry                         // the row vanished: ask the client to retry
)

var outcomeNames = [...]string{Execute: "execute", Replay: "replay", Reused: "reused", InProgress: "in_progress", Retry: "retry"}

// String returns the outcome's name, such as "in_progress".
func (o Outcome) String() string {
	if o > 0 && int(o) < len(outcomeNames) {
		return outcomeNames[o]
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// Decision is what Begin decided for one request.
type Decision struct {
	Outcome     Outcome
	Reservation *Reservation  // set for Execute
	Response    *Response     // set for Replay: the stored response
	RetryAfter  time.Duration // set for InProgress: when the owner is likely done, else when its lease ends

	retained time.Duration // Replay from a read: how long the row was yet to be kept when read
}

// Reservation is the right to execute one request's mutation: the
// principal's key at one generation of the fencing token, made by Begin.
type Reservation struct {
	Principal   string
	Key         string
	Fingerprint string
	Generation  int64
	Takeover    bool // it took over an earlier owner's stale pending row

	home          *home         // the database the reservation was claimed in
	ttl           time.Duration // BeginOptions.TTL, or zero: the ledger's
	acquired      time.Time     // local monotonic time when the claim was sent (see leaseFrom)
	clockAcquired time.Time     // the injected clock's time of the claim; zero with D1's clock
	renewed       *atomic.Int64 // nanoseconds after acquired of the last renewal's start
	debt          *budget.Debt  // what the claim owes the API budget: paid by the completion or release
}

// homeOf returns the database r was claimed in.
func (l *Ledger) homeOf(r *Reservation) (*home, error) {
	if h := cmp.Or(r.home, l.single); h != nil {
		return h, nil
	}
	return nil, errors.New("idem: the reservation was not made by this ledger's Begin")
}

// leaseStart returns when the claim or the last renewal began.
func (r *Reservation) leaseStart() time.Time {
	if r.renewed == nil {
		return r.acquired
	}
	return r.acquired.Add(time.Duration(r.renewed.Load()))
}

// Response is an HTTP response as the ledger stores and replays it.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
}

// MaxPrincipalLength is the longest principal the ledger accepts, in bytes.
const MaxPrincipalLength = 1024

// Errors of Begin for invalid arguments, none including the principal.
var (
	ErrNoPrincipal      = errors.New("idem: empty principal: derive it from the authenticated caller")
	ErrInvalidKey       = errors.New("idem: Idempotency-Key must be 1-255 printable ASCII characters")
	ErrInvalidPrincipal = errors.New("idem: invalid principal") // not UTF-8, or too long
)

// ValidPrincipal reports whether Begin accepts principal p: 1 to MaxPrincipalLength bytes of UTF-8.
func ValidPrincipal(p string) bool { return checkPrincipal(p) == nil }

func checkPrincipal(p string) error {
	switch {
	case p == "":
		return ErrNoPrincipal
	case len(p) > MaxPrincipalLength:
		return fmt.Errorf("%w: %d bytes, over the limit of %d", ErrInvalidPrincipal, len(p), MaxPrincipalLength)
	case !utf8.ValidString(p):
		return fmt.Errorf("%w: not valid UTF-8", ErrInvalidPrincipal)
	}
	return nil
}

// ErrReservationExpired is returned, the write not sent, when it could land
// after the sweep deleted its row and match a later owner's generation.
var ErrReservationExpired = errors.New("idem: reservation expired: its row may have been swept and the key claimed again")

// Begin runs round trip 1: one D1 batch that claims the key (or takes over
// a stale pending reservation with the same fingerprint) and reads the row.
// Options, if given, adjust this call (see BeginOptions).
func (l *Ledger) Begin(ctx context.Context, principal, key, fingerprint string, opts ...BeginOptions) (Decision, error) {
	err := checkPrincipal(principal)
	ttl, terr := l.beginTTL(opts)
	switch {
	case err != nil:
		return Decision{}, err
	case !ValidKey(key):
		return Decision{}, ErrInvalidKey
	case fingerprint == "":
		return Decision{}, errors.New("idem: empty fingerprint")
	case terr != nil:
		return Decision{}, terr
	}
	if l.cache != nil {
		if resp, ok := l.cache.get(principal, key, fingerprint); ok {
			l.tel.add(l.tel.cache, 1, attrCacheResult.String("hit"))
			return Decision{Outcome: Replay, Response: resp}, nil
		}
		l.tel.add(l.tel.cache, 1, attrCacheResult.String("miss"))
	}
	if l.shards != nil {
		return l.beginSharded(ctx, principal, key, fingerprint, ttl)
	}
	return l.claimAt(ctx, l.single, nil, principal, key, fingerprint, ttl)
}

// claimAt runs round trip 1 at h, after guard (the ring guard, if any).
func (l *Ledger) claimAt(ctx context.Context, h *home, guard []d1client.Statement, principal, key, fingerprint string, ttl time.Duration) (Decision, error) {
	now := l.now()
	stmts := l.sql.begin(principal, key, fingerprint, ttl, now)
	if guard != nil {
		stmts = append(guard, stmts...)
	}
	queued, debt := time.Now(), l.debt(ttl)
	var sent time.Time
	res, err := h.db.Exec(ctx, stmts, d1client.Coalesce(), opClaim, d1client.Owes(debt), d1client.SentAt(&sent))
	if err != nil {
		debt.Pay()
		return Decision{}, fmt.Errorf("idem: claim: %w", err)
	}
	acquired := l.leaseFrom(queued, sent)
	d, err := l.decide(res[len(guard):], principal, key, fingerprint, acquired, ttl)
	if d.Outcome == Replay {
		l.cache.put(principal, key, fingerprint, d.Response, acquired.Add(d.retained))
	}
	if d.Reservation == nil {
		debt.Pay() // nothing to complete
		return d, err
	}
	d.Reservation.clockAcquired = now
	d.Reservation.ttl = ttl
	d.Reservation.home = h
	d.Reservation.debt = debt
	if d.Reservation.Takeover {
		l.tel.takeovers.Add(ctx, 1)
	}
	return d, err
}

// debt is what a claim owes the API budget, as d1client.Owes admits it:
// its completion's call, which can wait minCompletionWindow at least (see
// finish), and while the handler runs its heartbeats, every Heartbeat (scaled to ttl),
// each of which can wait until the lease would end. It is forgiven after
// MaxLease (when the handler's context is cancelled), a TTL and a
// completion's window.
func (l *Ledger) debt(ttl time.Duration) *budget.Debt { return budget.NewDebt(l.debtTerms(ttl)) }

// debtTerms are the terms of debt(ttl).
func (l *Ledger) debtTerms(ttl time.Duration) budget.Terms {
	t := budget.Terms{Wait: minCompletionWindow, Life: l.cfg.MaxLease + ttl + minCompletionWindow}
	if hb := l.heartbeatFor(ttl); hb > 0 {
		t.Every, t.EveryWait = hb, ttl-hb
	}
	return t
}

// decide maps round trip 1's results (the claim, the lookup) to the outcome.
func (l *Ledger) decide(res []d1client.Result, principal, key, fingerprint string, acquired time.Time, ttl time.Duration) (Decision, error) {
	if len(res[0].Rows) == 1 {
		var gen int64
		if err := res[0].Rows[0].Scan(&gen); err != nil {
			return Decision{}, fmt.Errorf("idem: claim result: %w", err)
		}
		return Decision{Outcome: Execute, Reservation: &Reservation{
			Principal: principal, Key: key, Fingerprint: fingerprint,
			Generation: gen, Takeover: gen > 1, acquired: acquired, renewed: new(atomic.Int64),
		}}, nil
	}
	if len(res[1].Rows) == 0 {
		return Decision{Outcome: Retry}, nil
	}
	var row storedRow
	if err := row.scan(res[1].Rows[0]); err != nil {
		return Decision{}, fmt.Errorf("idem: lookup result: %w", err)
	}
	return l.decideRow(&row, fingerprint, ttl)
}

// decideRow answers from an existing row that was not claimed, judged by ttl.
func (l *Ledger) decideRow(row *storedRow, fingerprint string, ttl time.Duration) (Decision, error) {
	switch {
	case row.fingerprint != fingerprint:
		return Decision{Outcome: Reused}, nil
	case row.status == StatusCompleted:
		resp, err := row.response()
		if err != nil {
			return Decision{}, err
		}
		retained := time.Duration(row.updatedAt-row.now)*time.Millisecond + l.cfg.Retention
		return Decision{Outcome: Replay, Response: resp, retained: retained}, nil
	default:
		return Decision{Outcome: InProgress, RetryAfter: l.retryAfter(row, ttl)}, nil
	}
}

// retryAfter says when a client should ask again about a pending row: when
// its owner is likely done (the time handlers typically take, less the
// owner's age), or, once the owner is older than that (it may have died),
// when a retry can take the key over (the rest of its lease). So an obeying
// client asks at most once more before the owner's lease runs out, never
// in a tight loop. The owner's age counts from its own claim: created_at for
// generation 1; a later generation's claim, a takeover, set updated_at
// (which renewals move on, so its age is then underestimated, and the wait
// long rather than short).
func (l *Ledger) retryAfter(row *storedRow, ttl time.Duration) time.Duration {
	claimed := row.createdAt
	if row.generation > 1 {
		claimed = max(row.createdAt, row.updatedAt)
	}
	age := time.Duration(row.now-claimed) * time.Millisecond
	// A takeover needs updated_at < now - TTL: a millisecond past the lease.
	lease := time.Duration(row.updatedAt-row.now)*time.Millisecond + ttl + time.Millisecond
	if done := l.handlerTime.estimate() - age; done > 0 {
		return min(max(done, minRetryAfter), lease)
	}
	return max(lease, time.Millisecond)
}

// durationEstimate is a smoothed duration, safe for concurrent use.
type durationEstimate struct{ ns atomic.Int64 }

func (e *durationEstimate) estimate() time.Duration {
	return cmp.Or(time.Duration(e.ns.Load()), defaultHandlerTime) // add stores at least 1
}

// add folds d in, with a weight of 1/8.
func (e *durationEstimate) add(d time.Duration) {
	for {
		old := e.ns.Load()
		next := int64(d)
		if old > 0 {
			next = old + (int64(d)-old)/8
		}
		if e.ns.CompareAndSwap(old, max(next, 1)) {
			return
		}
	}
}

// Completion reports what Complete did.
type Completion struct {
	Stored   bool     // the response is now the stored one; false: fenced out
	Response Response // what to send: the handler's response (no body for 204, 205, 304) or the sentinel
	Sentinel bool     // Response is the sentinel, with only the replayable headers, as a replay
}

// Complete runs round trip 2: it stores the response, fenced by generation
// and status (with a due sweep), retrying until the lease would expire. A
// response a replay could not reproduce (body over MaxStoredBody or not UTF-8,
// status outside 200-599) is stored as the spec's sentinel, 500 with no body.
// Fenced out, it logs and Stored is false. Send Completion.Response even on an error.
func (l *Ledger) Complete(ctx context.Context, r *Reservation, resp Response) (done Completion, err error) {
	return l.complete(ctx, r, resp, l.cfg.ReplayableHeaders)
}

// complete is Complete, storing the headers named in replayable.
func (l *Ledger) complete(ctx context.Context, r *Reservation, resp Response, replayable []string) (done Completion, err error) {
	defer l.completed(r, &done, &err)
	w := l.prepare(ctx, r, resp, replayable)
	h, err := l.homeOf(r)
	if err != nil {
		return w.done, fmt.Errorf("idem: completion: %w", err)
	}
	sent := time.Now()
	err = l.finish(ctx, h, r, []d1client.Statement{w.stmt}, 0, &w)
	l.remember(r, &w, sent, err)
	return w.done, err // w.done as finish left it
}

// remember keeps a stored completion, written no sooner than sent, in the
// replay cache, as a replay will read it.
func (l *Ledger) remember(r *Reservation, w *completionWrite, sent time.Time, err error) {
	if l.cache == nil || err != nil || !w.done.Stored {
		return
	}
	header, _ := decodeHeaders(&w.headers) // encoded by captureHeaders: it decodes
	resp := Response{Status: w.done.Response.Status, Header: header}
	if w.body != nil && !nullBodyStatus(resp.Status) {
		resp.Body = []byte(*w.body)
	}
	l.cache.put(r.Principal, r.Key, r.Fingerprint, &resp, sent.Add(l.cfg.Retention))
}

// completed counts a completion and measures the handler's time.
func (l *Ledger) completed(r *Reservation, done *Completion, err *error) {
	l.tel.add(l.tel.completions, 1, attrCompletionResult.String(writeResult(done.Stored, *err, resStored, resFencedOut)))
	if *err == nil && done.Stored && !r.acquired.IsZero() {
		l.handlerTime.add(time.Since(r.acquired))
	}
}

// completionWrite is one completion: the fenced UPDATE and what it stores.
type completionWrite struct {
	stmt    d1client.Statement
	body    *string
	headers string
	done    Completion
}

// prepare builds r's completion of resp, logging at ERROR a response that
// will be stored as the sentinel instead.
func (l *Ledger) prepare(ctx context.Context, r *Reservation, resp Response, replayable []string) completionWrite {
	stored, headersJSON, body, unstored := l.normalize(resp, replayable)
	if unstored != "" {
		l.log().LogAttrs(ctx, slog.LevelError, "idem: response not stored as given: the spec's sentinel (500, no body) is stored and answered instead, to this request and every replay",
			append(r.LogValue().Group(), slog.String("reason", unstored), slog.Int("status", resp.Status))...)
	}
	return completionWrite{
		stmt: l.sql.complete(r, stored.Status, body, headersJSON, l.now()),
		body: body, headers: headersJSON, done: Completion{Response: stored, Sentinel: body == nil},
	}
}

// finish sends a completion batch (and a due sweep), recording it in w.done.
func (l *Ledger) finish(ctx context.Context, h *home, r *Reservation, stmts []d1client.Statement, userStmts int, w *completionWrite) error {
	// Taking the completion's first call pays its debt; failing before, this does.
	defer r.debt.Pay()
	now := time.Now() // retries stop when the lease would expire, but get minCompletionWindow
	ctx, cancel, err := l.writeContext(ctx, r, now.Add(max(r.leaseStart().Add(l.ttl(r)).Sub(now), minCompletionWindow)))
	if err != nil {
		l.expired(ctx, r, "completion")
		return fmt.Errorf("idem: completion: %w", err)
	}
	defer cancel()
	sweep := h.sweepDue(l.cfg.SweepInterval)
	if sweep {
		stmts = append(stmts, l.sql.sweep(l.cfg.Retention, l.cfg.SweepBatch, l.now()))
	}
	// Coalesced even with the caller's statements: completions that share
	// calls are what the budget counts on. A fence guard that fails aborts
	// the whole shared call: the check (a read of the row) picks this
	// completion out in one more call, and what it read saves the lookup
	// below; a caller's statement that fails is found by halving the call.
	opts := []d1client.ExecOption{d1client.Idempotent(), d1client.RetryUntilDeadline(), d1client.Priority(),
		d1client.Coalesce(), d1client.Pays(r.debt), opComplete}
	var fenced atomic.Pointer[rowState]
	if userStmts > 0 {
		opts = append(opts, d1client.Check(l.completionLookup(r), func(res d1client.Result) bool {
			st, err := rowStateOf(res, r, w)
			if err == nil && st != rowPending {
				fenced.Store(&st)
			}
			return err != nil || st == rowPending
		}))
	}
	res, err := h.db.Exec(ctx, stmts, opts...)
	if sweep && err != nil {
		h.sweepAgain()
	} else if sweep {
		deleted := res[len(res)-1].Meta.Changes
		if deleted >= int64(l.cfg.SweepBatch) {
			h.sweepAgain() // a full batch: a backlog to clear
		}
		if deleted > 0 {
			l.tel.add(l.tel.swept, deleted, attrSweepSource.String("completion"))
		}
		res = res[:len(res)-1]
	}
	switch {
	case err == nil && len(res[len(res)-1].Rows) == 1:
		w.done.Stored = true
		return nil
	case err != nil && (userStmts == 0 || !errors.Is(err, d1client.ErrSQL)):
		return fmt.Errorf("idem: completion: %w", err)
	}
	// No row came back, or the fence guard or a caller's statement aborted the
	// batch: an earlier attempt whose answer was lost may have stored ours.
	st, lerr := rowOther, error(nil)
	if f := fenced.Load(); f != nil && err != nil {
		st = *f
	} else {
		st, lerr = l.completionState(ctx, h, r, w)
	}
	switch {
	case lerr != nil:
		return fmt.Errorf("idem: completion: checking the row after an empty answer: %w", lerr)
	case st == rowOurs:
		w.done.Stored = true
	case st == rowPending && err != nil:
		// The guard let the batch through: a caller's statement failed.
		return fmt.Errorf("idem: completion: %w", err)
	case st == rowPending:
		return errors.New("idem: completion: the fenced update matched no row, yet the reservation is still pending")
	default:
		l.log().LogAttrs(ctx, slog.LevelError, "idem: fenced out: a takeover superseded this reservation; the mutation may have run twice unless it is repeatable (raise the TTL above the slowest mutation)",
			append(r.LogValue().Group(), slog.String("write", "completion"))...)
	}
	return nil
}

// rowState is what a reservation's row holds after its completion.
type rowState int

const (
	rowOther   rowState = iota // another owner's, or gone
	rowOurs                    // completed at r's generation with w's response
	rowPending                 // still pending at r's generation
)

// completionState reads the row of r and says whose it is.
func (l *Ledger) completionState(ctx context.Context, h *home, r *Reservation, w *completionWrite) (rowState, error) {
	res, err := h.db.Exec(ctx, []d1client.Statement{l.completionLookup(r)}, d1client.Coalesce(), d1client.Priority(), opCheckCompletion)
	if err != nil {
		return rowOther, err
	}
	return rowStateOf(res[0], r, w)
}

// completionLookup reads the row of r for completionState.
func (l *Ledger) completionLookup(r *Reservation) d1client.Statement {
	return d1client.Statement{SQL: l.sql.completeLookup, Params: []any{r.Principal, r.Key}}
}

// rowStateOf says whose the row of r is, from completionLookup's result.
func rowStateOf(res d1client.Result, r *Reservation, w *completionWrite) (rowState, error) {
	if len(res.Rows) == 0 {
		return rowOther, nil
	}
	var row storedRow
	if err := res.Rows[0].Scan((*string)(&row.status), &row.generation, &row.responseStatus, &row.responseBody, &row.responseHeaders); err != nil {
		return rowOther, err
	}
	status, body, headers := row.responseStatus, row.responseBody, row.responseHeaders
	switch {
	case row.generation != r.Generation:
		return rowOther, nil
	case row.status == StatusPending:
		return rowPending, nil
	case status != nil && *status == int64(w.done.Response.Status) && headers != nil && *headers == w.headers &&
		(body == w.body || body != nil && w.body != nil && *body == *w.body):
		return rowOurs, nil
	}
	return rowOther, nil
}

// writeContext bounds ctx by deadline and by the last moment r's owner may write, the claim +
// Retention - TTL - RetentionMargin/2 by the monotonic clock and an injected Clock (then
// ErrReservationExpired): till then the sweep cannot delete the row (a write sets updated_at
// at most TTL + 1ms back) and restart the key at generation 1 before the write lands.
func (l *Ledger) writeContext(ctx context.Context, r *Reservation, deadline time.Time) (context.Context, context.CancelFunc, error) {
	window := l.cfg.Retention - l.cfg.TTL - RetentionMargin/2
	limit := r.acquired.Add(window)
	if l.cfg.Clock != nil && !r.clockAcquired.IsZero() {
		if d := time.Now().Add(r.clockAcquired.Add(window).Sub(l.cfg.Clock())); d.Before(limit) {
			limit = d
		}
	}
	if !time.Now().Before(limit) {
		return ctx, func() {}, ErrReservationExpired
	}
	if deadline.IsZero() || limit.Before(deadline) {
		deadline = limit
	}
	ctx, cancel := context.WithDeadline(ctx, deadline)
	return ctx, cancel, nil
}

func (l *Ledger) expired(ctx context.Context, r *Reservation, what string) {
	l.log().LogAttrs(ctx, slog.LevelError, "idem: reservation expired: its owner outlived the retention window, so its write was not sent (its row may have been swept and the key claimed again)",
		append(r.LogValue().Group(), slog.String("write", what), slog.Duration("retention", l.cfg.Retention))...)
}

// LogValue identifies the reservation without its principal or full key: principal_sha256 and
// key_sha256 (12 hex digits of SHA-256), the key's first characters, and the generation.
func (r *Reservation) LogValue() slog.Value {
	key := r.Key
	if len(key) > logKeyPrefix {
		key = key[:logKeyPrefix] + "…"
	}
	return slog.GroupValue(
		slog.String("principal_sha256", shortHash(r.Principal)),
		slog.String("key", key),
		slog.String("key_sha256", shortHash(r.Key)),
		slog.Int64("generation", r.Generation),
	)
}

func shortHash(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])[:hashPrefix]
}

// Release gives up a pending reservation, fenced, moving its row a generation on so the client's
// retry takes it over at once; it reports whether it released the row.
func (l *Ledger) Release(ctx context.Context, r *Reservation) (bool, error) {
	defer r.debt.Pay()
	stmt := l.sql.release(r.Principal, r.Key, r.Generation, l.ttl(r), releaseOwner, l.now())
	ok, err := l.fencedWrite(ctx, r, "release", stmt, opRelease, d1client.Pays(r.debt))
	if errors.Is(err, ErrReservationExpired) {
		l.expired(ctx, r, "release")
	}
	l.tel.add(l.tel.releases, 1, attrReleaseResult.String(writeResult(ok, err, resReleased, resNotHeld)))
	return ok, err
}

// fencedWrite sends stmt, fenced by r's generation, and reports if it matched.
func (l *Ledger) fencedWrite(ctx context.Context, r *Reservation, what string, stmt d1client.Statement, op ...d1client.ExecOption) (bool, error) {
	h, err := l.homeOf(r)
	if err != nil {
		return false, fmt.Errorf("idem: %s: %w", what, err)
	}
	ctx, cancel, err := l.writeContext(ctx, r, time.Time{})
	if err != nil {
		return false, fmt.Errorf("idem: %s: %w", what, err)
	}
	defer cancel()
	res, err := h.db.Exec(ctx, []d1client.Statement{stmt}, append(op, d1client.Idempotent(), d1client.Coalesce(), d1client.Priority())...)
	if err != nil {
		return false, fmt.Errorf("idem: %s: %w", what, err)
	}
	return len(res[0].Rows) == 1, nil
}

// Lookup reads a key's row without claiming it and says what Begin would
// answer but Execute: Replay, Reused, InProgress (any pending row) or Retry.
func (l *Ledger) Lookup(ctx context.Context, principal, key, fingerprint string) (Decision, error) {
	res, _, err := l.findRow(ctx, principal, []d1client.Statement{l.sql.lookupRow(principal, key, l.now())}, d1client.Coalesce(), opLookup)
	if err != nil {
		return Decision{}, fmt.Errorf("idem: lookup: %w", err)
	}
	return l.decide([]d1client.Result{{}, res[0]}, principal, key, fingerprint, time.Time{}, l.cfg.TTL)
}

// Renew extends a pending reservation's lease, fenced; false: the lease is lost.
func (l *Ledger) Renew(ctx context.Context, r *Reservation) (bool, error) {
	queued := time.Now()
	var sent time.Time
	ok, err := l.fencedWrite(ctx, r, "renew", l.sql.renew(r, l.now()), opRenew, d1client.SentAt(&sent))
	if ok && r.renewed != nil {
		r.renewed.Store(int64(l.leaseFrom(queued, sent).Sub(r.acquired)))
	}
	l.tel.add(l.tel.renewals, 1, attrRenewalResult.String(writeResult(ok, err, resRenewed, resNotHeld)))
	return ok, err
}

// leaseFrom is the earliest, by the monotonic clock, that a lease written
// by a call queued at queued and first sent at sent (zero: unknown) starts:
// with D1's clock, the send, since the row takes D1's time when the call
// runs, however long it waited for the budget or group commit; with an
// injected clock, queued, when the time it writes was read.
func (l *Ledger) leaseFrom(queued, sent time.Time) time.Time {
	if l.sql.injected || sent.IsZero() {
		return queued
	}
	return sent
}

// sweepDue reports whether the next completion at h carries a sweep, recording it.
func (h *home) sweepDue(interval time.Duration) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.lastSweep.IsZero() && time.Since(h.lastSweep) < interval {
		return false
	}
	h.lastSweep = time.Now()
	return true
}

// sweepAgain makes the next completion at h carry a sweep.
func (h *home) sweepAgain() {
	h.mu.Lock()
	h.lastSweep = time.Time{}
	h.mu.Unlock()
}

// now returns the injected clock's time, or zero with D1's clock.
func (l *Ledger) now() time.Time {
	if l.cfg.Clock == nil {
		return time.Time{}
	}
	return l.cfg.Clock()
}
