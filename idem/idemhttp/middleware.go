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
	"github.com/d1idem/d1idem/internal/otelscope"
)

// HeaderKey is the request header carrying the idempotency key, and
// HeaderReplayed the response header marking a replay (Stripe's spelling).
const (
	HeaderKey      = "Idempotency-Key"
	HeaderReplayed = "Idempotent-Replayed"
)

// Error codes of the JSON bodies the middleware answers with. The first
// five are the spec's; the rest cover what the spec leaves open.
const (
	CodeKeyRequired       = "idempotency_key_required"
	CodeKeyInvalid        = "idempotency_key_invalid"
	CodeKeyReused         = "idempotency_key_reused"
	CodeKeyInProgress     = "idempotency_key_in_progress"
	CodeKeyRetry          = "idempotency_key_retry"
	CodeUnauthenticated   = "unauthenticated"
	CodePrincipalInvalid  = "idempotency_principal_invalid"
	CodeBodyTooLarge      = "request_body_too_large"
	CodeBodyUnreadable    = "request_body_unreadable"
	CodeLedgerUnavailable = "idempotency_ledger_unavailable"
	CodeBudgetExhausted   = "idempotency_budget_exhausted"
	CodeLedgerBusy        = "idempotency_ledger_busy"
	CodeRecordUnreadable  = "idempotency_record_unreadable"
	CodeMutationAbandoned = "idempotency_mutation_not_committed"
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
	return o, nil
}

// configErr is an invalid field of Options.
func configErr(field string, value any, want string, args ...any) error {
	return &idem.ConfigError{Field: field, Value: fmt.Sprint(value), Want: fmt.Sprintf(want, args...)}
}

type middleware struct {
	l       *idem.Ledger
	cfg     idem.Config // the ledger's, defaults filled in
	o       Options
	methods map[string]bool
	answers [numOutcomes]answer // answers, with Options applied

	tracer      trace.Tracer // no-ops unless the ledger's providers are set
	requests    metric.Float64Histogram
	outcomeSets [numOutcomes][]metric.RecordOption // built once: recording allocates nothing
}

// log returns the ledger's Config.Logger, else slog.Default() now.
func (m *middleware) log() *slog.Logger { return cmp.Or(m.cfg.Logger, slog.Default()) }

// New returns net/http middleware (for ServeMux, chi or gorilla/mux) guarding
// the handlers it wraps with the ledger, or an error naming an invalid option.
func New(l *idem.Ledger, opts Options) (func(http.Handler) http.Handler, error) {
	if l == nil {
		return nil, errors.New("idemhttp: New needs a Ledger")
	}
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	cfg := l.Config()
	m := &middleware{l: l, cfg: cfg, o: opts, methods: map[string]bool{}, answers: answers}
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
	return m.wrap, nil
}

// Must is like New but panics if the options are invalid.
func Must(l *idem.Ledger, opts Options) func(http.Handler) http.Handler {
	mw, err := New(l, opts)
	if err != nil {
		panic(err)
	}
	return mw
}

// wrap guards the requests of the guarded methods, each in its own span.
func (m *middleware) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !m.methods[strings.ToUpper(r.Method)] {
			next.ServeHTTP(w, r)
			return
		}
		rt := requestTrace{start: time.Now()}
		ctx, span := m.tracer.Start(r.Context(), "d1idem.request")
		if span.IsRecording() {
			r = r.WithContext(ctx)
		}
		defer m.endRequest(span, &rt)
		rt.outcome = m.guard(w, r, next, &rt)
	})
}

// resReleased is the d1idem.completion.result of a reservation given up.
const resReleased = "released"

// requestTrace is what the middleware learnt of a request, to record.
type requestTrace struct {
	start      time.Time
	outcome    outcome
	principal  string
	res        *idem.Reservation
	completion string // what became of an executed request's response
}

