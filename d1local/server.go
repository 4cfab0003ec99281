package d1local

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/d1idem/d1idem/internal/loopback"
)

// DefaultAccountID is the account ID /memberships and /accounts report
// when Config.AccountID is empty.
const DefaultAccountID = "d10ca1d10ca1d10ca1d10ca1d10ca1d1"

// LocalDir and LocalDatabaseID are where d1idem's programs keep a local
// ledger unless told otherwise: the demo (d1idem demo --dir), the example
// API (examples/orders --local) and the CLI (--local) all use the database
// LocalDatabaseID, so that what one writes the others read. They are
// conventions of those programs, not defaults of Config.
const (
	LocalDir        = ".d1idem"
	LocalDatabaseID = "d1idem"
)

// Config configures a Server.
type Config struct {
	// Dir holds one SQLite file per database ID ("<id>.sqlite", in WAL
	// mode). "" keeps every database in memory, for the Server's lifetime.
	Dir string
	// Token, if set, is required as "Authorization: Bearer <Token>".
	// A missing or different token is answered 403 with code 10000
	// "Authentication error" (401 with code 1000 "Invalid API Token" on
	// /user/tokens/verify); an Authorization header that is not a bearer
	// token, 400 with code 6003 (error_chain 6111), as Cloudflare does.
	Token string
	// NoAutoCreate makes New create neither Dir nor any database: Dir must
	// exist (New fails otherwise), and a call to an unknown database ID
	// fails with 404 and code 7404, as D1 does. Only CreateDatabase and
	// the create endpoint create databases then. By default Dir is created
	// by New and a database on its first query, raw, import or export call.
	NoAutoCreate bool
	// AccountID is the one account /memberships and /accounts report;
	// "" means DefaultAccountID. Requests may name any account ID: all
	// accounts share the server's databases.
	AccountID string
	// RateLimit, if not zero, is the account-wide API rate limit: every
	// authenticated API call counts, every answer carries Cloudflare's
	// Ratelimit and Ratelimit-Policy headers, and calls over the limit get
	// 429, code 971.
	RateLimit RateLimit
	// Now is the clock of the budget and of import and export links; nil
	// means time.Now.
	Now func() time.Time
	// Faults, if set, chooses a fault for every query or raw call that no
	// fault queued with Inject claimed.
	Faults FaultFunc
	// Logger receives a debug line per call and the causes of internal
	// errors; nil discards them.
	Logger *slog.Logger
	// MaxOpenDatabases bounds the database files of Dir held open at once
	// (three file descriptors each: the file, its WAL and its shared
	// memory), so that a Dir may hold any number of databases: past it,
	// the idle database used least recently is closed (its WAL
	// checkpointed into the file) and opened again on its next call. A
	// database in use is never closed; when every open one is, another
	// opens past the bound and closes once its call ends. 0 means
	// DefaultMaxOpenDatabases; a negative value, no bound. Databases in
	// memory stay open.
	MaxOpenDatabases int
}

// Server is a D1-compatible REST server, an http.Handler; see the package
// documentation for the endpoints. It is safe for concurrent use.
type Server struct {
	cfg     Config
	log     *slog.Logger
	now     func() time.Time
	account string
	budget  *limiter // nil: no budget

	mu       sync.Mutex
	dbs      map[string]*database
	deleting map[string]chan struct{} // see DeleteDatabase
	handles  *handles                 // see fileHandles
	closed   bool

	faultMu sync.Mutex
	faults  []Fault

	transfers transfers

	splits *splitCache // the SQL texts of query and raw calls, split

	// answers holds spare buffers for building successful query and raw
	// answers in (see writeResults): a batch's answer is tens of kilobytes,
	// and growing each afresh made most of a busy server's garbage. A
	// channel, not a sync.Pool, so that the spares outlive a GC cycle.
	answers chan []byte

	calls atomic.Int64
}

// maxBodyBytes bounds a request body.
const maxBodyBytes = 10 << 20

