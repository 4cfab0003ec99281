package idemhttp

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"net/http"
)

// captureWriter records a handler's response instead of sending it, so that
// it can be stored (with the handler's Tx statements) before the client sees
// it. Once the handler streams or hijacks, it passes everything through; while
// Tx statements are queued it refuses both (see Tx).
type captureWriter struct {
	w        http.ResponseWriter
	tx       *Tx
	max      int
	status   int
	body     bytes.Buffer
	streamed bool
	hijacked bool
}

func (c *captureWriter) Header() http.Header { return c.w.Header() }

// WriteHeader records the status. Like net/http, it panics on a code
// outside 100-999, sends a 1xx at once (never stored) and ignores a status
// after the first. A 101 cannot be replayed: with no Tx statements queued it
// is sent and the response streams; else it is stored as the sentinel.
func (c *captureWriter) WriteHeader(code int) {
	if code < 100 || code > 999 {
		panic(fmt.Sprintf("invalid WriteHeader code %v", code))
	}
	switch {
	case c.streamed || c.hijacked:
		c.w.WriteHeader(code)
	case c.status != 0: // not the first: ignored
	case code == http.StatusSwitchingProtocols && !c.stream():
		c.status = code
	case code < 200:
		c.w.WriteHeader(code)
	default:
		c.status = code
	}
}

func (c *captureWriter) Write(p []byte) (int, error) {
	if c.streamed || c.hijacked {
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

// stream switches to passing the response through, unless Tx statements
// are queued; from then on the Tx refuses statements.
func (c *captureWriter) stream() bool {
	c.tx.mu.Lock()
	defer c.tx.mu.Unlock()
	if len(c.tx.stmts) > 0 {
		return false
	}
	c.streamed = true
	c.tx.closeLocked(errTxStreamed)
	return true
}

// Flush is FlushError without the error.
func (c *captureWriter) Flush() {
	_ = c.FlushError()
}

// FlushError switches to streaming: what was captured is sent, and so is
// everything after it; the response will not be stored. It is held while Tx
// statements are queued (the response goes out after they commit), and
// ignored once the body is over the stored-body cap (the response will be
// the sentinel).
func (c *captureWriter) FlushError() error {
	if !c.streamed && !c.hijacked {
		if c.body.Len() > c.max || !c.stream() {
			return nil
		}
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
// stored. It is refused while Tx statements are queued: they commit only
// with a stored response.
func (c *captureWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c.tx.mu.Lock()
	defer c.tx.mu.Unlock()
	if len(c.tx.stmts) > 0 {
		return nil, nil, fmt.Errorf("idemhttp: hijack refused: Tx statements are queued, and they commit only with a stored response: %w", http.ErrNotSupported)
	}
	conn, rw, err := http.NewResponseController(c.w).Hijack()
	if err == nil {
		c.hijacked = true
		c.tx.closeLocked(errTxHijacked)
	}
	return conn, rw, err
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (c *captureWriter) Unwrap() http.ResponseWriter { return c.w }