// endRequest records a request's outcome and duration and ends its span. No
// attribute carries a principal, only its short SHA-256, as the logs do.
func (m *middleware) endRequest(span trace.Span, rt *requestTrace) {
	defer span.End()
	a := answers[rt.outcome]
	if rt.outcome != outNone {
		m.requests.Record(context.Background(), time.Since(rt.start).Seconds(), m.outcomeSets[rt.outcome]...)
	}
	if !span.IsRecording() {
		return
	}
	attrs := make([]attribute.KeyValue, 0, 5)
	if rt.outcome != outNone {
		attrs = append(attrs, attribute.String("d1idem.outcome", a.name))
	}
	if rt.principal != "" {
		sum := sha256.Sum256([]byte(rt.principal))
		attrs = append(attrs, attribute.String("d1idem.principal.sha256", hex.EncodeToString(sum[:])[:12]))
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
func (m *middleware) guard(w http.ResponseWriter, r *http.Request, next http.Handler, rt *requestTrace) outcome {
	principal, err := m.o.Principal(r)
	if err != nil || principal == "" {
		return m.refuse(w, outUnauthenticated, 0)
	}
	if !idem.ValidPrincipal(principal) {
		// The server's bug, which a retry cannot fix. Never log the principal.
		why := "not valid UTF-8"
		if len(principal) > idem.MaxPrincipalLength {
			why = fmt.Sprintf("%d bytes, over the limit of %d", len(principal), idem.MaxPrincipalLength)
		}
		m.log().LogAttrs(r.Context(), slog.LevelWarn, "idem: Options.Principal returned a principal the ledger cannot hold; request refused",
			slog.String("error", fmt.Sprintf("%v: %s", idem.ErrInvalidPrincipal, why)), slog.Int("principal_bytes", len(principal)))
		return m.refuse(w, outPrincipalInvalid, 0)
	}
	rt.principal = principal
	if len(r.Header.Values(HeaderKey)) > 1 {
		// Two fields are two keys: never merge them ("k1, k2") into one.
		writeAnswer(w, twoKeys, 0)
		return outKeyInvalid
	}
	key := strings.Trim(r.Header.Get(HeaderKey), "\t\n\r ") // Fetch's HTTP whitespace
	switch {
	case key == "" && m.o.KeyOptional:
		next.ServeHTTP(w, r)
		return outUnprotected
	case key == "":
		return m.refuse(w, outKeyMissing, 0)
	case !idem.ValidKey(key):
		return m.refuse(w, outKeyInvalid, 0)
	}
	var body []byte
	if r.Body != nil { // a server's request always has one; a test's may not
		if body, err = io.ReadAll(io.LimitReader(r.Body, m.o.MaxBodyBytes+1)); err != nil {
			return m.refuse(w, outBodyUnreadable, 0)
		}
	}
	if int64(len(body)) > m.o.MaxBodyBytes {
		return m.refuse(w, outTooLarge, 0)
	}
	// One reader serves the fingerprint, then, rewound, the handler.
	br := bytes.NewReader(body)
	fp, _ := idem.Fingerprint(r.Method, idem.PathAndQuery(r), r.Header, m.cfg.FingerprintHeaders, br) // hashing bytes cannot fail
	br.Reset(body)
	r.Body = io.NopCloser(br)

	bctx, cancel := context.WithTimeout(r.Context(), m.o.Timeout)
	dec, err := m.l.Begin(bctx, principal, key, fp)
	cancel()
	if err != nil {
		return m.unavailable(w, r, err)
	}
	if dec.Outcome != idem.Execute {
		return m.writeDecision(w, dec)
	}
	rt.outcome, rt.res = outExecute, dec.Reservation // set now: the handler may panic
	m.execute(w, r, next, rt)
	return outExecute
}

// unavailable answers a failed round trip 1: fail closed.
func (m *middleware) unavailable(w http.ResponseWriter, r *http.Request, err error) outcome {
	wait := defaultUnavailableWait
	if de, ok := errors.AsType[*d1client.Error](err); ok && de.RetryAfter > 0 {
		wait = de.RetryAfter
	}
	switch {
	case errors.Is(err, idem.ErrUnreadableRecord):
		return m.refuse(w, outRecordUnreadable, 0)
	case errors.Is(err, d1client.ErrBudget) || errors.Is(err, d1client.ErrRateLimited):
		return m.refuse(w, outBudgetShed, wait)
	case errors.Is(err, d1client.ErrShed):
		return m.refuse(w, outLedgerBusy, wait)
	}
	m.log().LogAttrs(r.Context(), slog.LevelError, "idem: ledger unavailable; request refused", errAttrs(err)...)
	return m.refuse(w, outLedgerUnavailable, wait)
}

// errAttrs are the log attributes of a ledger error, with its fix if known.
func errAttrs(err error) []slog.Attr {
	attrs := []slog.Attr{slog.String("error", err.Error())}
	if fix := idem.Remedy(err); fix != "" {
		attrs = append(attrs, slog.String("fix", fix))
	}
	return attrs
}

// execute runs the handler under the reservation's lease and stores its
// response, with its Tx statements, before sending it.
func (m *middleware) execute(w http.ResponseWriter, r *http.Request, next http.Handler, rt *requestTrace) {
	res, tx := rt.res, &Tx{}
	cw := &captureWriter{w: w, tx: tx, max: m.cfg.MaxStoredBody}
	defer func() {
		// Hold has stopped the heartbeat: no renewal races the release.
		if v := recover(); v != nil {
			tx.finish()
			if rt.completion != resReleased {
				m.release(r, res, "the handler panicked")
			}
			rt.completion = resReleased
			panic(v)
		}
	}()
	// The handler's context ends when the lease is lost, not when the client
	// goes away: a started mutation finishes, for the retry to replay.
	_ = m.l.Hold(context.WithoutCancel(r.Context()), res, func(ctx context.Context) error {
		next.ServeHTTP(cw, r.WithContext(context.WithValue(ctx, txKey{}, tx)))
		return nil
	})
	stmts, refused := tx.finish()

	if cw.streamed || cw.hijacked {
		why := "streamed its response"
		if cw.hijacked {
			why = "hijacked the connection"
		}
		m.release(r, res, "the handler "+why)
		rt.completion = resReleased
		if refused > 0 {
			m.log().LogAttrs(r.Context(), slog.LevelError, "idem: the handler added Tx statements after "+why+"; they were not committed, and the response is aborted",
				append(res.LogValue().Group(), slog.Int("refused_adds", refused))...)
			if cw.streamed {
				panic(http.ErrAbortHandler) // the client must not take this response for a success
			}
		}
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
			append(res.LogValue().Group(), errAttrs(err)...)...)
		clear(w.Header()) // the handler's headers describe what did not happen
		a, wait := txNotCommitted, time.Second
		if errors.Is(err, d1client.ErrSQL) || errors.Is(err, d1client.ErrInvalid) {
			a, wait = txFailed, 0 // the statements failed or could not be sent: so would a retry
		}
		writeAnswer(w, a, wait)
		return
	case err != nil:
		m.log().LogAttrs(r.Context(), slog.LevelError, "idem: completion not stored; the response is sent, and a retry after the TTL will run the mutation again",
			append(res.LogValue().Group(), errAttrs(err)...)...)
	case !done.Stored && len(stmts) > 0:
		// Fenced out: the writes its response describes were aborted.
		m.answerFromLedger(w, r, res)
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
	writeResponse(w, done.Response.Status, done.Response.Body)
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
func (m *middleware) answerFromLedger(w http.ResponseWriter, r *http.Request, res *idem.Reservation) {
	clear(w.Header())
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), m.o.Timeout)
	defer cancel()
	dec, err := m.l.Lookup(ctx, res.Principal, res.Key, res.Fingerprint)
	if err != nil {
		m.unavailable(w, r, err)
		return
	}
	if dec.Outcome != idem.Replay && dec.Outcome != idem.InProgress {
		dec.Outcome = idem.Retry
	}
	m.writeDecision(w, dec)
}

// release gives up the reservation of a response not stored, and logs why.
func (m *middleware) release(r *http.Request, res *idem.Reservation, why string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), releaseTimeout)
	defer cancel()
	released, err := m.l.Release(ctx, res)
	attrs := append(res.LogValue().Group(), slog.String("reason", why), slog.Bool("released", released))
	if err != nil {
		attrs = append(attrs, slog.String("error", err.Error()))
	}
	m.log().LogAttrs(r.Context(), slog.LevelWarn, "idem: response not stored; reservation released so the client may retry", attrs...)
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
	outExecute:           {name: "execute"},
	outReplay:            {name: "replay"},
	outUnprotected:       {name: "unprotected"},
	outInProgress:        {"in_progress", 409, CodeKeyInProgress, "A request with this Idempotency-Key is still being processed; retry after Retry-After seconds."},
	outReused:            {"reused", 0, CodeKeyReused, "This Idempotency-Key was already used for a different request."},
	outRetry:             {"retry", 409, CodeKeyRetry, "Retry the request."},
	outKeyMissing:        {"key_missing", 400, CodeKeyRequired, "This endpoint requires an Idempotency-Key header."},
	outKeyInvalid:        {"key_invalid", 400, CodeKeyInvalid, "Idempotency-Key must be 1-255 printable ASCII characters."},
	outUnauthenticated:   {"unauthenticated", 401, CodeUnauthenticated, "The request could not be authenticated."},
	outPrincipalInvalid:  {"principal_invalid", 500, CodePrincipalInvalid, fmt.Sprintf("The server derived an invalid principal for this request (not UTF-8, or over %d bytes).", idem.MaxPrincipalLength)},
	outTooLarge:          {"too_large", 413, CodeBodyTooLarge, "The request body exceeds %d bytes."},
	outBodyUnreadable:    {"body_unreadable", 400, CodeBodyUnreadable, "The request body could not be read."},
	outLedgerUnavailable: {"ledger_unavailable", 503, CodeLedgerUnavailable, "The idempotency ledger is unavailable; retry later."},
	outBudgetShed:        {"budget_shed", 503, CodeBudgetExhausted, "The idempotency ledger's request budget is spent; retry later."},
	outLedgerBusy:        {"ledger_busy", 503, CodeLedgerBusy, "The idempotency ledger has more requests waiting than it can answer in time; retry after Retry-After seconds."},
	outRecordUnreadable:  {"record_unreadable", 500, CodeRecordUnreadable, "The stored response for this Idempotency-Key cannot be read."},
}

