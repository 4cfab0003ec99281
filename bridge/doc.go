// Package bridge holds the d1idem bridge, a Cloudflare Worker (worker.js,
// JavaScript) that serves the D1 REST API's query endpoints on the D1
// bindings it is deployed with, behind a bearer secret, with an optional
// ledger-only mode; see README.md in this directory and docs/bridge.md.
//
// Its Go API is the Worker's files, embedded (WorkerFiles, WranglerExample
// and CompatibilityDate), a deployment's configuration (Config: its
// wrangler.toml, its bindings' names and checks) and secret (NewSecret,
// ValidSecret), and the steps of `d1idem bridge init` and `d1idem bridge
// deploy`: Init writes a bridge directory, Deploy runs wrangler there and
// sets the secret it keeps (ReadSecret, EnsureSecret). Its tests run the
// Worker in workerd (through internal/d1test) and check its
// authentication, routing, database mapping and ledger-only mode.
//
// # API stability
//
// The Go API exists for the d1idem CLI and is not covered by the module's
// semantic versioning: use `d1idem bridge init`. What is covered is the
// Worker's protocol: the D1 REST shapes it serves, its secret and its
// error codes (docs/bridge.md).
package bridge
