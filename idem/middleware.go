package idem

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/d1idem/d1idem/d1client"
)

// HeaderKey is the request header carrying the idempotency key, and
// HeaderReplayed the response header marking a replay (Stripe's spelling).
const (
	HeaderKey      = "Idempotency-Key"
	HeaderReplayed = "Idempotent-Replayed"
)

// DefaultMaxBodyBytes caps the request body the middleware reads (1 MiB).
const DefaultMaxBodyBytes = 1 << 20

// Error codes of the JSON bodies the middleware answers with. The first
// five are the spec's; the rest cover what the spec leaves open.
const (
	CodeKeyRequired        = "idempotency_key_required"
	CodeKeyInvalid         = "idempotency_key_invalid"
	CodeKeyReused          = "idempotency_key_reused"
	CodeKeyInProgress      = "idempotency_key_in_progress"
	CodeKeyRetry           = "idempotency_key_retry"
	CodeUnauthenticated    = "unauthenticated"
	CodeBodyTooLarge       = "request_body_too_large"
	CodeBodyUnreadable     = "request_body_unreadable"
	CodeLedgerUnavailable  = "idempotency_ledger_unavailable"
	CodeBudgetExhausted    = "idempotency_budget_exhausted"
	CodeRecordUnreadable   = "idempotency_record_unreadable"
	CodeMutationAbandoned  = "idempotency_mutation_not_committed"
	defaultUnavailableWait = time.Second
)

// Options configures the middleware.
type Options struct {
	// Principal derives the authenticated caller from the request: an
	// account ID, an API key's owner. It must come from authentication, never
	// from anything the client chooses. An error, or an empty principal,
	// answers 401 and the handler never runs. Required.
	Principal func(*http.Request) (string, error)
	// Methods are the methods guarded; others pass straight through.
	// Default POST, PUT, PATCH, DELETE.
	Methods []string
	// KeyOptional lets requests without an Idempotency-Key through,
	// unprotected. By default a key is required (400 idempotency_key_required):
	// a client that expected protection must not get a silent mutation.
	KeyOptional bool
	// MaxBodyBytes caps the request body read for the fingerprint (413 over
	// it). Default 1 MiB.
	MaxBodyBytes int64
	// ReuseStatus is the status for a key reused with a different request.
	// Default 409, as the spec says; 422 conforms to the IETF
	// Idempotency-Key draft.
	ReuseStatus int
	// Timeout bounds round trip 1, waiting for the D1 request budget
	// included; past it the answer is 503 with Retry-After. Default 10 s.
	Timeout time.Duration
	// Logger receives released reservations, panics and ledger failures;
	// nil uses the ledger's logger.
	Logger *slog.Logger
}

// DefaultTimeout bounds round trip 1 in the middleware.
const DefaultTimeout = 10 * time.Second

type middleware struct {
	l       *Ledger
	o       Options
	log     *slog.Logger
	methods map[string]bool
}

// Middleware returns net/http middleware that guards unsafe methods with the
// ledger: it works with net/http's ServeMux, chi and gorilla/mux alike. It
// panics if opts are invalid (a nil Principal, an unknown ReuseStatus), as a
// programming error found at start-up; use NewMiddleware to get an error.
//
// For each guarded request it validates the key, reads the body once (the
// handler can still read r.Body), fingerprints the request, and runs round
// trip 1. A replay, a reuse, a request in progress and a ledger failure are
// answered without running the handler. Otherwise the handler runs under a
// context that is cancelled if the reservation's lease is lost (not when the
// client goes away: a mutation that started is finished, and its response
// stored for the retry); its response is captured, stored by round trip 2,
// and then sent. When a transactional completion (Tx) is fenced out, the
// handler's writes were aborted, so its response is not sent: the request
// is answered with what the ledger holds (the other owner's stored response,
// or 409 in progress).
//
// Responses the middleware itself produces:
//
//	400 idempotency_key_required   no Idempotency-Key (unless KeyOptional)
//	400 idempotency_key_invalid    not 1-255 printable ASCII characters
//	400 request_body_unreadable    the body could not be read
//	401 unauthenticated            Principal failed or returned ""
//	409 idempotency_key_reused     same key, different request (ReuseStatus: 409 or 422)
//	409 idempotency_key_in_progress the first request is still running; Retry-After, retry_after_ms
//	409 idempotency_key_retry      the row vanished mid-claim; retry
//	413 request_body_too_large     the body exceeds MaxBodyBytes
//	500 idempotency_record_unreadable the stored response cannot be decoded
//	503 idempotency_ledger_unavailable D1 cannot be reached; Retry-After
//	503 idempotency_budget_exhausted the D1 request budget is spent; Retry-After
//	(replay)                       the stored status, headers, body, and Idempotent-Replayed: true
//
// Fails closed: when the ledger is unreachable the handler never runs.
//
// Streaming and hijacking: a handler that flushes (http.Flusher or
// http.ResponseController) or hijacks the connection cannot have its
// response stored and replayed. Its response goes out as it is written,
// nothing is stored, and the reservation is released (see Ledger.Release:
// fenced by generation, the generation moves on and the lease is made
// stale; a log line says so), so a retry executes again.
//
// Panics: when the handler panics, the reservation is released at once
// (fenced, so a newer owner's row is never touched) and the panic is
// re-raised. A handler that must give up without a response (its lease was
// lost, say) can panic with http.ErrAbortHandler. Leaving it for a TTL takeover, as the spec's Worker implicitly
// does, would not prevent re-execution, only delay it: after the TTL any
// retry runs the mutation again anyway. Releasing lets the client retry
// without waiting for a lease that nobody holds. Mutations kept in D1 and
// committed through the transactional completion (see Tx) cannot have
// happened when the handler panicked, so for them a retry is exactly right.
func Middleware(l *Ledger, opts Options) func(http.Handler) http.Handler {
	mw, err := NewMiddleware(l, opts)
	if err != nil {
		panic(err)
	}
	return mw
}

