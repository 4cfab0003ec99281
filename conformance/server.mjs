// server.mjs: runs the bridge (../bridge/worker.js) on Cloudflare's real
// local D1 (workerd through Miniflare), listening on 127.0.0.1 only, with
// the test harness Worker (harness.js) beside it.
//
//   node server.mjs [port] [stateDir]
//
// port     TCP port on 127.0.0.1; 0 (the default) picks a free one.
// stateDir if given, the databases persist there as plain SQLite files
//          (<stateDir>/miniflare-D1DatabaseObject/<sha256>.sqlite); without
//          it they live in Miniflare's temporary directory and vanish on exit.
//
// Once the server answers, it prints to stdout
//
//   BRIDGE http://127.0.0.1:<port>
//   ADMIN http://127.0.0.1:<port>        (only with BRIDGE_ADMIN=1)
//   LISTENING http://127.0.0.1:<port>
//
// and nothing else (diagnostics go to stderr). LISTENING is Miniflare's
// entry, which routes /__spec/* to the harness and everything else to the
// bridge; BRIDGE is the bridge's own socket, reached directly as a deployed
// Worker is (Miniflare's routing Worker costs a third of a small call). The
// harness runs any SQL on the same databases without the secret, so the
// bridge's guarantees (the secret, ledger-only mode) hold on the BRIDGE URL
// only: this is test tooling, on 127.0.0.1, never to be exposed or deployed
// ('d1idem bridge serve' runs the bridge alone). It shuts down cleanly
// (Miniflare's dispose(), which stops workerd) on SIGTERM, SIGINT, SIGHUP,
// and when its stdin reaches end-of-file, so a parent that dies (a Go test
// binary holding the write end of a pipe) never leaves it running. To run it
// by hand in the background, where stdin is often /dev/null, set
// CONFORMANCE_IGNORE_STDIN=1. However it exits (short of SIGKILL), it
// leaves nothing in the temporary directory.
//
// Workers, all on one workerd and the same D1 databases:
//   bridge   ../bridge/worker.js, the product, on the BRIDGE port and on
//            every path but /__spec/* of the LISTENING one.
//   harness  harness.js (the spec's own Worker code and a raw-binding
//            benchmark) on /__spec/*.
//   admin    with BRIDGE_ADMIN=1: the same bridge in full mode with the same
//            secret, on a port of its own (the ADMIN line): the operator's
//            way into the databases of a ledger-only bridge.
//
// Environment:
//   D1_POOL_SIZE   number of databases (default 128): bindings DB_0 ..
//                  DB_<n-1> with database IDs "db-0" .. "db-<n-1>". Each one
//                  is a small Worker of its own inside workerd (Miniflare's
//                  object-entry worker), costing about 4 ms of start-up and
//                  1 MB of memory.
//   BRIDGE_SECRET, BRIDGE_SECRET_PREVIOUS, BRIDGE_MODE,
//   BRIDGE_ALLOWED_STATEMENTS, BRIDGE_RAW_MODE
//                  passed to the bridge as they are (see ../bridge/worker.js);
//                  unset ones are left out. Without BRIDGE_SECRET the bridge
//                  refuses every request, as it must.
//   BRIDGE_DATABASES
//                  passed to the bridge; unset means {"db-<i>": "DB_<i>"}
//                  for the whole pool, and "none" leaves it unset in the
//                  Worker (each binding is then addressed by its name).
//   BRIDGE_DIR     the directory holding worker.js (default ../bridge).
//   CONFORMANCE_IGNORE_STDIN=1  do not exit on stdin EOF.
//
// No network egress: cf:false stops Miniflare fetching the Request.cf object
// from the internet, and nothing else reaches out.
import { Miniflare } from "miniflare";
import fs from "node:fs";
import os from "node:os";
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
const bridgeDir = path.resolve(process.env.BRIDGE_DIR || path.join(here, "..", "bridge"));

const d1Databases = {};
const pool = {};
for (let i = 0; i < poolSize; i++) {
  d1Databases[`DB_${i}`] = `db-${i}`;
  pool[`db-${i}`] = `DB_${i}`;
}

const bridgeBindings = {};
for (const name of ["BRIDGE_SECRET", "BRIDGE_SECRET_PREVIOUS", "BRIDGE_MODE", "BRIDGE_ALLOWED_STATEMENTS", "BRIDGE_RAW_MODE"]) {
  if (process.env[name] !== undefined) bridgeBindings[name] = process.env[name];
}
const databases = process.env.BRIDGE_DATABASES;
if (databases === undefined) bridgeBindings.BRIDGE_DATABASES = pool;
else if (databases !== "none") bridgeBindings.BRIDGE_DATABASES = databases;

const compatibilityDate = "2026-04-26";
const bridge = (name, bindings) => ({
  name,
  modules: true,
  scriptPath: path.join(bridgeDir, "worker.js"),
  modulesRoot: bridgeDir,
  // worker.js imports ledger-statements.js, an ES module too (Miniflare's
  // default rules would read an imported .js file as CommonJS).
  modulesRules: [{ type: "ESModule", include: ["**/*.js"] }],
  compatibilityDate,
  d1Databases,
  bindings,
});

const main = bridge("bridge", bridgeBindings);
main.unsafeDirectSockets = [{ host: "127.0.0.1", port: 0 }];
const workers = [
  main,
  {
    name: "harness",
    modules: true,
    scriptPath: path.join(here, "harness.js"),
    compatibilityDate,
    d1Databases,
    bindings: { POOL_SIZE: poolSize },
    routes: ["*/__spec/*"],
  },
];
if (process.env.BRIDGE_ADMIN === "1") {
  const admin = bridge("admin", { ...bridgeBindings, BRIDGE_MODE: "full", BRIDGE_DATABASES: pool });
  admin.unsafeDirectSockets = [{ host: "127.0.0.1", port: 0 }];
  workers.push(admin);
}

// Miniflare keeps its scratch (the databases without stateDir, its caches)
// in os.tmpdir()/miniflare-<random>, and dispose() removes it only in the
// background, which exiting cuts short: about 10 MB left behind per run.
// So its temporary directory is one of this server's own, removed on exit.
const scratch = fs.mkdtempSync(path.join(os.tmpdir(), "d1idem-workerd-"));
process.env.TMPDIR = scratch;
process.on("exit", () => fs.rmSync(scratch, { recursive: true, force: true }));

const mf = new Miniflare({
  workers,
  ...(stateDir ? { d1Persist: stateDir } : {}),
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
  const direct = await mf.unsafeGetDirectURL("bridge");
  process.stdout.write(`BRIDGE http://127.0.0.1:${direct.port}\n`);
  if (process.env.BRIDGE_ADMIN === "1") {
    const admin = await mf.unsafeGetDirectURL("admin");
    process.stdout.write(`ADMIN http://127.0.0.1:${admin.port}\n`);
  }
  process.stdout.write(`LISTENING http://127.0.0.1:${url.port}\n`);
} catch (e) {
  process.stderr.write(`server.mjs: start-up failed: ${e?.stack ?? e}\n`);
  await shutdown(1);
}
