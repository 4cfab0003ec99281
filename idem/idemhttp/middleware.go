package idemhttp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/idem"
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
	CodeRecordUnreadable  = "idempotency_record_unreadable"
	CodeMutationAbandoned = "idempotency_mutation_not_committed"
)

const (
	defaultUnavailableWait = time.Second     // Retry-After of a 503 when D1 gave none
	releaseTimeout         = 5 * time.Second // bound on a release made while unwinding
)

// Defaults of Options.
const (
	DefaultMaxBodyBytes = 1 << 20 // 1 MiB
	DefaultTimeout      = 10 * time.Second
)

// Limits of Options, as Options documents them.
const (
	maxBodyBytes = 1 << 30
	maxTimeout   = 10 * time.Minute
)

// Options configures the middleware. The zero value of every field but
// Principal means its default.
type Options struct {
	// Principal derives the authenticated caller from the request: an
	// account ID, an API key's owner. It must come from authentication, never
	// from anything the client chooses. An error, or an empty principal,
	// answers 401 and the handler never runs; a principal that is not valid
	// UTF-8 or is over idem.MaxPrincipalLength bytes answers 500
	// idempotency_principal_invalid. Required.
	Principal func(*http.Request) (string, error)
	// Methods are the methods guarded; others pass straight through.
	// Default POST, PUT, PATCH, DELETE.
	Methods []string
	// KeyOptional lets requests without an Idempotency-Key through,
	// unprotected. By default a key is required (400 idempotency_key_required):
	// a client that expected protection must not get a silent mutation.
	KeyOptional bool
	// MaxBodyBytes caps the request body read for the fingerprint (413 over
	// it). 1 to 1 GiB; default 1 MiB.
	MaxBodyBytes int64
	// ReuseStatus is the status for a key reused with a different request:
	// 409 (the spec, the default) or 422 (the IETF Idempotency-Key draft).
	ReuseStatus int
	// Timeout bounds round trip 1, waiting for the D1 request budget
	// included; past it the answer is 503 with Retry-After. 1ms to 10
	// minutes; default 10s.
	Timeout time.Duration
	// Logger receives released reservations, panics and ledger failures;
	// nil uses the ledger's logger.
	Logger *slog.Logger
}

func (o Options) withDefaults() (Options, error) {
	if o.Principal == nil {
		return o, errors.New("idemhttp: Options.Principal is required: derive the principal from authentication")
	}
	if o.Methods == nil {
		o.Methods = []string{http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete}
	}
	for i, meth := range o.Methods {
		if !validToken(meth) {
			return o, configErr(fmt.Sprintf("Options.Methods[%d]", i), fmt.Sprintf("%q", meth), "use an HTTP method")
		}
	}
	if o.MaxBodyBytes == 0 {
		o.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if o.MaxBodyBytes < 1 || o.MaxBodyBytes > maxBodyBytes {
		return o, configErr("Options.MaxBodyBytes", o.MaxBodyBytes, "use 1 to %d bytes", int64(maxBodyBytes))
	}
	if o.Timeout == 0 {
		o.Timeout = DefaultTimeout
	}
	if o.Timeout < time.Millisecond || o.Timeout > maxTimeout {
		return o, configErr("Options.Timeout", o.Timeout, "use 1ms to %v", maxTimeout)
	}
	switch o.ReuseStatus {
	case 0:
		o.ReuseStatus = http.StatusConflict
	case http.StatusConflict, http.StatusUnprocessableEntity:
	default:
		return o, configErr("Options.ReuseStatus", o.ReuseStatus, "use 409 (the spec) or 422 (the IETF Idempotency-Key draft)")
	}
	return o, nil
}

// configErr is an invalid field of Options.
func configErr(field string, value any, want string, args ...any) error {
	return &idem.ConfigError{Field: field, Value: fmt.Sprint(value), Want: fmt.Sprintf(want, args...)}
}

// validToken reports whether s is an RFC 9110 token, as a method is.
func validToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}

type middleware struct {
	l       *idem.Ledger
	cfg     idem.Config // the ledger's, defaults filled in
	o       Options
	methods map[string]bool
	tel     *telemetry
}

