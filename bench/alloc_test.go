package bench

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/internal/d1test"
	"github.com/d1idem/d1idem/internal/specseq"
)

// replay is an http.RoundTripper that has d1local answer the first request
// in process and then answers every later one with a copy of that answer,
// so that the allocations of a call are the client's own (and this
// transport's few).
type replay struct {
	local *d1local.Server

	once   sync.Once
	status int
	header http.Header
	body   []byte
}

func (t *replay) RoundTrip(r *http.Request) (*http.Response, error) {
	t.once.Do(func() {
		rec := httptest.NewRecorder()
		t.local.ServeHTTP(rec, r)
		t.status, t.header, t.body = rec.Code, rec.Header(), rec.Body.Bytes()
	})
	if r.Body != nil {
		_, _ = io.Copy(io.Discard, r.Body)
		r.Body.Close()
	}
	return &http.Response{StatusCode: t.status, Header: t.header, Body: io.NopCloser(bytes.NewReader(t.body)),
		ContentLength: int64(len(t.body)), Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Request: r}, nil
}

// BenchmarkClientExec: allocations per D1 call of one d1client Exec against
// d1local in process, for one statement (the spec's lookup: two parameters,
// one row back) and for a batch of two (the spec's claim and lookup, as
// round trip 1 is). client_only replays d1local's answer to the same call,
// so its allocs/op are the client's own (target: at most half the baseline
// of tools/benchtable); d1local_in_process has d1local execute every call, its SQLite
// work included. Each sub-benchmark reports its allocations itself.
func BenchmarkClientExec(b *testing.B) {
	local, err := d1local.New(d1local.Config{})
	if err != nil {
		b.Fatal(err)
	}
	defer local.Close()
	setup, err := newClient(inProcessURL, "bench", &http.Client{Transport: inProcess{local}}, false)
	if err != nil {
		b.Fatal(err)
	}
	d1test.ApplySchema(b, setup)
	if _, err := setup.Query(ctx, specseq.Claim, "p", "k", "fp", 1, 1); err != nil {
		b.Fatal(err)
	}
	one := []d1client.Statement{d1client.Statement{SQL: specseq.Lookup, Params: []any{"p", "k"}}}
	batch := []d1client.Statement{d1client.Statement{SQL: specseq.Claim, Params: []any{"p", "k", "fp", 1, 1}}, one[0]}
	for _, tc := range []struct {
		name      string
		transport http.RoundTripper
		stmts     []d1client.Statement
	}{
		{"client_only/one_statement", &replay{local: local}, one},
		{"client_only/batch_of_2", &replay{local: local}, batch},
		{"d1local_in_process/one_statement", inProcess{local}, one},
	} {
		b.Run(tc.name, func(b *testing.B) {
			c, err := newClient(inProcessURL, "bench", &http.Client{Transport: tc.transport}, false)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				res, err := c.Exec(ctx, tc.stmts)
				if err != nil || len(res) != len(tc.stmts) || len(res[len(res)-1].Rows) != 1 {
					b.Fatalf("%v, %d results", err, len(res))
				}
			}
		})
	}
}