// idPattern is what an account or database identifier must look like.
var idPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// New returns a Server. With cfg.Dir set, the directory is created if
// needed (it must exist with NoAutoCreate); databases are opened on first
// use.
func New(cfg Config) (*Server, error) {
	if cfg.Dir != "" {
		if cfg.NoAutoCreate {
			fi, err := os.Stat(cfg.Dir)
			if err != nil {
				return nil, fmt.Errorf("d1local: data directory: %w", err)
			}
			if !fi.IsDir() {
				return nil, fmt.Errorf("d1local: data directory %s is not a directory", cfg.Dir)
			}
		} else if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
			return nil, fmt.Errorf("d1local: create data directory: %w", err)
		}
	}
	if cfg.AccountID != "" && !idPattern.MatchString(cfg.AccountID) {
		return nil, fmt.Errorf("d1local: invalid AccountID %q", cfg.AccountID)
	}
	if err := cfg.RateLimit.validate(); err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	now := cfg.Now
	if now == nil {
		now = time.Now
	}
	account := cfg.AccountID
	if account == "" {
		account = DefaultAccountID
	}
	return &Server{cfg: cfg, log: log, now: now, account: account, budget: newLimiter(cfg.RateLimit, now),
		dbs: make(map[string]*database), splits: newSplitCache(), answers: make(chan []byte, spareAnswers)}, nil
}

// Close closes every database, waiting for the request running on each.
// Later calls are answered with an internal error. Close is idempotent.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	dbs := s.dbs
	s.dbs = make(map[string]*database)
	s.mu.Unlock()
	var errs []error
	for _, d := range dbs {
		errs = append(errs, d.close(errClosed))
	}
	return errors.Join(errs...)
}

// Calls returns the number of D1 calls received: every POST to a query or
// raw endpoint, whatever its outcome.
func (s *Server) Calls() int64 { return s.calls.Load() }

// ErrNoDatabase is the error of an operation on a database that does not
// exist.
var ErrNoDatabase = errors.New("d1local: no such database")

// path returns the file of database id ("" in memory).
func (s *Server) path(id string) string {
	if s.cfg.Dir == "" {
		return ""
	}
	return filepath.Join(s.cfg.Dir, id+".sqlite")
}

// database returns the open database id, opening it, or creating it when
// create is set; a missing one is ErrNoDatabase.
func (s *Server) database(id string, create bool) (*database, error) {
	mode := openExisting
	if create {
		mode = openOrCreate
	}
	return s.open(id, mode)
}

// ServeHTTP serves the D1 REST API.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	if s.cfg.Token == "" {
		if e := browserGuard(r); e != nil {
			s.reply(w, nil, e)
			return
		}
	}
	path := r.URL.Path
	if rest, ok := strings.CutPrefix(path, "/client/v4"); ok {
		path = rest
	}
	if rest, ok := strings.CutPrefix(path, linkPrefix); ok {
		s.serveLink(w, r, rest)
		return
	}
	rt, args := matchRoute(path)
	if rt == nil {
		s.reply(w, nil, &apiError{status: http.StatusNotFound, code: 7000, message: "No route for that URI"})
		return
	}
	h, ok := rt.methods[r.Method]
	if !ok {
		w.Header().Set("Allow", rt.allow())
		s.reply(w, nil, &apiError{status: http.StatusMethodNotAllowed, code: 10405,
			message: fmt.Sprintf("Method %s not allowed: use %s", r.Method, rt.allow())})
		return
	}
	c := &call{w: w, r: r, args: args, route: rt.name}
	if rt.d1Call {
		c.seq = s.calls.Add(1)
	}
	status := s.serve(c, h)
	s.log.Debug("d1local: call", "seq", c.seq, "route", rt.name, "args", args,
		"status", status, "duration", time.Since(start))
}

// call is one API request being served.
type call struct {
	w     http.ResponseWriter
	r     *http.Request
	args  []string // the route's parameters: account, database, endpoint
	route string
	seq   int64 // for query and raw calls, the call's number (see Calls)
	state *budgetState
}

// serve authenticates the call, charges the budget and runs the handler.
func (s *Server) serve(c *call, h handler) int {
	if e := s.authenticate(c.r, c.route); e != nil {
		return s.reply(c.w, c, e)
	}
	if s.budget != nil {
		st := s.budget.take()
		c.state = &st
		if st.blocked {
			return s.reply(c.w, c, rateLimited())
		}
	}
	return h(s, c)
}

// reply writes an error answer with the budget headers and returns its
// status.
func (s *Server) reply(w http.ResponseWriter, c *call, e *apiError) int {
	s.setBudgetHeaders(w, c)
	return writeError(w, e)
}

