package conformance

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

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
