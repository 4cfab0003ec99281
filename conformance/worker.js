// worker.js: the D1 REST API's request and response shapes, served by a
// Cloudflare Worker over real D1 bindings (workerd's own `cloudflare-internal:
// d1-api` binding code, backed by Miniflare's D1DatabaseObject on workerd's
// Durable-Object SQLite). server.mjs runs it on 127.0.0.1 with Miniflare.
//
// Routes (the `/client/v4` prefix of api.cloudflare.com is optional):
//
//   POST /accounts/:acc/d1/database/:db/query   rows as objects
//   POST /accounts/:acc/d1/database/:db/raw     rows as {columns, rows}
//        body {"sql": "...", "params": [...]} or {"batch": [{"sql","params"}, ...]}
//   POST /__spec/fingerprint/<path...>          the spec's computeFingerprint
//   ANY  /__spec/mutate/:db/<path...>           the spec's handleIdempotentMutation (spec.mjs)
//   GET  /healthz                               {"ok":true,"mode":...,"pool":N}
//
// Databases. The worker has a pool of D1 bindings, DB_0 .. DB_<POOL_SIZE-1>,
// whose database IDs are "db-0" .. "db-<POOL_SIZE-1>" (server.mjs declares
// them), so a test takes a fresh, empty database by choosing an unused ID.
// Any other database ID answers 404 with code 7404, like the Cloudflare API.
// The account ID is not checked, and no API token is required.
//
// Responses use the Cloudflare v4 envelope. Success (HTTP 200):
//   {"result":[<one entry per statement>],"success":true,"errors":[],"messages":[]}
// with each entry {"results": ..., "success": true, "meta": {...}}, where
// meta is exactly what the D1 backend reports (served_by "miniflare.db",
// duration, changes, last_row_id, changed_db, size_after, rows_read,
// rows_written). A failed statement fails the whole call (HTTP 400):
//   {"result":[],"success":false,"errors":[{"code":7500,"message":"..."}],"messages":[]}
// The message is the binding's with its "D1_ERROR: " (or "D1_TYPE_ERROR: ")
// prefix removed, so it reads like production's "<sqlite message>:
// SQLITE_<CODE>". A body that is not a query is 400 with code 7400; an
// unknown route is 404 with code 7000. Those non-SQL errors (7404, 7400,
// 7000) carry "result": null, the Cloudflare API's usual error shape; SQL
// errors carry "result": [], as captured from production D1.
//
// How /raw is made exact (RAW_MODE "internal", the default). The public
// binding API cannot do it: stmt.raw() returns no meta, and db.batch()
// returns rows as objects, which lose duplicate column names and, for zero
// rows, every column name. So the worker calls the binding's internal
// transport, the same one prepare().all(), .raw() and batch() use:
//
//   env.DB_i.alwaysPrimarySession._sendOrThrow('/query', sql | sql[],
//       params | params[], 'ROWS_AND_COLUMNS', span)
//
// It sends {sql, params} (or an array of them, which the D1 object runs in
// one storage.transactionSync(), so a batch is atomic and DDL rolls back too)
// and returns, per statement, {"results":{"columns":[...],"rows":[[...]]},
// "meta":{...}}: exact column names (duplicates and zero-row results
// included), rows and meta, for single statements and batches alike. /query
// turns the same answer into objects exactly as the binding's .all() does
// (Object.fromEntries: the last of duplicate names wins). Parameters are
// checked and converted first exactly as D1PreparedStatement.bind() does
// (booleans become 1/0, byte arrays pass, objects are a D1_TYPE_ERROR).
// This is not a public API: it was read from the workerd 2026-04-26 binary
// (miniflare 4.20260426.0, pinned in package.json) and is feature-tested at
// run time. If it is missing, or RAW_MODE is "public", the worker falls back
// to the public API: prepare().bind().all()/.raw({columnNames:true}) and
// db.batch(). In that mode /raw single statements keep exact columns but
// carry "meta": null, and /raw batches rebuild columns from the first row's
// object keys (zero-row results get no columns, duplicates collapse).
//
// Several statements in one "sql" string (REST: "executed as a batch", one
// result per statement). When "params" is absent or empty, the worker splits
// the string on top-level semicolons (quotes, [identifiers], comments and
// CREATE TRIGGER ... BEGIN ... END bodies respected; segments with no code
// dropped) and runs the parts as one atomic batch, answering one result per
// statement. With parameters it is sent unsplit, so workerd's own rule
// applies (only the last statement may have parameters, and only its result
// comes back); the Cloudflare REST API is reported to reject that
// combination. Never send parameters with multi-statement SQL.
//
// /__spec/fingerprint: computeFingerprint from the spec ("Idempotency-Key
// Ledger on D1"), copied verbatim (types removed), over request.method,
// url.pathname + url.search, request.headers and await request.arrayBuffer(),
// where url = new URL(request.url). Exactly the 19 characters
// "/__spec/fingerprint" are removed from the front of url.pathname before
// hashing; the rest (which starts with "/"), and url.search (with its "?",
// verbatim), are hashed. So "POST /__spec/fingerprint/v1/orders?a=1" hashes
// as "POST /v1/orders?a=1". The answer is
//   {"fingerprint":"<64 hex>","pathAndQuery":"/v1/orders?a=1","method":"POST"}
// Any method is accepted (the method is part of the fingerprint).