// setBudgetHeaders sets the Ratelimit headers of the call's budget state
// (the current one for a call that was not charged).
func (s *Server) setBudgetHeaders(w http.ResponseWriter, c *call) {
	if s.budget == nil {
		return
	}
	if c != nil && c.state != nil {
		s.budget.setHeaders(w.Header(), *c.state)
		return
	}
	s.budget.setHeaders(w.Header(), s.budget.peek())
}

// serveCall answers one query or raw call.
func serveCall(s *Server, c *call) int {
	account, dbID, endpoint := c.args[0], c.args[1], c.args[2]
	w, r := c.w, c.r
	if e := checkIDs(account, dbID, endpoint); e != nil {
		return s.reply(w, c, e)
	}
	body, e := readBody(w, r)
	if e != nil {
		return s.reply(w, c, e)
	}
	queries, err := decodeBody(body, s.splits)
	if err != nil {
		return s.reply(w, c, &apiError{status: http.StatusBadRequest, code: 7400, message: err.Error()})
	}

	fault := s.nextFault(Request{AccountID: account, DatabaseID: dbID, Endpoint: endpoint,
		Statements: statementTexts(queries), Seq: c.seq})
	ctx := r.Context()
	if err := sleep(ctx, fault.Latency); err != nil {
		return s.reply(w, c, internalError(fmt.Errorf("latency fault: %w", err)))
	}
	s.setBudgetHeaders(w, c)
	if fault.RateLimit {
		retry := fault.RetryAfter
		if retry <= 0 {
			retry = defaultRetryAfter
		}
		w.Header().Set("Retry-After", strconv.FormatInt(ceilSeconds(retry), 10))
		return writeError(w, rateLimited())
	}
	if fault.errorFault() && !fault.AfterCommit && !fault.LoseResponse {
		return writeFault(w, fault)
	}

	results, err := s.execute(r, dbID, queries, fault.Busy)
	if fault.LoseResponse {
		dropConnection(w)
		return 0
	}
	if fault.errorFault() {
		return writeFault(w, fault)
	}
	if err != nil {
		return writeError(w, s.errorResponse(err, dbID))
	}
	return s.writeResults(w, endpoint, results)
}

// checkIDs answers 7003 for an invalid account or database identifier.
func checkIDs(account, dbID, endpoint string) *apiError {
	if idPattern.MatchString(account) && (dbID == "" || idPattern.MatchString(dbID)) {
		return nil
	}
	path := "/client/v4/accounts/" + account + "/d1/database"
	if dbID != "" {
		path += "/" + dbID
	}
	if endpoint != "" {
		path += "/" + endpoint
	}
	return &apiError{status: http.StatusBadRequest, code: 7003, message: fmt.Sprintf(
		"Could not route to %s, perhaps your object identifier is invalid?", path)}
}

// readBody reads a request body of at most maxBodyBytes. A body of known
// length is read into a buffer of that size, not grown to it.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, *apiError) {
	var buf bytes.Buffer
	if n := r.ContentLength; n > 0 && n <= maxBodyBytes {
		buf.Grow(int(n) + bytes.MinRead)
	}
	if _, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, maxBodyBytes)); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, &apiError{status: http.StatusRequestEntityTooLarge, code: 7400,
				message: fmt.Sprintf("Request body too large: the limit is %d bytes", maxBodyBytes)}
		}
		return nil, &apiError{status: http.StatusBadRequest, code: 7400,
			message: "Could not read the request body: " + err.Error()}
	}
	return buf.Bytes(), nil
}

// execute compiles and runs the queries on database dbID, holding it for
// busy first.
func (s *Server) execute(r *http.Request, dbID string, queries []parsedQuery, busy time.Duration) ([]result, error) {
	d, err := s.database(dbID, !s.cfg.NoAutoCreate)
	if err != nil {
		return nil, err
	}
	stmts, err := compile(queries)
	if err != nil {
		return nil, err
	}
	return d.run(r.Context(), stmts, busy)
}

