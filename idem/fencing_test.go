package idem_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/internal/d1test"
)

// A generation reused while its owner could still write, with a retention
// of 10 minutes: an operator released a stuck key (the CLI backdated it by an
// hour), the next piggybacked sweep deleted the row, a different request
// claimed the key afresh at generation 1, the stuck owner's late completion
// (generation 1) passed the fence and was stored, and the new request was
// fenced out and later replayed the stuck owner's response.
//
// Now a retention of 10 minutes with the default 10-minute lease is refused,
// and with a configuration that allows it (a 1-minute lease) the release
// backdates by the TTL + 1ms only, and the stuck owner's write is never sent
// once its row may have been swept.
func TestReleasedKeyIsNeverCompletedByItsOldOwner(t *testing.T) {
	db := d1test.Local(t).NewClientSchema(t)
	_, err := idem.New(db, idem.Config{Retention: 10 * time.Minute})
	var ce *idem.ConfigError
	if !errors.As(err, &ce) || ce.Field != "Config.Retention" || !strings.Contains(err.Error(), "11m30s") {
		t.Fatalf("a retention of 10m with a 10m lease: %v", err)
	}

	clk := newClock()
	cfg := idem.Config{Clock: clk.Now, Heartbeat: -1, MaxLease: time.Minute, Retention: 10 * time.Minute}
	l := newLedger(t, db, cfg)
	fpA, fpB := "fp-request-a", "fp-request-b"
	// Another instance's completion: its first completion always carries
	// a sweep.
	completeElsewhere := func(key string) {
		t.Helper()
		other := newLedger(t, db, cfg)
		complete(t, other, begin(t, other, "acct", key, fpA).Reservation, 200, "carries a sweep")
	}

	stuck := begin(t, l, "acct", "k", fpA).Reservation // generation 1, then stalls
	clk.Advance(time.Minute)
	if res, err := l.Admin().Release(bg, "acct", "k", 1, idem.ReleaseOptions{}); err != nil || !res.Released {
		t.Fatalf("release: %+v %v", res, err)
	}
	// Ten minutes after the claim the released row is still there: it was
	// backdated by the TTL + 1ms, not by an hour.
	clk.Advance(9 * time.Minute)
	completeElsewhere("other")
	if d := begin(t, l, "acct", "k", fpB); d.Outcome != idem.Reused {
		t.Fatalf("a different request 10 minutes after the claim: %v, want reused (the row is kept)", d.Outcome)
	}
	// Later the sweep deletes it, and a different request claims the key
	// afresh, at generation 1: the stuck owner's generation.
	clk.Advance(time.Minute + time.Second)
	completeElsewhere("other2")
	fresh := begin(t, l, "acct", "k", fpB)
	if fresh.Outcome != idem.Execute || fresh.Reservation.Generation != 1 || fresh.Reservation.Takeover {
		t.Fatalf("after the sweep: %+v", fresh)
	}
	// The stuck owner wakes up: its generation matches the new row, but its
	// write is never sent.
	c, err := l.Complete(bg, stuck, idem.Response{Status: 201, Body: []byte(`{"order":"A"}`)})
	if !errors.Is(err, idem.ErrReservationExpired) || c.Stored {
		t.Fatalf("the stuck owner's completion: stored=%v err=%v", c.Stored, err)
	}
	if ok, err := l.Renew(bg, stuck); ok || !errors.Is(err, idem.ErrReservationExpired) {
		t.Fatalf("the stuck owner's renewal: %v %v", ok, err)
	}
	if ok, err := l.Release(bg, stuck); ok || !errors.Is(err, idem.ErrReservationExpired) {
		t.Fatalf("the stuck owner's release: %v %v", ok, err)
	}
	// The new request completes, and its retry replays its own response.
	if c := complete(t, l, fresh.Reservation, 201, `{"order":"B"}`); !c.Stored {
		t.Fatal("the new request was fenced out")
	}
	if d := begin(t, l, "acct", "k", fpB); d.Outcome != idem.Replay || string(d.Response.Body) != `{"order":"B"}` {
		t.Fatalf("the new request's retry: %+v", d)
	}
}

// owner is a reservation holder of the model: it may wake up and write at
// any time, as a stalled process does.
type owner struct {
	r       *idem.Reservation
	created int64 // created_at of the row it claimed or took over: its row's incarnation
}