// NewMiddleware is Middleware returning invalid options as an error.
func NewMiddleware(l *Ledger, opts Options) (func(http.Handler) http.Handler, error) {
	if l == nil {
		return nil, errors.New("idem: Middleware needs a Ledger")
	}
	if opts.Principal == nil {
		return nil, errors.New("idem: Options.Principal is required: derive the principal from authentication")
	}
	if opts.Methods == nil {
		opts.Methods = []string{http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete}
	}
	if opts.MaxBodyBytes == 0 {
		opts.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if opts.Timeout == 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.MaxBodyBytes < 0 || opts.Timeout < 0 {
		return nil, errors.New("idem: Options.MaxBodyBytes and Options.Timeout must not be negative")
	}
	switch opts.ReuseStatus {
	case 0:
		opts.ReuseStatus = http.StatusConflict
	case http.StatusConflict, http.StatusUnprocessableEntity, http.StatusBadRequest:
	default:
		return nil, fmt.Errorf("idem: Options.ReuseStatus %d: use 409 (the spec) or 422 (the IETF draft)", opts.ReuseStatus)
	}
	m := &middleware{l: l, o: opts, log: opts.Logger, methods: map[string]bool{}}
	if m.log == nil {
		m.log = l.log
	}
	for _, meth := range opts.Methods {
		m.methods[strings.ToUpper(meth)] = true
	}
	return m.wrap, nil
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

func (m *middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	principal, err := m.o.Principal(r)
	if err != nil || principal == "" {
		writeError(w, http.StatusUnauthorized, CodeUnauthenticated, "The request could not be authenticated.", nil)
		return
	}
	key := HeaderValue(r.Header, HeaderKey)
	if key == "" {
		if m.o.KeyOptional {
			next.ServeHTTP(w, r)
			return
		}
		writeError(w, http.StatusBadRequest, CodeKeyRequired, "This endpoint requires an Idempotency-Key header.", nil)
		return
	}
	if !ValidKey(key) {
		writeError(w, http.StatusBadRequest, CodeKeyInvalid, "Idempotency-Key must be 1-255 printable ASCII characters.", nil)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, m.o.MaxBodyBytes+1))
	if err != nil {
		writeError(w, http.StatusBadRequest, CodeBodyUnreadable, "The request body could not be read.", nil)
		return
	}
	if int64(len(body)) > m.o.MaxBodyBytes {
		writeError(w, http.StatusRequestEntityTooLarge, CodeBodyTooLarge,
			fmt.Sprintf("The request body exceeds %d bytes.", m.o.MaxBodyBytes), nil)
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	fp := fingerprintBytes(r.Method, PathAndQuery(r), r.Header, m.l.cfg.FingerprintHeaders, body)

	bctx, cancel := context.WithTimeout(r.Context(), m.o.Timeout)
	dec, err := m.l.Begin(bctx, principal, key, fp)
	cancel()
	if err != nil {
		m.unavailable(w, r, err)
		return
	}
	switch dec.Outcome {
	case Replay:
		writeResponse(w, dec.Response, true)
	case Reused:
		writeError(w, m.o.ReuseStatus, CodeKeyReused, "This Idempotency-Key was already used for a different request.", nil)
	case InProgress:
		writeInProgress(w, dec.RetryAfter)
	case Retry:
		writeError(w, http.StatusConflict, CodeKeyRetry, "Retry the request.", nil)
	case Execute:
		m.execute(w, r, next, dec.Reservation)
	}
}

// unavailable answers a failed round trip 1: fail closed, with a Retry-After.
func (m *middleware) unavailable(w http.ResponseWriter, r *http.Request, err error) {
	var de *d1client.Error
	wait := defaultUnavailableWait
	if errors.As(err, &de) && de.RetryAfter > 0 {
		wait = de.RetryAfter
	}
	h := http.Header{"Retry-After": {retryAfterSeconds(wait)}}
	switch {
	case errors.Is(err, ErrUnreadableRecord):
		writeError(w, http.StatusInternalServerError, CodeRecordUnreadable, "The stored response for this Idempotency-Key cannot be read.", nil)
	case errors.Is(err, d1client.ErrBudget) || errors.Is(err, d1client.ErrRateLimited):
		writeError(w, http.StatusServiceUnavailable, CodeBudgetExhausted, "The idempotency ledger's request budget is spent; retry later.", h)
	default:
		m.log.LogAttrs(r.Context(), slog.LevelError, "idem: ledger unavailable; request refused", slog.String("error", err.Error()))
		writeError(w, http.StatusServiceUnavailable, CodeLedgerUnavailable, "The idempotency ledger is unavailable; retry later.", h)
	}
}

func (m *middleware) execute(w http.ResponseWriter, r *http.Request, next http.Handler, res *Reservation) {
	// The handler's context ends when the lease is lost or the handler
	// returns, not when the client goes away: a mutation that has started is
	// finished and its response stored, for the client's retry to replay.
	lease := m.l.hold(context.WithoutCancel(r.Context()), res)
	defer lease.stop()
	tx := &Tx{}
	ctx := withTx(lease.ctx, tx)
	cw := &captureWriter{w: w, max: m.l.cfg.MaxStoredBody}

	defer func() {
		if v := recover(); v != nil {
			lease.stop()
			m.release(r, res, "the handler panicked")
			panic(v)
		}
	}()
	next.ServeHTTP(cw, r.WithContext(ctx))
	lease.stop()

	if cw.streamed || cw.hijacked {
		why := "the handler streamed its response"
		if cw.hijacked {
			why = "the handler hijacked the connection"
		}
		m.release(r, res, why)
		return
	}
	resp := Response{Status: cw.status, Header: w.Header(), Body: cw.body.Bytes()}
	if resp.Status == 0 {
		resp.Status = http.StatusOK
	}
	// The completion is written even if the client has gone away: the
	// mutation ran, and its response must be replayable.
	cctx := context.WithoutCancel(r.Context())
	var done Completion
	var err error
	stmts := tx.statements()
	if len(stmts) > 0 {
		done, err = m.l.CompleteTx(cctx, res, resp, stmts)
	} else {
		done, err = m.l.Complete(cctx, res, resp)
	}
	if err != nil {
		if errors.Is(err, ErrTxNotCommitted) {
			m.log.LogAttrs(r.Context(), slog.LevelError, "idem: the handler's statements were not committed; reservation released",
				append(logAttrs(res), slog.String("error", err.Error()))...)
			if errors.Is(err, d1client.ErrSQL) {
				// Deterministic: the handler's own statements failed.
				writeError(w, http.StatusInternalServerError, CodeMutationAbandoned,
					"The mutation failed and was not committed.", nil)
				return
			}
			writeError(w, http.StatusServiceUnavailable, CodeMutationAbandoned,
				"The mutation could not be committed; retry the request.", http.Header{"Retry-After": {"1"}})
			return
		}
		m.log.LogAttrs(r.Context(), slog.LevelError, "idem: completion not stored; the response is sent, and a retry after the TTL will run the mutation again",
			append(logAttrs(res), slog.String("error", err.Error()))...)
	}
	if err == nil && !done.Stored && len(stmts) > 0 {
		// Fenced out under transactional completion: the handler's writes
		// were aborted with the batch, so its response describes something
		// that did not happen. Answer with what the ledger holds instead.
		m.answerFromLedger(w, r, res)
		return
	}
	if done.Response.Status != resp.Status {
		// The spec's sentinel: the body could not be stored, so this caller
		// gets status 500 with the stored headers and no body, as a replay
		// will.
		resetHeader(w.Header(), done.Response.Header)
	}
	writeResponse(w, &Response{Status: done.Response.Status, Body: done.Response.Body}, false)
}

// answerFromLedger answers a request whose own response must not be sent:
// the stored response when another owner completed the key, 409 in progress
// while one is still working on it.
func (m *middleware) answerFromLedger(w http.ResponseWriter, r *http.Request, res *Reservation) {
	resetHeader(w.Header(), nil)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), m.o.Timeout)
	defer cancel()
	dec, err := m.l.Lookup(ctx, res.Principal, res.Key, res.Fingerprint)
	switch {
	case err != nil:
		m.unavailable(w, r, err)
	case dec.Outcome == Replay:
		writeResponse(w, dec.Response, true)
	case dec.Outcome == InProgress:
		writeInProgress(w, dec.RetryAfter)
	default:
		writeError(w, http.StatusConflict, CodeKeyRetry, "Retry the request.", nil)
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

func (m *middleware) release(r *http.Request, res *Reservation, why string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), releaseTimeout)
	defer cancel()
	released, err := m.l.Release(ctx, res)
	attrs := append(logAttrs(res), slog.String("reason", why), slog.Bool("released", released))
	if err != nil {
		attrs = append(attrs, slog.String("error", err.Error()))
	}
	m.log.LogAttrs(r.Context(), slog.LevelWarn, "idem: response not stored; reservation released so the client may retry", attrs...)
}