import { SPEC_MUTATE_PREFIX, handleSpecMutate } from "./spec.mjs";

const FINGERPRINT_PREFIX = "/__spec/fingerprint";

// --- The spec's computeFingerprint, verbatim but for the TypeScript types ---

// Headers that can change what the mutation does. Anything not on this list
// cannot affect the fingerprint -- keep it to headers your handler actually
// branches on.
const FINGERPRINT_HEADERS = ["content-type", "x-api-version"];

async function computeFingerprint(
  method,
  pathAndQuery,
  headers,
  bodyBytes,
) {
  const headerPart = FINGERPRINT_HEADERS.map(
    (name) => `${name}:${headers.get(name) ?? ""}`,
  ).join("\n");
  const prefix = new TextEncoder().encode(`${method.toUpperCase()}\n${pathAndQuery}\n${headerPart}\n`);
  const combined = new Uint8Array(prefix.byteLength + bodyBytes.byteLength);
  combined.set(prefix, 0);
  combined.set(new Uint8Array(bodyBytes), prefix.byteLength);
  const digest = await crypto.subtle.digest("SHA-256", combined);
  return Array.from(new Uint8Array(digest))
    .map((b) => b.toString(16).padStart(2, "0"))
    .join("");
}

// --- Envelope helpers ---

function json(status, body) {
  return new Response(JSON.stringify(body), {
    status,
    headers: { "content-type": "application/json; charset=UTF-8" },
  });
}

function ok(result) {
  return json(200, { result, success: true, errors: [], messages: [] });
}

// fail answers an error envelope. SQL errors (7500) carry "result": [], as
// real D1 captures show; other API errors carry "result": null, the
// Cloudflare API's usual shape.
function fail(status, code, message) {
  const result = code === 7500 ? [] : null;
  return json(status, { result, success: false, errors: [{ code, message }], messages: [] });
}

// RequestError is a client error found before anything reaches D1.
class RequestError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

// stripPrefix removes the binding's error prefix ("D1_ERROR: ",
// "D1_TYPE_ERROR: ", ...) from a message.
function stripPrefix(message) {
  return message.replace(/^D1_(?:[A-Z]+_)*ERROR: /, "");
}

// --- Parameters, as D1PreparedStatement.bind() checks and converts them ---

function bindValue(r) {
  const rType = typeof r;
  if (rType === "number" || rType === "string") return r;
  if (rType === "boolean") return r ? 1 : 0;
  if (rType === "object") {
    if (r == null) return r;
    if (Array.isArray(r) && r.every((b) => typeof b == "number" && b >= 0 && b < 256)) return r;
  }
  throw new Error(`D1_TYPE_ERROR: Type '${rType}' not supported for value '${r}'`);
}

// parseQuery validates one {sql, params} object.
function parseQuery(q, where) {
  if (q === null || typeof q !== "object" || Array.isArray(q)) {
    throw new RequestError(400, 7400, `${where}: expected an object with "sql"`);
  }
  if (typeof q.sql !== "string") {
    throw new RequestError(400, 7400, `${where}: "sql" must be a string`);
  }
  let params = q.params ?? [];
  if (!Array.isArray(params)) {
    throw new RequestError(400, 7400, `${where}: "params" must be an array`);
  }
  return { sql: q.sql, params };
}

// --- Splitting multi-statement SQL ---