// TestGenerationNeverReused drives every path that releases or sweeps
// (Ledger.Release, Admin.Release with and without Force, the piggybacked
// sweep, Admin.Sweep) and takeovers, with the shortest retention the
// configuration accepts and owners that stall for any length of time, and
// checks after every write an owner was told succeeded that it reached the
// row that owner claimed (the same incarnation, at its generation), never a
// row claimed afresh after a sweep that happens to be at the same
// generation.
func TestGenerationNeverReused(t *testing.T) {
	var expired, reused int
	for seed := uint64(1); seed <= 8; seed++ {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			e, r := generationModel(t, seed, 400)
			expired += e
			reused += r
		})
	}
	if expired == 0 || reused == 0 {
		t.Errorf("the runs never reached an owner whose row was swept and claimed again at its generation (expired %d, reused %d): lengthen them", expired, reused)
	}
}

// generationModel runs the model for steps steps and returns how many
// owners' writes were refused as expired, and how many of those would
// otherwise have reached a row claimed afresh at the owner's generation.
func generationModel(t *testing.T, seed uint64, steps int) (expired, reused int) {
	db := d1test.Local(t).NewClientSchema(t)
	cfg := idem.Config{Heartbeat: -1, TTL: 30 * time.Second, MaxLease: 30 * time.Second, SweepBatch: 5}
	cfg.Retention = cfg.MaxLease + cfg.TTL + idem.RetentionMargin // the shortest accepted
	m := &genModel{rng: rand.New(rand.NewPCG(seed, seed*7919)), db: db, clk: newClock(), keys: []string{"k0", "k1", "k2"}}
	cfg.Clock = m.clk.Now
	m.cfg = cfg
	m.l = newLedger(t, db, cfg)
	m.a = m.l.Admin()
	for step := 0; step < steps; step++ {
		if m.step(t) {
			m.clk.Advance(time.Millisecond) // every step at its own time
		}
	}
	t.Logf("seed %d: %d owners, %d completions stored, %d refused as expired, %d of them at a reused generation, %d rows swept by Admin.Sweep",
		seed, len(m.owners), m.stored, m.expired, m.reused, m.swept)
	return m.expired, m.reused
}

// genModel is one run of generationModel: its random source, its
// database, clock, ledger and administrative API, its keys and owners, and
// its counts.
type genModel struct {
	rng    *rand.Rand
	db     *d1client.Client
	clk    *clock
	cfg    idem.Config
	l      *idem.Ledger
	a      *idem.Admin
	keys   []string
	owners []owner

	swept, stored, expired, reused int
}

// step takes one random step of the model; it reports false when the
// step found no owner to act, which takes no time.
func (m *genModel) step(t *testing.T) bool {
	switch m.rng.IntN(10) {
	case 0: // a long stall
		m.clk.Advance(time.Duration(m.rng.Int64N(int64(3 * time.Minute))))
	case 1, 2: // time passes
		m.clk.Advance(time.Duration(m.rng.Int64N(int64(20 * time.Second))))
	case 3, 4: // a request: a fresh claim, a takeover, or none
		key := m.keys[m.rng.IntN(len(m.keys))]
		fp := fmt.Sprint("fp", m.rng.IntN(2))
		d := begin(t, m.l, "p", key, fp)
		if d.Outcome == idem.Execute {
			k, _ := m.row(t, key)
			m.owners = append(m.owners, owner{d.Reservation, k.CreatedAt.UnixMilli()})
		}
	case 5: // an owner completes (and the completion may carry a sweep)
		return m.complete(t)
	case 6: // an owner renews, or releases its reservation
		return m.renewOrRelease(t)
	case 7, 8: // an operator releases a key at its current generation
		key := m.keys[m.rng.IntN(len(m.keys))]
		if k, ok := m.row(t, key); ok {
			if _, err := m.a.Release(bg, "p", key, k.Generation, idem.ReleaseOptions{Force: m.rng.IntN(2) == 0}); err != nil {
				t.Fatal(err)
			}
		}
	case 9: // an operator sweeps
		n, err := m.a.Sweep(bg)
		if err != nil {
			t.Fatal(err)
		}
		m.swept += int(n)
	}
	return true
}