// browserGuard keeps web pages off a server without a token: any page a
// developer has open may send it a simple POST (no preflight), or reach it
// under a name of its own that resolves to 127.0.0.1 (DNS rebinding). A
// request addressed to a host that is not loopback, or sent from a page
// whose origin is not loopback, is refused. API clients (d1client, wrangler,
// curl) send no Origin and address the server as 127.0.0.1 or localhost.
// With a token none of this is needed: a page cannot add the Authorization
// header without a preflight, which the server does not answer.
func browserGuard(r *http.Request) *apiError {
	if r.Host != "" && !loopback.Host(r.Host) {
		return &apiError{status: http.StatusForbidden, code: 10000, message: fmt.Sprintf(
			"d1local without a token answers only requests addressed to 127.0.0.1, [::1] or localhost, not %q: set a token to serve other names", r.Host)}
	}
	if origin := r.Header.Get("Origin"); origin != "" {
		u, err := url.Parse(origin)
		if err != nil || !loopback.Host(u.Host) {
			return &apiError{status: http.StatusForbidden, code: 10000, message: fmt.Sprintf(
				"d1local without a token refuses requests from web pages (Origin %q): set a token to serve a page's requests", origin)}
		}
	}
	return nil
}

// authenticate checks the bearer token, if one is configured. A missing
// or wrong token gets the answer Cloudflare gives on the route.
func (s *Server) authenticate(r *http.Request, route string) *apiError {
	if s.cfg.Token == "" {
		return nil
	}
	h, ok := r.Header["Authorization"]
	if !ok {
		return authError(route)
	}
	scheme, token, found := strings.Cut(strings.Join(h, ","), " ")
	if !found || !strings.EqualFold(scheme, "Bearer") || token == "" || strings.ContainsAny(token, " \t,") {
		return &apiError{status: http.StatusBadRequest, code: 6003, message: "Invalid request headers",
			chain: []errorDetail{{code: 6111, message: "Invalid format for Authorization header"}}}
	}
	if subtle.ConstantTimeCompare([]byte(token), []byte(s.cfg.Token)) != 1 {
		return authError(route)
	}
	return nil
}

// authError is the answer to a missing or wrong token.
func authError(route string) *apiError {
	switch route {
	case routeVerify:
		return &apiError{status: http.StatusUnauthorized, code: 1000, message: "Invalid API Token"}
	case routeUser:
		return &apiError{status: http.StatusForbidden, code: 9109, message: "Invalid access token"}
	}
	return &apiError{status: http.StatusForbidden, code: 10000, message: "Authentication error"}
}

// errorResponse maps an execution error to its response.
func (s *Server) errorResponse(err error, dbID string) *apiError {
	var se *sqlError
	switch {
	case errors.As(err, &se):
		return &apiError{status: http.StatusBadRequest, code: 7500, message: se.msg, sqlResult: true}
	case errors.Is(err, ErrNoDatabase):
		return &apiError{status: http.StatusNotFound, code: 7404,
			message: "The database " + dbID + " could not be found"}
	case errors.Is(err, errMemoryLimit):
		return &apiError{status: http.StatusInternalServerError, code: 7500, message: memoryLimitMessage}
	}
	e := internalError(err)
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		// The client went away; the request was rolled back.
		s.log.Debug("d1local: request abandoned", "database", dbID, "error", err)
		return e
	}
	s.log.Error("d1local: internal error", "database", dbID, "message", e.message, "error", err)
	return e
}

// internalError is D1's 500 answer, with the cause appended for local use.
func internalError(cause error) *apiError {
	return &apiError{status: http.StatusInternalServerError, code: 7500,
		message: fmt.Sprintf("internal error; reference = %s (%v)", reference(), cause)}
}

// reference returns a random error reference like D1's.
func reference() string {
	return strings.ToLower(rand.Text())
}

// apiError is an error answer in Cloudflare's envelope.
type apiError struct {
	status    int
	code      int
	message   string
	chain     []errorDetail
	sqlResult bool // "result": [] as D1 answers SQL errors; null otherwise
}

type errorDetail struct {
	code    int
	message string
}

