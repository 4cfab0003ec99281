package idem

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/d1idem/d1idem/d1client"
)

// Defaults, from the spec.
const (
	DefaultTTL           = 30 * time.Second // PENDING_TTL_MS
	DefaultRetention     = 24 * time.Hour   // RETENTION_MS
	DefaultSweepBatch    = 20               // SWEEP_BATCH_SIZE
	DefaultMaxStoredBody = 16_384           // RESPONSE_BODY_MAX_BYTES
	DefaultSweepInterval = time.Minute      // how often a completion carries a sweep
	DefaultMaxLease      = 10 * time.Minute // longest a heartbeat keeps a reservation alive
	defaultRenewFraction = 3                // heartbeat every TTL/3
	releaseTimeout       = 5 * time.Second  // bound on a release made while unwinding
	minCompletionWindow  = 2 * time.Second  // completion retries get at least this long
	logKeyPrefix         = 16               // characters of a key shown in logs
	hashPrefix           = 12               // hex digits of a SHA-256 shown in logs
	statusPending        = "pending"        // status strings of the spec
	statusCompleted      = "completed"      //
	d1Now                = "CAST(unixepoch('subsec') * 1000 AS INTEGER)"
)

// DefaultFingerprintHeaders and DefaultReplayableHeaders are the spec's
// FINGERPRINT_HEADERS and REPLAYABLE_HEADERS.
var (
	DefaultFingerprintHeaders = []string{"content-type", "x-api-version"}
	DefaultReplayableHeaders  = []string{"content-type", "location"}
)

// Config configures a Ledger. The zero value of every field means the
// spec's default.
type Config struct {
	// TTL is how long a pending reservation is presumed alive: after it, a
	// retry with the same fingerprint takes the reservation over. Set it well
	// above the slowest realistic mutation. Default 30 s.
	TTL time.Duration
	// Retention is how long any row is kept after its last update before the
	// sweep deletes it. It is the retention promised to clients. Default 24 h.
	Retention time.Duration
	// SweepBatch bounds the rows one sweep deletes. Default 20.
	SweepBatch int
	// SweepInterval is how often a completion carries a sweep; a sweep that
	// deletes a full batch keeps the next completion sweeping too, so a
	// backlog clears. Default 1 minute.
	SweepInterval time.Duration
	// MaxStoredBody caps the stored response body in bytes. A larger body is
	// stored as a null body with status 500, as the spec says. Default 16,384.
	MaxStoredBody int
	// FingerprintHeaders are the request headers that take part in the
	// fingerprint, lower-case, in order. Default content-type, x-api-version.
	FingerprintHeaders []string
	// ReplayableHeaders are the response headers stored and replayed,
	// lower-case, in order. Default content-type, location. set-cookie is
	// refused.
	ReplayableHeaders []string

	// Clock, if set, supplies the timestamps of claims, takeovers,
	// completions and sweeps, bound as parameters as the spec does with
	// Date.now(). When nil (the default), D1's own clock supplies them:
	// unixepoch('subsec')*1000 evaluated inside each statement. One clock for
	// every instance means a fast local clock can never take a reservation
	// over early, and a slow one never late. Inject a clock for tests, or to
	// share a ledger with Workers that run the spec's code unmodified (their
	// Date.now() is a local clock too).
	Clock func() time.Time

	// Heartbeat renews a reservation's lease while its handler runs (see
	// Lease). Default TTL/3; negative disables heartbeats.
	Heartbeat time.Duration
	// MaxLease bounds how long heartbeats keep one reservation alive: a
	// handler running longer loses its lease. Default 10 minutes.
	MaxLease time.Duration

	// Logger receives fenced-out completions, lost leases and sweep
	// failures. Logs carry short SHA-256 digests of principals and a
	// truncated key, never a full principal. nil discards.
	Logger *slog.Logger
}

