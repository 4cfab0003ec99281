package idemclient

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Transport is an http.RoundTripper for APIs that take an Idempotency-Key:
// it gives each request of a guarded method (POST, PUT, PATCH, DELETE by
// default) a key unless it has one, keeps that key across its retries, and
// retries as Policy says, honouring the server's hints. See the package
// documentation for what it retries and what it returns.
//
// A Transport is safe for concurrent use. Its zero value is ready: the
// default transport, the default Policy.
type Transport struct {
	// Base sends each attempt; nil means http.DefaultTransport.
	Base http.RoundTripper
	// Policy says when to retry; its zero value is the defaults. An
	// invalid Policy fails each guarded request with an error naming the
	// field.
	Policy Policy
	// Methods are the methods whose requests are given a key and retried;
	// nil means POST, PUT, PATCH and DELETE. Requests of other methods go to
	// Base untouched.
	Methods []string
}

var defaultMethods = []string{http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete}

// Report is what a Transport tells of one request: put one in the request's
// context with WithReport, and read it once the request is done.
type Report struct {
	// Key is the request's Idempotency-Key: the one it had, or the one the
	// Transport made.
	Key string
	// Attempts is how many times it was sent.
	Attempts int
	// Replayed is whether the answer was a replay of the key's first
	// answer (Idempotent-Replayed: true).
	Replayed bool
	// Waited is the time spent waiting between attempts.
	Waited time.Duration
}

type reportKey struct{}

// WithReport returns a copy of ctx in which a Transport fills in r for the
// request made with it; requests of methods the Transport does not guard
// leave r as it is. Use one Report per request; under redirects, it tells
// of the last request.
func WithReport(ctx context.Context, r *Report) context.Context {
	return context.WithValue(ctx, reportKey{}, r)
}

// ReportFrom returns the Report WithReport put in ctx, for another
// transport of the protocol (contrib/grpc's interceptor) to fill in.
func ReportFrom(ctx context.Context) (*Report, bool) {
	r, ok := ctx.Value(reportKey{}).(*Report)
	return r, ok && r != nil
}

// NewKey returns a new idempotency key: 128 random bits, from crypto/rand,
// as 32 lowercase hexadecimal digits.
func NewKey() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (it crashes the program instead)
	return hex.EncodeToString(b[:])
}

// errDeadline stops the retries when the next attempt could not start
// before the context's deadline.
var errDeadline = fmt.Errorf("idemclient: the next attempt would start after the context's deadline: %w", context.DeadlineExceeded)

// RoundTrip sends req, with retries when its method is guarded. It
// returns the final answer, a *KeyReusedError, or an
// *UnknownOutcomeError when it gives up.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	base := t.base()
	if !t.guards(req.Method) {
		return base.RoundTrip(req)
	}
	if err := t.Policy.Validate(); err != nil {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, err
	}
	ctx := req.Context()
	rep, _ := ReportFrom(ctx)
	if rep == nil {
		rep = new(Report)
	}
	key, made := req.Header.Get(HeaderKey), false
	if key == "" {
		key, made = NewKey(), true
	}
	*rep = Report{Key: key}
	replayable := req.Body == nil || req.Body == http.NoBody || req.GetBody != nil

	start := time.Now()
	body := req.Body // the first attempt's; then GetBody's
	for n := 1; ; n++ {
		a := req.Clone(ctx)
		a.Body = body
		if made {
			a.Header.Set(HeaderKey, key)
		}
		rep.Attempts = n
		ans := classify(base.RoundTrip(a))
		if !t.Policy.Retries(ans.Class) {
			return ans.final(key, rep)
		}
		wait, stop := t.Policy.Wait(n, time.Since(start), ans.Outcome)
		if err := ctx.Err(); err != nil {
			stop = err // the context ended during the attempt
		} else if stop == nil {
			stop = mayWait(ctx, wait, replayable)
		}
		ans.discard()
		if stop == nil {
			slept := time.Now()
			stop = sleep(ctx, wait)
			rep.Waited += time.Since(slept)
		}
		if stop == nil && req.GetBody != nil {
			var err error
			if body, err = req.GetBody(); err != nil {
				stop = fmt.Errorf("idemclient: Request.GetBody: %w", err)
			}
		}
		if stop != nil {
			return nil, &UnknownOutcomeError{Key: key, Attempts: n, LastStatus: ans.status, LastCode: ans.code,
				RetryAfter: ans.RetryAfter, Err: ans.err, Stop: stop}
		}
	}
}

