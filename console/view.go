package console

import (
	"bytes"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/d1idem/d1idem/d1client/budget"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/internal/human"
	"github.com/d1idem/d1idem/internal/textsafe"
)

// What the templates show is prepared here: every value read from the
// ledger or D1 goes through package textsafe's rule (Display for a value
// in a field, EscapeLines for a body, Escape for free text, the templates'
// text) before html/template escapes it for HTML.

// funcs are the templates' functions.
var funcs = template.FuncMap{
	"text": textsafe.Escape, // free text: control characters escaped
}

// page is what the layout shows around a page's body.
type page struct {
	Title   string
	Nav     string // the menu entry to mark: overview, keys or key
	Where   string // the ledger's databases
	Release bool   // releasing is on
	SignOut bool   // a token is set: the sign-out form is shown
	CSRF    string // the forms' CSRF token
	Footer  string // the D1 calls the page cost
	Body    any
}

// render writes the page name with its body, and the layout's parts.
func (s *server) render(w http.ResponseWriter, r *http.Request, status int, name string, p *page, body any) {
	p.Release, p.Body = s.cfg.AllowRelease, body
	if s.signedIn(r) { // the databases' names are for those signed in
		p.Where, p.SignOut = s.where(), s.session != nil
	}
	if p.SignOut || name == "release" {
		p.CSRF = s.csrfToken(w, r)
	}
	var b bytes.Buffer
	if err := s.pages[name].ExecuteTemplate(&b, "layout", p); err != nil {
		s.log.Error("console: rendering a page", "page", name, "err", err)
		http.Error(w, "the console could not render this page", http.StatusInternalServerError)
		return
	}
	writeHTML(w, status, b.Bytes())
}

// writeHTML writes an HTML answer that no cache keeps: it shows the ledger.
func writeHTML(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// problemView is the page of a refused or failed request.
type problemView struct{ Heading, Message string }

// refuse answers with the problem page.
func (s *server) refuse(w http.ResponseWriter, r *http.Request, status int, heading, message string) {
	s.render(w, r, status, "problem", &page{Title: heading}, problemView{Heading: heading, Message: message})
}

// failed answers a request whose D1 read failed.
func (s *server) failed(w http.ResponseWriter, r *http.Request, what string, err error) {
	s.log.Warn("console: "+what+" failed", "err", err)
	s.refuse(w, r, http.StatusBadGateway, "Could not read the ledger", what+": "+err.Error())
}

// where describes the ledger's databases.
func (s *server) where() string {
	if s.cfg.Where != "" {
		return textsafe.Escape(s.cfg.Where)
	}
	names := make([]string, len(s.dbs))
	for i, db := range s.dbs {
		names[i] = textsafe.Display(db.Name)
	}
	if len(names) == 1 {
		return "database " + names[0]
	}
	return fmt.Sprintf("%d databases (%s)", len(names), strings.Join(names, ", "))
}

// name names the database with this ID.
func (s *server) name(id string) string {
	for _, db := range s.dbs {
		if db.ID == id {
			return db.Name
		}
	}
	return id
}

// callsText says what a page cost in D1 calls, on each database when there
// are several.
func (s *server) callsText(c calls) string {
	text := "This page cost " + human.Plural(c.Total, "D1 call", "D1 calls")
	if len(s.dbs) > 1 {
		each := make([]string, len(s.dbs))
		for i, db := range s.dbs {
			each[i] = fmt.Sprintf("%s: %d", textsafe.Display(db.Name), c.Each[i])
		}
		text += " (" + strings.Join(each, ", ") + ")"
	}
	return text + "."
}

// sharedText says that a page shows a reading made for another.
func (s *server) sharedText(rd *reading) string {
	return fmt.Sprintf("This page cost no D1 call: it shows the overview read %s for another page (%s).",
		human.Age(time.Since(rd.At)), human.Plural(rd.Calls.Total, "D1 call", "D1 calls"))
}

// keyView is a ledger row for people.
type keyView struct {
	Principal, Key string // as textsafe.Display shows them
	URL            string // its lookup page
	Status         string
	State          string // "owner quiet"
	StateClass     string // the state's CSS class: its KeyState
	Generation     int64
	Updated        string // "5m ago"
	UpdatedUTC     string
	Created        string
	Response       string // the stored status, or "-"
	Reason         string // the ledger's explanation: why, what the next retry gets, what to do
	Next, Remedy   string
	ReleaseURL     string // the release's confirmation page; "" unless a release is advised and allowed
	Advised        bool   // a release is advised (allowed or not)
}

func (s *server) keyView(k *idem.KeyRecord) keyView {
	e := s.admin.Explain(k)
	v := keyView{Principal: textsafe.Display(k.Principal), Key: textsafe.Display(k.Key), URL: keyURL(k.Principal, k.Key),
		Status: textsafe.Display(string(k.Status)), State: e.State.Words(), StateClass: string(e.State), Generation: k.Generation,
		Updated: human.Age(k.SinceUpdate()), UpdatedUTC: human.Time(k.UpdatedAt), Created: human.Age(k.Age()),
		Response: human.OrDash(k.ResponseStatus), Reason: e.Reason, Next: e.Next, Remedy: e.Remedy, Advised: e.Release != nil}
	if e.Release != nil && s.cfg.AllowRelease {
		v.ReleaseURL = "/release?" + url.Values{"principal": {k.Principal}, "key": {k.Key}, "generation": {strconv.FormatInt(k.Generation, 10)}}.Encode()
	}
	return v
}

// keyURL is the lookup page of a key.
func keyURL(principal, key string) string {
	return "/key?" + url.Values{"principal": {principal}, "key": {key}}.Encode()
}

// budgetText describes an account's API budget as its responses' Ratelimit
// headers last gave it, now.
func budgetText(b budget.State, now time.Time) string {
	if b.Seen.IsZero() {
		return "not reported: no response carried Ratelimit headers (d1local and a bridge send none)"
	}
	s := human.Count(int64(b.Remaining)) + " calls left"
	if b.Quota > 0 {
		s += " of " + human.Count(int64(b.Quota)) + " per " + human.Duration(b.Window)
	}
	if reset := b.Reset.Sub(now); reset > 0 {
		s += ", resetting in " + human.Duration(reset)
	} else {
		s += "; its window has reset since"
	}
	s += " (as a response said " + human.Age(now.Sub(b.Seen)) + ")"
	if now.Before(b.BlockedUntil) {
		s += "; D1 refuses calls (971) for another " + human.Duration(b.BlockedUntil.Sub(now))
	}
	return s
}
