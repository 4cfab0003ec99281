// Package d1local is a Cloudflare D1-compatible REST server backed by
// SQLite (modernc.org/sqlite, pure Go, no cgo).
//
// It answers the two D1 endpoints of the Cloudflare v4 API,
//
//	POST /accounts/{account_id}/d1/database/{database_id}/query
//	POST /accounts/{account_id}/d1/database/{database_id}/raw
//
// (also under a /client/v4 prefix), in the single form
// {"sql": "...", "params": [...]} and the batch form
// {"batch": [{"sql": "...", "params": [...]}, ...]}, with Cloudflare's
// envelope {"result": [...], "success": true, "errors": [], "messages": []}.
// /query returns each statement's rows as objects, /raw as
// {"columns": [...], "rows": [[...], ...]}.
//
// # Uses
//
//   - The embedded default for demos and local development: no Cloudflare
//     account, no network, no Node.
//   - The engine of integration tests: start it on httptest, point a D1
//     client at it, and assert on what D1 would have answered.
//   - Fault injection: Inject queues one-shot faults and Config.Faults
//     chooses them per call (latency, lost responses after a commit, 429
//     rate limits and overload, 500 and HTML 502 answers, and ambiguous
//     failures that commit first), to test a client's retry and
//     idempotency logic against the failures D1 really produces.
//   - A standalone server: wrap it in an http.Server (the d1idem CLI does:
//     d1idem local serve --dir DIR --addr 127.0.0.1:8787) and point
//     CLOUDFLARE_BASE_URL at http://127.0.0.1:8787/client/v4/ (or at the
//     bare address; both path forms are served) to run any D1 REST client
//     against it, including cloudflare-go.
//
// # Usage
//
// A Server is a plain http.Handler:
//
//	srv, err := d1local.New(d1local.Config{Dir: "data"}) // "" keeps databases in memory
//	if err != nil { ... }
//	defer srv.Close()
//	ts := httptest.NewServer(srv) // or: http.ListenAndServe("127.0.0.1:8787", srv)
//
// Each database ID is one SQLite file, Dir/<id>.sqlite, in WAL mode with a
// busy timeout; it is created on first use unless Config.NoAutoCreate is
// set (then CreateDatabase creates it and an unknown ID answers 404/7404).
// Config.Token makes the server require "Authorization: Bearer <token>".
//
// # What it reproduces
//
//   - Transactions: a request, single or batch, runs as one SQLite
//     transaction (BEGIN IMMEDIATE ... COMMIT): either every statement
//     commits or none does, DDL included. Requests to one database run one
//     at a time, as D1 runs each database single-threaded; concurrent
//     requests queue and never see SQLITE_BUSY.
//   - Multi-statement sql: split where SQLite's tokenizer ends a statement
//     (';' outside quotes, identifiers, comments and CREATE TRIGGER bodies);
//     the answer has one result per statement, as the REST API's has. As on
//     workerd, anything but whitespace after the last statement's ';' (an
//     empty statement such as "SELECT 1;;", or a comment) fails the call
//     with "SQL code did not contain a statement.".
//   - SQL errors: HTTP 400, code 7500, "result": [] and the message
//     "<sqlite3_errmsg>[ at offset N]: SQLITE_<CODE>[ (extended: SQLITE_<EXT>)]",
//     such as "no such table: nope: SQLITE_ERROR" or "UNIQUE constraint
//     failed: t.k: SQLITE_CONSTRAINT (extended: SQLITE_CONSTRAINT_UNIQUE)".
//   - The D1 authorizer (after workerd's): no BEGIN, COMMIT, ROLLBACK,
//     SAVEPOINT or RELEASE (workerd's "To execute a transaction, please use
//     the state.storage.transaction() ..." message), no ATTACH or DETACH, no
//     TEMP objects (the temp schema table stays readable, as ALTER TABLE
//     ... RENAME needs), no table, index, view or trigger named "_cf_*" (in
//     lower case: "_CF_x" is an ordinary name, as on workerd), only the fts5, fts5vocab, rtree and rtree_i32 virtual table
//     modules, no sqlite_version(), sqlite_source_id(),
//     sqlite_compileoption_used/get() or load_extension(), and D1's PRAGMA
//     allowlist: table_list, data_version, page_size (read), table_info,
//     table_xinfo, index_list, index_info, index_xinfo, foreign_key_list,
//     foreign_key_check, quick_check, optimize and the boolean toggles
//     case_sensitive_like, foreign_keys, defer_foreign_keys,
//     ignore_check_constraints, legacy_alter_table, recursive_triggers and
//     reverse_unordered_selects. Refusals answer "not authorized:
//     SQLITE_AUTH" (or SQLite's "not authorized to use function: ...").
//   - Limits (sqlite3_limit, as workerd sets them): 100 bound parameters, a
//     100,000-byte statement, 2,000,000-byte strings and BLOBs, 100
//     columns, expression depth 100, 5 terms per compound SELECT, 127
//     function arguments, 50-byte LIKE patterns, trigger depth 10, no
//     attached databases. More than 100 params or a longer statement is
//     refused before anything runs. params with a multi-statement sql, an
//     empty sql and a wrong number of parameters are refused as D1 refuses
//     them.
//   - Parameter binding as D1's JavaScript binds: every JSON number is a
//     REAL, even 42 (typeof(?) is 'real'; a 42 stored in a TEXT column
//     reads back "42.0", in an INTEGER column 42); strings are TEXT, null
//     is NULL, true and false are 1.0 and 0.0, an array of integers 0..255
//     is a BLOB, and anything else fails with D1_TYPE_ERROR.
//   - Result serialization as D1's JavaScript serializes: integers beyond
//     ±2^53 come back rounded to the nearest double and printed as
//     JavaScript prints it (9223372036854775807 as 9223372036854776000),
//     REALs in JavaScript's shortest form (1 not 1.0, 1e+21, 1e-7), NaN and
//     infinities as null, -0 as 0, BLOBs as arrays of byte values, and /query
//     objects with JavaScript's property semantics (a repeated column name
//     keeps its first position and its last value; names that are array
//     indices come first, in numeric order).
//   - Foreign keys are enforced (PRAGMA foreign_keys = ON); since every
//     request is a transaction, PRAGMA foreign_keys = OFF is a no-op, as on
//     D1, and PRAGMA defer_foreign_keys = ON defers checks to the commit.
//   - Cloudflare's API errors: 403/10000 for a missing or wrong token,
//     400/6003 (error_chain 6111) for a malformed Authorization header,
//     400/7003 for an invalid account or database identifier, 404/7404 for
//     an unknown database, 404/7000 for an unknown route, 405 for a method
//     other than POST, 400/7400 for a malformed body and 413 for a body over
//     10 MiB. Every error uses the envelope with "success": false and
//     "result": null ("result": [] for SQL errors, as in real answers).
//
// Each result's meta holds served_by ("d1local"), served_by_region
// ("LOCAL"), served_by_primary (true), duration and
// timings.sql_duration_ms (the statement's wall time from prepare to last
// row, in milliseconds rounded to four decimals),
// changes (the sqlite3_total_changes delta of the statement, so trigger and
// cascade changes count), last_row_id (sqlite3_last_insert_rowid, which
// keeps its value across statements that insert nothing, as on D1),
// changed_db, size_after (page_count × page_size at the end of the
// request), rows_read and rows_written; see below for how the last three
// are approximated.
//
// # Differences from D1
//
// Known differences between d1local, local workerd (Miniflare, what
// wrangler dev and wrangler d1 execute --local run) and production D1:
//
//   - Error message prefix: the Workers binding, and so Miniflare and a
//     shim Worker over it, prefixes messages with "D1_ERROR: "; the REST API
//     and d1local do not (except "D1_TYPE_ERROR: " for unbindable
//     parameters, which d1local keeps).
//   - Extended codes: d1local appends " (extended: SQLITE_...)" when the
//     extended result code differs from the primary one, as workerd does;
//     whether production REST answers carry it is unverified, so clients
//     should parse only the ": SQLITE_<CODE>" part.
//   - SQLite version: d1local runs the SQLite of modernc.org/sqlite
//     (3.54.x for v1.62.0); workerd and production D1 ran 3.47.0 until
//     August 2026 (3.53.4 since). Newer functions and syntax may work here
//     and fail on D1; error texts and offsets may differ slightly.
//   - DELETE ... LIMIT and UPDATE ... LIMIT fail here with a syntax error:
//     modernc.org/sqlite is not built with SQLITE_ENABLE_UPDATE_DELETE_LIMIT,
//     while workerd is (production D1 is documented to accept them). Use
//     "DELETE FROM t WHERE rowid IN (SELECT rowid FROM t WHERE ... LIMIT n)".
//   - Multi-statement sql: like the REST API, d1local returns one result
//     per statement; workerd's SQL API returns only the last statement's
//     result, and a Miniflare shim therefore answers differently.
//   - rows_read and rows_written are approximations: SQLite has no
//     rows-read counter. rows_read is the largest of the rows the
//     statement's full table scans visited (from
//     SQLITE_STMTSTATUS_FULLSCAN_STEP), the rows it returned and the rows
//     it changed, so index lookups that return nothing count 0; rows_written is the number of changed rows (D1 also
//     counts index entries: an INSERT into a table with two indexes writes 3
//     on D1 and 1 here) and 1 for DDL. changed_db is true when rows changed
//     or the statement is CREATE, DROP or ALTER. Do not use these figures to
//     predict D1 billing.
//   - duration has sub-microsecond resolution here; workerd reports whole
//     milliseconds, production fractional ones.
//     served_by is "d1local" (production: "v3-prod", Miniflare:
//     "miniflare.db"), served_by_region is "LOCAL", and there is no
//     served_by_colo or total_attempts.
//   - size_after is the database size at the end of the request, the same
//     for every result of a batch.
//   - The authorizer: workerd allows an explicit list of SQL functions;
//     d1local refuses only sqlite_version, sqlite_source_id,
//     sqlite_compileoption_used, sqlite_compileoption_get and
//     load_extension, and allows every other function this SQLite build
//     has. This build also has the dbstat and sqlite_dbpage virtual tables,
//     which workerd lacks; d1local refuses access to them (and runs in
//     SQLite's defensive mode). ALTER TABLE ... RENAME TO _cf_... is
//     refused by matching the statement text, since SQLite's authorizer
//     does not see the new name. Table-valued pragma functions
//     (pragma_table_info(...)) are checked when they run rather than when
//     they compile, so a parameter naming an allowed table works here and
//     fails on D1.
//   - _cf_ tables: production databases hold _cf_KV and Miniflare's
//     _cf_METADATA; d1local creates none. Existing ones (in a database file
//     copied in) cannot be read or written, but stay listed in
//     sqlite_master and PRAGMA table_list, as on D1.
//   - PRAGMA toggles (recursive_triggers, case_sensitive_like, ...) last
//     for the database's connection, so they carry over to later requests,
//     as they do on workerd's long-lived connection.
//   - Parameters: D1's documentation types params as strings; production
//     accepts numbers and null too. JSON booleans and byte arrays are
//     accepted here as workerd's binding accepts them, which production REST
//     has not been verified to do. An array holding anything but integers
//     0..255 is a D1_TYPE_ERROR here.
//   - Limits not emulated: the Cloudflare API's global rate limit (1,200
//     calls per 5 minutes per token, code 971), D1's overload queue, the
//     30-second query limit, free-tier daily row limits and database size
//     limits. Faults simulate the first two. The 10 MiB body limit is
//     d1local's own; D1 documents none.
//   - Errors of the Cloudflare API layer are modelled on captures, not
//     verified against production: the 405 (code 10405), 413 and malformed
//     body (7400) answers, and the status of 7003 (400 here).
//   - Authentication: one bearer token, checked by exact match; there are
//     no accounts, API keys, token permissions (D1 Read vs. D1 Edit) or 7403
//     answers, and the account ID is not checked beyond its syntax.
//   - Internal errors (an unreadable database file, say) answer 500/7500
//     "internal error; reference = ..." followed by the cause in
//     parentheses, which D1 would not reveal.
//   - A request whose client disconnects is interrupted and rolled back
//     (unless it had already committed); on D1 it may still commit.
//   - Read replicas and the Sessions API do not exist here, as they do not
//     exist in the REST API: served_by_primary is always true.
package d1local