// log returns Options.Logger, else the ledger's Config.Logger, else
// slog.Default() at the time of the call.
func (m *middleware) log() *slog.Logger {
	switch {
	case m.o.Logger != nil:
		return m.o.Logger
	case m.cfg.Logger != nil:
		return m.cfg.Logger
	}
	return slog.Default()
}

// New returns net/http middleware that guards the unsafe methods
// of the handlers it wraps with the ledger, or an error naming the invalid
// option. It works with net/http's ServeMux, chi and gorilla/mux alike.
//
// A guarded request's body is read once (the handler can still read
// r.Body) and fingerprinted; round trip 1 then decides. A replay, a reuse,
// a request in progress and a ledger failure are answered without running
// the handler; otherwise the handler runs under a context that is cancelled
// if the reservation's lease is lost, and its response is captured, stored
// by round trip 2, and then sent. It fails closed: when the ledger cannot be
// reached the handler never runs. The README documents every answer the
// middleware gives, and what happens when a handler streams, hijacks,
// panics or uses Tx.
//
// Its metrics and spans (docs/observability.md) go to the ledger's
// Config.MeterProvider and TracerProvider, under the ledger's scope
// (idem.ScopeName).
func New(l *idem.Ledger, opts Options) (func(http.Handler) http.Handler, error) {
	if l == nil {
		return nil, errors.New("idemhttp: New needs a Ledger")
	}
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	cfg := l.Config()
	m := &middleware{l: l, cfg: cfg, o: opts, methods: map[string]bool{}, tel: newTelemetry(cfg.MeterProvider, cfg.TracerProvider)}
	for _, meth := range opts.Methods {
		m.methods[strings.ToUpper(meth)] = true
	}
	return m.wrap, nil
}

// Must is like New but panics if the options are invalid. It simplifies
// initialization of global middleware stacks.
func Must(l *idem.Ledger, opts Options) func(http.Handler) http.Handler {
	mw, err := New(l, opts)
	if err != nil {
		panic(err)
	}
	return mw
}

func (m *middleware) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !m.methods[strings.ToUpper(r.Method)] {
			next.ServeHTTP(w, r)
			return
		}
		m.serve(w, r, next)
	})
}

// serve guards one request, in a span of its own (a child of the caller's
// span in r's context), and records its outcome.
func (m *middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	start := time.Now()
	ctx, span := m.tel.tracer.Start(r.Context(), requestSpan)
	if span.IsRecording() {
		r = r.WithContext(ctx)
	}
	var rt requestTrace
	defer m.tel.endRequest(span, &rt, start)
	rt.outcome = m.guard(w, r, next, &rt)
}