// complete has an owner complete, through this instance or a new one
// (whose first completion carries a sweep), and checks that a stored
// completion reached the owner's row. It reports false when there is no
// owner yet.
func (m *genModel) complete(t *testing.T) bool {
	o, ok := m.pick()
	if !ok {
		return false
	}
	if k, ok := m.row(t, o.r.Key); ok && k.Generation == o.r.Generation && k.CreatedAt.UnixMilli() != o.created {
		m.reused++ // the dangerous case: only the expiry keeps this write away
	}
	// Half of the completions come from a new instance, whose first
	// completion carries a sweep.
	by := m.l
	if m.rng.IntN(2) == 0 {
		by = newLedger(t, m.db, m.cfg)
	}
	c, err := by.Complete(bg, o.r, idem.Response{Status: 201, Body: []byte("x")})
	switch {
	case errors.Is(err, idem.ErrReservationExpired):
		m.expired++
	case err != nil:
		t.Fatal(err)
	case c.Stored:
		m.stored++
		m.check(t, o, "complete")
	}
	return true
}

// renewOrRelease has an owner renew, or release its reservation, and
// checks that a renewal or release that succeeded reached the owner's
// row. It reports false when there is no owner yet.
func (m *genModel) renewOrRelease(t *testing.T) bool {
	o, ok := m.pick()
	if !ok {
		return false
	}
	var err error
	what := "renew"
	if m.rng.IntN(2) == 0 {
		ok, err = m.l.Renew(bg, o.r)
	} else {
		what = "release"
		ok, err = m.l.Release(bg, o.r)
	}
	if err != nil && !errors.Is(err, idem.ErrReservationExpired) {
		t.Fatal(err)
	}
	if ok {
		m.check(t, o, what)
	}
	return true
}

// row returns key's row, and whether there is one.
func (m *genModel) row(t *testing.T, key string) (idem.KeyRecord, bool) {
	t.Helper()
	k, err := m.a.Get(bg, "p", key)
	if errors.Is(err, idem.ErrKeyNotFound) {
		return k, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return k, true
}

// check verifies that a write o was told succeeded reached o's row.
func (m *genModel) check(t *testing.T, o owner, what string) {
	t.Helper()
	k, ok := m.row(t, o.r.Key)
	if !ok || k.CreatedAt.UnixMilli() != o.created {
		t.Fatalf("step %s: owner of %s generation %d (row created %d) wrote to a row created %d: a generation was reused",
			what, o.r.Key, o.r.Generation, o.created, k.CreatedAt.UnixMilli())
	}
}

// pick chooses an owner, the recent ones more often.
func (m *genModel) pick() (owner, bool) {
	if len(m.owners) == 0 {
		return owner{}, false
	}
	if n := len(m.owners); m.rng.IntN(3) > 0 {
		return m.owners[max(0, n-1-m.rng.IntN(4))], true
	}
	return m.owners[m.rng.IntN(len(m.owners))], true
}

// The generation model catches the bug it exists for: without the expiry
// (an owner that writes whenever it wakes up), a write reaches a row
// claimed afresh at the owner's generation. The model's owners write
// through the spec's completion statement directly to show it.
func TestGenerationModelDetectsReuse(t *testing.T) {
	db := d1test.Local(t).NewClientSchema(t)
	clk := newClock()
	cfg := idem.Config{Clock: clk.Now, Heartbeat: -1, TTL: 30 * time.Second, MaxLease: 30 * time.Second}
	cfg.Retention = cfg.MaxLease + cfg.TTL + idem.RetentionMargin
	l := newLedger(t, db, cfg)
	stale := begin(t, l, "p", "k", "fp").Reservation
	clk.Advance(cfg.Retention + time.Second)
	if n, err := l.Admin().Sweep(bg); err != nil || n != 1 {
		t.Fatal(n, err)
	}
	fresh := begin(t, l, "p", "k", "fp2").Reservation
	if fresh.Generation != stale.Generation {
		t.Fatalf("fresh claim at %d", fresh.Generation)
	}
	// What the stale owner's completion would do if it were sent.
	res, err := db.Exec(bg, []d1client.Statement{{
		SQL:    `UPDATE idempotency_keys SET status = 'completed', response_status = 201 WHERE principal = ? AND key = ? AND generation = ? AND status = 'pending' RETURNING key`,
		Params: []any{"p", "k", stale.Generation}}})
	if err != nil || len(res[0].Rows) != 1 {
		t.Fatalf("the fence alone does not stop it: %v %v", res, err)
	}
	// The ledger never sends it.
	if _, err := l.Complete(bg, stale, idem.Response{Status: http.StatusCreated}); !errors.Is(err, idem.ErrReservationExpired) {
		t.Fatalf("Complete: %v", err)
	}
}
