package d1local

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// handler answers one routed API call and returns the HTTP status (0 when
// the response was dropped).
type handler func(s *Server, c *call) int

// route is one path pattern of the API and its handlers by method.
type route struct {
	name    string
	d1Call  bool // a query or raw call: counted by Calls
	methods map[string]handler
}

// allow lists the route's methods, for an Allow header.
func (rt *route) allow() string {
	var ms []string
	for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodDelete} {
		if _, ok := rt.methods[m]; ok {
			ms = append(ms, m)
		}
	}
	return strings.Join(ms, ", ")
}

// Route names, for logs and for the answer to a wrong token.
const (
	routeVerify      = "tokens/verify"
	routeUser        = "user"
	routeMemberships = "memberships"
	routeAccounts    = "accounts"
	routeDatabases   = "d1/database"
	routeDatabase    = "d1/database/{id}"
	routeQuery       = "d1/database/{id}/query"
	routeImport      = "d1/database/{id}/import"
	routeExport      = "d1/database/{id}/export"
)

// The API's routes. They are never modified.
var (
	verifyRoute      = &route{name: routeVerify, methods: map[string]handler{http.MethodGet: serveVerify}}
	userRoute        = &route{name: routeUser, methods: map[string]handler{http.MethodGet: serveUser}}
	membershipsRoute = &route{name: routeMemberships, methods: map[string]handler{http.MethodGet: serveMemberships}}
	accountsRoute    = &route{name: routeAccounts, methods: map[string]handler{http.MethodGet: serveAccounts}}
	databasesRoute   = &route{name: routeDatabases, methods: map[string]handler{
		http.MethodGet: serveListDatabases, http.MethodPost: serveCreateDatabase}}
	databaseRoute = &route{name: routeDatabase, methods: map[string]handler{
		http.MethodGet: serveGetDatabase, http.MethodDelete: serveDeleteDatabase}}
	queryRoute  = &route{name: routeQuery, d1Call: true, methods: map[string]handler{http.MethodPost: serveCall}}
	importRoute = &route{name: routeImport, methods: map[string]handler{http.MethodPost: serveImport}}
	exportRoute = &route{name: routeExport, methods: map[string]handler{http.MethodPost: serveExport}}
)

// apiRoutes are the API's paths (without the /client/v4 prefix and the
// leading '/') and their routes. A segment in braces is a parameter: "{}"
// any segment, "{a|b}" one of the words listed.
var apiRoutes = []struct {
	pattern []string
	route   *route
}{
	{segments("user/tokens/verify"), verifyRoute},
	{segments("user"), userRoute},
	{segments("memberships"), membershipsRoute},
	{segments("accounts"), accountsRoute},
	{segments("accounts/{}/tokens/verify"), verifyRoute},
	{segments("accounts/{}/d1/database"), databasesRoute},
	{segments("accounts/{}/d1/database/{}"), databaseRoute},
	{segments("accounts/{}/d1/database/{}/{query|raw}"), queryRoute},
	{segments("accounts/{}/d1/database/{}/{import}"), importRoute},
	{segments("accounts/{}/d1/database/{}/{export}"), exportRoute},
}

// segments splits a pattern of apiRoutes at its slashes.
func segments(pattern string) []string { return strings.Split(pattern, "/") }

// matchRoute finds the route of an API path (without the /client/v4
// prefix) and its parameters: the account, the database and the endpoint,
// as far as the path has them. A path with an empty segment has no route.
func matchRoute(path string) (*route, []string) {
	rest, ok := strings.CutPrefix(path, "/")
	if !ok {
		return nil, nil
	}
	p := strings.Split(rest, "/")
	if slices.Contains(p, "") {
		return nil, nil
	}
	for _, r := range apiRoutes {
		if args, ok := matchPattern(r.pattern, p); ok {
			return r.route, args
		}
	}
	return nil, nil
}