// guard is the middleware's work for one request; it returns how the
// request was answered.
func (m *middleware) guard(w http.ResponseWriter, r *http.Request, next http.Handler, rt *requestTrace) outcome {
	principal, err := m.o.Principal(r)
	if err != nil || principal == "" {
		writeError(w, http.StatusUnauthorized, CodeUnauthenticated, "The request could not be authenticated.", nil)
		return outUnauthenticated
	}
	if !idem.ValidPrincipal(principal) {
		m.principalInvalid(w, r, principal)
		return outPrincipalInvalid
	}
	rt.principal = principal
	keys := r.Header.Values(HeaderKey)
	if len(keys) > 1 {
		// Two fields are two keys: never merge them ("k1, k2") into one.
		writeError(w, http.StatusBadRequest, CodeKeyInvalid, "Send exactly one Idempotency-Key header.", nil)
		return outKeyInvalid
	}
	var key string
	if len(keys) == 1 {
		key = strings.Trim(keys[0], httpWhitespace)
	}
	if key == "" {
		if m.o.KeyOptional {
			next.ServeHTTP(w, r)
			return outUnprotected
		}
		writeError(w, http.StatusBadRequest, CodeKeyRequired, "This endpoint requires an Idempotency-Key header.", nil)
		return outKeyMissing
	}
	if !idem.ValidKey(key) {
		writeError(w, http.StatusBadRequest, CodeKeyInvalid, "Idempotency-Key must be 1-255 printable ASCII characters.", nil)
		return outKeyInvalid
	}
	var body []byte
	if r.Body != nil { // a server's request always has one; a test's may not
		if body, err = io.ReadAll(io.LimitReader(r.Body, m.o.MaxBodyBytes+1)); err != nil {
			writeError(w, http.StatusBadRequest, CodeBodyUnreadable, "The request body could not be read.", nil)
			return outBodyUnreadable
		}
	}
	if int64(len(body)) > m.o.MaxBodyBytes {
		writeError(w, http.StatusRequestEntityTooLarge, CodeBodyTooLarge,
			fmt.Sprintf("The request body exceeds %d bytes.", m.o.MaxBodyBytes), nil)
		return outTooLarge
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
	switch dec.Outcome {
	case idem.Replay:
		writeResponse(w, dec.Response, true)
		return outReplay
	case idem.Reused:
		writeError(w, m.o.ReuseStatus, CodeKeyReused, "This Idempotency-Key was already used for a different request.", nil)
		return outReused
	case idem.InProgress:
		writeInProgress(w, dec.RetryAfter)
		return outInProgress
	case idem.Retry:
		writeError(w, http.StatusConflict, CodeKeyRetry, "Retry the request.", nil)
		return outRetry
	}
	rt.outcome, rt.res = outExecute, dec.Reservation // set now: the handler may panic
	m.execute(w, r, next, rt)
	return outExecute
}

// unavailable answers a failed round trip 1: fail closed, with a
// Retry-After. It returns the outcome.
func (m *middleware) unavailable(w http.ResponseWriter, r *http.Request, err error) outcome {
	var de *d1client.Error
	wait := defaultUnavailableWait
	if errors.As(err, &de) && de.RetryAfter > 0 {
		wait = de.RetryAfter
	}
	h := http.Header{"Retry-After": {retryAfterSeconds(wait)}}
	switch {
	case errors.Is(err, idem.ErrUnreadableRecord):
		writeError(w, http.StatusInternalServerError, CodeRecordUnreadable, "The stored response for this Idempotency-Key cannot be read.", nil)
		return outRecordUnreadable
	case errors.Is(err, d1client.ErrBudget) || errors.Is(err, d1client.ErrRateLimited):
		writeError(w, http.StatusServiceUnavailable, CodeBudgetExhausted, "The idempotency ledger's request budget is spent; retry later.", h)
		return outBudgetShed
	}
	m.log().LogAttrs(r.Context(), slog.LevelError, "idem: ledger unavailable; request refused", errAttrs(err)...)
	writeError(w, http.StatusServiceUnavailable, CodeLedgerUnavailable, "The idempotency ledger is unavailable; retry later.", h)
	return outLedgerUnavailable
}

// principalInvalid answers a principal p the ledger cannot hold: the
// server derived it, so it is the server's bug, and a retry cannot help (no
// Retry-After). The log never carries the principal.
func (m *middleware) principalInvalid(w http.ResponseWriter, r *http.Request, p string) {
	why := "not valid UTF-8"
	if len(p) > idem.MaxPrincipalLength {
		why = fmt.Sprintf("%d bytes, over the limit of %d", len(p), idem.MaxPrincipalLength)
	}
	m.log().LogAttrs(r.Context(), slog.LevelWarn, "idem: Options.Principal returned a principal the ledger cannot hold; request refused",
		slog.String("error", fmt.Sprintf("%v: %s", idem.ErrInvalidPrincipal, why)), slog.Int("principal_bytes", len(p)))
	writeError(w, http.StatusInternalServerError, CodePrincipalInvalid,
		fmt.Sprintf("The server derived an invalid principal for this request (not UTF-8, or over %d bytes).", idem.MaxPrincipalLength), nil)
}

// errAttrs are the log attributes of a ledger error: the error, and the fix
// when it is known.
func errAttrs(err error) []slog.Attr {
	attrs := []slog.Attr{slog.String("error", err.Error())}
	if fix := idem.Remedy(err); fix != "" {
		attrs = append(attrs, slog.String("fix", fix))
	}
	return attrs
}

// execute runs the handler under the reservation's lease, captures its
// response, and stores it, with the handler's Tx statements, before it is
// sent.
func (m *middleware) execute(w http.ResponseWriter, r *http.Request, next http.Handler, rt *requestTrace) {
	res := rt.res
	tx := &Tx{}
	cw := &captureWriter{w: w, tx: tx, max: m.cfg.MaxStoredBody}

	released := false
	defer func() {
		// Hold has stopped the heartbeat by now: no renewal races the
		// release.
		if v := recover(); v != nil {
			tx.finish()
			if !released {
				m.release(r, res, "the handler panicked")
			}
			rt.completion = resReleased
			panic(v)
		}
	}()
	// The handler's context ends when the lease is lost or the handler
	// returns, not when the client goes away: a mutation that has started is
	// finished and its response stored, for the client's retry to replay.
	_ = m.l.Hold(context.WithoutCancel(r.Context()), res, func(ctx context.Context) error {
		next.ServeHTTP(cw, r.WithContext(withTx(ctx, tx)))
		return nil
	})
	stmts, refused := tx.finish()

	if cw.streamed || cw.hijacked {
		why := "the handler streamed its response"
		if cw.hijacked {
			why = "the handler hijacked the connection"
		}
		m.release(r, res, why)
		released = true
		rt.completion = resReleased
		if refused > 0 {
			m.log().LogAttrs(r.Context(), slog.LevelError, "idem: the handler added Tx statements after "+strings.TrimPrefix(why, "the handler ")+"; they were not committed, and the response is aborted",
				append(res.LogValue().Group(), slog.Int("refused_adds", refused))...)
			if cw.streamed {
				// The client must not take this response for a success.
				panic(http.ErrAbortHandler)
			}
		}
		return
	}
	resp := idem.Response{Status: cw.status, Header: w.Header(), Body: cw.body.Bytes()}
	if resp.Status == 0 {
		resp.Status = http.StatusOK
	}
	// The completion is written even if the client has gone away: the
	// mutation ran, and its response must be replayable.
	cctx := context.WithoutCancel(r.Context())
	var done idem.Completion
	var err error
	if len(stmts) > 0 {
		done, err = m.l.CompleteTx(cctx, res, resp, stmts)
	} else {
		done, err = m.l.Complete(cctx, res, resp)
	}
	rt.completion = completionResult(done, err)
	if err != nil {
		if errors.Is(err, idem.ErrTxNotCommitted) {
			m.log().LogAttrs(r.Context(), slog.LevelError, "idem: the handler's statements were not committed; reservation released",
				append(res.LogValue().Group(), errAttrs(err)...)...)
			resetHeader(w.Header(), nil) // the handler's headers describe what did not happen
			if errors.Is(err, d1client.ErrSQL) || errors.Is(err, d1client.ErrInvalid) {
				// Deterministic: the handler's own statements failed, or
				// d1client refused them before sending (a parameter type
				// it cannot send, several statements in one SQL text): a
				// retry would fail the same way.
				writeError(w, http.StatusInternalServerError, CodeMutationAbandoned,
					"The mutation failed and was not committed.", nil)
				return
			}
			writeError(w, http.StatusServiceUnavailable, CodeMutationAbandoned,
				"The mutation could not be committed; retry the request.", http.Header{"Retry-After": {"1"}})
			return
		}
		m.log().LogAttrs(r.Context(), slog.LevelError, "idem: completion not stored; the response is sent, and a retry after the TTL will run the mutation again",
			append(res.LogValue().Group(), errAttrs(err)...)...)
	}
	if err == nil && !done.Stored && len(stmts) > 0 {
		// Fenced out under transactional completion: the handler's writes
		// were aborted with the batch, so its response describes something
		// that did not happen. Answer with what the ledger holds instead.
		m.answerFromLedger(w, r, res)
		return
	}
	if done.Sentinel {
		// The spec's sentinel: the response could not be stored, so this
		// caller gets status 500 with the stored headers and no body, as a
		// replay will (even when the handler's own status was 500).
		resetHeader(w.Header(), done.Response.Header)
	}
	asStored(w.Header(), m.cfg.ReplayableHeaders)
	writeResponse(w, &idem.Response{Status: done.Response.Status, Body: done.Response.Body}, false)
}

// answerFromLedger answers a request whose own response must not be sent:
// the stored response when another owner completed the key, 409 in progress
// while one is still working on it.
func (m *middleware) answerFromLedger(w http.ResponseWriter, r *http.Request, res *idem.Reservation) {
	resetHeader(w.Header(), nil)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), m.o.Timeout)
	defer cancel()
	dec, err := m.l.Lookup(ctx, res.Principal, res.Key, res.Fingerprint)
	switch {
	case err != nil:
		m.unavailable(w, r, err)
	case dec.Outcome == idem.Replay:
		writeResponse(w, dec.Response, true)
	case dec.Outcome == idem.InProgress:
		writeInProgress(w, dec.RetryAfter)
	default:
		writeError(w, http.StatusConflict, CodeKeyRetry, "Retry the request.", nil)
	}
}