func (c Config) withDefaults() (Config, error) {
	if c.TTL == 0 {
		c.TTL = DefaultTTL
	}
	if c.Retention == 0 {
		c.Retention = DefaultRetention
	}
	if c.SweepBatch == 0 {
		c.SweepBatch = DefaultSweepBatch
	}
	if c.SweepInterval == 0 {
		c.SweepInterval = DefaultSweepInterval
	}
	if c.MaxStoredBody == 0 {
		c.MaxStoredBody = DefaultMaxStoredBody
	}
	if c.FingerprintHeaders == nil {
		c.FingerprintHeaders = DefaultFingerprintHeaders
	}
	if c.ReplayableHeaders == nil {
		c.ReplayableHeaders = DefaultReplayableHeaders
	}
	if c.Heartbeat == 0 {
		c.Heartbeat = c.TTL / defaultRenewFraction
	}
	if c.MaxLease == 0 {
		c.MaxLease = DefaultMaxLease
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	switch {
	case c.TTL < time.Millisecond:
		return c, fmt.Errorf("idem: TTL %v must be at least 1ms", c.TTL)
	case c.Retention <= c.TTL:
		return c, fmt.Errorf("idem: retention %v must exceed the TTL %v", c.Retention, c.TTL)
	case c.SweepBatch < 0 || c.MaxStoredBody < 0 || c.SweepInterval < 0:
		return c, errors.New("idem: sweep batch, sweep interval and stored body cap must not be negative")
	case c.Heartbeat > 0 && c.Heartbeat >= c.TTL:
		return c, fmt.Errorf("idem: heartbeat %v must be shorter than the TTL %v", c.Heartbeat, c.TTL)
	}
	var err error
	if c.FingerprintHeaders, err = lowerNames(c.FingerprintHeaders); err != nil {
		return c, err
	}
	if c.ReplayableHeaders, err = lowerNames(c.ReplayableHeaders); err != nil {
		return c, err
	}
	for _, h := range c.ReplayableHeaders {
		if neverReplayed[h] {
			return c, fmt.Errorf("idem: header %q must never be replayed", h)
		}
	}
	return c, nil
}

// neverReplayed are response headers that are connection-scoped, computed
// per response, or unsafe to hand to another request.
var neverReplayed = map[string]bool{
	"set-cookie": true, "content-length": true, "transfer-encoding": true, "connection": true,
	"keep-alive": true, "date": true, "trailer": true, "upgrade": true, "idempotent-replayed": true,
}

func lowerNames(names []string) ([]string, error) {
	out := make([]string, len(names))
	for i, n := range names {
		n = strings.ToLower(strings.TrimSpace(n))
		if n == "" || strings.ContainsAny(n, " :\t\r\n") {
			return nil, fmt.Errorf("idem: %q is not a header name", names[i])
		}
		out[i] = n
	}
	return out, nil
}

// Ledger is the spec's claim-before-mutate idempotency ledger on D1. It is
// safe for concurrent use by many goroutines, and many Ledgers (in many
// processes, or Workers running the spec's code) may share one table.
//
// A first execution costs 2 D1 calls (Begin, Complete); a replay, a reuse or
// an in-progress answer costs 1 (Begin). With d1client's group commit
// (d1client.Coalesce), which the Ledger uses for every statement that cannot
// fail by design, concurrent requests share those calls. Completions,
// heartbeats and releases are d1client.Priority work: they go first when
// the API budget is scarce, on a reserve that new claims never take.
type Ledger struct {
	db  *d1client.Client
	cfg Config
	log *slog.Logger
	sql ledgerSQL

	mu        sync.Mutex
	lastSweep time.Time // when the last sweep was sent (monotonic)
	backlog   bool      // the last sweep deleted a full batch
}

// New returns a Ledger that keeps its rows in db. The table must exist: apply
// d1idem.Schema (the CLI's "schema apply" does).
func New(db *d1client.Client, cfg Config) (*Ledger, error) {
	if db == nil {
		return nil, errors.New("idem: nil D1 client")
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Ledger{db: db, cfg: cfg, log: cfg.Logger, sql: buildSQL(cfg.Clock != nil)}, nil
}

// Config returns the ledger's configuration with defaults filled in.
func (l *Ledger) Config() Config { return l.cfg }

// Outcome is the decision Begin reaches for a request.
type Outcome int

// The outcomes of Begin, exactly one per request.
const (
	// Execute: this request owns the reservation and must run the mutation,
	// then call Complete (or Release). Decision.Reservation is set.
	Execute Outcome = iota + 1
	// Replay: the key completed before; send Decision.Response, do not run
	// the mutation.
	Replay
	// Reused: the key was used for a different request (another
	// fingerprint); reject, never execute, never replay.
	Reused
	// InProgress: the key's reservation is pending and alive; answer 409
	// with Retry-After and do not execute.
	InProgress
	// Retry: the row vanished between the claim and the lookup; ask the
	// client to retry.
	Retry
)

func (o Outcome) String() string {
	switch o {
	case Execute:
		return "execute"
	case Replay:
		return "replay"
	case Reused:
		return "reused"
	case InProgress:
		return "in_progress"
	case Retry:
		return "retry"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// Decision is what Begin decided for one request.
type Decision struct {
	Outcome Outcome
	// Reservation is set for Execute.
	Reservation *Reservation
	// Response is set for Replay: the stored status, headers and body.
	Response *Response
	// RetryAfter is set for InProgress: the spec's PENDING_TTL.
	RetryAfter time.Duration
}

// Reservation is the right to execute one request's mutation: the
// principal's key at one generation of the fencing token.
type Reservation struct {
	Principal   string
	Key         string
	Fingerprint string
	Generation  int64
	// Takeover is true when this reservation took over a stale pending row
	// of an earlier owner (whose completion will be fenced out); false for a
	// fresh claim.
	Takeover bool

	acquired time.Time     // local monotonic time of the claim
	renewed  *atomic.Int64 // nanoseconds after acquired of the last renewal's start
}

// leaseStart returns when the reservation's current lease began, by the
// local monotonic clock: the claim, or the last successful renewal.
func (r *Reservation) leaseStart() time.Time {
	if r.renewed == nil {
		return r.acquired
	}
	return r.acquired.Add(time.Duration(r.renewed.Load()))
}

func (r *Reservation) markRenewed(at time.Time) {
	if r.renewed != nil {
		r.renewed.Store(int64(at.Sub(r.acquired)))
	}
}

// Response is an HTTP response as the ledger stores and replays it.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
}

// ErrNoPrincipal is returned for an empty principal. The principal must be
// derived by the server from authentication (an account ID, an API key's
// owner), never taken from the client: it is what keeps one account from
// replaying or blocking another's keys.
var ErrNoPrincipal = errors.New("idem: empty principal: derive it from the authenticated caller")

// ErrInvalidKey is returned for a key outside the spec's pattern.
var ErrInvalidKey = errors.New("idem: Idempotency-Key must be 1-255 printable ASCII characters")

// Begin runs round trip 1 of the request path: one D1 batch (one
// transaction) that claims the key, or takes over a stale pending
// reservation with the same fingerprint, and reads the row. It is
// equivalent to the spec's claim, lookup and takeover statements run in
// sequence, without the interleavings three calls would allow.
func (l *Ledger) Begin(ctx context.Context, principal, key, fingerprint string) (Decision, error) {
	switch {
	case principal == "":
		return Decision{}, ErrNoPrincipal
	case !ValidKey(key):
		return Decision{}, ErrInvalidKey
	case fingerprint == "":
		return Decision{}, errors.New("idem: empty fingerprint")
	}
	stmts := l.sql.begin(principal, key, fingerprint, l.cfg.TTL, l.now())
	acquired := time.Now()
	res, err := l.db.Exec(ctx, stmts, d1client.Coalesce())
	if err != nil {
		return Decision{}, fmt.Errorf("idem: claim: %w", err)
	}
	return l.decide(res, principal, key, fingerprint, acquired)
}

// decide maps round trip 1's results (upsert RETURNING generation, then the
// lookup) to the outcome.
func (l *Ledger) decide(res []d1client.Result, principal, key, fingerprint string, acquired time.Time) (Decision, error) {
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
	switch {
	case row.fingerprint != fingerprint:
		return Decision{Outcome: Reused}, nil
	case row.status == statusCompleted:
		resp, err := row.response()
		if err != nil {
			return Decision{}, err
		}
		return Decision{Outcome: Replay, Response: resp}, nil
	default:
		return Decision{Outcome: InProgress, RetryAfter: l.cfg.TTL}, nil
	}
}

// Completion reports what Complete did.
type Completion struct {
	// Stored is true when the row now holds this reservation's response.
	// False means the reservation was fenced out: a takeover superseded it
	// and another owner's response is (or will be) the canonical one.
	Stored bool
	// Response is what the spec gives this caller: the handler's response,
	// or status 500 with no body when the body could not be stored (over the
	// cap, or not valid UTF-8), with only the replayable headers in that
	// case. A 204, 205 or 304 carries no body.
	Response Response
}

// Complete runs round trip 2: the fenced completion, which stores the
// response only if the reservation's generation is still current and the row
// still pending, plus a bounded sweep when one is due.
//
// A completion that fails transiently is retried (it is safe: the write is
// fenced by generation and status) until it lands or the lease would expire.
// A fenced-out completion is logged and reported as Stored == false; it is
// never an error. An error means the ledger could not be reached in time; the
// caller should still send Completion.Response, which is always set.
func (l *Ledger) Complete(ctx context.Context, r *Reservation, resp Response) (Completion, error) {
	w := l.prepare(r, resp)
	return w.done, l.finish(ctx, r, []d1client.Statement{w.stmt}, 0, &w)
}

// completionWrite is one completion: the fenced UPDATE and what it stores.
type completionWrite struct {
	stmt    d1client.Statement
	status  int
	body    *string
	headers string
	done    Completion
}

func (l *Ledger) prepare(r *Reservation, resp Response) completionWrite {
	stored, headersJSON, body := l.normalize(resp)
	return completionWrite{
		stmt:   l.sql.complete(r, stored.Status, body, headersJSON, l.now()),
		status: stored.Status, body: body, headers: headersJSON,
		done: Completion{Response: stored},
	}
}

// finish sends a completion batch whose last statement is the fenced UPDATE
// (after the guard and the caller's statements, if any), with a sweep
// appended when one is due, and records the outcome in w.done.
func (l *Ledger) finish(ctx context.Context, r *Reservation, stmts []d1client.Statement, userStmts int, w *completionWrite) error {
	sweep := l.sweepDue()
	if sweep {
		stmts = append(stmts, l.sql.sweep(l.cfg.Retention, l.cfg.SweepBatch, l.now()))
	}
	ctx, cancel := context.WithDeadline(ctx, l.completionDeadline(r))
	defer cancel()
	opts := []d1client.ExecOption{d1client.Idempotent(), d1client.RetryUntilDeadline(), d1client.Priority()}
	if userStmts == 0 {
		opts = append(opts, d1client.Coalesce())
	}
	res, err := l.db.Exec(ctx, stmts, opts...)
	if err != nil {
		if sweep {
			l.sweepFailed()
		}
		if userStmts == 0 || !isFenceViolation(err) {
			return fmt.Errorf("idem: completion: %w", err)
		}
		// The guard aborted the batch, so nothing of it committed: either
		// a takeover fenced us out, or an earlier attempt of this very batch
		// landed before its answer was lost (and the retry's guard tripped).
	} else {
		if sweep {
			l.sweepDone(res[len(res)-1].Meta.Changes)
			res = res[:len(res)-1]
		}
		if len(res[len(res)-1].Rows) == 1 {
			w.done.Stored = true
			return nil
		}
	}
	// No row came back. The completion may still be ours, written by an
	// earlier attempt whose answer was lost: the row then holds exactly our
	// response at our generation.
	landed, lerr := l.holdsCompletion(ctx, r, w)
	if lerr != nil {
		return fmt.Errorf("idem: completion: checking the row after an empty answer: %w", lerr)
	}
	w.done.Stored = landed
	if !landed {
		l.fencedOut(ctx, r, "completion")
	}
	return nil
}

// holdsCompletion reports whether the row is completed at r's generation
// with exactly w's response.
func (l *Ledger) holdsCompletion(ctx context.Context, r *Reservation, w *completionWrite) (bool, error) {
	res, err := l.db.Exec(ctx, []d1client.Statement{l.sql.lookupCompletion(r)}, d1client.Coalesce(), d1client.Priority())
	if err != nil || len(res[0].Rows) == 0 {
		return false, err
	}
	var status string
	var gen int64
	var respStatus *int64
	var body, headers *string
	if err := res[0].Rows[0].Scan(&status, &gen, &respStatus, &body, &headers); err != nil {
		return false, err
	}
	return status == statusCompleted && gen == r.Generation &&
		respStatus != nil && *respStatus == int64(w.status) &&
		equalNullable(body, w.body) && headers != nil && *headers == w.headers, nil
}

func equalNullable(a, b *string) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

// completionDeadline is when completion retries stop: when the lease would
// expire (the claim or the last renewal, plus the TTL: a takeover may then
// legitimately happen), but never sooner than a short window after now.
func (l *Ledger) completionDeadline(r *Reservation) time.Time {
	deadline := r.leaseStart().Add(l.cfg.TTL)
	if min := time.Now().Add(minCompletionWindow); deadline.Before(min) {
		deadline = min
	}
	return deadline
}

func (l *Ledger) fencedOut(ctx context.Context, r *Reservation, what string) {
	l.log.LogAttrs(ctx, slog.LevelError, "idem: fenced out: a takeover superseded this reservation; the mutation may have run twice unless it is repeatable (raise the TTL above the slowest mutation)",
		append(logAttrs(r), slog.String("write", what))...)
}

// logAttrs identifies a reservation in logs without its principal or full
// key.
func logAttrs(r *Reservation) []slog.Attr {
	return []slog.Attr{
		slog.String("principal_sha256", shortHash(r.Principal)),
		slog.String("key", truncate(r.Key, logKeyPrefix)),
		slog.String("key_sha256", shortHash(r.Key)),
		slog.Int64("generation", r.Generation),
	}
}

func shortHash(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])[:hashPrefix]
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// Release gives up a pending reservation, fenced by generation and status,
// so the client may retry at once: the row moves one generation on and its
// lease is made stale (updated_at one millisecond past the TTL), so the
// client's retry of the same request takes it over immediately. It never
// touches a newer owner's row or a completed one, and it reports whether it
// released the row.
//
// The row is not deleted. A fresh claim would restart at generation 1, and an
// earlier owner superseded by a takeover may still hold generation 1: its
// completion would then pass the fence over the new claim's row. Moving the
// generation on keeps every generation of a key unique.
func (l *Ledger) Release(ctx context.Context, r *Reservation) (bool, error) {
	res, err := l.db.Exec(ctx, []d1client.Statement{l.sql.release(r, l.cfg.TTL, l.now())}, d1client.Idempotent(), d1client.Coalesce(), d1client.Priority())
	if err != nil {
		return false, fmt.Errorf("idem: release: %w", err)
	}
	return len(res[0].Rows) == 1, nil
}

// Lookup reads a key's row without claiming it and says what Begin would
// answer other than Execute: Replay (with the response), Reused,
// InProgress (for any pending row, stale or not) or Retry (no row). The
// middleware uses it to answer a request whose transactional completion was
// fenced out with what the ledger now holds.
func (l *Ledger) Lookup(ctx context.Context, principal, key, fingerprint string) (Decision, error) {
	res, err := l.db.Exec(ctx, []d1client.Statement{l.sql.lookupRow(principal, key)}, d1client.Coalesce())
	if err != nil {
		return Decision{}, fmt.Errorf("idem: lookup: %w", err)
	}
	return l.decide([]d1client.Result{{}, res[0]}, principal, key, fingerprint, time.Time{})
}

// Renew extends a pending reservation's lease (updated_at = now), fenced by
// generation and status. False means the lease is lost: the reservation was
// taken over, released or swept.
func (l *Ledger) Renew(ctx context.Context, r *Reservation) (bool, error) {
	start := time.Now()
	res, err := l.db.Exec(ctx, []d1client.Statement{l.sql.renew(r, l.now())}, d1client.Idempotent(), d1client.Coalesce(), d1client.Priority())
	if err != nil {
		return false, fmt.Errorf("idem: renew: %w", err)
	}
	renewed := len(res[0].Rows) == 1
	if renewed {
		r.markRenewed(start)
	}
	return renewed, nil
}

// Sweep deletes up to SweepBatch rows last updated more than Retention ago,
// through the spec's rowid subquery, and returns how many it deleted. The
// request path sweeps on its own; call Sweep for maintenance (the CLI's
// sweep command does).
func (l *Ledger) Sweep(ctx context.Context) (int64, error) {
	res, err := l.db.Exec(ctx, []d1client.Statement{l.sql.sweep(l.cfg.Retention, l.cfg.SweepBatch, l.now())}, d1client.Idempotent())
	if err != nil {
		return 0, fmt.Errorf("idem: sweep: %w", err)
	}
	return res[0].Meta.Changes, nil
}

// sweepDue reports whether the next completion should carry a sweep, and
// if so records that one is on its way.
func (l *Ledger) sweepDue() bool {
	if l.cfg.SweepBatch == 0 {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.backlog && !l.lastSweep.IsZero() && time.Since(l.lastSweep) < l.cfg.SweepInterval {
		return false
	}
	l.lastSweep = time.Now()
	l.backlog = false
	return true
}

func (l *Ledger) sweepDone(deleted int64) {
	if deleted >= int64(l.cfg.SweepBatch) {
		l.mu.Lock()
		l.backlog = true
		l.mu.Unlock()
	}
}

func (l *Ledger) sweepFailed() {
	l.mu.Lock()
	l.lastSweep = time.Time{}
	l.mu.Unlock()
}

// now returns the injected clock's time, or the zero time when D1's clock
// is used.
func (l *Ledger) now() time.Time {
	if l.cfg.Clock == nil {
		return time.Time{}
	}
	return l.cfg.Clock()
}
