package d1local

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Config configures a Server.
type Config struct {
	// Dir holds one SQLite file per database ID ("<id>.sqlite", in WAL
	// mode). "" keeps every database in memory, for the Server's lifetime.
	Dir string
	// Token, if set, is required as "Authorization: Bearer <Token>".
	// A missing or different token is answered 403 with code 10000
	// "Authentication error"; an Authorization header that is not a bearer
	// token, 400 with code 6003 (error_chain 6111), as Cloudflare does.
	Token string
	// NoAutoCreate makes a call to an unknown database ID fail with 404 and
	// code 7404, as D1 does. By default a database is created on first use.
	// CreateDatabase creates one explicitly.
	NoAutoCreate bool
	// Faults, if set, chooses a fault for every call that no fault queued
	// with Inject claimed.
	Faults FaultFunc
	// Logger receives a debug line per call and the causes of internal
	// errors; nil discards them.
	Logger *slog.Logger
}

// Server is a D1-compatible REST server: an http.Handler serving
// POST /accounts/{account}/d1/database/{database}/query and /raw (also
// under a /client/v4 prefix). It is safe for concurrent use.
type Server struct {
	cfg Config
	log *slog.Logger

	mu     sync.Mutex
	dbs    map[string]*database
	closed bool

	faultMu sync.Mutex
	faults  []Fault

	calls atomic.Int64
}

// maxBodyBytes bounds a request body.
const maxBodyBytes = 10 << 20

// idPattern is what an account or database identifier must look like.
var idPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// New returns a Server. With cfg.Dir set, the directory is created if
// needed; databases are opened on first use.
func New(cfg Config) (*Server, error) {
	if cfg.Dir != "" {
		if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
			return nil, fmt.Errorf("d1local: create data directory: %w", err)
		}
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Server{cfg: cfg, log: log, dbs: make(map[string]*database)}, nil
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
		errs = append(errs, d.close())
	}
	return errors.Join(errs...)
}

// CreateDatabase creates the database id unless it exists (which is useful
// with Config.NoAutoCreate).
func (s *Server) CreateDatabase(id string) error {
	if !idPattern.MatchString(id) {
		return fmt.Errorf("d1local: invalid database ID %q", id)
	}
	_, err := s.database(id, true)
	return err
}

// Calls returns the number of D1 calls received: every POST to a query or
// raw endpoint, whatever its outcome.
func (s *Server) Calls() int64 { return s.calls.Load() }

// errNoDatabase is returned for an unknown database with NoAutoCreate.
var errNoDatabase = errors.New("d1local: no such database")

// database returns the open database id, opening or creating it.
func (s *Server) database(id string, create bool) (*database, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errClosed
	}
	if d, ok := s.dbs[id]; ok {
		return d, nil
	}
	path := memoryPath
	if s.cfg.Dir != "" {
		path = filepath.Join(s.cfg.Dir, id+".sqlite")
	}
	if !create {
		if s.cfg.Dir == "" {
			return nil, errNoDatabase
		}
		if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
			return nil, errNoDatabase
		}
	}
	d, err := openDatabase(id, path)
	if err != nil {
		return nil, fmt.Errorf("d1local: %w", err)
	}
	s.dbs[id] = d
	s.log.Debug("d1local: database opened", "database", id, "path", path)
	return d, nil
}

// ServeHTTP serves the D1 REST API.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	path := r.URL.Path
	if rest, ok := strings.CutPrefix(path, "/client/v4"); ok {
		path = rest
	}
	parts := strings.Split(path, "/")
	// "", "accounts", account, "d1", "database", database, endpoint
	if len(parts) != 7 || parts[0] != "" || parts[1] != "accounts" || parts[3] != "d1" ||
		parts[4] != "database" || (parts[6] != "query" && parts[6] != "raw") {
		writeError(w, &apiError{status: http.StatusNotFound, code: 7000, message: "No route for that URI"})
		return
	}
	account, dbID, endpoint := parts[2], parts[5], parts[6]
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeError(w, &apiError{status: http.StatusMethodNotAllowed, code: 10405,
			message: fmt.Sprintf("Method %s not allowed: use POST", r.Method)})
		return
	}
	seq := s.calls.Add(1)
	status := s.serveCall(w, r, seq, account, dbID, endpoint)
	s.log.Debug("d1local: call", "seq", seq, "database", dbID, "endpoint", endpoint,
		"status", status, "duration", time.Since(start))
}