// The answers that are not an outcome's own.
var (
	twoKeys        = answer{"", 400, CodeKeyInvalid, "Send exactly one Idempotency-Key header."}
	txFailed       = answer{"", 500, CodeMutationAbandoned, "The mutation failed and was not committed."}
	txNotCommitted = answer{"", 503, CodeMutationAbandoned, "The mutation could not be committed; retry the request."}
)

// decided maps the ledger's decisions other than Execute to outcomes.
var decided = [...]outcome{idem.Replay: outReplay, idem.Reused: outReused, idem.InProgress: outInProgress, idem.Retry: outRetry}

// writeDecision answers a decision of the ledger other than Execute.
func (m *middleware) writeDecision(w http.ResponseWriter, dec idem.Decision) outcome {
	if o := decided[dec.Outcome]; o != outReplay {
		return m.refuse(w, o, dec.RetryAfter)
	}
	maps.Copy(w.Header(), dec.Response.Header)
	w.Header().Set(HeaderReplayed, "true")
	writeResponse(w, dec.Response.Status, dec.Response.Body)
	return outReplay
}

// refuse answers outcome o with its JSON error body and returns o.
func (m *middleware) refuse(w http.ResponseWriter, o outcome, wait time.Duration) outcome {
	writeAnswer(w, m.answers[o], wait)
	return o
}

// writeAnswer sends a's JSON error body with wait, if positive, as Retry-After
// (whole seconds, rounded up; in ms in the body too for a key in progress).
func writeAnswer(w http.ResponseWriter, a answer, wait time.Duration) {
	body := map[string]any{"error": a.code, "message": a.message}
	if a.code == CodeKeyInProgress {
		body["retry_after_ms"] = wait.Milliseconds()
	}
	if wait > 0 {
		w.Header().Set("Retry-After", strconv.FormatInt(max(int64(math.Ceil(wait.Seconds())), 1), 10))
	}
	b, _ := json.Marshal(body)
	w.Header().Set("Content-Type", "application/json")
	writeResponse(w, a.status, b)
}
