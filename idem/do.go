package idem

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/d1idem/d1idem/d1client"
)

// Job names one piece of work that Ledger.Do runs at most once: a queue
// message, a webhook's event, a scheduled job's run.
type Job struct {
	// Principal scopes the key as a request's authenticated caller does: a
	// tenant, a webhook's sender, or a fixed name for the service's own jobs
	// ("cron"). Two principals' keys never meet.
	Principal string
	// Key names the work: a message ID, an event ID, a job and its period
	// ("daily-report/2026-12-06"). Any non-empty string: one that is not a
	// valid Idempotency-Key (1-255 printable ASCII) is stored as "sha256:"
	// and the hex SHA-256 of its bytes.
	Key string
	// Payload is what the work is done on. A later Do with the same key and
	// another payload is refused with ErrKeyReused, neither run nor answered
	// with this one's result. nil and empty are the same payload.
	Payload []byte
}

// Result is what Do returns of a job's run.
type Result struct {
	// Value is the function's result, or the stored one of an earlier run.
	Value []byte
	// Replayed: Value (or a final error) is an earlier run's, read from the
	// ledger or the replay cache; the function did not run.
	Replayed bool
	// Generation is the fencing generation the function ran at; 0 when
	// replayed.
	Generation int64
}

// Errors of Do. A function's own error is returned as it is.
var (
	// ErrKeyReused: the job's key was used with another payload.
	ErrKeyReused = errors.New("idem: the key was already used with another payload")
	// ErrInProgress is matched by *InProgressError: another run of the job
	// holds the key. Deliver it again after InProgressError.RetryAfter.
	ErrInProgress = errors.New("idem: the job is being run by another caller")
	// ErrFencedOut: a takeover superseded this run (its lease was lost), so
	// its result was not stored (and a DoTx function's statements were not
	// committed). Run the job again: it answers with the stored result, or
	// is in progress.
	ErrFencedOut = errors.New("idem: fenced out: a takeover superseded this run and its result was not stored; run the job again for the stored one")
	// ErrResultNotStored: the job ran, but its result could not be stored
	// (over Config.MaxStoredBody); every later Do answers this error, and
	// the job never runs again.
	ErrResultNotStored = errors.New("idem: the job ran, but its result was over Config.MaxStoredBody and was not stored")
	// ErrRunClosed is Run.Add's error after the function returned.
	ErrRunClosed = errors.New("idem: Run.Add after the function returned: the statements are not committed")
)

// InProgressError is Do's error while another caller runs the job, or a
// run died and its lease has not yet ended.
type InProgressError struct {
	RetryAfter time.Duration // when asking again is useful (see Decision.RetryAfter)
}

func (e *InProgressError) Error() string {
	return fmt.Sprintf("%v; retry after %v", ErrInProgress, e.RetryAfter)
}

// Is reports whether target is ErrInProgress.
func (e *InProgressError) Is(target error) bool { return target == ErrInProgress }

// FinalError marks a function's error as the job's final outcome: Do
// stores it, and every later Do of the job returns it (its text) instead of
// running the function again. Make one with Final.
type FinalError struct{ Err error }

// Final marks err as final (see FinalError); nil stays nil.
func Final(err error) error {
	if err == nil {
		return nil
	}
	return &FinalError{Err: err}
}

func (e *FinalError) Error() string { return e.Err.Error() }

// Unwrap returns the function's error (a replay's holds only its text).
func (e *FinalError) Unwrap() error { return e.Err }

// Run is what a Do function is given of its run: the fencing generation, and
// D1 statements to commit with its result.
type Run struct {
	r      *Reservation
	mu     sync.Mutex
	stmts  []d1client.Statement
	closed bool
}

// Generation is the run's fencing generation (see Reservation).
func (r *Run) Generation() int64 { return r.r.Generation }

// Takeover reports whether the run took over an earlier run that died.
func (r *Run) Takeover() bool { return r.r.Takeover }

// Add queues statements to commit in the D1 batch (one transaction) that
// stores the run's result, behind a fence guard: if a takeover superseded
// the run, none commits (as Ledger.CompleteTx). They must not fail by design
// (INSERT ... ON CONFLICT): a failed batch commits nothing, releases the
// key and makes Do return ErrTxNotCommitted. A function's error (unless
// final) drops them. After the function returns, Add fails with
// ErrRunClosed.
func (r *Run) Add(stmts ...d1client.Statement) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return ErrRunClosed
	}
	r.stmts = append(r.stmts, stmts...)
	return nil
}

