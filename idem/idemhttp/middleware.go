package idemhttp

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/idemclient"
	"github.com/d1idem/d1idem/internal/otelscope"
)

// HeaderKey is the request header carrying the idempotency key, and
// HeaderReplayed the response header marking a replay (Stripe's spelling):
// package idemclient's, the client half of the protocol.
const (
	HeaderKey      = idemclient.HeaderKey
	HeaderReplayed = idemclient.HeaderReplayed
)

// Error codes of the JSON bodies the middleware answers with, those of
// package idemclient (which documents each). The first five are the spec's;
// the rest cover what the spec leaves open.
const (
	CodeKeyRequired         = idemclient.CodeKeyRequired
	CodeKeyInvalid          = idemclient.CodeKeyInvalid
	CodeKeyReused           = idemclient.CodeKeyReused
	CodeKeyInProgress       = idemclient.CodeKeyInProgress
	CodeKeyRetry            = idemclient.CodeKeyRetry
	CodeUnauthenticated     = idemclient.CodeUnauthenticated
	CodePrincipalInvalid    = idemclient.CodePrincipalInvalid
	CodeBodyTooLarge        = idemclient.CodeBodyTooLarge
	CodeBodyUnreadable      = idemclient.CodeBodyUnreadable
	CodeLedgerUnavailable   = idemclient.CodeLedgerUnavailable
	CodeLedgerMisconfigured = idemclient.CodeLedgerMisconfigured
	CodeBudgetExhausted     = idemclient.CodeBudgetExhausted
	CodeLedgerBusy          = idemclient.CodeLedgerBusy
	CodeRecordUnreadable    = idemclient.CodeRecordUnreadable
	CodeMutationAbandoned   = idemclient.CodeMutationAbandoned
)

const (
	defaultMaxBodyBytes    = 1 << 20 // 1 MiB
	defaultTimeout         = 10 * time.Second
	maxBodyBytes           = 1 << 30
	maxTimeout             = 10 * time.Minute
	defaultUnavailableWait = time.Second     // Retry-After of a 503 when D1 gave none
	releaseTimeout         = 5 * time.Second // bound on a release made while unwinding
)

// Options configures the middleware. The zero value of every field but
// Principal means its default.
type Options struct {
	// Principal derives the authenticated caller from the request (an
	// account ID, an API key's owner), never from anything the client
	// chooses. An error or "" answers 401; a principal idem.ValidPrincipal
	// refuses answers 500 idempotency_principal_invalid. Required.
	Principal func(*http.Request) (string, error)
	// Methods are guarded (default POST, PUT, PATCH, DELETE); others pass.
	Methods []string
	// KeyOptional lets requests without an Idempotency-Key through,
	// unprotected, instead of answering 400 idempotency_key_required.
	KeyOptional bool
	// MaxBodyBytes caps the request body read for the fingerprint (413 over
	// it). 1 to 1 GiB; default 1 MiB.
	MaxBodyBytes int64
	// ReuseStatus is the status for a key reused with a different request:
	// 409 (the spec, the default) or 422 (the IETF Idempotency-Key draft).
	ReuseStatus int
	// Timeout bounds round trip 1, budget waits included; past it the answer
	// is 503 with Retry-After. 1ms to 10 minutes; default 10s.
	Timeout time.Duration

	// The options below go beyond the spec (docs/contract.md#11-options-beyond-the-spec);
	// left zero, the middleware answers as the spec does, byte for byte.

	// TTL, if set, replaces the ledger's Config.TTL for the requests this
	// middleware guards (idem.BeginOptions.TTL): 10ms up to Config.TTL, the
	// longest. Options per route are one middleware per route, on one ledger.
	TTL time.Duration
	// Key returns the request's idempotency key, in place of the
	// Idempotency-Key header: "" is a missing key, an error an invalid one
	// (400), and the key must pass idem.ValidKey. The body is read (up to
	// MaxBodyBytes) before Key runs, and r.Body is a fresh reader of it.
	Key func(r *http.Request) (string, error)
	// Fingerprint returns the bytes fingerprinted in place of the request
	// body (method, path and query and FingerprintHeaders stay); body is
	// the request's, which it must not modify. Its fingerprints are tagged,
	// never equal to the spec's: a Worker running the spec's code sees
	// such a key as reused. CanonicalJSON is one.
	Fingerprint func(r *http.Request, body []byte) []byte
	// Store reports whether a response with the handler's status is stored
	// (default: every one). A response it refuses is sent as the handler
	// writes it and its reservation released, so that a retry executes
	// again; its Tx statements are not committed, and if any were queued a
	// status under 400 is answered 500 idempotency_mutation_not_committed
	// instead, never a success for writes that did not happen.
	Store func(status int) bool
	// OnReplay, if set, runs before a replay is sent, with the response's
	// headers, which it may change (to add a header, say).
	OnReplay func(r *http.Request, header http.Header)
	// OnDecision, if set, runs once for each guarded request after it was
	// answered, with what the middleware did (for logs and metrics). It
	// never receives the principal or the key, only their digests.
	OnDecision func(ctx context.Context, e Event)
	// ProblemDetails answers the middleware's own errors as RFC 9457
	// application/problem+json (type, title, status, detail), keeping the
	// spec's "error" member and retry_after_ms.
	ProblemDetails bool
}

