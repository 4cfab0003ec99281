package faults

import (
	"strings"
	"testing"
	"time"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/idem"
)

func skewed(d time.Duration) func() time.Time { return func() time.Time { return time.Now().Add(d) } }

func mustLedger(t testing.TB, db *d1client.Client, cfg idem.Config) *idem.Ledger {
	t.Helper()
	l, err := idem.New(db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func mustBegin(t testing.TB, l *idem.Ledger, principal, key string) idem.Decision {
	t.Helper()
	d, err := l.Begin(bg, principal, key, "fp")
	if err != nil {
		t.Fatalf("Begin(%s): %v", key, err)
	}
	return d
}

// The hazard the D1 clock removes: two instances whose local clocks are
// skewed (+20 s and -20 s, injected through Config.Clock, the spec's
// Date.now()) disagree about a reservation's age by 40 s. The fast one takes
// a live, just-made reservation over at once (with the spec's 30 s TTL),
// fencing out its healthy owner; the slow one cannot take over a dead
// reservation until 40 s after the TTL.
func TestSkewedLocalClocksHazard(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	fast := mustLedger(t, w.client(), idem.Config{Clock: skewed(20 * time.Second), Heartbeat: -1})
	slow := mustLedger(t, w.client(), idem.Config{Clock: skewed(-20 * time.Second), Heartbeat: -1})
	exact := mustLedger(t, w.client(), idem.Config{Clock: time.Now, Heartbeat: -1})

	claimed := time.Now()
	owner := mustBegin(t, slow, "acct", "early")
	if owner.Outcome != idem.Execute {
		t.Fatalf("claim: %+v", owner)
	}
	if d := mustBegin(t, exact, "acct", "early"); d.Outcome != idem.InProgress {
		t.Fatalf("an instance with the right clock: %+v, want in progress", d)
	}
	d := mustBegin(t, fast, "acct", "early")
	if d.Outcome != idem.Execute || !d.Reservation.Takeover || d.Reservation.Generation != 2 {
		t.Fatalf("fast clock on a live reservation: %+v, want an (early) takeover", d)
	}
	t.Logf("hazard: the fast instance took over a live reservation %v old (TTL %v)",
		time.Since(claimed).Round(time.Millisecond), idem.DefaultTTL)
	c, err := slow.Complete(bg, owner.Reservation, idem.Response{Status: 201, Body: []byte(`{"exec":"owner"}`)})
	if err != nil || c.Stored {
		t.Fatalf("the healthy owner's completion: Stored=%v err=%v, want fenced out", c.Stored, err)
	}

	// The other direction, with a 1 s TTL: the fast instance claims and
	// dies; 1.3 s later (past the TTL) the slow instance still sees it in
	// progress, and would for 40 s more.
	shortFast := mustLedger(t, w.client(), idem.Config{TTL: time.Second, Clock: skewed(20 * time.Second), Heartbeat: -1})
	shortSlow := mustLedger(t, w.client(), idem.Config{TTL: time.Second, Clock: skewed(-20 * time.Second), Heartbeat: -1})
	if d := mustBegin(t, shortFast, "acct", "late"); d.Outcome != idem.Execute {
		t.Fatal(d)
	}
	time.Sleep(1300 * time.Millisecond)
	if d := mustBegin(t, shortSlow, "acct", "late"); d.Outcome != idem.InProgress {
		t.Fatalf("slow clock on a dead reservation: %+v", d)
	}
}

// With D1's clock (Config.Clock nil, the default) every timestamp is
// computed inside the statement, so the instances' local clocks play no
// part: the claim binds no time, and the takeover of a pending row happens
// when, and only when, D1's clock says the row is older than the TTL. The
// row's updated_at is set relative to D1's unixepoch by SQL; two default
// instances poll it, each poll bracketed by reads of the row's age on D1's
// clock: a poll that starts with the row older than the TTL must take it
// over, and one that ends with the row no older than the TTL must not. An
// instance with a skewed injected clock sharing the table, by contrast,
// takes over at once.
func TestD1ClockDecidesTakeover(t *testing.T) {
	t.Parallel()
	const ttl = 3 * time.Second
	w := newWorld(t)
	a := mustLedger(t, w.client(), idem.Config{TTL: ttl, Heartbeat: -1})
	b := mustLedger(t, w.client(), idem.Config{TTL: ttl, Heartbeat: -1})

	claimReadsD1Clock(t, w, a, "d1clock")

	// Age the row to 2 s short of the TTL, by D1's clock.
	const margin = 2000
	w.mustExec(d1client.Statement{SQL: adminMark + `UPDATE idempotency_keys SET updated_at = CAST(unixepoch('subsec') * 1000 AS INTEGER) - ? WHERE key = ?`,
		Params: []any{ttl.Milliseconds() - margin, "d1clock"}})
	aged, _ := w.row("acct", "d1clock")
	age := func() int64 { return w.d1Now() - aged.UpdatedAt }
	var inProgress, provenFresh int
	var winner string
	deadline := time.Now().Add(30 * time.Second)
	for winner == "" {
		if time.Now().After(deadline) {
			t.Fatal("no takeover in 30 s")
		}
		for name, l := range map[string]*idem.Ledger{"a": a, "b": b} {
			before := age()
			d := mustBegin(t, l, "acct", "d1clock")
			after := age()
			switch d.Outcome {
			case idem.InProgress:
				inProgress++
				if before > ttl.Milliseconds() {
					t.Errorf("%s: in progress although the row was already %d ms old by D1's clock (TTL %v)", name, before, ttl)
				}
				if after <= ttl.Milliseconds() {
					provenFresh++
				}
			case idem.Execute:
				winner = name
				if after <= ttl.Milliseconds() {
					t.Errorf("%s: took over a row at most %d ms old by D1's clock, within the TTL %v", name, after, ttl)
				}
			default:
				t.Fatalf("%s: %+v", name, d)
			}
			if winner != "" {
				break
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("%d in-progress answers (%d of them proven inside the TTL by D1's clock), then instance %s took over (TTL %v)", inProgress, provenFresh, winner, ttl)
	if provenFresh == 0 {
		t.Errorf("no poll ended inside the TTL: nothing showed that a fresh row is left alone")
	}
	var takeoverAt int64
	for _, e := range w.events() {
		if e.Kind == "takeover" {
			takeoverAt = e.At
		}
	}
	if takeoverAt == 0 {
		t.Fatal("no takeover audited")
	}
	if age := takeoverAt - aged.UpdatedAt; age <= ttl.Milliseconds() {
		t.Errorf("taken over when the row was %d ms old by D1's clock, within the TTL %v", age, ttl)
	}

	skewedInstanceTakesOverFreshRow(t, w, a, b, ttl)
}

// claimReadsD1Clock claims key with l, and checks that the claim's SQL
// reads D1's clock and binds no time of its own.
func claimReadsD1Clock(t *testing.T, w *world, l *idem.Ledger, key string) {
	t.Helper()
	var claimSQL []string
	w.setPolicy(func(req d1local.Request, c calls) d1local.Fault {
		if c.claim {
			for _, s := range req.Statements {
				if strings.HasPrefix(s, "INSERT INTO idempotency_keys") {
					claimSQL = append(claimSQL, s)
				}
			}
		}
		return d1local.Fault{}
	})
	if d := mustBegin(t, l, "acct", key); d.Outcome != idem.Execute {
		t.Fatal(d)
	}
	w.setPolicy(nil)
	if len(claimSQL) == 0 || !strings.Contains(claimSQL[0], "unixepoch('subsec')") || strings.Contains(claimSQL[0], "?5") {
		t.Fatalf("the default claim does not read D1's clock:\n%s", claimSQL)
	}
}

// skewedInstanceTakesOverFreshRow checks a fresh row, made with D1's
// clock: skew has no say for the default instances a and b, but a +20 s
// injected clock sharing the table takes over.
func skewedInstanceTakesOverFreshRow(t *testing.T, w *world, a, b *idem.Ledger, ttl time.Duration) {
	t.Helper()
	if d := mustBegin(t, a, "acct", "mixed"); d.Outcome != idem.Execute {
		t.Fatal(d)
	}
	if d := mustBegin(t, b, "acct", "mixed"); d.Outcome != idem.InProgress {
		t.Fatalf("D1-clock instance on a fresh row: %+v", d)
	}
	fast := mustLedger(t, w.client(), idem.Config{TTL: ttl, Clock: skewed(20 * time.Second), Heartbeat: -1})
	if d := mustBegin(t, fast, "acct", "mixed"); d.Outcome != idem.Execute || d.Reservation.Generation != 2 {
		t.Fatalf("skewed instance sharing the table: %+v, want its early takeover", d)
	}
}
