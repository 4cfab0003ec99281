// Generates fingerprint test vectors with the spec's computeFingerprint,
// copied verbatim (TypeScript annotations removed). Run with Node 20+:
//   node idem/testdata/fingerprint_vectors.mjs > idem/testdata/fingerprint_vectors.json
// The Go test TestFingerprintMatchesSpecVectors checks idem.Fingerprint
// against the output, and re-runs this script when node is on PATH.

const FINGERPRINT_HEADERS = ["content-type", "x-api-version"];

async function computeFingerprint(method, pathAndQuery, headers, bodyBytes) {
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

const cases = [
  { name: "empty body, no headers", method: "POST", path: "/v1/orders", headers: [], body: "" },
  { name: "lower-case method", method: "post", path: "/v1/orders", headers: [], body: "" },
  { name: "json body", method: "POST", path: "/v1/orders", headers: [["Content-Type", "application/json"]], body: Buffer.from('{"sku":"A","qty":1}').toString("base64") },
  { name: "api version", method: "PUT", path: "/v1/x", headers: [["X-Api-Version", "2026-01-01"], ["content-type", "text/plain"]], body: Buffer.from("hi").toString("base64") },
  { name: "empty query kept as given", method: "POST", path: "/a?", headers: [], body: "" },
  { name: "repeated parameters in order", method: "POST", path: "/a?id=1&id=2", headers: [], body: "" },
  { name: "repeated parameters reversed", method: "POST", path: "/a?id=2&id=1", headers: [], body: "" },
  { name: "percent-encoding verbatim", method: "POST", path: "/caf%C3%A9/%2f?q=a%20b+c&x=%zz", headers: [], body: "" },
  { name: "invalid UTF-8 body", method: "POST", path: "/bin", headers: [["content-type", "application/octet-stream"]], body: Buffer.from([0xff, 0xfe, 0x00, 0xc3, 0x28, 0x80]).toString("base64") },
  { name: "multi-valued header", method: "POST", path: "/m", headers: [["x-api-version", "1"], ["x-api-version", "2"]], body: "" },
  { name: "empty header value", method: "POST", path: "/e", headers: [["x-api-version", ""]], body: "" },
  { name: "unlisted headers ignored", method: "POST", path: "/u", headers: [["x-trace-id", "abc"], ["user-agent", "curl"]], body: "" },
  { name: "non-ASCII header value", method: "POST", path: "/n", headers: [["content-type", "text/plain; charset=utf-8"]], body: Buffer.from("héllo wörld").toString("base64") },
  { name: "large body", method: "PATCH", path: "/big", headers: [], body: Buffer.alloc(20000, 7).toString("base64") },
];

const out = [];
for (const c of cases) {
  const headers = new Headers();
  for (const [k, v] of c.headers) headers.append(k, v);
  const body = Buffer.from(c.body, "base64");
  const ab = body.buffer.slice(body.byteOffset, body.byteOffset + body.byteLength);
  out.push({ ...c, fingerprint: await computeFingerprint(c.method, c.path, headers, ab) });
}
console.log(JSON.stringify(out, null, 2));
