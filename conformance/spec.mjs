// spec.mjs: the spec's Worker ("Idempotency-Key Ledger on D1",
// handleIdempotentMutation and the helpers it calls), copied verbatim but for
// the TypeScript types, so that interop tests can have a Worker running the
// spec's own code write rows that Go replays, and replay rows that Go wrote.
//
// harness.js (the test-only Worker beside the bridge) imports it and routes
// to it:
//
//   ANY /__spec/mutate/<database-id>/<path...>
//
// runs handleIdempotentMutation on the database's D1 binding for a request
// whose URL is <path...> plus the query (the prefix is removed before the
// spec's code sees it, so its fingerprint is the one a Worker serving
// <path...> computes). The rest is test plumbing, not the spec's:
//   X-Spec-Principal:    the principal (a Worker derives it from
//                        authentication)
//   X-Spec-Status:       the status runMutation returns (default 200)
//   X-Spec-Body:         the body runMutation returns (default "")
//   X-Spec-Set-<name>:   a header runMutation's response carries, with the
//                        value workerd decoded from the request's bytes, as it
//                        decodes an origin's response headers
// The answer is the spec's Response, as a Worker sends it.

// --- Verbatim from the spec, types removed ---

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

// --- Test plumbing (not the spec's) ---

// harness.js's other routes call the spec's code directly.
export { computeFingerprint, handleIdempotentMutation };

export const SPEC_MUTATE_PREFIX = "/__spec/mutate/";

// handleSpecMutate serves /__spec/mutate/<database-id>/<path...> on db (the
// binding of <database-id>), as described at the top of this file.
export async function handleSpecMutate(request, db, rest, ctx) {
  const url = new URL(request.url);
  const inner = new Request(new URL(rest + url.search, url.origin), request);
  const principal = request.headers.get("x-spec-principal") ?? "";
  const runMutation = async () => {
    const headers = new Headers();
    for (const [name, value] of request.headers) {
      if (name.startsWith("x-spec-set-")) headers.set(name.slice("x-spec-set-".length), value);
    }
    const status = Number(request.headers.get("x-spec-status") ?? 200);
    return { status, body: request.headers.get("x-spec-body") ?? "", headers };
  };
  return handleIdempotentMutation(inner, { DB: db }, ctx, principal, runMutation);
}
