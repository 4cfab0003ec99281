package bridge

import (
	"embed"
	"io/fs"
)

//go:embed worker.js ledger-statements.js wrangler.toml.example
var files embed.FS

// CompatibilityDate is the compatibility_date the Worker is tested with:
// that of wrangler.toml.example and of the tests' workerd
// (conformance/server.mjs).
const CompatibilityDate = "2026-04-26"

// File is one file of the Worker.
type File struct {
	Name string // a base name: "worker.js"
	Data []byte
}

// workerModules are the Worker's modules, its main module first.
var workerModules = []string{"worker.js", "ledger-statements.js"}

// WorkerFiles returns the Worker's modules, worker.js (its main module)
// first: all a deployment needs beside its wrangler configuration.
func WorkerFiles() []File {
	out := make([]File, len(workerModules))
	for i, name := range workerModules {
		out[i] = File{Name: name, Data: mustRead(name)}
	}
	return out
}

// WranglerExample returns wrangler.toml.example, the annotated
// configuration README.md explains.
func WranglerExample() []byte { return mustRead("wrangler.toml.example") }

func mustRead(name string) []byte {
	data, err := fs.ReadFile(files, name)
	if err != nil {
		panic("bridge: " + name + " is not embedded: " + err.Error()) // a build error, caught by the tests
	}
	return data
}
