// Package console is d1idem's web console for operators: an http.Handler
// that shows a ledger at a glance (counts by status, keys awaiting retry,
// the oldest row, the sweep backlog, the size, the API budget and the
// ring), lists the keys whose owner has gone quiet with the ledger's
// explanation of each, pages through every key, looks one up with its
// stored response, and releases a stuck key, fenced by its generation,
// after a confirmation. `d1idem console` serves it; an application can
// mount it in its own admin server too:
//
//	h, err := console.New(console.Config{
//		Ledger:    ledger,
//		Databases: []console.Database{{Name: "orders", Client: db}},
//	})
//	...
//	admin.Handle("/idem/", http.StripPrefix("/idem", h))
//
// The console is built on idem's administrative API (idem.Admin) alone, and
// every page says the D1 calls it cost. Its templates, style sheet and
// script are embedded: nothing is fetched from elsewhere, and nothing is
// built.
//
// # Security
//
// Every page carries a strict Content-Security-Policy (scripts, styles and
// images from the console alone, no inline script, no framing), and every
// value read from the ledger is escaped twice over: html/template escapes
// it for HTML, and package textsafe's rule (the CLI's) shows its control and
// invisible characters as Go escapes. Without a Token the console answers
// only requests addressed to a loopback name (127.0.0.1, [::1], localhost),
// which keeps out a web page that rebinds its own name to 127.0.0.1; serve
// it on a loopback address then. With a Token every request must present it,
// as a bearer token or through the session cookie the sign-in page sets.
// Releasing is off unless Config.AllowRelease is set; a release is a POST
// from the console's own confirmation page, with its CSRF token, and any
// other request to release is refused and changes nothing. No secret reaches
// a page: the console shows database names and IDs, never a token.
package console

import (
	"cmp"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/internal/loopback"
)

// DefaultRefresh is how often the overview refreshes itself by default.
const DefaultRefresh = 10 * time.Second

// MinTokenLength is the shortest Config.Token: a token is the only thing
// between the network and releasing keys.
const MinTokenLength = 16

// Config configures the console. Ledger and Databases are required.
type Config struct {
	// Ledger is the ledger the console shows: its Admin reads every page
	// and releases keys, under its TTL, heartbeat and retention.
	Ledger *idem.Ledger
	// Databases are the ledger's databases with the clients the ledger
	// reaches them by (New's one, or one per Home of NewSharded): each
	// page counts the D1 calls it cost on them, and the overview shows
	// their account's API budget as their responses last reported it.
	Databases []Database
	// Where describes the ledger's databases for people, in each page's
	// header ("database orders"); it must hold no secret. "" names the
	// Databases.
	Where string
	// AllowRelease lets operators release the keys whose owner has gone
	// quiet (those idem.Admin.Explain advises releasing), fenced by their
	// generation. Off, the console only reads.
	AllowRelease bool
	// Token, if set (at least MinTokenLength bytes), is required of every
	// request: as "Authorization: Bearer TOKEN", or through the session
	// cookie that signing in with it sets. Without one, the console answers
	// only requests addressed to a loopback name.
	Token string
	// Refresh is how often the overview refreshes itself in the browser,
	// and how long one read of it serves every page open on it; 0 means
	// DefaultRefresh, a negative value turns the refresh off.
	Refresh time.Duration
	// Logger logs releases and refused requests; nil logs nothing.
	Logger *slog.Logger
}

// Database is one of the ledger's databases.
type Database struct {
	// ID is the database's ID in the ledger (idem.Home.ID); "" for the
	// client's database ID, as idem.Home has it.
	ID string
	// Name names it for people; "" for its ID.
	Name   string
	Client *d1client.Client
}

//go:embed templates/*.tmpl
var templateFiles embed.FS

//go:embed static
var staticFiles embed.FS

// server is the console: Config, and what New made of it.
type server struct {
	cfg      Config
	admin    *idem.Admin
	ledger   idem.Config
	dbs      []Database // IDs and names filled in
	refresh  time.Duration
	pages    map[string]*template.Template
	static   http.Handler
	csrfKey  []byte // signs the CSRF tokens of this process
	session  []byte // the session cookie's value with a Token; nil without
	origin   *http.CrossOriginProtection
	log      *slog.Logger
	paths    map[string]route
	d1       chan struct{} // one page at a time reads D1, so that its calls are its own
	overview snapshots
}

// New returns the console for cfg.
func New(cfg Config) (http.Handler, error) {
	if err := check(cfg); err != nil {
		return nil, err
	}
	s := &server{cfg: cfg, admin: cfg.Ledger.Admin(), ledger: cfg.Ledger.Config(), refresh: cmp.Or(cfg.Refresh, DefaultRefresh),
		origin: http.NewCrossOriginProtection(), log: cfg.Logger, d1: make(chan struct{}, 1), csrfKey: make([]byte, 32)}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if _, err := rand.Read(s.csrfKey); err != nil {
		return nil, fmt.Errorf("console: %w", err)
	}
	if cfg.Token != "" {
		s.session = sessionValue(cfg.Token)
	}
	for _, db := range cfg.Databases {
		db.ID = cmp.Or(db.ID, db.Client.DatabaseID())
		db.Name = cmp.Or(db.Name, db.ID)
		s.dbs = append(s.dbs, db)
	}
	s.paths = s.routes()
	var err error
	if s.pages, err = parsePages(); err != nil {
		return nil, err
	}
	sub, err := fs.Sub(staticFiles, "static")
	if err != nil {
		return nil, err
	}
	s.static = http.StripPrefix("/static/", http.FileServerFS(sub))
	return s, nil
}

