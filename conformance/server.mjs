// server.mjs: runs worker.js on Cloudflare's real local D1 (workerd through
// Miniflare), listening on 127.0.0.1 only.
//
//   node server.mjs [port] [stateDir]
//
// port     TCP port on 127.0.0.1; 0 (the default) picks a free one.
// stateDir if given, the databases persist there as plain SQLite files
//          (<stateDir>/miniflare-D1DatabaseObject/<sha256>.sqlite); without
//          it they live in Miniflare's temporary directory and vanish on exit.
//
// Once the server answers, it prints exactly one line to stdout:
//
//   LISTENING http://127.0.0.1:<port>
//
// and nothing else (diagnostics go to stderr). It shuts down cleanly
// (Miniflare's dispose(), which stops workerd) on SIGTERM, SIGINT, SIGHUP,
// and when its stdin reaches end-of-file, so a parent that dies (a Go test
// binary holding the write end of a pipe) never leaves it running. To run it
// by hand in the background, where stdin is often /dev/null, set
// CONFORMANCE_IGNORE_STDIN=1.
//
// Environment:
//   D1_POOL_SIZE   number of databases (default 128): bindings DB_0 ..
//                  DB_<n-1> with database IDs "db-0" .. "db-<n-1>". Each one
//                  is a small Worker of its own inside workerd (Miniflare's
//                  object-entry worker), costing about 4 ms of start-up and
//                  1 MB of memory: 128 start in about 1.1 s, 256 in 1.5-2 s.
//   RAW_MODE       "internal" (default) or "public"; see worker.js.
//   CONFORMANCE_IGNORE_STDIN=1  do not exit on stdin EOF.
//
// No network egress: cf:false stops Miniflare fetching the Request.cf object
// from the internet, and nothing else reaches out.
import { Miniflare } from "miniflare";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));

function fatal(msg) {
  process.stderr.write(`server.mjs: ${msg}\n`);
  process.exit(2);
}

const port = Number(process.argv[2] ?? 0);
if (!Number.isInteger(port) || port < 0 || port > 65535) fatal(`bad port ${process.argv[2]}`);
const stateDir = process.argv[3] ? path.resolve(process.argv[3]) : undefined;
const poolSize = Number(process.env.D1_POOL_SIZE || 128);
if (!Number.isInteger(poolSize) || poolSize < 1 || poolSize > 4096) fatal(`bad D1_POOL_SIZE ${process.env.D1_POOL_SIZE}`);
const rawMode = process.env.RAW_MODE === "public" ? "public" : "internal";

const d1Databases = {};
for (let i = 0; i < poolSize; i++) d1Databases[`DB_${i}`] = `db-${i}`;

const mf = new Miniflare({
  modules: true,
  scriptPath: path.join(here, "worker.js"),
  compatibilityDate: "2026-04-26",
  d1Databases,
  ...(stateDir ? { d1Persist: stateDir } : {}),
  bindings: { POOL_SIZE: poolSize, RAW_MODE: rawMode },
  host: "127.0.0.1",
  port,
  cf: false,
});

let closing = false;
async function shutdown(code) {
  if (closing) return;
  closing = true;
  try {
    await mf.dispose();
  } catch (e) {
    process.stderr.write(`server.mjs: dispose: ${e?.stack ?? e}\n`);
  }
  process.exit(code);
}

for (const sig of ["SIGTERM", "SIGINT", "SIGHUP"]) process.on(sig, () => shutdown(0));
if (process.env.CONFORMANCE_IGNORE_STDIN !== "1") {
  process.stdin.on("end", () => shutdown(0));
  process.stdin.on("error", () => shutdown(0));
  process.stdin.resume();
}

try {
  const url = await mf.ready;
  process.stdout.write(`LISTENING http://127.0.0.1:${url.port}\n`);
} catch (e) {
  process.stderr.write(`server.mjs: start-up failed: ${e?.stack ?? e}\n`);
  await shutdown(1);
}
