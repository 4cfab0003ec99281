package conformance

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/internal/d1test"
)

// BenchmarkClaimLookup measures one claim+lookup batch (the spec's claim
// INSERT and lookup SELECT in one D1 call, a unique key per operation)
// against each backend, sequentially ("seq") and from 16 goroutines
// ("c16"). It reports ns/op (one op = one batch = one HTTP call) and
// stmts/s (two statements per op).
//
//	go test -run '^$' -bench ClaimLookup -benchtime 2s ./conformance/
func BenchmarkClaimLookup(b *testing.B) {
	backends := []struct {
		name string
		make func(testing.TB) *d1test.Backend
	}{
		{d1test.NameLocal, d1test.Local},
		{d1test.NameWorkerd, d1test.Workerd},
	}
	for _, be := range backends {
		b.Run(be.name, func(b *testing.B) {
			c := be.make(b).NewClientSchema(b)
			var seq atomic.Int64
			op := func(ctx context.Context) error {
				key := fmt.Sprintf("bench-%d", seq.Add(1))
				res, err := c.Exec(ctx, []d1client.Statement{claim("bench", key, "fp", 1000), lookup("bench", key)})
				if err != nil {
					return err
				}
				if len(res[0].Rows) != 1 || len(res[1].Rows) != 1 {
					return fmt.Errorf("claim of %s: %d and %d rows, want 1 and 1", key, len(res[0].Rows), len(res[1].Rows))
				}
				return nil
			}
			report := func(b *testing.B) {
				if s := b.Elapsed().Seconds(); s > 0 {
					b.ReportMetric(float64(2*b.N)/s, "stmts/s")
				}
			}
			b.Run("seq", func(b *testing.B) {
				ctx := b.Context()
				b.ResetTimer()
				for range b.N {
					if err := op(ctx); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				report(b)
			})
			b.Run("c16", func(b *testing.B) {
				const workers = 16
				ctx := b.Context()
				var (
					next atomic.Int64
					wg   sync.WaitGroup
				)
				b.ResetTimer()
				for range workers {
					wg.Go(func() {
						for next.Add(1) <= int64(b.N) {
							if err := op(ctx); err != nil {
								b.Error(err)
								return
							}
						}
					})
				}
				wg.Wait()
				b.StopTimer()
				report(b)
			})
		})
	}
}

// BenchmarkBridgeOverhead measures the bridge's own cost: D1 statements per
// second through the bridge (HTTP from Go to bridge/worker.js, which runs
// them on its D1 binding) against the same statements run straight on the
// binding by a Worker (harness.js's /__spec/bench/raw), on one workerd,
// with 16 calls in flight on each side. One op is one statement on each
// side: "write" is the spec's claim (a unique key each), "read" the spec's
// lookup of an existing row; "single" sends one statement per call (per
// HTTP request, and per binding call), "batch16" sixteen (a {"batch"}
// request, and db.batch()). The two sides take turns, a chunk of 64 calls
// each, so a machine whose load changes during the run weighs on both
// alike. Request bodies are encoded before the clock starts, so the Go
// side's cost is the HTTP exchange only. It reports both rates and the
// bridge's as a percentage of the raw binding's (target >= 70 %).
//
//	go test -run '^$' -bench BridgeOverhead -benchtime 4000x ./conformance/
func BenchmarkBridgeOverhead(b *testing.B) {
	const (
		concurrency = 16
		chunkCalls  = 64
	)
	be := d1test.Workerd(b)
	for _, kind := range []string{"write", "read"} {
		for _, batch := range []int{1, 16} {
			name := kind + "/single"
			if batch > 1 {
				name = fmt.Sprintf("%s/batch%d", kind, batch)
			}
			b.Run(name, func(b *testing.B) {
				db := be.NewDatabase(b)
				c := db.Client(b)
				d1test.ApplySchema(b, c)
				exec(b, c, claim("bench", "existing", "fp", 1000))
				sql := sqlClaim
				if kind == "read" {
					sql = sqlLookup
				}
				var seq atomic.Int64
				params := func(n int) [][]any {
					out := make([][]any, n)
					for i := range out {
						if kind == "read" {
							out[i] = []any{"bench", "existing"}
						} else {
							out[i] = []any{"bench", fmt.Sprintf("k-%d", seq.Add(1)), "fp", 1000, 1000}
						}
					}
					return out
				}
				// Every call of both sides, encoded up front, in chunks.
				type chunk struct {
					raw    []byte   // one /__spec/bench/raw request
					bridge [][]byte // the bridge's requests
				}
				var chunks []chunk
				for left := b.N; left > 0; left -= chunkCalls * batch {
					n := min(left, chunkCalls*batch)
					var ch chunk
					ch.raw, _ = json.Marshal(map[string]any{"database": db.ID, "sql": sql, "params": params(n),
						"concurrency": concurrency, "batch": batch})
					ps := params(n)
					for i := 0; i < n; i += batch {
						var body []byte
						if batch == 1 {
							body, _ = json.Marshal(map[string]any{"sql": sql, "params": ps[i]})
						} else {
							var stmts []map[string]any
							for _, p := range ps[i:min(i+batch, n)] {
								stmts = append(stmts, map[string]any{"sql": sql, "params": p})
							}
							body, _ = json.Marshal(map[string]any{"batch": stmts})
						}
						ch.bridge = append(ch.bridge, body)
					}
					chunks = append(chunks, ch)
				}
				ctx := b.Context()
				post := func(url string, body []byte) error {
					req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
					if err != nil {
						return err
					}
					req.Header.Set("Content-Type", "application/json")
					req.Header.Set("Authorization", "Bearer "+be.Token)
					res, err := be.HTTPClient.Do(req)
					if err != nil {
						return err
					}
					defer res.Body.Close()
					data, err := io.ReadAll(res.Body)
					if err != nil {
						return err
					}
					if res.StatusCode != http.StatusOK {
						return fmt.Errorf("HTTP %d: %s", res.StatusCode, data)
					}
					return nil
				}
				var rawTime, bridgeTime time.Duration
				b.ResetTimer()
				for _, ch := range chunks {
					start := time.Now()
					if err := post(be.HarnessURL+"/__spec/bench/raw", ch.raw); err != nil {
						b.Fatal(err)
					}
					rawTime += time.Since(start)
					start = time.Now()
					var (
						next atomic.Int64
						wg   sync.WaitGroup
						errs = make(chan error, concurrency)
					)
					for range concurrency {
						wg.Go(func() {
							for i := next.Add(1) - 1; i < int64(len(ch.bridge)); i = next.Add(1) - 1 {
								if err := post(db.URL("raw"), ch.bridge[i]); err != nil {
									errs <- err
									return
								}
							}
						})
					}
					wg.Wait()
					bridgeTime += time.Since(start)
					select {
					case err := <-errs:
						b.Fatal(err)
					default:
					}
				}
				b.StopTimer()
				raw, bridge := float64(b.N)/rawTime.Seconds(), float64(b.N)/bridgeTime.Seconds()
				b.ReportMetric(raw, "raw-stmts/s")
				b.ReportMetric(bridge, "bridge-stmts/s")
				b.ReportMetric(100*bridge/raw, "bridge-%-of-raw")
				if kind == "write" {
					if n := count(b, c, "SELECT count(*) FROM idempotency_keys"); n != int64(2*b.N+1) {
						b.Fatalf("%d rows after the run, want %d: statements were lost", n, 2*b.N+1)
					}
				}
			})
		}
	}
}