// serveCall answers one query or raw call and returns the HTTP status
// (0 when the response was dropped).
func (s *Server) serveCall(w http.ResponseWriter, r *http.Request, seq int64, account, dbID, endpoint string) int {
	if e := s.authenticate(r); e != nil {
		return writeError(w, e)
	}
	if !idPattern.MatchString(account) || !idPattern.MatchString(dbID) {
		return writeError(w, &apiError{status: http.StatusBadRequest, code: 7003, message: fmt.Sprintf(
			"Could not route to /client/v4/accounts/%s/d1/database/%s/%s, perhaps your object identifier is invalid?",
			account, dbID, endpoint)})
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return writeError(w, &apiError{status: http.StatusRequestEntityTooLarge, code: 7400,
				message: fmt.Sprintf("Request body too large: the limit is %d bytes", maxBodyBytes)})
		}
		return writeError(w, &apiError{status: http.StatusBadRequest, code: 7400,
			message: "Could not read the request body: " + err.Error()})
	}
	queries, err := decodeBody(body)
	if err != nil {
		return writeError(w, &apiError{status: http.StatusBadRequest, code: 7400, message: err.Error()})
	}

	fault := s.nextFault(Request{AccountID: account, DatabaseID: dbID, Endpoint: endpoint,
		Statements: statementTexts(queries), Seq: seq})
	ctx := r.Context()
	if err := sleep(ctx, fault.Latency); err != nil {
		return writeError(w, internalError(fmt.Errorf("latency fault: %w", err)))
	}
	if fault.RateLimit {
		retry := fault.RetryAfter
		if retry <= 0 {
			retry = defaultRetryAfter
		}
		w.Header().Set("Retry-After", strconv.FormatInt(int64(math.Ceil(retry.Seconds())), 10))
		return writeError(w, &apiError{status: http.StatusTooManyRequests, code: 971,
			message: "Please wait and consider throttling your request speed"})
	}
	if fault.errorFault() && !fault.AfterCommit && !fault.LoseResponse {
		return writeFault(w, fault)
	}

	results, err := s.execute(r, dbID, queries)
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
	return writeResults(w, endpoint, results)
}

// execute compiles and runs the queries on database dbID.
func (s *Server) execute(r *http.Request, dbID string, queries []parsedQuery) ([]result, error) {
	d, err := s.database(dbID, !s.cfg.NoAutoCreate)
	if err != nil {
		return nil, err
	}
	stmts, err := compile(queries)
	if err != nil {
		return nil, err
	}
	return d.run(r.Context(), stmts)
}

// authenticate checks the bearer token, if one is configured.
func (s *Server) authenticate(r *http.Request) *apiError {
	if s.cfg.Token == "" {
		return nil
	}
	h, ok := r.Header["Authorization"]
	if !ok {
		return authError()
	}
	scheme, token, found := strings.Cut(strings.Join(h, ","), " ")
	if !found || !strings.EqualFold(scheme, "Bearer") || token == "" || strings.ContainsAny(token, " \t,") {
		return &apiError{status: http.StatusBadRequest, code: 6003, message: "Invalid request headers",
			chain: []errorDetail{{code: 6111, message: "Invalid format for Authorization header"}}}
	}
	if subtle.ConstantTimeCompare([]byte(token), []byte(s.cfg.Token)) != 1 {
		return authError()
	}
	return nil
}

func authError() *apiError {
	return &apiError{status: http.StatusForbidden, code: 10000, message: "Authentication error"}
}

// errorResponse maps an execution error to its response.
func (s *Server) errorResponse(err error, dbID string) *apiError {
	var se *sqlError
	switch {
	case errors.As(err, &se):
		return &apiError{status: http.StatusBadRequest, code: 7500, message: se.msg, sqlResult: true}
	case errors.Is(err, errNoDatabase):
		return &apiError{status: http.StatusNotFound, code: 7404,
			message: "The database " + dbID + " could not be found"}
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

// writeResults writes a successful answer.
func writeResults(w http.ResponseWriter, endpoint string, results []result) int {
	b := []byte(`{"result":[`)
	for i, r := range results {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"results":`...)
		if endpoint == "raw" {
			b = appendRaw(b, r.columns, r.rows)
		} else {
			b = appendObjects(b, r.columns, r.rows)
		}
		b = append(b, `,"success":true,"meta":`...)
		b = appendMeta(b, r.meta)
		b = append(b, '}')
	}
	b = append(b, `],"success":true,"errors":[],"messages":[]}`...)
	writeJSON(w, http.StatusOK, b)
	return http.StatusOK
}

// servedBy and servedByRegion name d1local in meta.
const (
	servedBy       = "d1local"
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
	b = append(b, jsInteger(m.changes)...)
	b = append(b, `,"last_row_id":`...)
	b = append(b, jsInteger(m.lastRowID)...)
	b = append(b, `,"changed_db":`...)
	b = strconv.AppendBool(b, m.changedDB)
	b = append(b, `,"size_after":`...)
	b = append(b, jsInteger(m.sizeAfter)...)
	b = append(b, `,"rows_read":`...)
	b = append(b, jsInteger(m.rowsRead)...)
	b = append(b, `,"rows_written":`...)
	b = append(b, jsInteger(m.rowsWritten)...)
	return append(b, '}')
}

func writeJSON(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	w.Write(body)
}