// matchPattern reports whether the segments p match pattern, and returns
// the parameters.
func matchPattern(pattern, p []string) ([]string, bool) {
	if len(p) != len(pattern) {
		return nil, false
	}
	var args []string
	for i, seg := range pattern {
		if !strings.HasPrefix(seg, "{") {
			if p[i] != seg {
				return nil, false
			}
			continue
		}
		if words := strings.Trim(seg, "{}"); words != "" && !slices.Contains(strings.Split(words, "|"), p[i]) {
			return nil, false
		}
		args = append(args, p[i])
	}
	return args, true
}

// writeOK writes a success envelope holding result, with result_info when
// info is not nil, and returns 200.
func (s *Server) writeOK(c *call, result, info, messages any) int {
	if messages == nil {
		messages = []any{}
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(struct {
		Result     any   `json:"result"`
		Success    bool  `json:"success"`
		Errors     []any `json:"errors"`
		Messages   any   `json:"messages"`
		ResultInfo any   `json:"result_info,omitempty"`
	}{result, true, []any{}, messages, info}); err != nil {
		return s.reply(c.w, c, internalError(err))
	}
	s.setBudgetHeaders(c.w, c)
	writeJSON(c.w, http.StatusOK, bytes.TrimSuffix(buf.Bytes(), []byte("\n")))
	return http.StatusOK
}

// message is an entry of an envelope's "messages".
type message struct {
	Code    int     `json:"code"`
	Message string  `json:"message"`
	Type    *string `json:"type"`
}

// serveVerify answers GET /user/tokens/verify (and the account form): the
// token is valid, or authenticate has answered 401 with code 1000.
func serveVerify(s *Server, c *call) int {
	if len(c.args) == 1 && !idPattern.MatchString(c.args[0]) {
		return s.reply(c.w, c, &apiError{status: http.StatusBadRequest, code: 7003,
			message: "Could not route to /client/v4/accounts/" + c.args[0] + "/tokens/verify, perhaps your object identifier is invalid?"})
	}
	sum := sha256.Sum256([]byte(s.cfg.Token))
	return s.writeOK(c, map[string]string{"id": hex.EncodeToString(sum[:16]), "status": "active"}, nil,
		[]message{{Code: 10000, Message: "This API Token is valid and active"}})
}

// serveUser answers GET /user as Cloudflare does for a token that may not
// read user details (d1local has accounts, not users): 403, code 9109.
func serveUser(s *Server, c *call) int {
	return s.reply(c.w, c, &apiError{status: http.StatusForbidden, code: 9109,
		message: "Unauthorized to access requested resource"})
}

// accountName is the name of d1local's one account.
const accountName = "d1local"

// serveMemberships answers GET /memberships: the token's one account.
func serveMemberships(s *Server, c *call) int {
	m := map[string]any{
		"id":      s.account,
		"status":  "accepted",
		"account": map[string]string{"id": s.account, "name": accountName},
		"roles":   []string{"Administrator"},
	}
	return s.writeOK(c, []any{m}, pageInfo(1, 20, 1, 1), nil)
}

// serveAccounts answers GET /accounts: the one account.
func serveAccounts(s *Server, c *call) int {
	a := map[string]any{"id": s.account, "name": accountName, "type": "standard"}
	return s.writeOK(c, []any{a}, pageInfo(1, 20, 1, 1), nil)
}

// pageInfo is a list's result_info.
func pageInfo(page, perPage, count, total int) map[string]int {
	pages := 0
	if perPage > 0 {
		pages = (total + perPage - 1) / perPage
	}
	return map[string]int{"page": page, "per_page": perPage, "count": count,
		"total_count": total, "total_pages": pages}
}

// databaseObject is a database as the list endpoint describes it.
func databaseObject(id string) map[string]any {
	return map[string]any{"uuid": id, "name": id, "version": "production"}
}

// serveListDatabases answers GET /accounts/{a}/d1/database, paginated by
// page and per_page (1000 by default), filtered by an exact name.
func serveListDatabases(s *Server, c *call) int {
	if e := checkIDs(c.args[0], "", ""); e != nil {
		return s.reply(c.w, c, e)
	}
	q := c.r.URL.Query()
	page, e1 := queryInt(q.Get("page"), 1, 1, 1<<30)
	perPage, e2 := queryInt(q.Get("per_page"), 1000, 1, 10000)
	if e := errors.Join(e1, e2); e != nil {
		return s.reply(c.w, c, &apiError{status: http.StatusBadRequest, code: 7400, message: e.Error()})
	}
	ids, err := s.Databases()
	if err != nil {
		return s.reply(c.w, c, s.errorResponse(err, ""))
	}
	if name := q.Get("name"); name != "" {
		ids = filterEqual(ids, name)
	}
	from := min((page-1)*perPage, len(ids))
	to := min(from+perPage, len(ids))
	out := make([]any, 0, to-from)
	for _, id := range ids[from:to] {
		out = append(out, databaseObject(id))
	}
	return s.writeOK(c, out, pageInfo(page, perPage, len(out), len(ids)), nil)
}

func filterEqual(ids []string, name string) []string {
	for _, id := range ids {
		if id == name {
			return []string{id}
		}
	}
	return nil
}

// queryInt parses an integer query parameter within [lo, hi]; "" is def.
func queryInt(v string, def, lo, hi int) (int, error) {
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		return 0, errors.New("invalid pagination parameter " + strconv.Quote(v))
	}
	return n, nil
}