func (o Options) withDefaults() (Options, error) {
	if o.Principal == nil {
		return o, errors.New("idemhttp: Options.Principal is required: derive the principal from authentication")
	}
	if o.Methods == nil {
		o.Methods = []string{http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete}
	}
	for i, meth := range o.Methods {
		// net/http refuses a method that is not a token (and takes "" for GET).
		if _, err := http.NewRequest(meth, "/", nil); meth == "" || err != nil {
			return o, configErr(fmt.Sprintf("Options.Methods[%d]", i), fmt.Sprintf("%q", meth), "use an HTTP method")
		}
	}
	o.MaxBodyBytes = cmp.Or(o.MaxBodyBytes, defaultMaxBodyBytes)
	if o.MaxBodyBytes < 1 || o.MaxBodyBytes > maxBodyBytes {
		return o, configErr("Options.MaxBodyBytes", o.MaxBodyBytes, "use 1 to %d bytes", int64(maxBodyBytes))
	}
	o.Timeout = cmp.Or(o.Timeout, defaultTimeout)
	if o.Timeout < time.Millisecond || o.Timeout > maxTimeout {
		return o, configErr("Options.Timeout", o.Timeout, "use 1ms to %v", maxTimeout)
	}
	o.ReuseStatus = cmp.Or(o.ReuseStatus, http.StatusConflict)
	if o.ReuseStatus != http.StatusConflict && o.ReuseStatus != http.StatusUnprocessableEntity {
		return o, configErr("Options.ReuseStatus", o.ReuseStatus, "use 409 (the spec) or 422 (the IETF Idempotency-Key draft)")
	}
	if o.Store == nil {
		o.Store = storeAll
	}
	return o, nil
}

// storeAll is the spec's rule: every response is stored.
func storeAll(int) bool { return true }

// configErr is an invalid field of Options.
func configErr(field string, value any, want string, args ...any) error {
	return &idem.ConfigError{Field: field, Value: fmt.Sprint(value), Want: fmt.Sprintf(want, args...)}
}

// Guard is the middleware for one set of Options: the flow every adapter
// shares (net/http's New, contrib's gin and echo middleware), so that none
// has a state machine of its own. Safe for concurrent use.
type Guard struct {
	l       *idem.Ledger
	cfg     idem.Config // the ledger's, defaults filled in
	o       Options
	begin   idem.BeginOptions
	methods map[string]bool
	answers [numOutcomes]answer // answers, with Options applied

	tracer      trace.Tracer // no-ops unless the ledger's providers are set
	requests    metric.Float64Histogram
	outcomeSets [numOutcomes][]metric.RecordOption // built once: recording allocates nothing
}

// log returns the ledger's Config.Logger, else slog.Default() now.
func (m *Guard) log() *slog.Logger { return cmp.Or(m.cfg.Logger, slog.Default()) }