// splitSQL splits sql on top-level semicolons. It skips quoted strings and
// identifiers ('', "", ``, []), -- and /* */ comments, and the BEGIN ... END
// body of CREATE TRIGGER (with CASE ... END nesting inside it). Segments
// holding only whitespace and comments are dropped.
function splitSQL(sql) {
  const out = [];
  let start = 0;
  let hasCode = false;
  let words = []; // the first few keywords of the current statement
  let depth = 0; // BEGIN/CASE nesting inside a trigger body
  const n = sql.length;
  let i = 0;
  const push = (end) => {
    if (hasCode) out.push(sql.slice(start, end).trim());
    start = end + 1;
    hasCode = false;
    words = [];
    depth = 0;
  };
  while (i < n) {
    const c = sql[i];
    if (c === "-" && sql[i + 1] === "-") {
      const j = sql.indexOf("\n", i);
      i = j < 0 ? n : j + 1;
      continue;
    }
    if (c === "/" && sql[i + 1] === "*") {
      const j = sql.indexOf("*/", i + 2);
      i = j < 0 ? n : j + 2;
      continue;
    }
    if (c === "'" || c === '"' || c === "`" || c === "[") {
      const close = c === "[" ? "]" : c;
      let j = i + 1;
      for (;;) {
        j = sql.indexOf(close, j);
        if (j < 0) { j = n; break; }
        if (close !== "]" && sql[j + 1] === close) { j += 2; continue; }
        j += 1;
        break;
      }
      hasCode = true;
      i = j;
      continue;
    }
    if (c === ";") {
      if (depth === 0) push(i);
      i++;
      continue;
    }
    if (/[A-Za-z_]/.test(c)) {
      let j = i + 1;
      while (j < n && /[A-Za-z0-9_$]/.test(sql[j])) j++;
      const w = sql.slice(i, j).toUpperCase();
      if (words.length < 4) words.push(w);
      const trigger = words[0] === "CREATE" && (words[1] === "TRIGGER" || words[2] === "TRIGGER");
      if (trigger) {
        if (w === "BEGIN" || (w === "CASE" && depth > 0)) depth++;
        else if (w === "END" && depth > 0) depth--;
      }
      hasCode = true;
      i = j;
      continue;
    }
    if (!/\s/.test(c)) hasCode = true;
    i++;
  }
  push(n);
  return out;
}

// --- Running statements ---

// A no-op tracing span for the binding's internal methods.
const span = { setAttribute() {}, end() {} };

function internalAvailable(db) {
  return typeof db?.alwaysPrimarySession?._sendOrThrow === "function";
}

// toObjects turns {columns, rows} into an array of row objects the way the
// binding's .all() does.
function toObjects(results) {
  if (!results || Array.isArray(results)) return results ?? [];
  const { columns, rows } = results;
  return rows.map((row) => Object.fromEntries(row.map((cell, i) => [columns[i], cell])));
}

// runInternal sends the queries through the binding's internal transport.
// Exactly one query goes as a single {sql, params}, as .all() sends it;
// several go as one array, as batch() sends them.
async function runInternal(db, queries, raw) {
  const session = db.alwaysPrimarySession;
  let answers =
    queries.length === 1
      ? await session._sendOrThrow("/query", queries[0].sql, queries[0].params, "ROWS_AND_COLUMNS", span)
      : await session._sendOrThrow(
          "/query",
          queries.map((q) => q.sql),
          queries.map((q) => q.params),
          "ROWS_AND_COLUMNS",
          span,
        );
  // The D1 object answers with an array even for a single {sql, params}.
  if (!Array.isArray(answers)) answers = [answers];
  if (!Array.isArray(answers) || answers.length !== queries.length) {
    throw new Error(`D1_ERROR: expected ${queries.length} results from D1, got ${Array.isArray(answers) ? answers.length : "one"}`);
  }
  return answers.map((a) => {
    let results = a.results ?? { columns: [], rows: [] };
    if (Array.isArray(results)) {
      // An older ARRAY_OF_OBJECTS answer: rebuild columns from the first row.
      results = { columns: results.length ? Object.keys(results[0]) : [], rows: results.map((r) => Object.values(r)) };
    }
    return { results: raw ? results : toObjects(results), success: true, meta: a.meta ?? null };
  });
}

