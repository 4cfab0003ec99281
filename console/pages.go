package console

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/internal/human"
	"github.com/d1idem/d1idem/internal/textsafe"
)

// formValue reads a principal or key as a form or link gives it: a value
// that starts with a double quote is Go-quoted, as the console shows any
// value that is not plain (textsafe.Display), so that one copied from a
// page reads back as the same bytes; any other is taken as it is.
func formValue(s string) (string, error) {
	if !strings.HasPrefix(s, `"`) {
		return s, nil
	}
	v, err := strconv.Unquote(s)
	if err != nil {
		return "", fmt.Errorf("%s starts with a double quote but is not a quoted value, as the console shows one (\"\\x1b[31m\")", textsafe.Display(s))
	}
	return v, nil
}

// principalAndKey reads the principal and key of a form or link.
func principalAndKey(form url.Values) (principal, key string, err error) {
	if principal, err = formValue(form.Get("principal")); err != nil {
		return "", "", fmt.Errorf("principal %w", err)
	}
	if key, err = formValue(form.Get("key")); err != nil {
		return "", "", fmt.Errorf("key %w", err)
	}
	switch {
	case !idem.ValidPrincipal(principal):
		return "", "", fmt.Errorf("%s is not a principal the ledger holds: principals are 1 to %d bytes of UTF-8", textsafe.Display(principal), idem.MaxPrincipalLength)
	case !idem.ValidKey(key):
		return "", "", fmt.Errorf("%s is not an Idempotency-Key: keys are 1 to 255 printable ASCII characters", textsafe.Display(key))
	}
	return principal, key, nil
}

// ---- the keys ----

// keysView is a page of keys, with the filters that chose them.
type keysView struct {
	Principal, Status, OlderThan string // the filters, as the form shows them
	Limit                        int
	Keys                         []keyView
	Next, First                  string // the next page, the first page ("" when none, or on it)
	Empty                        string
}

// keysPage pages through the ledger's keys by last update, with
// Admin.List's cursors: each page is one indexed read of a page of rows on
// each database, however many rows there are.
func (s *server) keysPage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	opts, v, err := listOptions(q)
	if err != nil {
		s.refuse(w, r, http.StatusBadRequest, "Not a list of keys", err.Error())
		return
	}
	var list idem.KeyPage
	c, err := s.measure(r.Context(), func(ctx context.Context) error {
		list, err = s.admin.List(ctx, opts)
		return err
	})
	switch {
	case errors.Is(err, idem.ErrBadCursor):
		s.refuse(w, r, http.StatusBadRequest, "Not a cursor", "The cursor is not one this console handed out: start again from the first page.")
		return
	case err != nil:
		s.failed(w, r, "listing keys", err)
		return
	}
	for i := range list.Keys {
		v.Keys = append(v.Keys, s.keyView(&list.Keys[i]))
	}
	if list.NextCursor != "" {
		next := maps.Clone(q) // Set and Del replace the slices, never change them
		next.Set("cursor", list.NextCursor)
		v.Next = "/keys?" + next.Encode()
	}
	if opts.Cursor != "" {
		first := maps.Clone(q)
		first.Del("cursor")
		v.First = "/keys?" + first.Encode()
	}
	switch {
	case len(v.Keys) == 0 && opts.Cursor != "":
		v.Empty = "No more keys after this point."
	case len(v.Keys) == 0:
		v.Empty = "No keys match."
	}
	s.render(w, r, http.StatusOK, "keys", &page{Title: "Keys", Nav: "keys", Footer: s.callsText(c)}, v)
}

// listOptions reads the keys page's filters.
func listOptions(q url.Values) (idem.ListOptions, keysView, error) {
	v := keysView{Status: q.Get("status"), OlderThan: q.Get("older_than"), Limit: idem.DefaultListLimit}
	opts := idem.ListOptions{Status: idem.Status(v.Status), Cursor: q.Get("cursor")}
	var err error
	if opts.Principal, err = formValue(q.Get("principal")); err != nil {
		return opts, v, fmt.Errorf("principal %w", err)
	}
	v.Principal = q.Get("principal")
	if v.Status != "" && !opts.Status.Valid() {
		return opts, v, fmt.Errorf("status %s is not one of the ledger's: pending or completed", textsafe.Display(v.Status))
	}
	if v.OlderThan != "" {
		if opts.OlderThan, err = time.ParseDuration(v.OlderThan); err != nil || opts.OlderThan <= 0 {
			return opts, v, fmt.Errorf("older than %s is not a positive duration, such as 30s, 10m or 24h", textsafe.Display(v.OlderThan))
		}
	}
	if l := q.Get("limit"); l != "" {
		if v.Limit, err = strconv.Atoi(l); err != nil || v.Limit < 1 || v.Limit > idem.MaxListLimit {
			return opts, v, fmt.Errorf("limit %s is out of range: 1 to %d", textsafe.Display(l), idem.MaxListLimit)
		}
	}
	opts.Limit = v.Limit
	return opts, v, nil
}