// New returns net/http middleware (for ServeMux, chi or gorilla/mux) guarding
// the handlers it wraps with the ledger, or an error naming an invalid option.
func New(l *idem.Ledger, opts Options) (func(http.Handler) http.Handler, error) {
	g, err := NewGuard(l, opts)
	if err != nil {
		return nil, err
	}
	return g.Wrap, nil
}

// NewGuard returns the middleware's flow for adapters to other frameworks
// (Guard.Serve), or an error naming an invalid option.
func NewGuard(l *idem.Ledger, opts Options) (*Guard, error) {
	if l == nil {
		return nil, errors.New("idemhttp: New needs a Ledger")
	}
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	begin := idem.BeginOptions{TTL: opts.TTL}
	if err := l.CheckBeginOptions(begin); err != nil {
		return nil, configErr("Options.TTL", opts.TTL, "%s", strings.TrimPrefix(err.(*idem.ConfigError).Want, "use "))
	}
	cfg := l.Config()
	m := &Guard{l: l, cfg: cfg, o: opts, begin: begin, methods: map[string]bool{}, answers: answers}
	for _, meth := range opts.Methods {
		m.methods[strings.ToUpper(meth)] = true
	}
	// In the ledger's scope; a histogram the provider refuses is its no-op.
	meter, tracer := otelscope.New(cfg.MeterProvider, cfg.TracerProvider, idem.ScopeName)
	m.tracer = tracer
	m.requests, _ = meter.Float64Histogram("d1idem.request.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of the requests the middleware guarded, by outcome."),
		metric.WithExplicitBucketBoundaries(otelscope.DurationBuckets...))
	for o := outExecute; o < numOutcomes; o++ {
		m.outcomeSets[o] = []metric.RecordOption{metric.WithAttributes(attribute.String("d1idem.outcome", answers[o].name))}
	}
	m.answers[outReused].status = opts.ReuseStatus
	m.answers[outTooLarge].message = fmt.Sprintf(answers[outTooLarge].message, opts.MaxBodyBytes)
	return m, nil
}

// Must is like New but panics if the options are invalid.
func Must(l *idem.Ledger, opts Options) func(http.Handler) http.Handler {
	mw, err := New(l, opts)
	if err != nil {
		panic(err)
	}
	return mw
}

// Wrap returns next guarded: the net/http middleware New returns.
func (m *Guard) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { m.Serve(w, r, next) })
}

// Serve answers one request: it calls next at most once, and reports
// whether it did. A request of a method not guarded, or without a key when
// KeyOptional is set, goes to next as it came. An executed request goes to
// next with a ResponseWriter that captures the response (Flush and Hijack
// through http.ResponseController, and Unwrap) and a request whose context
// carries the Tx; the response is written to w once it is stored. When
// Serve returns false it answered w itself (a replay, a refusal) and next
// must not run: an adapter whose framework runs the rest of a chain unless
// told (gin's Abort) tells it. A panic in next releases the reservation
// and is re-raised.
func (m *Guard) Serve(w http.ResponseWriter, r *http.Request, next http.Handler) (ran bool) {
	if !m.methods[strings.ToUpper(r.Method)] {
		next.ServeHTTP(w, r)
		return true
	}
	rt := requestTrace{start: time.Now()}
	ctx, span := m.tracer.Start(r.Context(), "d1idem.request")
	if span.IsRecording() {
		r = r.WithContext(ctx)
	}
	defer m.endRequest(r.Context(), span, &rt)
	rt.outcome = m.guard(w, r, next, &rt)
	return rt.ran
}

// resReleased is the d1idem.completion.result of a reservation given up.
const resReleased = "released"

// requestTrace is what the middleware learnt of a request, to record.
type requestTrace struct {
	start      time.Time
	outcome    outcome
	principal  string
	key        string
	res        *idem.Reservation
	completion string // what became of an executed request's response
	status     int    // the status sent, if known
	ran        bool   // next was called
}

