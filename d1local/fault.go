package d1local

import (
	"context"
	"time"
)

// Request describes one D1 call, for a FaultFunc.
type Request struct {
	AccountID  string
	DatabaseID string
	Endpoint   string   // "query" or "raw"
	Statements []string // the SQL of each statement, in order
	Seq        int64    // 1-based number of the call, as counted by Server.Calls
}

// FaultFunc chooses the fault, if any, to apply to a request. It is
// called for every well-formed query or raw call that no injected fault
// claimed, possibly from several goroutines at once. Return the zero Fault
// for none.
type FaultFunc func(Request) Fault

// Fault is a failure to simulate on one call. The zero Fault is no fault.
//
// Fields combine: Latency applies first. RateLimit then answers without
// executing, whatever else is set. Otherwise LoseResponse executes the
// request and drops the connection, whatever else is set. Otherwise
// Overloaded, Internal and BadGateway answer with their error, without
// executing unless AfterCommit is set; when several are set, the first in
// that order wins.
type Fault struct {
	// Latency is slept before executing. A request whose context ends
	// during the sleep is not executed.
	Latency time.Duration
	// Busy is slept while the request holds its database, just before
	// executing: the other calls to that database wait behind it, as
	// behind D1's single writer, while calls to other databases go on.
	// Latency delays only the call it is set on; Busy makes its database
	// slow. It applies to calls that execute (see above). A request whose
	// context ends during the sleep is not executed.
	Busy time.Duration
	// LoseResponse executes the request (committing it when it succeeds)
	// and then closes the connection without an answer: the client sees a
	// connection error although the write stands.
	LoseResponse bool
	// RateLimit answers 429 with code 971, Cloudflare's API rate limit, and
	// a Retry-After header, without executing.
	RateLimit bool
	// RetryAfter is the Retry-After of a RateLimit fault; 0 means 300 s.
	RetryAfter time.Duration
	// Overloaded answers 429 with code 7500 "D1 DB is overloaded. Requests
	// queued for too long."
	Overloaded bool
	// Internal answers 500 with code 7500 "internal error; reference = ...".
	Internal bool
	// BadGateway answers 502 with an HTML page, as Cloudflare's edge does.
	BadGateway bool
	// AfterCommit makes Overloaded, Internal and BadGateway execute and
	// commit the request before answering with the error: an ambiguous
	// failure, where the client cannot tell that the write stands.
	AfterCommit bool
}

// IsZero reports whether f is the zero Fault, which simulates nothing.
func (f Fault) IsZero() bool { return f == Fault{} }

// errorFault reports whether f answers with an error status.
func (f Fault) errorFault() bool { return f.Overloaded || f.Internal || f.BadGateway }

// defaultRetryAfter is the Retry-After of a rate limit: Cloudflare blocks
// the account's API calls for five minutes.
const defaultRetryAfter = 300 * time.Second

// Inject queues one-shot faults. Each of the next requests (well-formed
// query or raw calls) takes the first queued fault, in order, before the
// Config.Faults hook is consulted; a queued zero Fault lets a request pass
// unharmed, which targets a later request.
func (s *Server) Inject(faults ...Fault) {
	s.faultMu.Lock()
	defer s.faultMu.Unlock()
	s.faults = append(s.faults, faults...)
}

// nextFault takes the fault for req: the first injected one, else the
// hook's.
func (s *Server) nextFault(req Request) Fault {
	s.faultMu.Lock()
	if len(s.faults) > 0 {
		f := s.faults[0]
		s.faults[0] = Fault{}
		s.faults = s.faults[1:]
		s.faultMu.Unlock()
		return f
	}
	s.faultMu.Unlock()
	if s.cfg.Faults != nil {
		return s.cfg.Faults(req)
	}
	return Fault{}
}

// sleep waits for d, or until ctx is done.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
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