// ---- one key ----

// keyPageView is the lookup page: its form, and the key found.
type keyPageView struct {
	Principal, Key string // the form's values, as typed
	Found          *keyDetail
	Missing        string // no such key
	Problem        string // the form's values are not a principal and key
}

// keyDetail is one row with its stored response.
type keyDetail struct {
	keyView
	Fingerprint string
	Headers     [][2]string
	HeadersNote string // when there are no headers to list
	Body        string
	BodyNote    string
}

// keyPage looks a key up by principal and key (one D1 call).
func (s *server) keyPage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	v := keyPageView{Principal: q.Get("principal"), Key: q.Get("key")}
	if v.Principal == "" && v.Key == "" {
		s.render(w, r, http.StatusOK, "key", &page{Title: "Look up a key", Nav: "key", Footer: "This page cost no D1 call."}, v)
		return
	}
	principal, key, err := principalAndKey(q)
	if err != nil {
		v.Problem = err.Error()
		s.render(w, r, http.StatusBadRequest, "key", &page{Title: "Look up a key", Nav: "key", Footer: "This page cost no D1 call."}, v)
		return
	}
	// The form shows the values as the console shows any value.
	v.Principal, v.Key = textsafe.Display(principal), textsafe.Display(key)
	var k idem.KeyRecord
	c, err := s.measure(r.Context(), func(ctx context.Context) error {
		k, err = s.admin.Get(ctx, principal, key)
		return err
	})
	status := http.StatusOK
	switch {
	case errors.Is(err, idem.ErrKeyNotFound):
		status, v.Missing = http.StatusNotFound, fmt.Sprintf("No key %s for principal %s: it was never claimed, or the sweep deleted it.", v.Key, v.Principal)
	case err != nil:
		s.failed(w, r, "looking the key up", err)
		return
	default:
		v.Found = s.keyDetail(&k)
	}
	s.render(w, r, status, "key", &page{Title: "Key " + v.Key, Nav: "key", Footer: s.callsText(c)}, v)
}

// keyDetail prepares a row and its stored response.
func (s *server) keyDetail(k *idem.KeyRecord) *keyDetail {
	d := &keyDetail{keyView: s.keyView(k), Fingerprint: textsafe.Display(k.Fingerprint)}
	headers, err := k.StoredHeaders()
	switch {
	case err != nil:
		d.HeadersNote = fmt.Sprintf("%s (not a JSON object of strings: %s)", textsafe.Display(*k.ResponseHeaders), textsafe.Escape(err.Error()))
	case k.ResponseHeaders != nil && len(headers) == 0:
		d.HeadersNote = "none stored"
	case len(headers) == 0:
		d.HeadersNote = "-"
	}
	for _, n := range slices.Sorted(maps.Keys(headers)) {
		d.Headers = append(d.Headers, [2]string{textsafe.Display(n), textsafe.Escape(headers[n])})
	}
	switch {
	case k.ResponseBody == nil && k.Status == idem.StatusCompleted:
		d.BodyNote = "NULL: no body stored (an oversized response is stored as status 500 with no body)"
	case k.ResponseBody == nil:
		d.BodyNote = "-"
	default:
		d.Body = textsafe.EscapeLines(*k.ResponseBody)
		d.BodyNote = human.Plural(int64(len(*k.ResponseBody)), "byte", "bytes")
	}
	return d
}

// ---- releasing a key ----

// releaseView is the confirmation page of a release.
type releaseView struct {
	K              keyView
	Principal, Key string // the form's hidden values (textsafe.Display: they read back exactly)
	Generation     int64
	Force          bool
	Takeover       int64 // the generation the client's retry then runs at
	Problem        string
	Released       bool  // on the result page: whether it was released
	To             int64 // the generation the release moves it to
}

// releaseRequest is the key and generation a release names.
type releaseRequest struct {
	principal, key string
	generation     int64
}

func parseRelease(form url.Values) (releaseRequest, error) {
	p, k, err := principalAndKey(form)
	if err != nil {
		return releaseRequest{}, err
	}
	gen, err := strconv.ParseInt(form.Get("generation"), 10, 64)
	if err != nil || gen < 1 {
		return releaseRequest{}, fmt.Errorf("generation %s is not a generation (1, 2, ...)", textsafe.Display(form.Get("generation")))
	}
	return releaseRequest{principal: p, key: k, generation: gen}, nil
}

