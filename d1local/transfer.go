package d1local

import (
	"bytes"
	"context"
	"crypto/md5"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The import and export flows of the D1 API, as wrangler d1 execute --file
// and wrangler d1 export --remote drive them. Cloudflare hands out R2
// presigned URLs for the file; d1local serves the equivalent itself, under
// linkPrefix, each URL carrying a random secret instead of a signature.
//
//	import: POST .../import {"action":"init","etag":MD5}      -> upload_url, filename
//	        PUT  upload_url (the SQL file)                    -> ETag "MD5"
//	        POST .../import {"action":"ingest","filename","etag"} -> status complete, or error
//	        POST .../import {"action":"poll","current_bookmark"}  -> the same answer again
//	export: POST .../export {"output_format":"polling","dump_options":{...}}
//	                                                          -> status complete, result.signed_url
//	        GET  signed_url                                   -> the SQL dump
//
// Both run at once, so the first answer is already "complete".

const (
	// linkPrefix is the path of upload and download links.
	linkPrefix = "/d1local/"
	// maxImportBytes bounds an uploaded SQL file (held in memory).
	maxImportBytes = 100 << 20
	// linkTTL is how long a link works: an hour, as Cloudflare's.
	linkTTL = time.Hour
	// maxLinks bounds the links kept at once; the oldest go first.
	maxLinks = 32
)

// transfers holds the links and the last import of each database.
type transfers struct {
	mu      sync.Mutex
	links   map[string]*link // by secret
	imports map[string]any   // the last import answer, by database ID
	seq     int64            // bookmarks handed out
}

// link is an upload URL (for an import) or a download URL (an export).
type link struct {
	upload   bool
	db       string
	filename string
	etag     string // upload: the MD5 announced by init
	data     []byte // upload: the file once PUT; export: the dump
	uploaded bool
	sum      string // upload: the MD5 of data
	created  time.Time
}

// addLink stores l under a new secret and returns the secret.
func (s *Server) addLink(l *link) string {
	t := &s.transfers
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.links == nil {
		t.links = make(map[string]*link)
	}
	now := s.now()
	for k, v := range t.links {
		if now.Sub(v.created) >= linkTTL {
			delete(t.links, k)
		}
	}
	for len(t.links) >= maxLinks {
		oldest := ""
		for k, v := range t.links {
			if oldest == "" || v.created.Before(t.links[oldest].created) {
				oldest = k
			}
		}
		delete(t.links, oldest)
	}
	if l.upload {
		// A new upload of the same file replaces the one before.
		for k, v := range t.links {
			if v.upload && v.db == l.db && v.filename == l.filename {
				delete(t.links, k)
			}
		}
	}
	l.created = now
	secret := rand.Text()
	t.links[secret] = l
	return secret
}

// getLink returns the live link of secret, or nil.
func (s *Server) getLink(secret string) *link {
	t := &s.transfers
	t.mu.Lock()
	defer t.mu.Unlock()
	l := t.links[secret]
	if l != nil && s.now().Sub(l.created) >= linkTTL {
		delete(t.links, secret)
		return nil
	}
	return l
}

// bookmark returns a new time-travel bookmark, in D1's format.
func (s *Server) bookmark() string {
	t := &s.transfers
	t.mu.Lock()
	t.seq++
	n := t.seq
	t.mu.Unlock()
	return fmt.Sprintf("%08x-00000000-00000000-%032x", n, n)
}

// linkURL returns the absolute URL of a link path, on the host the
// request reached.
func linkURL(r *http.Request, path string) string {
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	host := r.Host
	if host == "" {
		host = "localhost"
	}
	return scheme + "://" + host + linkPrefix + path
}

// etagPattern is what an import's etag (an MD5 in hex) must look like.
var etagPattern = regexp.MustCompile(`^[A-Za-z0-9]{1,64}$`)

// serveImport answers POST /accounts/{a}/d1/database/{id}/import.
func serveImport(s *Server, c *call) int {
	id := c.args[1]
	if e := checkIDs(c.args[0], id, "import"); e != nil {
		return s.reply(c.w, c, e)
	}
	body, e := readBody(c.w, c.r)
	if e != nil {
		return s.reply(c.w, c, e)
	}
	var req struct {
		Action          string `json:"action"`
		Etag            string `json:"etag"`
		Filename        string `json:"filename"`
		CurrentBookmark string `json:"current_bookmark"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return s.reply(c.w, c, badRequest("malformed JSON in request body: "+err.Error()))
	}
	switch req.Action {
	case "init":
		if !etagPattern.MatchString(req.Etag) {
			return s.reply(c.w, c, badRequest(`"etag" must be the MD5 of the file, in hex`))
		}
		if _, err := s.database(id, !s.cfg.NoAutoCreate); err != nil {
			return s.reply(c.w, c, s.errorResponse(err, id))
		}
		filename := id + "-" + strings.ToLower(req.Etag) + ".sql"
		secret := s.addLink(&link{upload: true, db: id, filename: filename, etag: strings.ToLower(req.Etag)})
		return s.writeOK(c, map[string]any{"success": true, "type": "import", "filename": filename,
			"upload_url": linkURL(c.r, "upload/"+secret)}, nil, nil)
	case "ingest":
		return s.ingest(c, id, req.Filename, strings.ToLower(req.Etag))
	case "poll":
		s.transfers.mu.Lock()
		last := s.transfers.imports[id]
		s.transfers.mu.Unlock()
		if last == nil {
			return s.writeOK(c, importFailure("no import of this database to poll", ""), nil, nil)
		}
		return s.writeOK(c, last, nil, nil)
	}
	return s.reply(c.w, c, badRequest(fmt.Sprintf(`unknown import action %q: want "init", "ingest" or "poll"`, req.Action)))
}

// ingest runs an uploaded SQL file as one transaction.
func (s *Server) ingest(c *call, id, filename, etag string) int {
	t := &s.transfers
	t.mu.Lock()
	var l *link
	secret := ""
	for k, v := range t.links {
		if v.upload && v.db == id && v.filename == filename {
			l, secret = v, k
		}
	}
	var data []byte
	switch {
	case l == nil:
		t.mu.Unlock()
		return s.reply(c.w, c, badRequest(fmt.Sprintf("no upload %q for database %s: start with the init action", filename, id)))
	case !l.uploaded:
		t.mu.Unlock()
		return s.reply(c.w, c, badRequest(fmt.Sprintf("%s has not been uploaded to its upload_url", filename)))
	case etag != l.etag:
		t.mu.Unlock()
		return s.reply(c.w, c, badRequest(fmt.Sprintf(`"etag" %q is not the one given to init`, etag)))
	case l.sum != l.etag:
		t.mu.Unlock()
		return s.reply(c.w, c, badRequest(fmt.Sprintf("the uploaded file's MD5 is %s, not the etag %s: upload it again", l.sum, l.etag)))
	}
	data = l.data
	delete(t.links, secret)
	t.mu.Unlock()

	var answer any
	results, err := s.runImport(c.r.Context(), id, string(data))
	bookmark := s.bookmark()
	var se *sqlError
	switch {
	case errors.As(err, &se):
		answer = importFailure(se.msg, bookmark)
	case err != nil:
		return s.reply(c.w, c, s.errorResponse(err, id))
	default:
		answer = map[string]any{"success": true, "type": "import", "status": "complete",
			"at_bookmark": bookmark, "messages": []string{},
			"result": map[string]any{"num_queries": len(results), "final_bookmark": bookmark,
				"meta": json.RawMessage(appendMeta(nil, totalMeta(results)))}}
	}
	t.mu.Lock()
	if t.imports == nil {
		t.imports = make(map[string]any)
	}
	t.imports[id] = answer
	t.mu.Unlock()
	return s.writeOK(c, answer, nil, nil)
}

// importFailure is an import's answer when it failed, nothing committed.
func importFailure(msg, bookmark string) map[string]any {
	m := map[string]any{"success": false, "type": "import", "status": "error", "error": msg, "messages": []string{}}
	if bookmark != "" {
		m["at_bookmark"] = bookmark
	}
	return m
}

// runImport runs the statements of an SQL file on database id as one
// transaction, under the same rules as a query call. Empty statements
// (";;", trailing comments) are skipped.
func (s *Server) runImport(ctx context.Context, id, sql string) ([]result, error) {
	pieces, _ := splitSQL(sql)
	stmts, err := compile([]parsedQuery{{pieces: pieces, sql: sql}})
	if err != nil {
		return nil, err
	}
	d, err := s.database(id, !s.cfg.NoAutoCreate)
	if err != nil {
		return nil, err
	}
	return d.run(ctx, stmts, 0)
}

// totalMeta sums the meta of an import's statements.
func totalMeta(results []result) meta {
	var m meta
	for _, r := range results {
		m.duration += r.meta.duration
		m.changes += r.meta.changes
		m.rowsRead += r.meta.rowsRead
		m.rowsWritten += r.meta.rowsWritten
		m.changedDB = m.changedDB || r.meta.changedDB
		m.lastRowID, m.sizeAfter = r.meta.lastRowID, r.meta.sizeAfter
	}
	return m
}

// serveExport answers POST /accounts/{a}/d1/database/{id}/export.
func serveExport(s *Server, c *call) int {
	id := c.args[1]
	if e := checkIDs(c.args[0], id, "export"); e != nil {
		return s.reply(c.w, c, e)
	}
	body, e := readBody(c.w, c.r)
	if e != nil {
		return s.reply(c.w, c, e)
	}
	var req struct {
		OutputFormat string      `json:"output_format"`
		DumpOptions  dumpOptions `json:"dump_options"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return s.reply(c.w, c, badRequest("malformed JSON in request body: "+err.Error()))
	}
	if req.OutputFormat != "polling" {
		return s.reply(c.w, c, badRequest(`"output_format" must be "polling"`))
	}
	d, err := s.database(id, !s.cfg.NoAutoCreate)
	if err != nil {
		return s.reply(c.w, c, s.errorResponse(err, id))
	}
	dump, err := d.dump(c.r.Context(), req.DumpOptions)
	bookmark := s.bookmark()
	var ee *exportError
	switch {
	case errors.As(err, &ee):
		return s.writeOK(c, map[string]any{"success": false, "type": "export", "status": "error",
			"error": ee.msg, "at_bookmark": bookmark, "messages": []string{}}, nil, nil)
	case err != nil:
		return s.reply(c.w, c, s.errorResponse(err, id))
	}
	filename := id + "-" + bookmark[:8] + ".sql"
	secret := s.addLink(&link{db: id, filename: filename, data: []byte(dump)})
	return s.writeOK(c, map[string]any{"success": true, "type": "export", "status": "complete",
		"at_bookmark": bookmark, "messages": []string{},
		"result": map[string]string{"filename": filename, "signed_url": linkURL(c.r, "export/"+secret+"/"+filename)}}, nil, nil)
}

// serveLink serves the upload and download links: PUT upload/{secret} and
// GET export/{secret}/{filename}. They need no token (the secret is the
// credential, as in a presigned URL) and are not API calls: the budget
// does not count them.
func (s *Server) serveLink(w http.ResponseWriter, r *http.Request, path string) {
	kind, rest, _ := strings.Cut(path, "/")
	secret, filename, _ := strings.Cut(rest, "/")
	l := s.getLink(secret)
	switch {
	case l == nil || kind != "upload" && kind != "export" || l.upload != (kind == "upload") ||
		(!l.upload && filename != l.filename) || (l.upload && filename != ""):
		http.Error(w, "no such link (links work for an hour)", http.StatusNotFound)
	case l.upload && r.Method != http.MethodPut, !l.upload && r.Method != http.MethodGet && r.Method != http.MethodHead:
		method := http.MethodGet
		if l.upload {
			method = http.MethodPut
		}
		w.Header().Set("Allow", method)
		http.Error(w, "use "+method, http.StatusMethodNotAllowed)
	case l.upload:
		data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxImportBytes))
		if err != nil {
			var tooBig *http.MaxBytesError
			if errors.As(err, &tooBig) {
				http.Error(w, fmt.Sprintf("the file is over d1local's import limit of %d bytes", maxImportBytes),
					http.StatusRequestEntityTooLarge)
				return
			}
			http.Error(w, "reading the upload: "+err.Error(), http.StatusBadRequest)
			return
		}
		sum := md5.Sum(data)
		etag := hex.EncodeToString(sum[:])
		s.transfers.mu.Lock()
		l.data, l.uploaded, l.sum = data, true, etag
		s.transfers.mu.Unlock()
		w.Header().Set("ETag", strconv.Quote(etag))
		w.WriteHeader(http.StatusOK)
	default:
		w.Header().Set("Content-Type", "application/sql; charset=utf-8")
		w.Header().Set("Content-Disposition", `attachment; filename="`+l.filename+`"`)
		http.ServeContent(w, r, "", l.created, bytes.NewReader(l.data))
	}
}

func badRequest(msg string) *apiError {
	return &apiError{status: http.StatusBadRequest, code: 7400, message: msg}
}
