package idem_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/internal/d1test"
)

// BenchmarkLedgerCalls reports D1 calls per request on each path of the
// request path, against d1local over real HTTP: 2 for a first execution and
// for a takeover (Begin + Complete, the sweep amortised into completions),
// 1 for a replay and for an in-progress answer (Begin alone).
func BenchmarkLedgerCalls(b *testing.B) {
	backend := d1test.Local(b)
	resp := idem.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"id":1}`)}

	b.Run("first_execution", func(b *testing.B) {
		db := backend.NewClientSchema(b)
		l := newLedger(b, db, idem.Config{Heartbeat: -1})
		before := db.Stats().Calls
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			d := begin(b, l, "p", fmt.Sprintf("first-%d", i), "fp")
			if _, err := l.Complete(bg, d.Reservation, resp); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(db.Stats().Calls-before)/float64(b.N), "d1-calls/req")
	})

	b.Run("replay", func(b *testing.B) {
		db := backend.NewClientSchema(b)
		l := newLedger(b, db, idem.Config{Heartbeat: -1})
		d := begin(b, l, "p", "replayed", "fp")
		if _, err := l.Complete(bg, d.Reservation, resp); err != nil {
			b.Fatal(err)
		}
		before := db.Stats().Calls
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if d := begin(b, l, "p", "replayed", "fp"); d.Outcome != idem.Replay {
				b.Fatal(d.Outcome)
			}
		}
		b.ReportMetric(float64(db.Stats().Calls-before)/float64(b.N), "d1-calls/req")
	})

	b.Run("in_progress", func(b *testing.B) {
		db := backend.NewClientSchema(b)
		l := newLedger(b, db, idem.Config{Heartbeat: -1})
		begin(b, l, "p", "pending", "fp")
		before := db.Stats().Calls
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if d := begin(b, l, "p", "pending", "fp"); d.Outcome != idem.InProgress {
				b.Fatal(d.Outcome)
			}
		}
		b.ReportMetric(float64(db.Stats().Calls-before)/float64(b.N), "d1-calls/req")
	})

	b.Run("takeover", func(b *testing.B) {
		db := backend.NewClientSchema(b)
		clk := newClock()
		l := newLedger(b, db, idem.Config{Clock: clk.Now, Heartbeat: -1})
		var calls int64
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			b.StopTimer()
			key := fmt.Sprintf("orphan-%d", i)
			begin(b, l, "p", key, "fp") // an owner that dies
			clk.Advance(idem.DefaultTTL + time.Millisecond)
			before := db.Stats().Calls
			b.StartTimer()
			d := begin(b, l, "p", key, "fp")
			if d.Outcome != idem.Execute || !d.Reservation.Takeover {
				b.Fatal(d.Outcome)
			}
			if _, err := l.Complete(bg, d.Reservation, resp); err != nil {
				b.Fatal(err)
			}
			calls += db.Stats().Calls - before
		}
		b.ReportMetric(float64(calls)/float64(b.N), "d1-calls/req")
	})
}

// BenchmarkShardTransitionCalls reports the extra D1 calls per request
// that a change of the ring costs (2 to 3 databases, one request at a time
// so that no call is shared), over the same request before the change:
// for unmoved principals, nothing; for a moved principal, one call (the
// read of its old home) for a first execution and for a replay of a key at
// its new home, none for a replay of a key still at its old home; and
// nothing once the change is over. The change lasts two retention windows
// (docs/sharding.md).
func BenchmarkShardTransitionCalls(b *testing.B) {
	got := transitionCalls(b, d1test.Local(b), b.N)
	first, replay := got["stable/first"], got["stable/moved/replay"]
	b.ReportMetric(got["moving/unmoved/first"]-first, "extra-calls/unmoved-first-exec")
	b.ReportMetric(got["moving/unmoved/replay"]-replay, "extra-calls/unmoved-replay")
	b.ReportMetric(got["moving/moved/first"]-first, "extra-calls/moved-first-exec")
	b.ReportMetric(got["moving/moved/replay_new_home"]-replay, "extra-calls/moved-replay")
	b.ReportMetric(got["moving/moved/replay_old_home"]-replay, "extra-calls/moved-replay-old-home")
	b.ReportMetric(got["stable/moved/first"]-first, "extra-calls/after-first-exec")
}