// endRequest records a request's outcome and duration, ends its span and
// calls OnDecision. No attribute carries a principal, only its short
// SHA-256, as the logs do.
func (m *Guard) endRequest(ctx context.Context, span trace.Span, rt *requestTrace) {
	defer span.End()
	a := answers[rt.outcome]
	if rt.outcome != outNone {
		m.requests.Record(context.Background(), time.Since(rt.start).Seconds(), m.outcomeSets[rt.outcome]...)
	}
	if m.o.OnDecision != nil {
		m.o.OnDecision(ctx, rt.event())
	}
	if !span.IsRecording() {
		return
	}
	attrs := make([]attribute.KeyValue, 0, 5)
	if rt.outcome != outNone {
		attrs = append(attrs, attribute.String("d1idem.outcome", a.name))
	}
	if rt.principal != "" {
		attrs = append(attrs, attribute.String("d1idem.principal.sha256", shortHash(rt.principal)))
	}
	if r := rt.res; r != nil {
		attrs = append(attrs, attribute.Int64("d1idem.generation", r.Generation), attribute.Bool("d1idem.takeover", r.Takeover))
	}
	if rt.completion != "" {
		attrs = append(attrs, attribute.String("d1idem.completion.result", rt.completion))
	}
	span.SetAttributes(attrs...)
	if a.status >= 500 {
		span.SetStatus(codes.Error, a.name)
	}
}

// guard answers one request and returns how.
func (m *Guard) guard(w http.ResponseWriter, r *http.Request, next http.Handler, rt *requestTrace) outcome {
	principal, err := m.o.Principal(r)
	if err != nil || principal == "" {
		return m.refuse(w, rt, outUnauthenticated, 0)
	}
	if !idem.ValidPrincipal(principal) {
		// The server's bug, which a retry cannot fix. Never log the principal.
		why := "not valid UTF-8"
		if len(principal) > idem.MaxPrincipalLength {
			why = fmt.Sprintf("%d bytes, over the limit of %d", len(principal), idem.MaxPrincipalLength)
		}
		m.log().LogAttrs(r.Context(), slog.LevelWarn, "idem: Options.Principal returned a principal the ledger cannot hold; request refused",
			slog.String("error", fmt.Sprintf("%v: %s", idem.ErrInvalidPrincipal, why)), slog.Int("principal_bytes", len(principal)))
		return m.refuse(w, rt, outPrincipalInvalid, 0)
	}
	rt.principal = principal
	var body []byte
	var o outcome
	if m.o.Key != nil { // it may read the body
		if body, o = m.readBody(w, r, rt); o != outNone {
			return o
		}
	}
	key, o := m.key(w, r, rt)
	if m.o.Key != nil {
		r.Body = io.NopCloser(bytes.NewReader(body)) // Key may have read it
	}
	switch {
	case o != outNone:
		return o
	case key == "" && m.o.KeyOptional:
		rt.ran = true
		next.ServeHTTP(w, r)
		return outUnprotected
	case key == "":
		return m.refuse(w, rt, outKeyMissing, 0)
	case !idem.ValidKey(key):
		return m.refuse(w, rt, outKeyInvalid, 0)
	}
	rt.key = key
	if m.o.Key == nil {
		if body, o = m.readBody(w, r, rt); o != outNone {
			return o
		}
	}
	fp := m.fingerprint(r, body)

	bctx, cancel := context.WithTimeout(r.Context(), m.o.Timeout)
	dec, err := m.l.Begin(bctx, principal, key, fp, m.begin)
	cancel()
	if err != nil {
		return m.unavailable(w, r, rt, err)
	}
	if dec.Outcome != idem.Execute {
		return m.writeDecision(w, r, rt, dec)
	}
	rt.outcome, rt.res = outExecute, dec.Reservation // set now: the handler may panic
	m.execute(w, r, next, rt)
	return outExecute
}

// key returns the request's key, trimmed of HTTP whitespace as Fetch
// trims it, or the outcome of a refusal it answered.
func (m *Guard) key(w http.ResponseWriter, r *http.Request, rt *requestTrace) (string, outcome) {
	if m.o.Key != nil {
		key, err := m.o.Key(r)
		if err != nil {
			return "", m.refuse(w, rt, outKeyInvalid, 0)
		}
		return strings.Trim(key, "\t\n\r "), outNone
	}
	if len(r.Header.Values(HeaderKey)) > 1 {
		// Two fields are two keys: never merge them ("k1, k2") into one.
		m.writeAnswer(w, rt, twoKeys, 0)
		return "", outKeyInvalid
	}
	return strings.Trim(r.Header.Get(HeaderKey), "\t\n\r "), outNone
}

