package main

import (
	"bytes"
	"context"
	"os"
	"testing"
)

// TestExpectedIsCurrent fails when schema/expected.go is not what shapegen
// makes of the current schema.sql.
func TestExpectedIsCurrent(t *testing.T) {
	want, err := generate(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("../../expected.go")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("schema/expected.go is stale: run `go generate ./schema`; shapegen makes:\n%s", want)
	}
}