// writeResponse sends a response: resp.Header's fields are added to those
// already on the writer, and replays are marked Idempotent-Replayed: true.
func writeResponse(w http.ResponseWriter, resp *Response, replayed bool) {
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
	writeJSON(w, http.StatusConflict, map[string]any{"error": CodeKeyInProgress, "retry_after_ms": retryAfter.Milliseconds()},
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

func retryAfterSeconds(d time.Duration) string {
	s := int64(math.Ceil(d.Seconds()))
	if s < 1 {
		s = 1
	}
	return strconv.FormatInt(s, 10)
}

// captureWriter records a handler's response instead of sending it, so it
// can be stored before the client sees it. Once the handler flushes or
// hijacks, it passes everything through and records nothing more.
type captureWriter struct {
	w        http.ResponseWriter
	max      int
	status   int
	body     bytes.Buffer
	streamed bool
	hijacked bool
}

func (c *captureWriter) Header() http.Header { return c.w.Header() }

func (c *captureWriter) WriteHeader(code int) {
	if c.streamed {
		c.w.WriteHeader(code)
		return
	}
	if c.status != 0 || code < 200 {
		return // informational responses are not captured
	}
	c.status = code
}

func (c *captureWriter) Write(p []byte) (int, error) {
	if c.streamed {
		return c.w.Write(p)
	}
	if c.status == 0 {
		c.status = http.StatusOK
	}
	if nullBodyStatus(c.status) {
		return 0, http.ErrBodyNotAllowed
	}
	// Keep at most max+1 bytes: enough to know the body is over the cap.
	if room := c.max + 1 - c.body.Len(); room > 0 {
		c.body.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

// Flush switches to streaming: what was captured is sent, and so is
// everything after it. The response will not be stored.
func (c *captureWriter) Flush() {
	_ = c.FlushError()
}

// FlushError is Flush for http.ResponseController. A flush after the body
// has outgrown the stored-body cap is ignored: what was written beyond the
// cap is gone, and the response will be the spec's status 500 sentinel.
func (c *captureWriter) FlushError() error {
	if c.hijacked || c.body.Len() > c.max {
		return nil
	}
	if !c.streamed {
		c.streamed = true
		if c.status != 0 {
			c.w.WriteHeader(c.status)
		}
		if c.body.Len() > 0 {
			if _, err := c.w.Write(c.body.Bytes()); err != nil {
				return err
			}
		}
	}
	return http.NewResponseController(c.w).Flush()
}

// Hijack hands the connection to the handler; the response will not be
// stored.
func (c *captureWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	hj, ok := c.w.(http.Hijacker)
	if !ok {
		return nil, nil, http.ErrNotSupported
	}
	conn, rw, err := hj.Hijack()
	if err == nil {
		c.hijacked = true
	}
	return conn, rw, err
}

// Unwrap lets http.ResponseController reach the underlying writer for
// deadlines.
func (c *captureWriter) Unwrap() http.ResponseWriter { return c.w }