// runPublic uses only the public binding API (see the file header for what
// /raw loses this way).
async function runPublic(db, queries, raw) {
  const stmts = queries.map((q) => db.prepare(q.sql).bind(...q.params));
  if (stmts.length === 1) {
    if (raw) {
      const [columns = [], ...rows] = await stmts[0].raw({ columnNames: true });
      return [{ results: { columns, rows }, success: true, meta: null }];
    }
    const r = await stmts[0].all();
    return [{ results: r.results ?? [], success: true, meta: r.meta ?? null }];
  }
  const rs = await db.batch(stmts);
  return rs.map((r) => {
    const objs = r.results ?? [];
    const results = raw
      ? { columns: objs.length ? Object.keys(objs[0]) : [], rows: objs.map((o) => Object.values(o)) }
      : objs;
    return { results, success: true, meta: r.meta ?? null };
  });
}

async function handleQuery(request, env, db, raw) {
  let body;
  try {
    body = await request.json();
  } catch {
    return fail(400, 7400, "The request body is not valid JSON.");
  }
  let queries;
  try {
    if (body !== null && typeof body === "object" && !Array.isArray(body) && "batch" in body) {
      if (!Array.isArray(body.batch) || body.batch.length === 0) {
        throw new RequestError(400, 7400, '"batch" must be a non-empty array of {"sql","params"}');
      }
      queries = body.batch.map((q, i) => parseQuery(q, `batch[${i}]`));
    } else {
      const q = parseQuery(body, "body");
      const parts = q.params.length === 0 ? splitSQL(q.sql) : [];
      queries = parts.length > 1 ? parts.map((sql) => ({ sql, params: [] })) : [q];
    }
  } catch (e) {
    if (e instanceof RequestError) return fail(e.status, e.code, e.message);
    throw e;
  }
  try {
    for (const q of queries) q.params = q.params.map(bindValue);
    const mode = env.RAW_MODE === "public" || !internalAvailable(db) ? "public" : "internal";
    const result = mode === "internal" ? await runInternal(db, queries, raw) : await runPublic(db, queries, raw);
    return ok(result);
  } catch (e) {
    const message = String(e?.message ?? e);
    if (message.startsWith("D1_")) return fail(400, 7500, stripPrefix(message));
    return fail(500, 7500, `internal error: ${message}`);
  }
}

async function handleFingerprint(request, url) {
  const pathAndQuery = url.pathname.slice(FINGERPRINT_PREFIX.length) + url.search;
  const bodyBytes = await request.arrayBuffer();
  const fingerprint = await computeFingerprint(request.method, pathAndQuery, request.headers, bodyBytes);
  return json(200, { fingerprint, pathAndQuery, method: request.method });
}

// poolDB returns the binding of database ID "db-<i>", or undefined.
function poolDB(env, dbID) {
  const idx = /^db-(0|[1-9][0-9]*)$/.exec(dbID);
  return idx && Number(idx[1]) < Number(env.POOL_SIZE) ? env[`DB_${idx[1]}`] : undefined;
}

const QUERY_ROUTE = /^(?:\/client\/v4)?\/accounts\/([^/]+)\/d1\/database\/([^/]+)\/(query|raw)\/?$/;

export default {
  async fetch(request, env, ctx) {
    const url = new URL(request.url);
    const path = url.pathname;
    if (path === "/healthz") {
      const mode = env.RAW_MODE === "public" || !internalAvailable(env.DB_0) ? "public" : "internal";
      return json(200, { ok: true, mode, pool: Number(env.POOL_SIZE) });
    }
    if (path.startsWith(FINGERPRINT_PREFIX + "/")) {
      return handleFingerprint(request, url);
    }
    if (path.startsWith(SPEC_MUTATE_PREFIX)) {
      const [dbID, ...rest] = path.slice(SPEC_MUTATE_PREFIX.length).split("/");
      const db = poolDB(env, dbID);
      if (!db) return fail(404, 7404, `The database ${dbID} could not be found`);
      return handleSpecMutate(request, db, "/" + rest.join("/"), ctx);
    }
    const m = QUERY_ROUTE.exec(path);
    if (!m) return fail(404, 7000, "No route for that URI");
    if (request.method !== "POST") return fail(405, 10405, `Method ${request.method} not allowed`);
    const dbID = decodeURIComponent(m[2]);
    const db = poolDB(env, dbID);
    if (!db) return fail(404, 7404, `The database ${dbID} could not be found`);
    return handleQuery(request, env, db, m[3] === "raw");
  },
};
