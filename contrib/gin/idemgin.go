// Package idemgin is d1idem's Idempotency-Key middleware for gin: a thin
// layer over idemhttp.Guard, the flow the net/http middleware runs, with the
// same Options, answers and guarantees (docs/guide.md of the module
// github.com/d1idem/d1idem).
//
// Put it after gin.Recovery (r.Use(gin.Recovery(), idemgin.Must(...))): a
// panic that reaches the middleware releases the key and is re-raised, for
// Recovery to answer 500, and a retry executes again. A recovery that runs
// after the middleware turns a panic into an ordinary 500 response, which
// the middleware cannot tell from a handler's own and stores unless
// Options.Store refuses it; the middleware logs a warning, once per route,
// when it sees gin's Recovery there.
//
// Handlers commit their D1 writes with the response through the request's
// Tx: TxFromContext(c) or MustTx(c). Use c.Request.Context() for the
// handler's own calls: it is cancelled if the reservation's lease is lost.
package idemgin

import (
	"bufio"
	"cmp"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"

	"github.com/gin-gonic/gin"

	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/idem/idemhttp"
)

// New returns gin middleware guarding the handlers after it in the chain
// with the ledger, or an error naming an invalid option.
func New(l *idem.Ledger, opts idemhttp.Options) (gin.HandlerFunc, error) {
	g, err := idemhttp.NewGuard(l, opts)
	if err != nil {
		return nil, err
	}
	m := &middleware{g: g, log: cmp.Or(l.Config().Logger, slog.Default())}
	return m.handle, nil
}

// Must is like New but panics if the options are invalid.
func Must(l *idem.Ledger, opts idemhttp.Options) gin.HandlerFunc {
	h, err := New(l, opts)
	if err != nil {
		panic(err)
	}
	return h
}

// TxFromContext returns the Tx of the request the middleware executes.
// idemhttp.TxFromContext(c) finds it too, with or without the engine's
// ContextWithFallback.
func TxFromContext(c *gin.Context) (*idemhttp.Tx, bool) {
	return idemhttp.TxFromContext(c.Request.Context())
}

// MustTx returns the Tx of the request the middleware executes, and panics
// if there is none (idemhttp.MustTx): a business write that must commit
// with the response is never skipped silently.
func MustTx(c *gin.Context) *idemhttp.Tx { return idemhttp.MustTx(c.Request.Context()) }

type middleware struct {
	g      *idemhttp.Guard
	log    *slog.Logger
	warned sync.Map // routes whose chain runs a recovery after the middleware
}

// handle runs the rest of the chain behind the Guard, with a writer that
// keeps gin's semantics over the Guard's capture, and stops the chain when
// the Guard answered itself.
func (m *middleware) handle(c *gin.Context) {
	m.checkOrder(c)
	orig, req := c.Writer, c.Request
	ran := m.g.Serve(orig, req, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() { c.Writer, c.Request = orig, req }() // a panic included
		c.Request = r
		if w == http.ResponseWriter(orig) { // not captured: a method not guarded, or no key
			c.Next()
			return
		}
		if tx, ok := idemhttp.TxFromContext(r.Context()); ok {
			c.Set(idemhttp.TxContextKey, tx)
		}
		rw := &responseWriter{ResponseWriter: w, orig: orig, size: unwritten, status: http.StatusOK}
		c.Writer = rw
		c.Next()
		rw.WriteHeaderNow() // gin sends a status set without a body once its chain is done
	}))
	if !ran {
		c.Abort()
	}
}

// checkOrder warns, once per route, when gin's Recovery runs after the
// middleware: a panic then reaches the middleware as a stored 500.
func (m *middleware) checkOrder(c *gin.Context) {
	route := c.Request.Method + " " + c.FullPath()
	if _, seen := m.warned.Load(route); seen {
		return
	}
	m.warned.Store(route, true)
	names := c.HandlerNames()
	self := -1
	for i, n := range names {
		switch {
		case self < 0 && strings.HasSuffix(n, "contrib/gin.(*middleware).handle-fm"):
			self = i
		case self >= 0 && strings.Contains(n, "github.com/gin-gonic/gin.CustomRecoveryWithWriter"):
			m.log.LogAttrs(c.Request.Context(), slog.LevelWarn,
				"idemgin: gin.Recovery runs after the idempotency middleware: a panic becomes a 500 that is stored and replayed; put gin.Recovery() first, or refuse 5xx with Options.Store",
				slog.String("route", route))
			return
		}
	}
}

// unwritten is responseWriter.size before anything was written.
const unwritten = -1

// errHijackWritten refuses a hijack once the body was written, as gin does.
var errHijackWritten = errors.New("idemgin: response body already written")

// responseWriter is gin's ResponseWriter over the Guard's capture, with
// gin's semantics: WriteHeader records the status, which goes out with the
// first write or WriteHeaderNow.
type responseWriter struct {
	http.ResponseWriter // the capture
	orig                gin.ResponseWriter
	size                int
	status              int
}

var _ gin.ResponseWriter = (*responseWriter)(nil)

func (w *responseWriter) WriteHeader(code int) {
	if code > 0 && w.status != code && !w.Written() {
		w.status = code
	}
}

func (w *responseWriter) WriteHeaderNow() {
	if !w.Written() {
		w.size = 0
		w.ResponseWriter.WriteHeader(w.status)
	}
}

func (w *responseWriter) Write(p []byte) (int, error) {
	w.WriteHeaderNow()
	n, err := w.ResponseWriter.Write(p)
	w.size += n
	return n, err
}

func (w *responseWriter) WriteString(s string) (int, error) { return w.Write([]byte(s)) }

func (w *responseWriter) Status() int   { return w.status }
func (w *responseWriter) Size() int     { return w.size }
func (w *responseWriter) Written() bool { return w.size != unwritten }

// Hijack hands over the connection, as the capture allows it (not with Tx
// statements queued).
func (w *responseWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if w.size > 0 {
		return nil, nil, errHijackWritten
	}
	w.size = max(w.size, 0)
	return http.NewResponseController(w.ResponseWriter).Hijack()
}

// Flush sends the status and what was written, unstored (see idemhttp.Tx).
func (w *responseWriter) Flush() {
	w.WriteHeaderNow()
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

// CloseNotify is gin's writer's.
func (w *responseWriter) CloseNotify() <-chan bool { return w.orig.CloseNotify() }

// Pusher is nil: a pushed response would bypass the capture.
func (w *responseWriter) Pusher() http.Pusher { return nil }

// Unwrap lets http.ResponseController reach the capture.
func (w *responseWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