// CloseIdleConnections closes the idle connections of Base, if it has a
// CloseIdleConnections method.
func (t *Transport) CloseIdleConnections() {
	if c, ok := t.base().(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

func (t *Transport) base() http.RoundTripper {
	if t.Base == nil {
		return http.DefaultTransport
	}
	return t.Base
}

// guards reports whether requests of method get a key and retries.
func (t *Transport) guards(method string) bool {
	if method == "" {
		method = http.MethodGet
	}
	methods := t.Methods
	if methods == nil {
		methods = defaultMethods
	}
	for _, m := range methods {
		if strings.EqualFold(m, method) {
			return true
		}
	}
	return false
}

// mayWait returns why the request cannot be sent again after wait, nil if
// it can.
func mayWait(ctx context.Context, wait time.Duration, replayable bool) error {
	if !replayable {
		return ErrBodyNotReplayable
	}
	if dl, ok := ctx.Deadline(); ok && !time.Now().Add(wait).Before(dl) {
		return errDeadline
	}
	return nil
}

// sleep waits for d, or until ctx is done.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// maxErrorBody bounds the part of an answer's body read to classify it:
// error bodies are small.
const maxErrorBody = 64 << 10

// maxHint bounds the server's hints, so that none overflows a Duration.
const maxHint = 24 * time.Hour

// answer is one attempt's result, classified.
type answer struct {
	Outcome
	res           *http.Response // nil on a transport error
	read          int            // bytes of res.Body read to classify it, which it reads again
	err           error
	status        int
	code, message string // of the JSON error body, if any
}

// classify classifies the result of one attempt.
func classify(res *http.Response, err error) answer {
	if err != nil {
		// A certificate the client refuses: the request was never sent,
		// and no retry changes the certificate.
		if _, ok := errors.AsType[*tls.CertificateVerificationError](err); ok {
			return answer{Outcome: Outcome{Class: Final}, err: err}
		}
		return answer{Outcome: Outcome{Class: Unavailable}, err: err}
	}
	a := answer{res: res, status: res.StatusCode}
	s := res.StatusCode
	if res.Header.Get(HeaderReplayed) == "true" {
		return a // the server stored this answer: a retry gets it again
	}
	var ms *float64
	if s == http.StatusConflict || s == http.StatusUnprocessableEntity || s == http.StatusTooManyRequests || s >= 500 {
		ms = a.readError()
	}
	if (a.code == CodeKeyInProgress || a.code == codeStripeInUse) && ms != nil && *ms >= 0 {
		a.RetryAfter = time.Duration(min(*ms, float64(maxHint.Milliseconds())) * float64(time.Millisecond))
	} else {
		a.RetryAfter = parseRetryAfter(res.Header.Get(HeaderRetryAfter), time.Now())
	}
	switch {
	case a.code == CodeKeyReused && (s == http.StatusConflict || s == http.StatusUnprocessableEntity):
		a.Class = Reused
	case s == http.StatusConflict && (a.code == CodeKeyInProgress || a.code == codeStripeInUse):
		a.Class = InProgress
	case s == http.StatusConflict && a.code == CodeKeyRetry:
		a.Class = RetryNow
	case s == http.StatusTooManyRequests || s == http.StatusServiceUnavailable:
		a.Class = Unavailable
	case s >= 500 && s <= 599 && a.code != CodeMutationAbandoned && a.code != CodeRecordUnreadable && a.code != CodePrincipalInvalid && a.code != CodeLedgerMisconfigured:
		a.Class = ServerError
	}
	return a
}

// readError reads the start of the answer's body, decodes its error code
// and message ({"error": code} or, as Stripe answers, {"error": {"code":
// code}}; the message, or RFC 9457's "detail"), and returns its retry_after_ms, if any. The body is left whole
// for the caller.
func (a *answer) readError() (retryAfterMS *float64) {
	body := a.res.Body
	b, err := io.ReadAll(io.LimitReader(body, maxErrorBody+1))
	a.read = len(b)
	a.res.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(b), body), body}
	if err != nil || len(b) > maxErrorBody {
		return nil
	}
	var eb struct {
		Error        json.RawMessage `json:"error"`
		Message      string          `json:"message"`
		Detail       string          `json:"detail"` // RFC 9457's, in a problem+json body
		RetryAfterMS *float64        `json:"retry_after_ms"`
	}
	if json.Unmarshal(b, &eb) != nil || len(eb.Error) == 0 {
		return nil
	}
	if json.Unmarshal(eb.Error, &a.code) != nil {
		var obj struct{ Code, Message string }
		if json.Unmarshal(eb.Error, &obj) == nil {
			a.code, eb.Message = obj.Code, obj.Message
		}
	}
	a.message = cmp.Or(eb.Message, eb.Detail)
	return eb.RetryAfterMS
}

// final returns a final answer to the caller.
func (a answer) final(key string, rep *Report) (*http.Response, error) {
	if a.Class == Reused {
		a.discard()
		return nil, &KeyReusedError{Key: key, Status: a.status, Message: printable(a.message)}
	}
	if a.err != nil {
		return nil, a.err
	}
	rep.Replayed = a.res.Header.Get(HeaderReplayed) == "true"
	return a.res, nil
}

// discard drains the answer's body (up to maxErrorBody bytes past what
// classify read) and closes it, so that its connection can serve the next
// attempt.
func (a answer) discard() {
	if a.res != nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(a.res.Body, int64(a.read)+maxErrorBody))
		a.res.Body.Close()
	}
}

// parseRetryAfter returns the wait a Retry-After value asks for (delay
// seconds or an HTTP date), 0 if none or unreadable.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if secs, err := strconv.ParseFloat(v, 64); err == nil && secs >= 0 && !math.IsInf(secs, 0) {
		return time.Duration(min(secs, maxHint.Seconds()) * float64(time.Second))
	}
	if t, err := http.ParseTime(v); err == nil {
		return min(max(t.Sub(now), 0), maxHint)
	}
	return 0
}

// printable is the server's message s, made safe to print in an error:
// control characters become spaces, and it is cut at 200 bytes.
func printable(s string) string {
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, strings.ToValidUTF8(s, "\uFFFD"))
}