// writeError writes e and returns its status.
func writeError(w http.ResponseWriter, e *apiError) int {
	b := []byte(`{"result":`)
	if e.sqlResult {
		b = append(b, "[]"...)
	} else {
		b = append(b, "null"...)
	}
	b = append(b, `,"success":false,"errors":[{"code":`...)
	b = strconv.AppendInt(b, int64(e.code), 10)
	b = append(b, `,"message":`...)
	b = appendJSONString(b, e.message)
	if len(e.chain) > 0 {
		b = append(b, `,"error_chain":[`...)
		for i, c := range e.chain {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"code":`...)
			b = strconv.AppendInt(b, int64(c.code), 10)
			b = append(b, `,"message":`...)
			b = appendJSONString(b, c.message)
			b = append(b, '}')
		}
		b = append(b, ']')
	}
	b = append(b, `}],"messages":[]}`...)
	writeJSON(w, e.status, b)
	return e.status
}

// writeFault answers with the error of an Overloaded, Internal or
// BadGateway fault.
func writeFault(w http.ResponseWriter, f Fault) int {
	switch {
	case f.Overloaded:
		return writeError(w, &apiError{status: http.StatusTooManyRequests, code: 7500,
			message: "D1 DB is overloaded. Requests queued for too long."})
	case f.Internal:
		return writeError(w, &apiError{status: http.StatusInternalServerError, code: 7500,
			message: "internal error; reference = " + reference()})
	default:
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(http.StatusBadGateway)
		io.WriteString(w, badGatewayPage)
		return http.StatusBadGateway
	}
}

// badGatewayPage is the HTML page Cloudflare's edge answers a 502 with.
const badGatewayPage = `<html>
<head><title>502 Bad Gateway</title></head>
<body>
<center><h1>502 Bad Gateway</h1></center>
<hr><center>cloudflare</center>
</body>
</html>
`

// dropConnection closes the client's connection without an answer.
func dropConnection(w http.ResponseWriter) {
	if hj, ok := w.(http.Hijacker); ok {
		if conn, _, err := hj.Hijack(); err == nil {
			conn.Close()
			return
		}
	}
	// HTTP/2, or a wrapped writer: abort the response instead.
	panic(http.ErrAbortHandler)
}

// writeResults writes a successful answer, built in a buffer of s.answers
// (w.Write does not keep it).
func (s *Server) writeResults(w http.ResponseWriter, endpoint string, results []result) int {
	var b []byte
	select {
	case b = <-s.answers:
	default:
	}
	b = append(b[:0], `{"result":[`...)
	var objects objectEncoder
	for i, r := range results {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"results":`...)
		if endpoint == "raw" {
			b = appendRaw(b, r.columns, r.rows)
		} else {
			b = objects.append(b, r.columns, r.rows)
		}
		b = append(b, `,"success":true,"meta":`...)
		b = appendMeta(b, r.meta)
		b = append(b, '}')
	}
	b = append(b, `],"success":true,"errors":[],"messages":[]}`...)
	writeJSON(w, http.StatusOK, b)
	if cap(b) <= maxSpareAnswer {
		select {
		case s.answers <- b:
		default:
		}
	}
	return http.StatusOK
}

// spareAnswers and maxSpareAnswer bound the buffers a Server keeps for its
// next answers: how many, and the largest kept.
const (
	spareAnswers   = 8
	maxSpareAnswer = 1 << 20
)

// ServerName is the Server header of every JSON answer of a Server, as
// Cloudflare's API answers with "cloudflare": a client tells d1local from
// D1 by it. (d1idem's schema apply creates a missing database on d1local,
// where a database's ID is its name, and never on D1.)
const ServerName = "d1local"

// servedBy and servedByRegion name d1local in meta.
const (
	servedBy       = ServerName
	servedByRegion = "LOCAL"
)

// appendMeta appends a result's meta object, in the field order of real D1
// answers.
func appendMeta(b []byte, m meta) []byte {
	b = append(b, `{"served_by":"`+servedBy+`","served_by_region":"`+servedByRegion+
		`","served_by_primary":true,"timings":{"sql_duration_ms":`...)
	b = appendJSNumber(b, m.duration)
	b = append(b, `},"duration":`...)
	b = appendJSNumber(b, m.duration)
	b = append(b, `,"changes":`...)
	b = appendJSInteger(b, m.changes)
	b = append(b, `,"last_row_id":`...)
	b = appendJSInteger(b, m.lastRowID)
	b = append(b, `,"changed_db":`...)
	b = strconv.AppendBool(b, m.changedDB)
	b = append(b, `,"size_after":`...)
	b = appendJSInteger(b, m.sizeAfter)
	b = append(b, `,"rows_read":`...)
	b = appendJSInteger(b, m.rowsRead)
	b = append(b, `,"rows_written":`...)
	b = appendJSInteger(b, m.rowsWritten)
	return append(b, '}')
}

func writeJSON(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Server", ServerName)
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	w.Write(body)
}
