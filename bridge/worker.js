// d1idem bridge: the D1 REST API's query endpoints, served by a Cloudflare
// Worker over the D1 bindings it is deployed with. A client of the REST API
// (d1client, the d1idem CLI, the idemhttp middleware) uses it by changing only
// its base URL and its token: the calls go to the database's binding, past
// the account's API budget (1200 calls per 300 s).
//
// No npm dependency at run time: this file and ledger-statements.js are the
// whole Worker. README.md explains deployment; the configuration is below.
//
// Routes (the /client/v4 prefix of api.cloudflare.com is optional):
//
//   POST /accounts/:account/d1/database/:database/query   rows as objects
//   POST /accounts/:account/d1/database/:database/raw     rows as {columns, rows}
//        body {"sql": "...", "params": [...]} or {"batch": [{"sql","params"}, ...]}
//
// The account segment is not checked (the Worker serves its own bindings).
// Answers use the Cloudflare v4 envelope and D1's statuses and codes:
//
//   200  {"result":[{"results":...,"success":true,"meta":{...}}, ...],
//         "success":true,"errors":[],"messages":[]}, one entry per statement
//   400  7500  a statement failed (nothing of the call is committed); the
//              message is D1's without the binding's "D1_ERROR: " prefix,
//              "<sqlite message>: SQLITE_<CODE>"; "result" is []
//   400  7400  the body is not a query
//   400  6003  an Authorization header that is not "Bearer <token>"
//              (error_chain 6111)
//   401 10000  no Authorization header, or the wrong token
//   404  7404  a database this Worker is not bound to (asked after the token
//              is checked, so bound names cannot be probed without it)
//   404  7000  no such route;  405 10405  not POST
//   429  7500  D1 overloaded;  500 7500  D1's transient failures
//   500 10001  the Worker is misconfigured: without a usable BRIDGE_SECRET
//              it answers every request so rather than serve openly; with
//              one, an unreadable setting (a bad BRIDGE_DATABASES, ...) is
//              named to requests that carry the secret (others get 401)
//
// Configuration (wrangler.toml [vars] and secrets):
//
//   BRIDGE_SECRET      required, a secret (`wrangler secret put BRIDGE_SECRET`):
//                      16 to 4096 visible ASCII characters, no commas.
//                      Clients send it as "Authorization: Bearer <secret>",
//                      the API token's place. It is compared in constant
//                      time: both sides are HMAC-SHA256'd with a random
//                      per-isolate key and the digests compared with
//                      crypto.subtle.timingSafeEqual, so neither the length
//                      nor any prefix of the secret shows in the timing.
//   BRIDGE_SECRET_PREVIOUS
//                      optional, a secret too: a second secret accepted as
//                      well, for rotation without downtime. Rotate by
//                      moving the secret here and setting a new
//                      BRIDGE_SECRET (`d1idem bridge deploy --rotate-secret`
//                      does both), update the clients, then delete this one
//                      (`wrangler secret delete BRIDGE_SECRET_PREVIOUS`).
//                      An unusable value is a misconfiguration (500 10001,
//                      to requests that carry BRIDGE_SECRET).
//   BRIDGE_DATABASES   which database IDs and names reach which D1 binding: a
//                      JSON object (a [vars.BRIDGE_DATABASES] table, or a
//                      string holding JSON), {"<id or name>": "<binding>"}.
//                      List both the database's UUID and its name to accept
//                      either. Unset: each D1 binding is addressed by its
//                      binding name.
//   BRIDGE_MODE        "full" (the default): any SQL, as the REST API.
//                      "ledger-only": only the SQL texts the idem package
//                      sends (ledger-statements.js, generated from idem) and
//                      those in BRIDGE_ALLOWED_STATEMENTS, compared exactly
//                      (byte for byte: no normalisation of whitespace, case
//                      or comments). A call holding any other statement is
//                      refused whole, before anything runs, with 400/7500
//                      "not authorized: ...: SQLITE_AUTH".
//   BRIDGE_ALLOWED_STATEMENTS
//                      a JSON array of further SQL texts accepted in
//                      ledger-only mode (a TOML array, or a string holding
//                      JSON): the statements of idemhttp.Tx, for example.
//   BRIDGE_RAW_MODE    "internal" (the default) or "public"; see below.
//
// How /raw is made exact (BRIDGE_RAW_MODE "internal"). The public binding
// API cannot do it: stmt.raw() returns no meta, and db.batch() returns rows
// as objects, which lose duplicate column names and, for zero rows, every
// column name. So the Worker calls the binding's internal transport, the one
// prepare().all(), .raw() and batch() use themselves:
//
//   env.DB.alwaysPrimarySession._sendOrThrow('/query', sql | sql[],
//       params | params[], 'ROWS_AND_COLUMNS', span)
//
// It sends {sql, params} (or an array of them, which D1 runs as one
// transaction, DDL included) and returns, per statement, {"results":
// {"columns":[...],"rows":[[...]]},"meta":{...}}: exact column names, rows
// and meta, for single statements and batches alike. /query turns the same
// answer into objects exactly as the binding's .all() does (the last of
// duplicate names wins). Parameters are checked and converted first as
// D1PreparedStatement.bind() does (booleans become 1/0, byte arrays pass,
// objects are a D1_TYPE_ERROR). This is not a public API: it was read from
// workerd 2026-04-26 and is feature-tested on every call. Without it, or
// with BRIDGE_RAW_MODE "public", the Worker uses the public API:
// prepare().bind().all()/.raw({columnNames:true}) and db.batch(). Then /raw
// single statements keep exact columns but carry "meta": null, and /raw
// batches rebuild columns from the first row's keys (zero-row results get
// no columns, duplicates collapse).
//
// Several statements in one "sql" string (REST: "executed as a batch", one
// result per statement). When "params" is absent or empty, the Worker splits
// the string on top-level semicolons (quotes, [identifiers], comments and
// CREATE TRIGGER ... BEGIN ... END bodies respected; segments with no code
// dropped) and runs the parts as one atomic batch. With parameters it is
// sent unsplit, so workerd's own rule applies (only the last statement may
// have parameters, and only its result comes back). In ledger-only mode the
// whole string must be an accepted text before it is split.

