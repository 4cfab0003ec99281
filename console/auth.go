package console

import (
	"crypto/hmac"
	"crypto/rand"
	"encoding/base64"
	"net/http"
	"strings"
)

// The console's cookies. Both are HttpOnly and SameSite=Strict: no script
// reads them, and no other site's page sends them.
const (
	// sessionCookie holds, with a Token, a value derived from it (never the
	// token itself): sessionValue.
	sessionCookie = "d1idem_console_session"
	// csrfCookie holds a random nonce; a form's CSRF token is its HMAC
	// under the process's key (csrfToken).
	csrfCookie = "d1idem_console_csrf"
)

// sessionValue is the session cookie's value for token: an HMAC of a fixed
// text under the token, so that the cookie proves the token without
// holding it. It is the same across restarts with the same token; changing
// the token signs everyone out.
func sessionValue(token string) []byte {
	return []byte(base64.RawURLEncoding.EncodeToString(mac([]byte(token), "d1idem console session v1")))
}

// signedIn reports whether r may see the console: always without a Token;
// with one, when r carries it as a bearer token or the session cookie.
func (s *server) signedIn(r *http.Request) bool {
	if s.session == nil {
		return true
	}
	if h := r.Header.Get("Authorization"); h != "" {
		scheme, token, ok := strings.Cut(h, " ")
		return ok && strings.EqualFold(scheme, "Bearer") && s.isToken(token)
	}
	c, err := r.Cookie(sessionCookie)
	return err == nil && hmac.Equal([]byte(c.Value), s.session)
}

// isToken reports whether token is the console's, in constant time (the
// HMACs compared have one length whatever token's).
func (s *server) isToken(token string) bool {
	return hmac.Equal(mac(s.csrfKey, "token "+token), mac(s.csrfKey, "token "+s.cfg.Token))
}

// setCookie sets an HttpOnly, SameSite=Strict cookie for the whole console
// (Secure when the request came over TLS); maxAge < 0 deletes it.
func setCookie(w http.ResponseWriter, r *http.Request, name, value string, maxAge int) {
	http.SetCookie(w, &http.Cookie{Name: name, Value: value, Path: "/", MaxAge: maxAge, HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
}

// askSignIn answers a request that is not signed in: the sign-in page, or
// for the overview's refresh a short 401 that its script shows.
func (s *server) askSignIn(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/live" {
		http.Error(w, "signed out: reload the page to sign in", http.StatusUnauthorized)
		return
	}
	s.render(w, r, http.StatusUnauthorized, "login", &page{Title: "Sign in"}, loginView{})
}

// loginView is the sign-in page.
type loginView struct {
	Wrong bool // the token given was not the console's
}

// login serves the sign-in page and its form: the right token sets the
// session cookie.
func (s *server) login(w http.ResponseWriter, r *http.Request) {
	switch {
	case s.session == nil || r.Method != http.MethodPost && s.signedIn(r):
		http.Redirect(w, r, "/", http.StatusSeeOther)
	case r.Method == http.MethodGet || r.Method == http.MethodHead:
		s.render(w, r, http.StatusOK, "login", &page{Title: "Sign in"}, loginView{})
	case r.Method != http.MethodPost:
		w.Header().Set("Allow", "GET, HEAD, POST")
		s.refuse(w, r, http.StatusMethodNotAllowed, "Method not allowed", r.Method+" is not how /login is used.")
	case !s.isToken(r.PostFormValue("token")):
		s.log.Warn("console: sign-in refused: not the console's token", "remote", r.RemoteAddr)
		s.render(w, r, http.StatusUnauthorized, "login", &page{Title: "Sign in"}, loginView{Wrong: true})
	default:
		setCookie(w, r, sessionCookie, string(s.session), 0)
		http.Redirect(w, r, "/", http.StatusSeeOther)
	}
}

// logout deletes the session cookie (a POST with the CSRF token).
func (s *server) logout(w http.ResponseWriter, r *http.Request) {
	if !s.csrfOK(r) {
		s.refuseCSRF(w, r)
		return
	}
	setCookie(w, r, sessionCookie, "", -1)
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}

// csrfToken is the CSRF token the page's forms carry: the HMAC of the
// browser's CSRF nonce (set here when it has none) under the process's
// key. Another site's page can neither read the nonce nor compute the
// HMAC, and a nonce planted in the browser is worthless without it.
func (s *server) csrfToken(w http.ResponseWriter, r *http.Request) string {
	nonce := ""
	if c, err := r.Cookie(csrfCookie); err == nil && len(c.Value) == 43 {
		nonce = c.Value
	} else {
		b := make([]byte, 32)
		_, _ = rand.Read(b) // never fails (crypto/rand)
		nonce = base64.RawURLEncoding.EncodeToString(b)
		setCookie(w, r, csrfCookie, nonce, 0)
	}
	return base64.RawURLEncoding.EncodeToString(mac(s.csrfKey, "csrf "+nonce))
}

// csrfOK reports whether the form posted in r carries the CSRF token of
// the browser's nonce.
func (s *server) csrfOK(r *http.Request) bool {
	c, err := r.Cookie(csrfCookie)
	if err != nil {
		return false
	}
	got, err := base64.RawURLEncoding.DecodeString(r.PostFormValue("csrf"))
	return err == nil && hmac.Equal(got, mac(s.csrfKey, "csrf "+c.Value))
}

// refuseCSRF answers a form posted without the right CSRF token.
func (s *server) refuseCSRF(w http.ResponseWriter, r *http.Request) {
	s.log.Warn("console: form refused: no valid CSRF token", "path", r.URL.Path, "remote", r.RemoteAddr)
	s.refuse(w, r, http.StatusForbidden, "Refused: no valid form token",
		"The console accepts this form only from its own page, with the token that page carries. Nothing was changed. Open the page again and submit it from there.")
}