// confirmPage shows exactly what a release would do, with the form that
// does it (one D1 call: the row as it is now).
func (s *server) confirmPage(w http.ResponseWriter, r *http.Request) {
	if !s.cfg.AllowRelease {
		s.releaseOff(w, r)
		return
	}
	req, err := parseRelease(r.URL.Query())
	if err != nil {
		s.refuse(w, r, http.StatusBadRequest, "Not a release", err.Error())
		return
	}
	var k idem.KeyRecord
	c, err := s.measure(r.Context(), func(ctx context.Context) error {
		k, err = s.admin.Get(ctx, req.principal, req.key)
		return err
	})
	if s.lookupFailed(w, r, req, err) {
		return
	}
	v := s.releaseView(&k, req)
	status := http.StatusOK
	if v.Problem != "" {
		status = http.StatusConflict
	}
	s.render(w, r, status, "release", &page{Title: "Release " + v.K.Key, Footer: s.callsText(c)}, v)
}

// releaseView prepares the confirmation of releasing k at req's generation,
// or says why there is nothing to release.
func (s *server) releaseView(k *idem.KeyRecord, req releaseRequest) releaseView {
	v := releaseView{K: s.keyView(k), Principal: textsafe.Display(req.principal), Key: textsafe.Display(req.key), Generation: req.generation}
	e := s.admin.Explain(k)
	switch {
	case k.Generation != req.generation:
		v.Problem = fmt.Sprintf("The key has moved on: it is at generation %d now (%s, updated %s), not %d. Nothing is released at generation %d.",
			k.Generation, e.State.Words(), human.Age(k.SinceUpdate()), req.generation, req.generation)
	case e.Release == nil:
		v.Problem = fmt.Sprintf("Nothing to release: the key is %s. %s", e.State.Words(), e.Remedy)
	default:
		v.Force, v.To, v.Takeover = e.Release.Force, req.generation+1, e.TakeoverGeneration
	}
	return v
}

// lookupFailed answers a release whose row could not be read, and
// reports whether it did.
func (s *server) lookupFailed(w http.ResponseWriter, r *http.Request, req releaseRequest, err error) bool {
	switch {
	case errors.Is(err, idem.ErrKeyNotFound):
		s.refuse(w, r, http.StatusNotFound, "No such key", fmt.Sprintf("No key %s for principal %s: nothing to release.",
			textsafe.Display(req.key), textsafe.Display(req.principal)))
	case err != nil:
		s.failed(w, r, "reading the key", err)
	}
	return err != nil
}

// releaseOff answers a release while releasing is off.
func (s *server) releaseOff(w http.ResponseWriter, r *http.Request) {
	s.log.Warn("console: release refused: releasing is off", "remote", r.RemoteAddr)
	s.refuse(w, r, http.StatusForbidden, "Releasing is off",
		"This console only reads the ledger. Start it with --allow-release (console.Config.AllowRelease) to release stuck keys; 'd1idem keys release' releases one from a shell.")
}

// release releases a key, fenced by its generation, as the confirmation
// page's form asks: releasing must be on, the form must carry its CSRF
// token, and the key must still be at that generation with a release
// advised (two D1 calls: the row, then the fenced release).
func (s *server) release(w http.ResponseWriter, r *http.Request) {
	switch {
	case !s.cfg.AllowRelease:
		s.releaseOff(w, r)
		return
	case !s.csrfOK(r):
		s.refuseCSRF(w, r)
		return
	}
	req, err := parseRelease(r.PostForm)
	if err != nil {
		s.refuse(w, r, http.StatusBadRequest, "Not a release", err.Error())
		return
	}
	var v releaseView
	c, err := s.measure(r.Context(), func(ctx context.Context) error {
		k, err := s.admin.Get(ctx, req.principal, req.key)
		if err != nil {
			return err
		}
		if v = s.releaseView(&k, req); v.Problem != "" {
			return nil
		}
		// Forced only while pending: an owner that completes the key
		// between the read and the release keeps its response.
		res, err := s.admin.Release(ctx, req.principal, req.key, req.generation, idem.ReleaseOptions{Force: v.Force, PendingOnly: true})
		if err != nil {
			return err
		}
		v.Released, v.To, v.Takeover = res.Released, res.Generation, res.Generation+1
		if !res.Released {
			v = s.releaseView(&res.Before, req)
			v.Problem = "Not released: " + v.Problem
		}
		return nil
	})
	if s.lookupFailed(w, r, req, err) {
		return
	}
	s.released(w, r, req, v, c)
}

// released answers a release: what was done, or why nothing was.
func (s *server) released(w http.ResponseWriter, r *http.Request, req releaseRequest, v releaseView, c calls) {
	status := http.StatusOK
	if v.Released {
		s.forget()
		s.log.Info("console: released a key", "principal", req.principal, "key", req.key, "from_generation", req.generation,
			"to_generation", v.To, "remote", r.RemoteAddr)
	} else {
		status = http.StatusConflict
	}
	s.render(w, r, status, "released", &page{Title: "Release " + v.K.Key, Footer: s.callsText(c)}, v)
}
