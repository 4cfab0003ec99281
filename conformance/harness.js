// harness.js: the test-only Worker that runs beside the bridge
// (../bridge/worker.js) in server.mjs's workerd. It holds the spec's own
// code ("Idempotency-Key Ledger on D1"), copied verbatim with the
// TypeScript types removed (and handleIdempotentMutation's "export", which
// workerd would read as an entrypoint), and a benchmark of raw D1 binding
// calls. It is
// bound to the same D1 databases as the bridge, so a Go backend talking to
// the bridge and the spec's Worker share one ledger. Never deploy it.
//
// Routes (server.mjs routes every path under /__spec/ here):
//
//   GET  /__spec/healthz          {"ok":true,"pool":N}
//   ANY  /__spec/fingerprint/<path...>
//        the spec's computeFingerprint over request.method, url.pathname +
//        url.search, request.headers and await request.arrayBuffer(), where
//        exactly the 19 characters "/__spec/fingerprint" are removed from
//        the front of url.pathname first; answers
//        {"fingerprint":"<64 hex>","pathAndQuery":"/v1/orders?a=1","method":"POST"}
//   ANY  /__spec/ledger/<path...>
//        the spec's handleIdempotentMutation, as its "Wiring It Into a
//        Worker" section has it, on the database named by the
//        X-Spec-Database header (a pool database ID, "db-<i>"), for the
//        principal in X-Spec-Principal. The fingerprint covers the full
//        path, /__spec/ledger included, so a Go server sharing the ledger
//        must serve the same path. The mutation answers X-Spec-Status
//        (default 201) with Content-Type application/json, the Location in
//        X-Spec-Location if any, and the body
//        {"by":"spec-worker","request":"<the request body as text>"}.
//   POST /__spec/bench/raw
//        {"database":"db-<i>","sql":"...","params":[[...], ...],
//         "concurrency":16,"batch":1} runs params.length statements straight
//        on the binding, concurrency calls at a time: one statement per call
//        (prepare().bind().raw()) with batch 1, else db.batch() of batch
//        statements per call. Answers {"statements":n}: the baseline the
//        bridge's overhead is measured against.

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

// --- The rest of the spec's Worker, verbatim but for the TypeScript types ---

function jsonResponse(
  status,
  body,
  headers = {},
) {
  return new Response(JSON.stringify(body), {
    status,
    headers: { "Content-Type": "application/json", ...headers },
  });
}

const PENDING_TTL_MS = 30_000; // set well above the slowest realistic mutation

const REPLAYABLE_HEADERS = ["content-type", "location"];

const RESPONSE_BODY_MAX_BYTES = 16_384; // 16 KB

function captureHeaders(headers) {
  const captured = {};
  for (const name of REPLAYABLE_HEADERS) {
    const value = headers.get(name);
    if (value !== null) captured[name] = value;
  }
  return JSON.stringify(captured);
}

const NULL_BODY_STATUSES = new Set([204, 205, 304]);

function bodyForStatus(status, body) {
  return NULL_BODY_STATUSES.has(status) ? null : body;
}

function replayResponse(row) {
  const headers = JSON.parse(row.response_headers ?? "{}");
  const status = row.response_status ?? 500;
  return new Response(bodyForStatus(status, row.response_body), {
    status,
    headers,
  });
}

const SWEEP_BATCH_SIZE = 20;
const RETENTION_MS = 24 * 60 * 60 * 1000; // 24h

async function sweepExpired(db, now) {
  await db
    .prepare(
      `DELETE FROM idempotency_keys
       WHERE rowid IN (
         SELECT rowid FROM idempotency_keys
         WHERE updated_at < ?
         LIMIT ?
       )`,
    )
    .bind(now - RETENTION_MS, SWEEP_BATCH_SIZE)
    .run();
}

const IDEMPOTENCY_KEY_PATTERN = /^[\x20-\x7e]{1,255}$/; // printable ASCII, 1-255 chars