// check validates cfg, naming the field at fault.
func check(cfg Config) error {
	switch {
	case cfg.Ledger == nil:
		return errors.New("console: Config.Ledger is required")
	case len(cfg.Databases) == 0:
		return errors.New("console: Config.Databases is empty: give the ledger's databases with their clients")
	case cfg.Token != "" && len(cfg.Token) < MinTokenLength:
		return fmt.Errorf("console: Config.Token is %d bytes long: use at least %d (openssl rand -hex 16 makes 32)", len(cfg.Token), MinTokenLength)
	}
	for i, db := range cfg.Databases {
		if db.Client == nil {
			return fmt.Errorf("console: Config.Databases[%d].Client is nil", i)
		}
	}
	return nil
}

// parsePages parses each page's template with the layout.
func parsePages() (map[string]*template.Template, error) {
	pages := map[string]*template.Template{}
	for _, name := range []string{"overview", "keys", "key", "release", "released", "login", "problem"} {
		t, err := template.New(name).Funcs(funcs).ParseFS(templateFiles, "templates/layout.tmpl", "templates/parts.tmpl", "templates/"+name+".tmpl")
		if err != nil {
			return nil, fmt.Errorf("console: %w", err)
		}
		pages[name] = t
	}
	return pages, nil
}

// The security headers of every answer: the page may load scripts, styles
// and images from the console alone, send forms and fetches to it alone,
// and be framed by no one.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; " +
	"form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

func securityHeaders(h http.Header) {
	h.Set("Content-Security-Policy", contentSecurityPolicy)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	h.Set("Cross-Origin-Resource-Policy", "same-origin")
}

// maxForm bounds a form's body: a release names a key, a sign-in a token.
const maxForm = 64 << 10

// staticPaths are the console's embedded files, served to anyone (the
// sign-in page uses them): nothing in them is secret.
var staticPaths = map[string]bool{"/static/console.css": true, "/static/console.js": true, "/static/favicon.svg": true}

// ServeHTTP guards every request, then routes it.
func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	securityHeaders(w.Header())
	if s.session == nil && r.Host != "" && !loopback.Host(r.Host) {
		s.refuse(w, r, http.StatusForbidden, "Not a loopback name",
			fmt.Sprintf("Without a token the console answers only requests addressed to 127.0.0.1, [::1] or localhost, not %q. Start it with a token to serve other names.", r.Host))
		return
	}
	if r.Method == http.MethodPost {
		r.Body = http.MaxBytesReader(w, r.Body, maxForm)
	}
	if err := s.origin.Check(r); err != nil {
		s.refuse(w, r, http.StatusForbidden, "Refused", "The console refuses requests that change anything from other sites' pages.")
		return
	}
	if staticPaths[r.URL.Path] && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
		w.Header().Set("Cache-Control", "no-cache")
		s.static.ServeHTTP(w, r)
		return
	}
	if r.URL.Path == "/login" {
		s.login(w, r)
		return
	}
	if !s.signedIn(r) {
		s.askSignIn(w, r)
		return
	}
	s.route(w, r)
}

// route is a path's handlers, by method.
type route struct{ get, post http.HandlerFunc }

// routes are the console's pages.
func (s *server) routes() map[string]route {
	return map[string]route{
		"/": {get: s.overviewPage}, "/live": {get: s.livePart}, "/keys": {get: s.keysPage}, "/key": {get: s.keyPage},
		"/release": {get: s.confirmPage, post: s.release}, "/logout": {post: s.logout},
	}
}

// route serves a signed-in request.
func (s *server) route(w http.ResponseWriter, r *http.Request) {
	rt, ok := s.paths[r.URL.Path]
	switch {
	case !ok:
		s.refuse(w, r, http.StatusNotFound, "Not found", "The console has no page "+r.URL.Path+".")
	case (r.Method == http.MethodGet || r.Method == http.MethodHead) && rt.get != nil:
		rt.get(w, r)
	case r.Method == http.MethodPost && rt.post != nil:
		rt.post(w, r)
	default:
		var allowed []string
		if rt.get != nil {
			allowed = append(allowed, http.MethodGet, http.MethodHead)
		}
		if rt.post != nil {
			allowed = append(allowed, http.MethodPost)
		}
		w.Header().Set("Allow", strings.Join(allowed, ", "))
		s.refuse(w, r, http.StatusMethodNotAllowed, "Method not allowed",
			fmt.Sprintf("%s is not how %s is used: %s.", r.Method, r.URL.Path, strings.Join(allowed, ", ")))
	}
}

// mac is the HMAC-SHA256 of msg under key.
func mac(key []byte, msg string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(msg))
	return m.Sum(nil)
}