// readBody reads the request's body, up to MaxBodyBytes, and gives r a
// fresh reader of it, or answers a refusal and returns its outcome.
func (m *Guard) readBody(w http.ResponseWriter, r *http.Request, rt *requestTrace) ([]byte, outcome) {
	var body []byte
	if r.Body != nil { // a server's request always has one; a test's may not
		var err error
		if body, err = io.ReadAll(io.LimitReader(r.Body, m.o.MaxBodyBytes+1)); err != nil {
			return nil, m.refuse(w, rt, outBodyUnreadable, 0)
		}
	}
	if int64(len(body)) > m.o.MaxBodyBytes {
		return nil, m.refuse(w, rt, outTooLarge, 0)
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	return body, outNone
}

// customFingerprint tags the fingerprints of Options.Fingerprint: their
// SHA-256 input starts with it, which no spec input (starting with an HTTP
// method, a token) can.
const customFingerprint = "d1idem:fingerprint-body\n"

// fingerprint returns the request's fingerprint (docs/contract.md#3-fingerprint),
// or with Options.Fingerprint the tagged fingerprint of what it returns.
func (m *Guard) fingerprint(r *http.Request, body []byte) string {
	if m.o.Fingerprint != nil {
		body = m.o.Fingerprint(r, body)
	}
	fp, _ := idem.Fingerprint(r.Method, idem.PathAndQuery(r), r.Header, m.cfg.FingerprintHeaders, bytes.NewReader(body)) // hashing bytes cannot fail
	if m.o.Fingerprint == nil {
		return fp
	}
	sum := sha256.Sum256([]byte(customFingerprint + fp))
	return hex.EncodeToString(sum[:])
}

// unavailable answers a failed round trip 1: fail closed.
func (m *Guard) unavailable(w http.ResponseWriter, r *http.Request, rt *requestTrace, err error) outcome {
	wait := defaultUnavailableWait
	if de, ok := errors.AsType[*d1client.Error](err); ok && de.RetryAfter > 0 {
		wait = de.RetryAfter
	}
	switch {
	case errors.Is(err, idem.ErrUnreadableRecord):
		return m.refuse(w, rt, outRecordUnreadable, 0)
	case errors.Is(err, d1client.ErrBudget) || errors.Is(err, d1client.ErrRateLimited):
		return m.refuse(w, rt, outBudgetShed, wait)
	case errors.Is(err, d1client.ErrShed):
		return m.refuse(w, rt, outLedgerBusy, wait)
	case idem.Permanent(err):
		// A retry cannot succeed until an operator acts: no Retry-After.
		m.log().LogAttrs(r.Context(), slog.LevelError, "idem: ledger misconfigured; request refused", idem.ErrorAttrs(err)...)
		return m.refuse(w, rt, outLedgerMisconfigured, 0)
	}
	m.log().LogAttrs(r.Context(), slog.LevelError, "idem: ledger unavailable; request refused", idem.ErrorAttrs(err)...)
	return m.refuse(w, rt, outLedgerUnavailable, wait)
}

// execute runs the handler under the reservation's lease and stores its
// response, with its Tx statements, before sending it.
func (m *Guard) execute(w http.ResponseWriter, r *http.Request, next http.Handler, rt *requestTrace) {
	res, tx := rt.res, &Tx{}
	cw := &captureWriter{w: w, tx: tx, max: m.cfg.MaxStoredBody, store: m.o.Store}
	defer func() {
		// Hold has stopped the heartbeat: no renewal races the release.
		if v := recover(); v != nil {
			tx.finish()
			if rt.completion != resReleased {
				m.release(r, res, slog.LevelWarn, "the handler panicked")
			}
			rt.completion, rt.status = resReleased, 0
			panic(v)
		}
	}()
	rt.ran = true
	// The handler's context ends when the lease is lost, not when the client
	// goes away: a started mutation finishes, for the retry to replay.
	_ = m.l.Hold(context.WithoutCancel(r.Context()), res, func(ctx context.Context) error {
		next.ServeHTTP(cw, r.WithContext(context.WithValue(ctx, txKey{}, tx)))
		cw.end()
		return nil
	})
	stmts, refused := tx.finish()
	rt.status = cw.status

	if cw.passing() {
		m.unstored(r, rt, cw, len(stmts), refused)
		return
	}
	if cw.discard {
		// Store refused a success whose statements were queued: they are not
		// committed, and the client must not read a success.
		m.release(r, res, slog.LevelError, fmt.Sprintf("Options.Store refused status %d, and the handler's Tx statements were not committed", cw.status))
		rt.completion = resReleased
		clear(w.Header())
		m.writeAnswer(w, rt, txUnstored, 0)
		return
	}
	resp := idem.Response{Status: cmp.Or(cw.status, http.StatusOK), Header: w.Header(), Body: cw.body.Bytes()}
	cctx := context.WithoutCancel(r.Context()) // the mutation ran: store its response even if the client left
	var done idem.Completion
	var err error
	if len(stmts) > 0 {
		done, err = m.l.CompleteTx(cctx, res, resp, stmts)
	} else {
		done, err = m.l.Complete(cctx, res, resp)
	}
	rt.completion = completionResult(done, err)
	switch {
	case errors.Is(err, idem.ErrTxNotCommitted):
		m.log().LogAttrs(r.Context(), slog.LevelError, "idem: the handler's statements were not committed; reservation released",
			append(res.LogValue().Group(), idem.ErrorAttrs(err)...)...)
		clear(w.Header()) // the handler's headers describe what did not happen
		a, wait := txNotCommitted, time.Second
		if errors.Is(err, d1client.ErrSQL) || errors.Is(err, d1client.ErrInvalid) {
			a, wait = txFailed, 0 // the statements failed or could not be sent: so would a retry
		}
		m.writeAnswer(w, rt, a, wait)
		return
	case err != nil:
		m.log().LogAttrs(r.Context(), slog.LevelError, "idem: completion not stored; the response is sent, and a retry after the TTL will run the mutation again",
			append(res.LogValue().Group(), idem.ErrorAttrs(err)...)...)
	case !done.Stored && len(stmts) > 0:
		// Fenced out: the writes its response describes were aborted.
		m.answerFromLedger(w, r, rt, res)
		return
	}
	if done.Sentinel { // the stored headers and no body, as a replay will have
		clear(w.Header())
		maps.Copy(w.Header(), done.Response.Header)
	}
	// The replayable headers go out as stored, as every replay sends them.
	for _, name := range m.cfg.ReplayableHeaders {
		if len(w.Header().Values(name)) > 0 {
			w.Header().Set(name, idem.HeaderValue(w.Header(), name))
		}
	}
	rt.status = done.Response.Status
	writeResponse(w, done.Response.Status, done.Response.Body)
}

// unstored ends a response that went out unstored: streamed, hijacked, or
// refused by Options.Store. Its reservation is released, so that a retry
// runs the handler again.
func (m *Guard) unstored(r *http.Request, rt *requestTrace, cw *captureWriter, dropped, refused int) {
	why, level := "the handler streamed its response", slog.LevelWarn
	switch {
	case cw.hijacked:
		why = "the handler hijacked the connection"
	case cw.refusedStatus:
		why, level = fmt.Sprintf("Options.Store refused status %d", cw.status), slog.LevelInfo
	}
	m.release(r, rt.res, level, why)
	rt.completion = resReleased
	if cw.refusedStatus {
		// Its status is 400 or more when statements were queued (a success
		// is answered txUnstored instead): the client is told of no write.
		if dropped+refused > 0 {
			m.log().LogAttrs(r.Context(), slog.LevelWarn, "idem: the handler's Tx statements were not committed: Options.Store refused its response",
				append(rt.res.LogValue().Group(), slog.Int("status", cw.status), slog.Int("statements", dropped), slog.Int("refused_adds", refused))...)
		}
		return
	}
	if refused == 0 {
		return
	}
	m.log().LogAttrs(r.Context(), slog.LevelError, "idem: the handler added Tx statements after "+strings.TrimPrefix(why, "the handler ")+"; they were not committed, and the response is aborted",
		append(rt.res.LogValue().Group(), slog.Int("refused_adds", refused))...)
	if cw.streamed {
		panic(http.ErrAbortHandler) // the client must not take this response for a success
	}
}

// completionResult is a completion's d1idem.completion.result, as the ledger's.
func completionResult(done idem.Completion, err error) string {
	switch {
	case errors.Is(err, idem.ErrReservationExpired):
		return "expired" // never sent
	case err != nil:
		return "failed" // D1 not reached in time
	case done.Stored:
		return "stored"
	}
	return "fenced_out" // a takeover superseded the reservation
}

// answerFromLedger answers with what the ledger holds for the request's key.
func (m *Guard) answerFromLedger(w http.ResponseWriter, r *http.Request, rt *requestTrace, res *idem.Reservation) {
	clear(w.Header())
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), m.o.Timeout)
	defer cancel()
	dec, err := m.l.Lookup(ctx, res.Principal, res.Key, res.Fingerprint)
	if err != nil {
		m.unavailable(w, r, rt, err)
		return
	}
	if dec.Outcome != idem.Replay && dec.Outcome != idem.InProgress {
		dec.Outcome = idem.Retry
	}
	m.writeDecision(w, r, rt, dec)
}