// serveGetDatabase answers GET /accounts/{a}/d1/database/{id}.
func serveGetDatabase(s *Server, c *call) int {
	id := c.args[1]
	if e := checkIDs(c.args[0], id, ""); e != nil {
		return s.reply(c.w, c, e)
	}
	info, err := s.describe(c.r.Context(), id)
	if err != nil {
		return s.reply(c.w, c, s.errorResponse(err, id))
	}
	return s.writeOK(c, describeDatabase(info), nil, nil)
}

// describeDatabase is the get and create endpoints' database object.
func describeDatabase(info databaseInfo) map[string]any {
	m := databaseObject(info.id)
	m["num_tables"] = info.tables
	m["file_size"] = info.size
	m["read_replication"] = map[string]string{"mode": "disabled"}
	return m
}

// serveCreateDatabase answers POST /accounts/{a}/d1/database with
// {"name": ...}; the new database's ID is its name.
func serveCreateDatabase(s *Server, c *call) int {
	if e := checkIDs(c.args[0], "", ""); e != nil {
		return s.reply(c.w, c, e)
	}
	body, e := readBody(c.w, c.r)
	if e != nil {
		return s.reply(c.w, c, e)
	}
	var req struct {
		Name *string `json:"name"`
	}
	if err := json.Unmarshal(body, &req); err != nil || req.Name == nil {
		return s.reply(c.w, c, &apiError{status: http.StatusBadRequest, code: 7400,
			message: `request body must be a JSON object with "name"`})
	}
	name := *req.Name
	if !idPattern.MatchString(name) {
		return s.reply(c.w, c, &apiError{status: http.StatusBadRequest, code: 7400, message: "invalid database name " +
			strconv.Quote(name) + ": use up to 128 letters, digits, '.', '_' and '-', starting with a letter or digit"})
	}
	if _, err := s.open(name, createNew); errors.Is(err, errExists) {
		return s.reply(c.w, c, &apiError{status: http.StatusBadRequest, code: 7502,
			message: "A database with that name already exists."})
	} else if err != nil {
		return s.reply(c.w, c, s.errorResponse(err, name))
	}
	info, err := s.describe(c.r.Context(), name)
	if err != nil {
		return s.reply(c.w, c, s.errorResponse(err, name))
	}
	s.log.Debug("d1local: database created", "database", name)
	return s.writeOK(c, describeDatabase(info), nil, nil)
}

// serveDeleteDatabase answers DELETE /accounts/{a}/d1/database/{id}.
func serveDeleteDatabase(s *Server, c *call) int {
	id := c.args[1]
	if e := checkIDs(c.args[0], id, ""); e != nil {
		return s.reply(c.w, c, e)
	}
	if err := s.DeleteDatabase(id); err != nil {
		return s.reply(c.w, c, s.errorResponse(err, id))
	}
	return s.writeOK(c, nil, nil, nil)
}
