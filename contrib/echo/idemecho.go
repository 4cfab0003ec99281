// Package idemecho is d1idem's Idempotency-Key middleware for echo (v4): a
// thin layer over idemhttp.Guard, the flow the net/http middleware runs,
// with the same Options, answers and guarantees (docs/guide.md of the
// module github.com/d1idem/d1idem).
//
// The handler writes to a Response over the Guard's capture, so every way
// echo writes (c.JSON, c.String, c.NoContent, c.Response().Write) is stored
// as the client sees it. An error the handler returns is handed to echo's
// HTTPErrorHandler (c.Error) inside the middleware, so that the response it
// writes is the one stored and replayed; the middleware then returns nil.
//
// Put middleware.Recover before the middleware (e.Use(middleware.Recover(),
// idemecho.Must(...))): a panic that reaches the middleware releases the
// key and is re-raised, for Recover to answer 500, and a retry executes
// again. A Recover after it turns a panic into an ordinary 500 response,
// stored and replayed unless Options.Store refuses it.
//
// Handlers commit their D1 writes with the response through the request's
// Tx: TxFromContext(c) or MustTx(c). Use c.Request().Context() for the
// handler's own calls: it is cancelled if the reservation's lease is lost.
package idemecho

import (
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/idem/idemhttp"
)

// New returns echo middleware guarding the handlers it wraps with the
// ledger, or an error naming an invalid option.
func New(l *idem.Ledger, opts idemhttp.Options) (echo.MiddlewareFunc, error) {
	g, err := idemhttp.NewGuard(l, opts)
	if err != nil {
		return nil, err
	}
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error { return serve(g, c, next) }
	}, nil
}

// Must is like New but panics if the options are invalid.
func Must(l *idem.Ledger, opts idemhttp.Options) echo.MiddlewareFunc {
	mw, err := New(l, opts)
	if err != nil {
		panic(err)
	}
	return mw
}

// TxFromContext returns the Tx of the request the middleware executes.
func TxFromContext(c echo.Context) (*idemhttp.Tx, bool) {
	return idemhttp.TxFromContext(c.Request().Context())
}

// MustTx returns the Tx of the request the middleware executes, and panics
// if there is none (idemhttp.MustTx): a business write that must commit
// with the response is never skipped silently.
func MustTx(c echo.Context) *idemhttp.Tx { return idemhttp.MustTx(c.Request().Context()) }

// serve runs next behind the Guard. When the Guard captures the response,
// next writes to a Response over the capture, and an error it returns is
// answered there; otherwise next runs as it would without the middleware.
func serve(g *idemhttp.Guard, c echo.Context, next echo.HandlerFunc) error {
	res, req := c.Response(), c.Request()
	defer func() { c.SetResponse(res); c.SetRequest(req) }() // a panic included
	var err error
	g.Serve(res, req, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.SetRequest(r)
		if w == http.ResponseWriter(res) { // not captured: a method not guarded, or no key
			err = next(c)
			return
		}
		c.SetResponse(echo.NewResponse(w, c.Echo()))
		if herr := next(c); herr != nil {
			c.Error(herr)
		}
	}))
	return err
}