// asStored rewrites the replayable headers of h to the one value each is
// stored and replayed with (idem.HeaderValue): the fields joined, HTTP
// whitespace trimmed, decoded as UTF-8 as workerd decodes them. So the first
// response carries the same bytes as every replay: a Location of "/caf\xe9"
// goes out as "/caf\uFFFD" both times.
func asStored(h http.Header, names []string) {
	for _, name := range names {
		if len(h.Values(name)) > 0 {
			h.Set(name, idem.HeaderValue(h, name))
		}
	}
}

// resetHeader replaces every field of h with those of with.
func resetHeader(h, with http.Header) {
	for k := range h {
		delete(h, k)
	}
	for k, v := range with {
		h[k] = v
	}
}

// release gives up the reservation of a response that will not be stored,
// so the client may retry, and logs why.
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

// writeResponse sends a response: resp.Header's fields are added to those
// already on the writer, and replays are marked Idempotent-Replayed: true.
func writeResponse(w http.ResponseWriter, resp *idem.Response, replayed bool) {
	h := w.Header()
	for k, v := range resp.Header {
		h[k] = v
	}
	if replayed {
		h.Set(HeaderReplayed, "true")
	}
	if nullBodyStatus(resp.Status) {
		w.WriteHeader(resp.Status)
		return
	}
	h.Set("Content-Length", strconv.Itoa(len(resp.Body)))
	w.WriteHeader(resp.Status)
	_, _ = w.Write(resp.Body)
}

