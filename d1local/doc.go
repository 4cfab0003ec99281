// Package d1local is a local Cloudflare D1: the D1 part of the Cloudflare v4
// REST API, served from SQLite (modernc.org/sqlite, pure Go, no cgo), close
// enough to the real one that wrangler, cloudflare-go and other D1 REST
// clients work against it unchanged.
//
// A Server is an http.Handler:
//
//	srv, err := d1local.New(d1local.Config{Dir: "data"}) // "" keeps databases in memory
//	if err != nil {
//		return err
//	}
//	defer srv.Close()
//	ts := httptest.NewServer(srv) // or http.ListenAndServe("127.0.0.1:8787", srv)
//
// For tests of a service that uses D1, package d1localtest starts one with a
// ready d1client.Client. The d1idem CLI serves one with
// "d1idem local serve --dir DIR".
//
// # Endpoints
//
// With or without the /client/v4 prefix of api.cloudflare.com:
//
//	POST   /accounts/{account}/d1/database/{id}/query    run SQL, rows as objects
//	POST   /accounts/{account}/d1/database/{id}/raw      run SQL, rows as {columns, rows}
//	POST   /accounts/{account}/d1/database/{id}/import   import an SQL file: init, upload, ingest, poll
//	POST   /accounts/{account}/d1/database/{id}/export   export an SQL dump, with a download link
//	GET    /accounts/{account}/d1/database/{id}          database details
//	DELETE /accounts/{account}/d1/database/{id}          delete a database
//	GET    /accounts/{account}/d1/database               list databases (page, per_page, name)
//	POST   /accounts/{account}/d1/database               create a database ({"name": ...})
//	GET    /user/tokens/verify                           check the token (also /accounts/{account}/tokens/verify)
//	GET    /memberships, /accounts                       the one account, for clients that look it up
//	GET    /user                                         403, code 9109, as for a token without user access
//
// Answers use Cloudflare's envelope, {"result": ..., "success": ...,
// "errors": [...], "messages": [...]}, and its error codes: 400/7500 for SQL
// errors ("<sqlite message>: SQLITE_<CODE>") and for a database file that
// is not SQLite or is corrupt, 404/7404 for an unknown database, 403/10000
// for a wrong token (401/1000 on tokens/verify), 429/971 over the budget,
// 404/7000 "No route for that URI" for any other path. Their Server header
// is "d1local" (ServerName), where Cloudflare's is "cloudflare". The upload and download links of import and export are served under
// /d1local/ and need no token: like R2's presigned URLs, they carry a random
// secret, and they work for an hour.
//
// Each database is one SQLite file, Dir/<id>.sqlite, and its name is its ID.
// At most Config.MaxOpenDatabases files (256 by default) are held open: past
// that, the idle database used least recently is closed and reopened on its
// next call, so a Dir may hold any number of databases.
// A database is created on its first query, raw, import or export call,
// unless Config.NoAutoCreate is set; with it, nothing is created but by the
// create endpoint or CreateDatabase, and New does not create Dir either, so
// read-only use of a directory changes nothing in it.
//
// # SQL
//
// Each call, single or batch, is one transaction, DDL included, and calls to
// one database run one at a time, as on D1. Like workerd, each database
// keeps its data statements (SELECT, INSERT, UPDATE, DELETE, REPLACE, WITH)
// compiled, the 128 used last, by their exact text. d1local applies D1's authorizer
// (after workerd's: no BEGIN or SAVEPOINT, ATTACH, TEMP objects or "_cf_"
// names, D1's PRAGMA allowlist), its limits (100 bound parameters, 100,000
// bytes of SQL per statement, 5 terms per compound SELECT, ...), D1's
// JavaScript parameter binding (every JSON number binds as a REAL) and its
// JavaScript result serialization (integers beyond 2^53 are rounded). A
// conformance suite (package conformance) holds d1local to what Cloudflare's
// local D1, workerd, answers.
//
// # wrangler
//
// With a server on 127.0.0.1:8787, wrangler 4.86.0 talks to it when pointed
// there:
//
//	export CLOUDFLARE_API_BASE_URL=http://127.0.0.1:8787/client/v4
//	export CLOUDFLARE_API_TOKEN=any-token      # Config.Token, if set
//	export CLOUDFLARE_ACCOUNT_ID=any-account   # optional: /memberships names one
//
// These commands are tested against it (conformance/wrangler_test.go): d1
// execute --remote with --command and with --file (the import flow), d1
// info, d1 list, d1 export --remote, d1 create, d1 delete and d1 migrations
// apply --remote, with and without an account ID; a wrong token reads as
// wrangler's authentication error.
// d1 info reports zero queries in the last 24 hours: d1local keeps no
// analytics (GraphQL is not served).
//
// # Rate limit and faults
//
// Config.RateLimit plays the account's API rate limit: one limit for every
// database and client, reported in Cloudflare's Ratelimit and
// Ratelimit-Policy headers, and 429 with code 971 and Retry-After once it
// is spent. Inject and Config.Faults simulate D1's failures on query and raw
// calls: latency, a busy database (Fault.Busy, held behind its single
// writer), a response lost after the commit, rate limiting, overload, 500
// and HTML 502 answers, before or after the commit.
//
// # Differences from D1
//
// d1local runs a newer SQLite than D1, lacks DELETE ... LIMIT, approximates
// rows_read and rows_written, keeps no analytics, and differs in other
// details listed in docs/d1local.md of the module's repository
// (https://github.com/d1idem/d1idem/blob/main/docs/d1local.md).
//
// # API stability
//
// The Go API (Config, Server and its methods, RateLimit, Fault, Request)
// follows the module's semantic versioning. What the server answers tracks
// D1: when D1 or workerd is found to answer differently, d1local changes to
// match, and such a change is a fix, not a break.
package d1local
