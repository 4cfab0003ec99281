package idemhttp

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"

	"github.com/d1idem/d1idem/d1client"
)

// Tx collects a handler's own D1 statements (the business write) to commit in
// the batch of the fenced completion (idem.Ledger.CompleteTx): a takeover
// aborts them with it, so a mutation kept in D1 happens once per key. They
// must not fail by design (use INSERT ... ON CONFLICT): a failed batch
// commits nothing, and the request is answered with an error instead.
//
// The response is sent after the commit: while statements are queued, a
// flush is held and a hijack refused. After a stream, a hijack or the
// handler's return, Add fails with ErrTxClosed (logged; a stream is aborted).
type Tx struct {
	mu      sync.Mutex
	stmts   []d1client.Statement
	closed  error // why Add fails; nil while open
	refused int   // Adds refused after the Tx closed
}

// ErrTxClosed is returned by Tx.Add once its statements can no longer
// commit with the response.
var ErrTxClosed = errors.New("idemhttp: Tx closed: the statements will not be committed")

var (
	errTxStreamed = fmt.Errorf("%w: the response was already streamed (flushed before any statement was queued)", ErrTxClosed)
	errTxHijacked = fmt.Errorf("%w: the connection was hijacked", ErrTxClosed)
	errTxDone     = fmt.Errorf("%w: the handler has returned", ErrTxClosed)
	errTxUnstored = fmt.Errorf("%w: Options.Store refused the response's status", ErrTxClosed)
)

// Add queues statements to commit in order, or fails with ErrTxClosed.
func (t *Tx) Add(stmts ...d1client.Statement) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed != nil {
		t.refused++
		return t.closed
	}
	t.stmts = append(t.stmts, stmts...)
	return nil
}

// finish closes the Tx and hands over its statements and refused Adds.
func (t *Tx) finish() ([]d1client.Statement, int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closed = cmp.Or(t.closed, errTxDone)
	return t.stmts, t.refused
}

type txKey struct{}

// TxContextKey is the string key under which a framework whose context looks
// values up by string (gin's Context, whose Keys hold it) may keep the Tx,
// so that TxFromContext finds it there too.
const TxContextKey = "github.com/d1idem/d1idem/idem/idemhttp.Tx"

// TxFromContext returns the Tx of the request the middleware executes, from
// the request's context (or a framework's context that holds it under
// TxContextKey, as contrib/gin's does).
func TxFromContext(ctx context.Context) (*Tx, bool) {
	if tx, ok := ctx.Value(txKey{}).(*Tx); ok {
		return tx, true
	}
	tx, ok := ctx.Value(TxContextKey).(*Tx)
	return tx, ok
}

// MustTx returns the Tx of the request the middleware executes, and panics
// if ctx has none: a handler whose business write must commit with the
// response fails loudly rather than skipping the write when it is not
// behind the middleware (behind it, the panic releases the key and is
// re-raised, so the client gets a 500 and its retry executes).
func MustTx(ctx context.Context) *Tx {
	tx, ok := TxFromContext(ctx)
	if !ok {
		panic("idemhttp: MustTx: no Tx in this context: the handler does not run behind the idempotency middleware, or was given another context than its request's")
	}
	return tx
}

// captureWriter records a handler's response, to be stored before the client
// sees it, until the handler streams or hijacks (see Tx), or passes it
// through unstored when Options.Store refuses its status.
type captureWriter struct {
	w        http.ResponseWriter
	tx       *Tx
	max      int
	store    func(status int) bool
	status   int
	body     bytes.Buffer
	streamed bool
	hijacked bool
	// Store refused the status: the response passes through, or with Tx
	// statements queued and a status under 400, is discarded.
	refusedStatus bool
	discard       bool
}

// passing reports whether the response goes to the client as written.
func (c *captureWriter) passing() bool {
	return c.streamed || c.hijacked || c.refusedStatus && !c.discard
}