// writeInProgress is the spec's 409 for a pending key.
func writeInProgress(w http.ResponseWriter, retryAfter time.Duration) {
	writeJSON(w, http.StatusConflict, map[string]any{"error": CodeKeyInProgress,
		"message":        "A request with this Idempotency-Key is still being processed; retry after Retry-After seconds.",
		"retry_after_ms": retryAfter.Milliseconds()},
		http.Header{"Retry-After": {retryAfterSeconds(retryAfter)}})
}

func writeError(w http.ResponseWriter, status int, code, message string, h http.Header) {
	writeJSON(w, status, map[string]string{"error": code, "message": message}, h)
}

func writeJSON(w http.ResponseWriter, status int, body any, h http.Header) {
	b, _ := json.Marshal(body)
	for k, v := range h {
		w.Header()[k] = v
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// retryAfterSeconds is d as a Retry-After value: whole seconds, rounded
// up, at least 1.
func retryAfterSeconds(d time.Duration) string {
	s := int64(math.Ceil(d.Seconds()))
	if s < 1 {
		s = 1
	}
	return strconv.FormatInt(s, 10)
}

// nullBodyStatus reports whether status never carries a body
// (docs/contract.md#6-responses).
func nullBodyStatus(status int) bool {
	return status == http.StatusNoContent || status == http.StatusResetContent || status == http.StatusNotModified
}

// httpWhitespace is Fetch's HTTP whitespace, trimmed from the key as from
// every header value.
const httpWhitespace = "\t\n\r "