async function handleIdempotentMutation(
  request,
  env,
  ctx,
  principal,
  runMutation,
) {
  const idempotencyKey = request.headers.get("Idempotency-Key");
  if (!idempotencyKey) {
    return jsonResponse(400, { error: "idempotency_key_required" });
  }
  if (!IDEMPOTENCY_KEY_PATTERN.test(idempotencyKey)) {
    return jsonResponse(400, {
      error: "idempotency_key_invalid",
      message: "Idempotency-Key must be 1-255 printable ASCII characters.",
    });
  }

  const now = Date.now();
  const url = new URL(request.url);
  const bodyBytes = await request.arrayBuffer();
  const fingerprint = await computeFingerprint(
    request.method,
    url.pathname + url.search,
    request.headers,
    bodyBytes,
  );

  let generation;

  const claim = await env.DB.prepare(
    `INSERT INTO idempotency_keys (principal, key, fingerprint, status, generation, created_at, updated_at)
     VALUES (?, ?, ?, 'pending', 1, ?, ?)
     ON CONFLICT (principal, key) DO NOTHING
     RETURNING key, generation`,
  )
    .bind(principal, idempotencyKey, fingerprint, now, now)
    .first();

  if (claim) {
    generation = claim.generation;
  } else {
    const existing = await env.DB.prepare(
      `SELECT fingerprint, status, generation, response_status, response_body, response_headers
       FROM idempotency_keys WHERE principal = ? AND key = ?`,
    )
      .bind(principal, idempotencyKey)
      .first();

    if (!existing) {
      return jsonResponse(409, { error: "idempotency_key_retry", message: "Retry the request." });
    }
    if (existing.fingerprint !== fingerprint) {
      return jsonResponse(409, { error: "idempotency_key_reused" });
    }
    if (existing.status === "completed") {
      return replayResponse(existing);
    }

    const takeover = await env.DB.prepare(
      `UPDATE idempotency_keys
       SET generation = generation + 1, updated_at = ?
       WHERE principal = ? AND key = ? AND status = 'pending' AND updated_at < ?
       RETURNING generation`,
    )
      .bind(now, principal, idempotencyKey, now - PENDING_TTL_MS)
      .first();

    if (!takeover) {
      return jsonResponse(
        409,
        { error: "idempotency_key_in_progress", retry_after_ms: PENDING_TTL_MS },
        { "Retry-After": String(Math.ceil(PENDING_TTL_MS / 1000)) },
      );
    }
    generation = takeover.generation;
  }

  const result = await runMutation(bodyBytes);
  let responseBody = result.body;
  let responseStatus = result.status;

  if (new TextEncoder().encode(result.body).byteLength > RESPONSE_BODY_MAX_BYTES) {
    responseBody = null;
    responseStatus = 500;
  }

  const headersJson = captureHeaders(result.headers);

  const completed = await env.DB.prepare(
    `UPDATE idempotency_keys
     SET status = 'completed', response_status = ?, response_body = ?, response_headers = ?, updated_at = ?
     WHERE principal = ? AND key = ? AND generation = ? AND status = 'pending'
     RETURNING key`,
  )
    .bind(responseStatus, responseBody, headersJson, Date.now(), principal, idempotencyKey, generation)
    .first();

  if (!completed) {
    console.error(
      `[idempotency] fenced out for principal=${principal}, key=${idempotencyKey}, generation=${generation} superseded`,
    );
  }

  ctx.waitUntil(sweepExpired(env.DB, now));

  return new Response(bodyForStatus(responseStatus, responseBody), {
    status: responseStatus,
    headers: JSON.parse(headersJson),
  });
}

// --- The harness around it ---

const FINGERPRINT_PREFIX = "/__spec/fingerprint";

function json(status, body) {
  return new Response(JSON.stringify(body), {
    status,
    headers: { "content-type": "application/json; charset=UTF-8" },
  });
}

// binding returns the pool database's D1 binding for an ID "db-<i>".
function binding(env, id) {
  const m = /^db-(0|[1-9][0-9]*)$/.exec(id ?? "");
  return m && Number(m[1]) < Number(env.POOL_SIZE) ? env[`DB_${m[1]}`] : undefined;
}

async function handleFingerprint(request, url) {
  const pathAndQuery = url.pathname.slice(FINGERPRINT_PREFIX.length) + url.search;
  const bodyBytes = await request.arrayBuffer();
  const fingerprint = await computeFingerprint(request.method, pathAndQuery, request.headers, bodyBytes);
  return json(200, { fingerprint, pathAndQuery, method: request.method });
}

async function handleLedger(request, env, ctx) {
  const db = binding(env, request.headers.get("X-Spec-Database"));
  if (!db) return json(400, { error: "X-Spec-Database must name a pool database (db-<i>)" });
  const principal = request.headers.get("X-Spec-Principal");
  if (!principal) return json(400, { error: "X-Spec-Principal is required" });
  const status = Number(request.headers.get("X-Spec-Status") ?? 201);
  const location = request.headers.get("X-Spec-Location");
  return handleIdempotentMutation(request, { DB: db }, ctx, principal, async (bodyBytes) => {
    const headers = new Headers({ "Content-Type": "application/json" });
    if (location !== null) headers.set("Location", location);
    const body = JSON.stringify({ by: "spec-worker", request: new TextDecoder().decode(bodyBytes) });
    return { status, body, headers };
  });
}

async function handleBenchRaw(request, env) {
  const { database, sql, params, concurrency = 16, batch = 1 } = await request.json();
  const db = binding(env, database);
  if (!db) return json(400, { error: "database must name a pool database (db-<i>)" });
  const stmt = db.prepare(sql);
  let next = 0;
  const worker = async () => {
    while (next < params.length) {
      const ps = params.slice(next, next + batch);
      next += ps.length;
      if (batch === 1) await stmt.bind(...ps[0]).raw();
      else await db.batch(ps.map((p) => stmt.bind(...p)));
    }
  };
  await Promise.all(Array.from({ length: Math.max(1, concurrency) }, worker));
  return json(200, { statements: params.length });
}

export default {
  async fetch(request, env, ctx) {
    const url = new URL(request.url);
    const path = url.pathname;
    if (path === "/__spec/healthz") return json(200, { ok: true, pool: Number(env.POOL_SIZE) });
    if (path.startsWith(FINGERPRINT_PREFIX + "/")) return handleFingerprint(request, url);
    if (path.startsWith("/__spec/ledger/")) return handleLedger(request, env, ctx);
    if (path === "/__spec/bench/raw" && request.method === "POST") return handleBenchRaw(request, env);
    return json(404, { error: "no such harness route" });
  },
};