// close ends Add and returns the statements queued.
func (r *Run) close() []d1client.Statement {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	return r.stmts
}

// The Content-Type stored with a job's result, and a final error's.
const (
	jobBytes      = "application/octet-stream"
	jobBase64     = "application/octet-stream; d1idem-encoding=base64" // a result that is not UTF-8
	jobJSON       = "application/json"
	jobFinalError = "text/plain; charset=utf-8; d1idem=final-error"
	jobRetries    = 3 // Begins tried when the row vanishes under the claim
)

// jobHeaders are the headers a job's stored result keeps, whatever
// Config.ReplayableHeaders says.
var jobHeaders = []string{"content-type"}

// Do runs fn at most once per (job.Principal, job.Key), for work that is not
// an HTTP handler: a queue consumer makes at-least-once delivery
// exactly-once, a webhook receiver keys on the sender's event ID, a
// scheduled job runs once across replicas. It is the middleware's state
// machine with fn where the handler was: an atomic claim, heartbeats that
// cancel fn's context (cause ErrLeaseLost) if the lease is lost, a fenced
// completion, and the statements fn adds to its Run committed with the
// result.
//
// fn's result is stored and returned, with Result.Replayed, by every later
// Do of the job. Its error is not stored: the key is released, so that the
// next delivery runs fn again; wrap it with Final to store it instead. A
// panic releases the key too, and goes on. Do's other errors: another run
// holds the key (*InProgressError: deliver the job again later), the key
// was used with another payload (ErrKeyReused), this run was superseded
// (ErrFencedOut), the result could not be stored (ErrResultNotStored), the
// Run's statements failed (ErrTxNotCommitted), or the ledger failed (D1's
// errors, wrapped). The result is stored even if ctx ends once fn returned.
func (l *Ledger) Do(ctx context.Context, job Job, fn func(ctx context.Context, run *Run) ([]byte, error)) (Result, error) {
	return l.do(ctx, job, jobBytes, fn)
}

// DoJSON is Do for a function whose result is a JSON value: it stores the
// value's encoding, and returns it decoded, as every later DoJSON of the job
// does. An encoding that fails is a final error (the work ran).
func DoJSON[T any](ctx context.Context, l *Ledger, job Job, fn func(ctx context.Context, run *Run) (T, error)) (T, Result, error) {
	var v T
	res, err := l.do(ctx, job, jobJSON, func(ctx context.Context, run *Run) ([]byte, error) {
		v, err := fn(ctx, run)
		if err != nil {
			return nil, err
		}
		b, err := json.Marshal(v)
		if err != nil {
			return nil, Final(fmt.Errorf("idem: DoJSON: encoding the result: %w", err))
		}
		return b, nil
	})
	if err != nil {
		return v, res, err
	}
	if err := json.Unmarshal(res.Value, &v); err != nil {
		return v, res, fmt.Errorf("%w: decoding the stored JSON result: %v", ErrUnreadableRecord, err)
	}
	return v, res, nil
}

func (l *Ledger) do(ctx context.Context, job Job, contentType string, fn func(ctx context.Context, run *Run) ([]byte, error)) (Result, error) {
	if job.Key == "" {
		return Result{}, fmt.Errorf("%w: a Job needs a non-empty Key", ErrInvalidKey)
	}
	key, fp := jobKey(job.Key), jobFingerprint(job.Payload)
	var d Decision
	var err error
	for range jobRetries {
		if d, err = l.Begin(ctx, job.Principal, key, fp); err != nil || d.Outcome != Retry {
			break
		}
	}
	switch {
	case err != nil:
		return Result{}, err
	case d.Outcome == Execute:
		return l.runJob(ctx, d.Reservation, contentType, fn)
	case d.Outcome == Replay:
		return jobReplay(d.Response)
	case d.Outcome == Reused:
		return Result{}, ErrKeyReused
	}
	return Result{}, &InProgressError{RetryAfter: max(d.RetryAfter, minRetryAfter)}
}

