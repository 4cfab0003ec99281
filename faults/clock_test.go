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
// instances poll it; neither takes it over before the TTL by D1's clock,
// and one does within a few polls after. An instance with a skewed injected
// clock sharing the table, by contrast, takes over at once.
func TestD1ClockDecidesTakeover(t *testing.T) {
	t.Parallel()
	const ttl = 2 * time.Second
	w := newWorld(t)
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
	a := mustLedger(t, w.client(), idem.Config{TTL: ttl, Heartbeat: -1})
	b := mustLedger(t, w.client(), idem.Config{TTL: ttl, Heartbeat: -1})

	if d := mustBegin(t, a, "acct", "d1clock"); d.Outcome != idem.Execute {
		t.Fatal(d)
	}
	w.setPolicy(nil)
	if len(claimSQL) == 0 || !strings.Contains(claimSQL[0], "unixepoch('subsec')") || strings.Contains(claimSQL[0], "?5") {
		t.Fatalf("the default claim does not read D1's clock:\n%s", claimSQL)
	}
	// Age the row to 400 ms short of the TTL, by D1's clock.
	const margin = 400
	w.mustExec(d1client.Statement{SQL: adminMark + `UPDATE idempotency_keys SET updated_at = CAST(unixepoch('subsec') * 1000 AS INTEGER) - ? WHERE key = ?`,
		Params: []any{ttl.Milliseconds() - margin, "d1clock"}})
	aged, _ := w.row("acct", "d1clock")
	var inProgress int
	var winner string
	var d1Age int64
	deadline := time.Now().Add(10 * time.Second)
	for winner == "" {
		if time.Now().After(deadline) {
			t.Fatal("no takeover in 10 s")
		}
		for name, l := range map[string]*idem.Ledger{"a": a, "b": b} {
			r, _ := w.row("acct", "d1clock")
			before := w.d1Now() - r.UpdatedAt
			d := mustBegin(t, l, "acct", "d1clock")
			switch d.Outcome {
			case idem.InProgress:
				inProgress++
			case idem.Execute:
				winner, d1Age = name, before
			default:
				t.Fatalf("%s: %+v", name, d)
			}
			if winner != "" {
				break
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	var takeoverAt int64
	for _, e := range w.events() {
		if e.Kind == "takeover" {
			takeoverAt = e.At
		}
	}
	t.Logf("%d in-progress answers, then instance %s took over with the row %d+ ms old by D1's clock (TTL %v)", inProgress, winner, d1Age, ttl)
	if inProgress < 4 {
		t.Errorf("only %d in-progress answers before the takeover", inProgress)
	}
	// Ages by D1's clock: at the takeover, the pending row was at least
	// the TTL old; it had been set to TTL-400 ms, so the takeover came no
	// sooner than 400 ms after that, and not much later.
	if d1Age > ttl.Milliseconds()+1000 {
		t.Errorf("takeover late: the row was %d ms old", d1Age)
	}
	if takeoverAt == 0 {
		t.Fatal("no takeover audited")
	}
	if age := takeoverAt - aged.UpdatedAt; age <= ttl.Milliseconds() {
		t.Errorf("taken over when the row was %d ms old by D1's clock, within the TTL %v", age, ttl)
	}

	// A fresh row, made with D1's clock: skew has no say for default
	// instances, but a +20 s injected clock sharing the table takes over.
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