import LEDGER_STATEMENTS from "./ledger-statements.js";

// --- Envelopes ---

function json(status, body, headers = {}) {
  return new Response(JSON.stringify(body), {
    status,
    headers: { "content-type": "application/json; charset=UTF-8", ...headers },
  });
}

function ok(result) {
  return json(200, { result, success: true, errors: [], messages: [] });
}

// fail answers an error envelope. SQL errors (7500) carry "result": [], as
// D1 captures show; other API errors "result": null, the API's usual shape.
function fail(status, code, message, headers = {}, extra = {}) {
  const result = code === 7500 ? [] : null;
  return json(status, { result, success: false, errors: [{ code, message, ...extra }], messages: [] }, headers);
}

// RequestError is a client error found before anything reaches D1.
class RequestError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

// ConfigError is a misconfiguration of the Worker itself.
class ConfigError extends Error {}

// --- Configuration ---

const MODE_FULL = "full";
const MODE_LEDGER_ONLY = "ledger-only";
const SECRET_PATTERN = /^[\x21-\x2b\x2d-\x7e]{16,4096}$/; // visible ASCII but the comma

// The ledger's own statements, as the idem package sends them.
const LEDGER_SET = new Set(LEDGER_STATEMENTS);

function isD1Binding(v) {
  return v !== null && typeof v === "object" && typeof v.prepare === "function" && typeof v.batch === "function";
}

// jsonSetting reads a setting that is either a JSON value (a wrangler [vars]
// table or array) or a string holding JSON.
function jsonSetting(env, name) {
  const v = env[name];
  if (v === undefined || v === null || v === "") return undefined;
  if (typeof v !== "string") return v;
  try {
    return JSON.parse(v);
  } catch (e) {
    throw new ConfigError(`${name} is not valid JSON: ${e.message}`);
  }
}