// jobKey is the ledger key of a Job's Key.
func jobKey(k string) string {
	if ValidKey(k) {
		return k
	}
	sum := sha256.Sum256([]byte(k))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// jobFingerprint is a Job's fingerprint: no request's, whose first line is
// an HTTP method (a token, which holds no "/").
func jobFingerprint(payload []byte) string {
	h := sha256.New()
	h.Write([]byte("d1idem-job/1\n"))
	h.Write(payload)
	return hex.EncodeToString(h.Sum(nil))
}

// runJob runs fn under r's lease and stores its result.
func (l *Ledger) runJob(ctx context.Context, r *Reservation, contentType string, fn func(ctx context.Context, run *Run) ([]byte, error)) (Result, error) {
	run := &Run{r: r}
	var value []byte
	var fnErr error
	returned := false
	defer func() {
		if !returned { // fn panicked: give the key up, and let the panic go on
			run.close()
			l.releaseJob(ctx, r, slog.LevelWarn, "the function panicked")
		}
	}()
	var lost error // why fn's context was cancelled, if the lease was lost
	_ = l.Hold(ctx, r, func(ctx context.Context) error {
		value, fnErr = fn(ctx, run)
		if c := context.Cause(ctx); errors.Is(c, ErrLeaseLost) || errors.Is(c, ErrMaxLease) {
			lost = c
		}
		return nil
	})
	returned = true
	stmts := run.close()
	res := Result{Value: value, Generation: r.Generation}
	final, isFinal := errors.AsType[*FinalError](fnErr)
	if fnErr != nil && !isFinal {
		l.releaseJob(ctx, r, slog.LevelInfo, "the function failed")
		if lost != nil && !errors.Is(fnErr, lost) {
			fnErr = fmt.Errorf("%w (its context was cancelled: %w)", fnErr, lost)
		}
		return Result{Generation: r.Generation}, fnErr
	}
	resp := jobResponse(value, contentType, final)
	cctx := context.WithoutCancel(ctx) // fn ran: store its result even if ctx ended
	var done Completion
	var err error
	if len(stmts) > 0 {
		done, err = l.completeTx(cctx, r, resp, stmts, jobHeaders)
	} else {
		done, err = l.complete(cctx, r, resp, jobHeaders)
	}
	switch {
	case err != nil:
		return res, fmt.Errorf("idem: the job ran, but its result was not stored: %w", err)
	case !done.Stored:
		return res, ErrFencedOut
	case done.Sentinel:
		return res, ErrResultNotStored
	case isFinal:
		return Result{Generation: r.Generation}, fnErr
	}
	return res, nil
}

// jobResponse is how a job's result, or its final error, is stored.
func jobResponse(value []byte, contentType string, final *FinalError) Response {
	if final != nil {
		msg := final.Error()
		if msg == "" {
			msg = "final error"
		}
		return Response{Status: http.StatusInternalServerError, Header: http.Header{"Content-Type": {jobFinalError}}, Body: []byte(msg)}
	}
	if !utf8.Valid(value) {
		value, contentType = base64.StdEncoding.AppendEncode(nil, value), jobBase64
	}
	return Response{Status: http.StatusOK, Header: http.Header{"Content-Type": {contentType}}, Body: value}
}

// jobReplay reads an earlier run's stored result, or final error.
func jobReplay(resp *Response) (Result, error) {
	res := Result{Replayed: true}
	switch {
	case resp.Status == http.StatusOK && strings.HasSuffix(resp.Header.Get("Content-Type"), "d1idem-encoding=base64"):
		v, err := base64.StdEncoding.AppendDecode(nil, resp.Body)
		if err != nil {
			return res, fmt.Errorf("%w: the stored result is not base64: %v", ErrUnreadableRecord, err)
		}
		res.Value = v
	case resp.Status == http.StatusOK:
		res.Value = resp.Body
		if res.Value == nil {
			res.Value = []byte{}
		}
	case resp.Status == http.StatusInternalServerError && resp.Body == nil:
		return res, ErrResultNotStored
	case resp.Status == http.StatusInternalServerError:
		return res, &FinalError{Err: errors.New(string(resp.Body))}
	default:
		return res, fmt.Errorf("%w: status %d is not a job's", ErrUnreadableRecord, resp.Status)
	}
	return res, nil
}

// releaseJob gives up r, so that the job's next delivery runs it again.
func (l *Ledger) releaseJob(ctx context.Context, r *Reservation, level slog.Level, why string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	released, err := l.Release(ctx, r)
	attrs := append(r.LogValue().Group(), slog.String("reason", why), slog.Bool("released", released))
	if err != nil {
		attrs = append(attrs, ErrorAttrs(err)...)
	}
	if err != nil {
		level = slog.LevelError
	}
	l.log().LogAttrs(ctx, level, "idem: job result not stored; key released so that the job runs again", attrs...)
}
