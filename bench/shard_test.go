package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/internal/d1test"
)

// perStatement is how long d1local's simulated D1 writer is busy per
// statement in BenchmarkShardScaling: one database then executes at most
// 1,000 statements per second, D1's "about 1 / (average query duration)"
// for a 1 ms query.
const perStatement = time.Millisecond

// BenchmarkShardScaling: idempotent first executions per second (Begin and
// Complete, 256 closed-loop callers, principals spread over the ring)
// with 1, 2, 4 and 8 databases, each database one writer:
//
//   - d1local: each call holds its database for 1 ms per statement
//     (d1local.Fault.Busy, taken inside the database's lock, where calls to
//     one database wait for each other), so a database runs 1,000
//     statements per second whatever the machine, as D1's limits page puts
//     it for 1 ms queries;
//   - workerd_busy: the same 1 ms per statement, held per database by a
//     proxy in front of the bridge, with the SQL run by workerd's D1;
//   - workerd: workerd's D1 as it is, each database's Durable Object
//     running its calls one at a time at workerd's own speed (microseconds
//     per statement): the machine's cores, not the databases, are then the
//     limit, and more databases only mean smaller batches.
//
// It reports the rate, the D1 calls per first execution, and, for 2, 4 and
// 8 databases, the factor over one database. Target: at least 3x from 1 to
// 4 databases where a database is the bottleneck (d1local, workerd_busy).
func BenchmarkShardScaling(b *testing.B) {
	for _, backend := range []string{d1test.NameLocal, "workerd_busy", d1test.NameWorkerd} {
		var one float64
		for _, n := range []int{1, 2, 4, 8} {
			b.Run(fmt.Sprintf("%s/dbs=%d", backend, n), func(b *testing.B) {
				var be *d1test.Backend
				if backend == d1test.NameLocal {
					be = d1test.LocalConfig(b, d1local.Config{Faults: func(r d1local.Request) d1local.Fault {
						return d1local.Fault{Busy: time.Duration(len(r.Statements)) * perStatement}
					}})
				} else {
					be = d1test.Workerd(b)
					if backend == "workerd_busy" {
						be = busyProxy(b, be)
					}
				}
				for range b.N {
					rate, calls := shardThroughput(b, be, n)
					b.ReportMetric(rate, "first-exec/s")
					b.ReportMetric(calls, "d1-calls/req")
					if n == 1 {
						one = rate
					} else if one > 0 {
						b.ReportMetric(rate/one, "x-vs-1-db")
					}
				}
			})
		}
	}
}

// shardThroughput runs 256 closed-loop callers of first executions on a
// sharded ledger over n fresh databases of be, for a warm-up and then a
// measured window, and returns first executions per second and D1 calls
// per first execution in the window.
func shardThroughput(b *testing.B, be *d1test.Backend, n int) (rate, callsPerReq float64) {
	const callers = 256
	warmup, window := time.Second, 3*time.Second
	hc := poolClient(4 * callers)
	var homes []idem.Home
	var dbs []*d1client.Client
	for range n {
		db := be.NewDatabase(b)
		c := db.Client(b, func(c *d1client.Config) { c.HTTPClient = hc })
		d1test.ApplySchema(b, c)
		homes = append(homes, idem.Home{DB: c})
		dbs = append(dbs, c)
	}
	l, err := idem.NewSharded(homes, idem.Config{Heartbeat: -1, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := l.Admin().InitRing(context.Background()); err != nil {
		b.Fatal(err)
	}
	calls := func() (n int64) {
		for _, db := range dbs {
			n += db.Stats().Calls
		}
		return n
	}
	resp := idem.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"ok":true}`)}
	ctx := context.Background()
	var done, seq atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for c := range callers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(c), 17))
			for {
				select {
				case <-stop:
					return
				default:
				}
				p := fmt.Sprint("acct-", rng.IntN(4096))
				d, err := l.Begin(ctx, p, fmt.Sprint("k-", seq.Add(1)), "fp")
				var derr *d1client.Error
				if errors.Is(err, d1client.ErrShed) && errors.As(err, &derr) {
					// Past the ceiling a claim is shed at once: the
					// caller waits as told (at most 250ms) and tries a
					// new key, as a client obeying Retry-After would.
					time.Sleep(min(derr.RetryAfter, 250*time.Millisecond))
					continue
				}
				if err == nil && d.Outcome == idem.Execute {
					_, err = l.Complete(ctx, d.Reservation, resp)
				}
				if err != nil {
					b.Error(err)
					return
				}
				done.Add(1)
			}
		})
	}
	time.Sleep(warmup)
	startDone, startCalls := done.Load(), calls()
	time.Sleep(window)
	reqs, used := done.Load()-startDone, calls()-startCalls
	close(stop)
	wg.Wait()
	return float64(reqs) / window.Seconds(), float64(used) / float64(reqs)
}

// busyProxy returns be reached through a proxy that holds each database for
// perStatement per statement of each call, one call at a time per
// database, before forwarding the call: D1's single writer, simulated in
// front of a backend whose own statements take microseconds.
func busyProxy(b *testing.B, be *d1test.Backend) *d1test.Backend {
	var locks sync.Map // database ID -> *sync.Mutex
	hc := poolClient(1024)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var q struct {
			Batch []json.RawMessage `json:"batch"`
		}
		_ = json.Unmarshal(body, &q)
		n := max(1, len(q.Batch))
		parts := strings.Split(r.URL.Path, "/")
		mu, _ := locks.LoadOrStore(parts[len(parts)-2], &sync.Mutex{})
		mu.(*sync.Mutex).Lock()
		time.Sleep(time.Duration(n) * perStatement)
		req, _ := http.NewRequestWithContext(r.Context(), r.Method, be.BaseURL+r.URL.RequestURI(), bytes.NewReader(body))
		req.Header = r.Header.Clone()
		res, err := hc.Do(req)
		var data []byte
		if err == nil {
			data, err = io.ReadAll(res.Body)
			res.Body.Close()
		}
		mu.(*sync.Mutex).Unlock()
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		for k, v := range res.Header {
			w.Header()[k] = v
		}
		w.WriteHeader(res.StatusCode)
		_, _ = w.Write(data)
	}))
	b.Cleanup(srv.Close)
	pb := *be
	pb.BaseURL = srv.URL
	return &pb
}