// setStatus records the response's status, the first, and asks Store about
// it: refused, the response passes through from now on unless Tx statements
// are queued and the status is under 400 (a success for writes that will
// not commit): then it is discarded. Either way the Tx closes.
func (c *captureWriter) setStatus(code int) {
	c.status = code
	if c.store(code) {
		return
	}
	c.tx.mu.Lock()
	defer c.tx.mu.Unlock()
	c.refusedStatus = true
	c.tx.closed = cmp.Or(c.tx.closed, errTxUnstored)
	if len(c.tx.stmts) > 0 && code < 400 {
		c.discard = true
		return
	}
	c.w.WriteHeader(code)
}

// end is the handler's return: a response never written is a 200 with no
// body, as net/http sends it.
func (c *captureWriter) end() {
	switch {
	case c.hijacked || c.status != 0:
	case c.passing(): // streamed before anything was written: net/http sent 200
		c.status = http.StatusOK
	default:
		c.WriteHeader(http.StatusOK)
	}
}

func (c *captureWriter) Header() http.Header { return c.w.Header() }

// WriteHeader records the status; like net/http, it panics outside 100-999,
// sends a 1xx at once and ignores a second status. A 101 streams, or with Tx
// statements queued is stored as the sentinel.
func (c *captureWriter) WriteHeader(code int) {
	if code < 100 || code > 999 {
		panic(fmt.Sprintf("invalid WriteHeader code %v", code))
	}
	switch {
	case c.passing():
		c.w.WriteHeader(code)
	case c.status != 0: // not the first: ignored
	case code == http.StatusSwitchingProtocols && !c.stream():
		c.status = code
	case code < 200:
		c.w.WriteHeader(code)
	default:
		c.setStatus(code)
	}
}

func (c *captureWriter) Write(p []byte) (int, error) {
	if c.status == 0 && !c.passing() {
		c.setStatus(http.StatusOK)
	}
	switch {
	case c.passing():
		return c.w.Write(p)
	case c.discard:
		return len(p), nil
	case nullBodyStatus(c.status):
		return 0, http.ErrBodyNotAllowed
	}
	// Keep at most max+1 bytes: enough to know the body is over the cap.
	if room := c.max + 1 - c.body.Len(); room > 0 {
		c.body.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

// stream passes the response through from now on, unless Tx statements are
// queued, and closes the Tx.
func (c *captureWriter) stream() bool {
	c.tx.mu.Lock()
	defer c.tx.mu.Unlock()
	if len(c.tx.stmts) > 0 {
		return false
	}
	c.streamed = true
	c.tx.closed = cmp.Or(c.tx.closed, errTxStreamed)
	return true
}

// Flush is FlushError without the error.
func (c *captureWriter) Flush() { _ = c.FlushError() }

// FlushError sends what was captured and streams the rest, unstored. It is
// held while Tx statements are queued, and ignored once the body is over the
// stored-body cap (the response will be the sentinel).
func (c *captureWriter) FlushError() error {
	if c.discard {
		return nil
	}
	if !c.passing() {
		if c.body.Len() > c.max || !c.stream() {
			return nil
		}
		if c.status != 0 {
			c.w.WriteHeader(c.status)
		}
		if _, err := c.body.WriteTo(c.w); err != nil { // writes nothing when empty
			return err
		}
	}
	return http.NewResponseController(c.w).Flush()
}

// Hijack hands the connection to the handler, unless Tx statements are
// queued: they commit only with a stored response.
func (c *captureWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c.tx.mu.Lock()
	defer c.tx.mu.Unlock()
	if len(c.tx.stmts) > 0 {
		return nil, nil, fmt.Errorf("idemhttp: hijack refused: Tx statements are queued, and they commit only with a stored response: %w", http.ErrNotSupported)
	}
	conn, rw, err := http.NewResponseController(c.w).Hijack()
	if err == nil {
		c.hijacked = true
		c.tx.closed = cmp.Or(c.tx.closed, errTxHijacked)
	}
	return conn, rw, err
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (c *captureWriter) Unwrap() http.ResponseWriter { return c.w }
