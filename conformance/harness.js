// harness.js: the test-only Worker that runs beside the bridge
// (../bridge/worker.js) in server.mjs's workerd. It holds the spec's own
// code ("Idempotency-Key Ledger on D1", in spec.mjs: copied verbatim with
// the TypeScript types removed), and a benchmark of raw D1 binding calls. It
// is
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
//   ANY  /__spec/mutate/<database-id>/<path...>
//        the spec's handleIdempotentMutation on that pool database, as
//        described in spec.mjs (the prefix is removed before the spec's code
//        sees the URL).
//   POST /__spec/bench/raw
//        {"database":"db-<i>","sql":"...","params":[[...], ...],
//         "concurrency":16,"batch":1} runs params.length statements straight
//        on the binding, concurrency calls at a time: one statement per call
//        (prepare().bind().raw()) with batch 1, else db.batch() of batch
//        statements per call. Answers {"statements":n}: the baseline the
//        bridge's overhead is measured against.

import { computeFingerprint, handleIdempotentMutation, SPEC_MUTATE_PREFIX, handleSpecMutate } from "./spec.mjs";

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
    if (path.startsWith(SPEC_MUTATE_PREFIX)) {
      const [id, ...rest] = path.slice(SPEC_MUTATE_PREFIX.length).split("/");
      const db = binding(env, id);
      if (!db) return json(404, { error: "no such pool database (db-<i>)" });
      return handleSpecMutate(request, db, "/" + rest.join("/"), ctx);
    }
    if (path === "/__spec/bench/raw" && request.method === "POST") return handleBenchRaw(request, env);
    return json(404, { error: "no such harness route" });
  },
};