// release gives up the reservation of a response not stored, and logs why.
func (m *Guard) release(r *http.Request, res *idem.Reservation, level slog.Level, why string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), releaseTimeout)
	defer cancel()
	released, err := m.l.Release(ctx, res)
	attrs := append(res.LogValue().Group(), slog.String("reason", why), slog.Bool("released", released))
	if err != nil {
		attrs, level = append(attrs, idem.ErrorAttrs(err)...), max(level, slog.LevelWarn)
	}
	m.log().LogAttrs(r.Context(), level, "idem: response not stored; reservation released so the client may retry", attrs...)
}

// writeResponse sends status and body.
func writeResponse(w http.ResponseWriter, status int, body []byte) {
	if nullBodyStatus(status) {
		w.WriteHeader(status)
		return
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// nullBodyStatus reports whether status never carries a body
// (docs/contract.md#6-responses).
func nullBodyStatus(status int) bool {
	return status == http.StatusNoContent || status == http.StatusResetContent || status == http.StatusNotModified
}

// outcome is how the middleware answered a guarded request, its
// d1idem.outcome (docs/observability.md).
type outcome uint8

const (
	outNone outcome = iota // not decided: the handler panicked
	outExecute
	outReplay
	outInProgress
	outReused
	outRetry
	outKeyMissing
	outKeyInvalid
	outUnauthenticated
	outPrincipalInvalid
	outTooLarge
	outBodyUnreadable
	outLedgerUnavailable
	outLedgerMisconfigured
	outBudgetShed
	outLedgerBusy
	outRecordUnreadable
	outUnprotected
	numOutcomes
)

// answer is an outcome's name (d1idem.outcome) and, if the middleware
// answers it itself, its status and JSON error body.
type answer struct {
	name          string
	status        int
	code, message string
}

// answers maps each outcome to its answer; Options set outReused's status
// and outTooLarge's limit.
var answers = [numOutcomes]answer{
	outExecute:             {name: "execute"},
	outReplay:              {name: "replay"},
	outUnprotected:         {name: "unprotected"},
	outInProgress:          {"in_progress", 409, CodeKeyInProgress, "A request with this Idempotency-Key is still being processed; retry after Retry-After seconds."},
	outReused:              {"reused", 0, CodeKeyReused, "This Idempotency-Key was already used for a different request."},
	outRetry:               {"retry", 409, CodeKeyRetry, "Retry the request."},
	outKeyMissing:          {"key_missing", 400, CodeKeyRequired, "This endpoint requires an Idempotency-Key header."},
	outKeyInvalid:          {"key_invalid", 400, CodeKeyInvalid, "Idempotency-Key must be 1-255 printable ASCII characters."},
	outUnauthenticated:     {"unauthenticated", 401, CodeUnauthenticated, "The request could not be authenticated."},
	outPrincipalInvalid:    {"principal_invalid", 500, CodePrincipalInvalid, fmt.Sprintf("The server derived an invalid principal for this request (not UTF-8, or over %d bytes).", idem.MaxPrincipalLength)},
	outTooLarge:            {"too_large", 413, CodeBodyTooLarge, "The request body exceeds %d bytes."},
	outBodyUnreadable:      {"body_unreadable", 400, CodeBodyUnreadable, "The request body could not be read."},
	outLedgerUnavailable:   {"ledger_unavailable", 503, CodeLedgerUnavailable, "The idempotency ledger is unavailable; retry later."},
	outLedgerMisconfigured: {"ledger_misconfigured", 500, CodeLedgerMisconfigured, "The idempotency ledger is misconfigured; the server's operators must fix it before this request can succeed."},
	outBudgetShed:          {"budget_shed", 503, CodeBudgetExhausted, "The idempotency ledger's request budget is spent; retry later."},
	outLedgerBusy:          {"ledger_busy", 503, CodeLedgerBusy, "The idempotency ledger has more requests waiting than it can answer in time; retry after Retry-After seconds."},
	outRecordUnreadable:    {"record_unreadable", 500, CodeRecordUnreadable, "The stored response for this Idempotency-Key cannot be read."},
}

// The answers that are not an outcome's own.
var (
	twoKeys        = answer{"", 400, CodeKeyInvalid, "Send exactly one Idempotency-Key header."}
	txFailed       = answer{"", 500, CodeMutationAbandoned, "The mutation failed and was not committed."}
	txNotCommitted = answer{"", 503, CodeMutationAbandoned, "The mutation could not be committed; retry the request."}
	txUnstored     = answer{"", 500, CodeMutationAbandoned, "The response was not stored, so the mutation was not committed."}
)

// decided maps the ledger's decisions other than Execute to outcomes.
var decided = [...]outcome{idem.Replay: outReplay, idem.Reused: outReused, idem.InProgress: outInProgress, idem.Retry: outRetry}

// writeDecision answers a decision of the ledger other than Execute.
func (m *Guard) writeDecision(w http.ResponseWriter, r *http.Request, rt *requestTrace, dec idem.Decision) outcome {
	if o := decided[dec.Outcome]; o != outReplay {
		return m.refuse(w, rt, o, dec.RetryAfter)
	}
	maps.Copy(w.Header(), dec.Response.Header)
	w.Header().Set(HeaderReplayed, "true")
	if m.o.OnReplay != nil {
		m.o.OnReplay(r, w.Header())
	}
	rt.status = dec.Response.Status
	writeResponse(w, dec.Response.Status, dec.Response.Body)
	return outReplay
}

// refuse answers outcome o with its error body and returns o.
func (m *Guard) refuse(w http.ResponseWriter, rt *requestTrace, o outcome, wait time.Duration) outcome {
	m.writeAnswer(w, rt, m.answers[o], wait)
	return o
}

// writeAnswer sends a's error body with wait, if positive, as Retry-After
// (whole seconds, rounded up; in ms in the body too for a key in progress):
// the spec's JSON, or with ProblemDetails RFC 9457's.
func (m *Guard) writeAnswer(w http.ResponseWriter, rt *requestTrace, a answer, wait time.Duration) {
	body := map[string]any{"error": a.code, "message": a.message}
	contentType := "application/json"
	if m.o.ProblemDetails {
		body, contentType = problem(a), problemContentType
	}
	if a.code == CodeKeyInProgress {
		body["retry_after_ms"] = wait.Milliseconds()
	}
	if wait > 0 {
		w.Header().Set("Retry-After", strconv.FormatInt(max(int64(math.Ceil(wait.Seconds())), 1), 10))
	}
	b, _ := json.Marshal(body)
	w.Header().Set("Content-Type", contentType)
	rt.status = a.status
	writeResponse(w, a.status, b)
}