function databasesSetting(env) {
  const map = new Map();
  const v = jsonSetting(env, "BRIDGE_DATABASES");
  if (v === undefined) {
    for (const [name, value] of Object.entries(env)) if (isD1Binding(value)) map.set(name, name);
    if (map.size === 0) throw new ConfigError("the Worker has no D1 binding ([[d1_databases]] in wrangler.toml)");
    return map;
  }
  if (v === null || typeof v !== "object" || Array.isArray(v)) {
    throw new ConfigError('BRIDGE_DATABASES must be a JSON object {"<database id or name>": "<D1 binding>"}');
  }
  for (const [id, binding] of Object.entries(v)) {
    if (id === "") throw new ConfigError("BRIDGE_DATABASES has an empty database id");
    if (typeof binding !== "string" || !isD1Binding(env[binding])) {
      throw new ConfigError(`BRIDGE_DATABASES maps ${JSON.stringify(id)} to ${JSON.stringify(binding)}, which is not a D1 binding of this Worker`);
    }
    map.set(id, binding);
  }
  if (map.size === 0) throw new ConfigError("BRIDGE_DATABASES is empty");
  return map;
}

function allowedSetting(env) {
  const v = jsonSetting(env, "BRIDGE_ALLOWED_STATEMENTS");
  if (v === undefined) return [];
  if (!Array.isArray(v) || !v.every((s) => typeof s === "string" && s !== "")) {
    throw new ConfigError("BRIDGE_ALLOWED_STATEMENTS must be a JSON array of SQL strings");
  }
  return v;
}

// configure reads and checks the Worker's settings, once per env object.
// Without a usable secret it throws a ConfigError: every request then fails
// with 500/10001. Any other unreadable setting is kept as settingsError and
// reported (500/10001) only to a request that carries the secret, so the
// settings are never shown to anyone else.
const configs = new WeakMap();

async function configure(env) {
  let c = configs.get(env);
  if (!c) {
    c = buildConfig(env);
    configs.set(env, c);
  }
  return c;
}

async function buildConfig(env) {
  const secret = env.BRIDGE_SECRET;
  if (secret === undefined || secret === null || secret === "") {
    throw new ConfigError("no BRIDGE_SECRET is set, so the bridge refuses every request; set one with `wrangler secret put BRIDGE_SECRET`");
  }
  if (typeof secret !== "string" || !SECRET_PATTERN.test(secret)) {
    throw new ConfigError("BRIDGE_SECRET must be 16 to 4096 visible ASCII characters, no spaces or commas");
  }
  // The secrets are kept only as HMACs under a key made here, never
  // exported; see authenticate.
  const macKey = await crypto.subtle.generateKey({ name: "HMAC", hash: "SHA-256" }, false, ["sign"]);
  const secretMac = new Uint8Array(await crypto.subtle.sign("HMAC", macKey, new TextEncoder().encode(secret)));
  const previous = env.BRIDGE_SECRET_PREVIOUS;
  let previousMac = null;
  let previousError = null;
  if (previous !== undefined && previous !== null && previous !== "") {
    if (typeof previous === "string" && SECRET_PATTERN.test(previous)) {
      previousMac = new Uint8Array(await crypto.subtle.sign("HMAC", macKey, new TextEncoder().encode(previous)));
    } else {
      previousError = "BRIDGE_SECRET_PREVIOUS must be 16 to 4096 visible ASCII characters, no spaces or commas";
    }
  }
  try {
    if (previousError !== null) throw new ConfigError(previousError);
    return { macKey, secretMac, previousMac, settingsError: null, ...settings(env) };
  } catch (e) {
    if (!(e instanceof ConfigError)) throw e;
    return { macKey, secretMac, previousMac, settingsError: e.message };
  }
}

// settings reads every setting but the secret.
function settings(env) {
  const mode = env.BRIDGE_MODE === undefined || env.BRIDGE_MODE === "" ? MODE_FULL : env.BRIDGE_MODE;
  if (mode !== MODE_FULL && mode !== MODE_LEDGER_ONLY) {
    throw new ConfigError(`BRIDGE_MODE ${JSON.stringify(mode)} is neither "${MODE_FULL}" nor "${MODE_LEDGER_ONLY}"`);
  }
  const rawMode = env.BRIDGE_RAW_MODE === undefined || env.BRIDGE_RAW_MODE === "" ? "internal" : env.BRIDGE_RAW_MODE;
  if (rawMode !== "internal" && rawMode !== "public") {
    throw new ConfigError(`BRIDGE_RAW_MODE ${JSON.stringify(rawMode)} is neither "internal" nor "public"`);
  }
  const databases = databasesSetting(env);
  const allowed = allowedSetting(env);
  return {
    databases,
    rawMode,
    ledgerOnly: mode === MODE_LEDGER_ONLY,
    accepted: mode === MODE_LEDGER_ONLY ? new Set([...LEDGER_SET, ...allowed]) : null,
  };
}

