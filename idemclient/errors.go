package idemclient

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// ErrBodyNotReplayable stops the retries of a request whose body cannot be
// sent again: it has a Body but no GetBody. http.NewRequest sets GetBody
// for a *bytes.Buffer, *bytes.Reader or *strings.Reader body.
var ErrBodyNotReplayable = errors.New("idemclient: the request body cannot be replayed (Request.GetBody is nil)")

// UnknownOutcomeError is the error of a request given up on: the server may
// or may not have run it. Send it again later with the same
// Idempotency-Key (Key): the server then runs it if it never did, or
// replays its first answer. A new key risks running it twice.
type UnknownOutcomeError struct {
	// Key is the request's Idempotency-Key.
	Key string
	// Attempts is how many attempts were made.
	Attempts int
	// LastStatus is the status of the last attempt's answer; 0 if it had
	// none (Err says why).
	LastStatus int
	// LastCode is the error code of that answer's JSON body, if any
	// (CodeKeyInProgress, CodeLedgerUnavailable, ...).
	LastCode string
	// RetryAfter is the server's last hint of when to retry, 0 if none.
	RetryAfter time.Duration
	// Err is the last attempt's transport error, nil if it was answered.
	Err error
	// Stop is why no further attempt was made: ErrMaxAttempts,
	// ErrMaxElapsed, ErrBodyNotReplayable, the context's error, ...
	Stop error
}

func (e *UnknownOutcomeError) Error() string {
	var b strings.Builder
	b.WriteString("idemclient: outcome unknown after ")
	b.WriteString(strconv.Itoa(e.Attempts))
	if e.Attempts == 1 {
		b.WriteString(" attempt")
	} else {
		b.WriteString(" attempts")
	}
	switch {
	case e.LastStatus != 0:
		fmt.Fprintf(&b, " (last answer: %d %s", e.LastStatus, http.StatusText(e.LastStatus))
		if e.LastCode != "" {
			b.WriteString(", " + e.LastCode)
		}
		if e.RetryAfter > 0 {
			b.WriteString(", retry after " + e.RetryAfter.String())
		}
		b.WriteString(")")
	case e.Err != nil:
		b.WriteString(" (last: " + e.Err.Error() + ")")
	}
	if e.Stop != nil {
		b.WriteString(": " + strings.TrimPrefix(e.Stop.Error(), "idemclient: "))
	}
	fmt.Fprintf(&b, "; keep Idempotency-Key %q and retry with it later", e.Key)
	return b.String()
}

// Unwrap returns Err and Stop, for errors.Is and errors.As.
func (e *UnknownOutcomeError) Unwrap() []error {
	var errs []error
	for _, err := range []error{e.Err, e.Stop} {
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// KeyReusedError is the server's refusal of a key already used for a
// different request (CodeKeyReused, with 409 or 422). It is never retried:
// a new request needs a new key, and a retry of the first one must send it
// exactly as it was.
type KeyReusedError struct {
	Key     string // the key refused
	Status  int    // 409 (the spec) or 422 (the IETF draft)
	Message string // the server's message
}

func (e *KeyReusedError) Error() string {
	msg := fmt.Sprintf("idemclient: Idempotency-Key %q was already used for a different request (%d %s)", e.Key, e.Status, http.StatusText(e.Status))
	if e.Message != "" {
		msg += ": " + e.Message
	}
	return msg
}