// --- Authentication ---

// timingSafeEqual compares two byte arrays of equal length in time that
// depends only on the length. workerd provides crypto.subtle.timingSafeEqual;
// elsewhere the loop below does the same, without an early exit.
function timingSafeEqual(a, b) {
  if (a.byteLength !== b.byteLength) return false; // digests: never differ
  if (typeof crypto.subtle.timingSafeEqual === "function") return crypto.subtle.timingSafeEqual(a, b);
  let diff = 0;
  for (let i = 0; i < a.byteLength; i++) diff |= a[i] ^ b[i];
  return diff === 0;
}

const BEARER = /^Bearer +([^\s,]+) *$/i;

// authenticate answers the request's rejection, or null when it carries the
// secret (or BRIDGE_SECRET_PREVIOUS). The token is HMAC'd with the same key
// as the secrets and the 32-byte digests compared in constant time, each of
// them: the work does not depend on where, or whether, the token and a
// secret differ, nor on their lengths.
async function authenticate(request, config) {
  const header = request.headers.get("Authorization");
  if (header === null) return unauthorized();
  const m = BEARER.exec(header);
  if (!m) {
    return fail(400, 6003, "Invalid request headers", {}, {
      error_chain: [{ code: 6111, message: "Invalid format for Authorization header" }],
    });
  }
  const mac = new Uint8Array(await crypto.subtle.sign("HMAC", config.macKey, new TextEncoder().encode(m[1])));
  const current = timingSafeEqual(mac, config.secretMac);
  const previous = config.previousMac !== null && timingSafeEqual(mac, config.previousMac);
  return current || previous ? null : unauthorized();
}

function unauthorized() {
  return fail(401, 10000, "Authentication error", { "www-authenticate": 'Bearer realm="d1idem-bridge"' });
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
  throw new Error(`D1_TYPE_ERROR: Type '${rType}' not supported for value '${shownValue(r)}'`);
}

// shownValue is r as the binding's message shows it (`${r}`), when that
// can be made and is short: an object whose toString throws, or an array
// nested too deep to print, is a bad parameter, not an internal error (500
// would be retried as transient); a huge one is not echoed whole.
function shownValue(r) {
  let text;
  try {
    text = `${r}`;
  } catch {
    return Array.isArray(r) ? "[array]" : "[object]";
  }
  return text.length > 200 ? `${text.slice(0, 200)}... (${text.length} characters)` : text;
}

// parseQuery validates one {sql, params} object.
function parseQuery(q, where) {
  if (q === null || typeof q !== "object" || Array.isArray(q)) {
    throw new RequestError(400, 7400, `${where}: expected an object with "sql"`);
  }
  if (typeof q.sql !== "string") {
    throw new RequestError(400, 7400, `${where}: "sql" must be a string`);
  }
  const params = q.params ?? [];
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
        if (j < 0) {
          j = n;
          break;
        }
        if (close !== "]" && sql[j + 1] === close) {
          j += 2;
          continue;
        }
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

// toObjects turns {columns, rows} into row objects the way .all() does.
function toObjects(results) {
  if (!results || Array.isArray(results)) return results ?? [];
  const { columns, rows } = results;
  return rows.map((row) => Object.fromEntries(row.map((cell, i) => [columns[i], cell])));
}

// runInternal sends the queries through the binding's internal transport:
// one query as a single {sql, params}, as .all() sends it; several as one
// array, as batch() sends them.
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
  // D1 answers with an array even for a single {sql, params}.
  if (!Array.isArray(answers)) answers = [answers];
  if (answers.length !== queries.length) {
    throw new Error(`expected ${queries.length} results from D1, got ${answers.length}`);
  }
  return answers.map((a) => {
    let results = a.results ?? { columns: [], rows: [] };
    if (Array.isArray(results)) {
      // An ARRAY_OF_OBJECTS answer: rebuild columns from the first row.
      results = { columns: results.length ? Object.keys(results[0]) : [], rows: results.map((r) => Object.values(r)) };
    }
    return { results: raw ? results : toObjects(results), success: true, meta: a.meta ?? null };
  });
}

// runPublic uses only the public binding API (see the header for what /raw
// loses this way).
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

// D1's transient failures, as the binding words them; the REST API answers
// them 429 (overload) or 500, never 400, so clients may retry reads.
const OVERLOADED = /\boverloaded\b|Too many requests queued/i;
const TRANSIENT =
  /internal error|Network connection lost|D1 DB reset|object to be reset|Cannot resolve D1 DB|exceeded its (memory|CPU time) limit|storage operation exceeded timeout|storage caused object/i;

// d1Failure maps an exception of the binding to the REST API's answer.
function d1Failure(e) {
  const message = String(e?.message ?? e);
  const text = message.replace(/^D1_(?:[A-Z]+_)*ERROR: /, "");
  if (OVERLOADED.test(text)) return fail(429, 7500, text);
  if (TRANSIENT.test(text)) return fail(500, 7500, text);
  if (message.startsWith("D1_")) return fail(400, 7500, text);
  return fail(500, 7500, `internal error: ${message}`);
}

// refused answers a call that ledger-only mode does not accept.
function refused(index, count) {
  const which = count === 1 ? "the statement" : `statement ${index + 1} of ${count}`;
  return fail(
    400,
    7500,
    `not authorized: the bridge runs in ledger-only mode and ${which} is neither one of the ledger's own ` +
      "statements nor listed in BRIDGE_ALLOWED_STATEMENTS (texts must match exactly); nothing was executed: SQLITE_AUTH",
  );
}

async function handleQuery(request, config, db, raw) {
  let body;
  try {
    body = await request.json();
  } catch {
    return fail(400, 7400, "The request body is not valid JSON.");
  }
  let queries;
  try {
    let sent; // the statements as sent, before any split
    if (body !== null && typeof body === "object" && !Array.isArray(body) && "batch" in body) {
      if (!Array.isArray(body.batch) || body.batch.length === 0) {
        throw new RequestError(400, 7400, '"batch" must be a non-empty array of {"sql","params"}');
      }
      sent = body.batch.map((q, i) => parseQuery(q, `batch[${i}]`));
      queries = sent;
    } else {
      const q = parseQuery(body, "body");
      sent = [q];
      const parts = q.params.length === 0 ? splitSQL(q.sql) : [];
      queries = parts.length > 1 ? parts.map((sql) => ({ sql, params: [] })) : [q];
    }
    if (config.ledgerOnly) {
      const i = sent.findIndex((q) => !config.accepted.has(q.sql));
      if (i >= 0) return refused(i, sent.length);
    }
  } catch (e) {
    if (e instanceof RequestError) return fail(e.status, e.code, e.message);
    throw e;
  }
  try {
    for (const q of queries) q.params = q.params.map(bindValue);
    const internal = config.rawMode === "internal" && internalAvailable(db);
    return ok(internal ? await runInternal(db, queries, raw) : await runPublic(db, queries, raw));
  } catch (e) {
    return d1Failure(e);
  }
}

const QUERY_ROUTE = /^(?:\/client\/v4)?\/accounts\/([^/]+)\/d1\/database\/([^/]+)\/(query|raw)\/?$/;

export default {
  async fetch(request, env) {
    let config;
    try {
      config = await configure(env);
    } catch (e) {
      configs.delete(env); // read the settings again next time
      if (e instanceof ConfigError) return fail(500, 10001, `bridge misconfigured: ${e.message}`);
      throw e;
    }
    const url = new URL(request.url);
    const m = QUERY_ROUTE.exec(url.pathname);
    if (!m) return fail(404, 7000, "No route for that URI");
    if (request.method !== "POST") {
      return fail(405, 10405, `Method ${request.method} not allowed: use POST`, { allow: "POST" });
    }
    const rejection = await authenticate(request, config);
    if (rejection) return rejection;
    if (config.settingsError !== null) return fail(500, 10001, `bridge misconfigured: ${config.settingsError}`);
    let id;
    try {
      id = decodeURIComponent(m[2]);
    } catch {
      return fail(400, 7003, `Could not route to ${url.pathname}, perhaps your object identifier is invalid?`);
    }
    const binding = config.databases.get(id);
    if (binding === undefined) return fail(404, 7404, `The database ${id} could not be found`);
    return handleQuery(request, config, env[binding], m[3] === "raw");
  },
};
