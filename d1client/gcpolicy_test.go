package d1client

import (
	"testing"
	"time"
)

// The policy of group commit, rule by rule, on views of the batcher: no
// goroutine, no clock.

var t0 = time.Unix(1_700_000_000, 0)

func ms(n float64) time.Duration { return time.Duration(n * float64(time.Millisecond)) }

// testPolicy is the default policy with calls of 512 statements and 512
// KiB at most, 4 in flight.
func testPolicy() groupPolicy {
	cfg, _ := CoalesceConfig{MaxStatements: 512, MaxBytes: 512 << 10}.withDefaults()
	return newGroupPolicy(cfg)
}

func TestPolicyCapacity(t *testing.T) {
	p := testPolicy()
	for _, c := range []struct {
		name string
		v    groupView
		want int
	}{
		{"no cost known", groupView{plentiful: true}, 512},
		{"calls scarce: each carries all it can", groupView{base: ms(40), per: ms(0.1)}, 512},
		// 2 ms of work at 0.1 ms a statement; an eighth of 40 ms is 5 ms.
		{"calls plentiful: 2 ms of the database's time", groupView{plentiful: true, base: ms(40), per: ms(0.1)}, 20},
		// An eighth of a 8 ms call is 1 ms.
		{"calls plentiful, short round trip: an eighth of it", groupView{plentiful: true, base: ms(8), per: ms(0.1)}, 10},
		{"at least one", groupView{plentiful: true, base: ms(40), per: ms(10)}, 1},
		{"every slot in flight: all it can", groupView{plentiful: true, runners: 4, base: ms(40), per: ms(0.1)}, 512},
	} {
		if got := p.capacity(c.v); got != c.want {
			t.Errorf("%s: capacity %d, want %d", c.name, got, c.want)
		}
	}
}

func TestPolicySpawn(t *testing.T) {
	p := testPolicy()
	inFlight := func(started ...time.Duration) []flight {
		var fs []flight
		for _, s := range started {
			fs = append(fs, flight{start: t0.Add(-s)})
		}
		return fs
	}
	for _, c := range []struct {
		name          string
		v             groupView
		start, gather bool
	}{
		{"idle: at once, without gathering, whatever the budget (it waits for a call)", groupView{now: t0, groups: 1, stmts: 2}, true, false},
		{"every slot taken", groupView{now: t0, groups: 9, stmts: 9, runners: 4, spare: true, plentiful: true}, false, false},
		{"no call of the budget now", groupView{now: t0, groups: 9, stmts: 9999, runners: 1}, false, false},
		{"more than the runners carry", groupView{now: t0, groups: 3, stmts: 600, runners: 1, departing: 1, spare: true}, true, false},
		{"a runner about to depart carries it", groupView{now: t0, groups: 3, stmts: 6, runners: 2, departing: 1, spare: true, plentiful: true, rtt: ms(20)}, false, false},
		{"calls scarce: it waits for the call in flight", groupView{now: t0, groups: 3, stmts: 6, runners: 1, spare: true, rtt: ms(20), flights: inFlight(0)}, false, false},
		// 3 callers x 20 ms > 20 ms, each waiting more than 5 ms.
		{"plentiful, waiting costs more than a round trip", groupView{now: t0, groups: 3, stmts: 6, runners: 1, spare: true, plentiful: true, rtt: ms(20), flights: inFlight(0)}, true, true},
		// 1 caller x 20 ms is a round trip: not more.
		{"plentiful, one caller waits a round trip", groupView{now: t0, groups: 1, stmts: 2, runners: 1, spare: true, plentiful: true, rtt: ms(20), flights: inFlight(0)}, false, true},
		// The call in flight is back in 4 ms: less than the gather time.
		{"plentiful, the call in flight is nearly back", groupView{now: t0, groups: 9, stmts: 18, runners: 1, spare: true, plentiful: true, rtt: ms(20), flights: inFlight(ms(16))}, false, true},
		{"plentiful, no round trip known: two callers", groupView{now: t0, groups: 2, stmts: 4, runners: 1, spare: true, plentiful: true}, true, true},
		{"plentiful, no round trip known: one caller", groupView{now: t0, groups: 1, stmts: 2, runners: 1, spare: true, plentiful: true}, false, true},
	} {
		start, gather := p.spawn(c.v)
		if start != c.start || (start && gather != c.gather) {
			t.Errorf("%s: start %v gather %v, want %v %v", c.name, start, gather, c.start, c.gather)
		}
	}
}

func TestPolicyLeftover(t *testing.T) {
	p := testPolicy()
	for _, c := range []struct {
		name          string
		v             groupView
		start, gather bool
	}{
		{"nothing left", groupView{runners: 1, spare: true}, false, false},
		{"left, scarce: a call now, all it can", groupView{stmts: 5, runners: 1, spare: true}, true, false},
		{"left, plentiful: a call that gathers", groupView{stmts: 5, runners: 1, spare: true, plentiful: true}, true, true},
		{"another runner departs next", groupView{stmts: 5, runners: 2, departing: 1, spare: true}, false, false},
		{"no slot", groupView{stmts: 5, runners: 4, spare: true}, false, false},
		{"no call of the budget", groupView{stmts: 5, runners: 1}, false, false},
	} {
		start, gather := p.leftover(c.v)
		if start != c.start || gather != c.gather {
			t.Errorf("%s: start %v gather %v, want %v %v", c.name, start, gather, c.start, c.gather)
		}
	}
}

func TestPolicyDepart(t *testing.T) {
	p := testPolicy()
	rtt := ms(20)
	back := func(w wait, n int) uint64 { return w.arrivals + uint64(n) }
	returned := p.afterReturn(groupView{now: t0, rtt: rtt}, 10, 3) // waits for 3 callers, until t0 + 20 ms
	if returned.until != t0.Add(rtt) || returned.answered != 3 || returned.gathering {
		t.Fatalf("afterReturn: %+v", returned)
	}
	gathering := p.gathering(groupView{now: t0, rtt: rtt}) // until t0 + 5 ms
	if gathering.until != t0.Add(ms(5)) || !gathering.gathering {
		t.Fatalf("gathering: %+v", gathering)
	}
	for _, c := range []struct {
		name    string
		v       groupView
		w       wait
		returns float64
		depart  bool
		wake    time.Time
	}{
		{"a fresh runner departs at once", groupView{now: t0, groups: 1, stmts: 1}, wait{}, 1, true, t0},
		{"all callers back", groupView{now: t0.Add(ms(1)), groups: 3, stmts: 6, arrivals: back(returned, 3), lastArrival: t0.Add(ms(1)), plentiful: true},
			returned, 1, true, t0.Add(ms(1))},
		{"one missing, the last came back now: gap", groupView{now: t0.Add(ms(1)), groups: 2, stmts: 4, arrivals: back(returned, 2), lastArrival: t0.Add(ms(1)), plentiful: true},
			returned, 1, false, t0.Add(ms(3))},
		{"one missing, none back for the gap", groupView{now: t0.Add(ms(3)), groups: 2, stmts: 4, arrivals: back(returned, 2), lastArrival: t0.Add(ms(1)), plentiful: true},
			returned, 1, true, t0.Add(ms(3))},
		{"none back, nobody queued: wait to the window", groupView{now: t0.Add(ms(5)), arrivals: back(returned, 0), plentiful: true},
			returned, 1, false, t0.Add(rtt)},
		// Scarce: 1 missing x 20 ms / 2 queued = 10 ms of waiting is
		// worth it, from the last arrival.
		{"scarce: the missing caller is worth more waiting", groupView{now: t0.Add(ms(3)), groups: 2, stmts: 4, arrivals: back(returned, 2), lastArrival: t0.Add(ms(1)), rtt: rtt},
			returned, 1, false, t0.Add(ms(11))},
		// ... less when few callers usually come back.
		{"scarce, callers rarely come back", groupView{now: t0.Add(ms(3)), groups: 2, stmts: 4, arrivals: back(returned, 2), lastArrival: t0.Add(ms(1)), rtt: rtt},
			returned, 0.1, true, t0.Add(ms(3))},
		{"the window has passed", groupView{now: t0.Add(rtt), groups: 2, stmts: 4, arrivals: back(returned, 2), lastArrival: t0.Add(ms(19)), rtt: rtt},
			returned, 1, true, t0.Add(rtt)},
		{"the call is full", groupView{now: t0.Add(ms(1)), groups: 2, stmts: 512, arrivals: back(returned, 1), lastArrival: t0.Add(ms(1)), plentiful: true},
			returned, 1, true, t0.Add(ms(1))},
		{"gathering, callers still arriving", groupView{now: t0.Add(ms(1)), groups: 2, stmts: 4, lastArrival: t0.Add(ms(1)), plentiful: true},
			gathering, 1, false, t0.Add(ms(3))},
		{"gathering, arrivals stopped", groupView{now: t0.Add(ms(3)), groups: 2, stmts: 4, lastArrival: t0.Add(ms(1)), plentiful: true},
			gathering, 1, true, t0.Add(ms(3))},
		{"gathering, at most its time", groupView{now: t0.Add(ms(4)), groups: 2, stmts: 4, lastArrival: t0.Add(ms(4)), plentiful: true},
			gathering, 1, false, t0.Add(ms(5))},
	} {
		depart, wake := p.depart(c.v, c.w, c.returns)
		if depart != c.depart || (!depart && !wake.Equal(c.wake)) {
			t.Errorf("%s: depart %v at %v, want %v at %v", c.name, depart, wake.Sub(t0), c.depart, c.wake.Sub(t0))
		}
	}
	never := testPolicy()
	never.window = -1
	if w := never.gathering(groupView{now: t0, rtt: rtt}); w.until != t0 {
		t.Errorf("a negative window gathers until %v", w.until.Sub(t0))
	}
	if w := never.afterReturn(groupView{now: t0, rtt: rtt}, 0, 3); w.until != t0 {
		t.Errorf("a negative window waits for callers until %v", w.until.Sub(t0))
	}
	fixed := testPolicy()
	fixed.window = ms(7)
	if w := fixed.afterReturn(groupView{now: t0, rtt: rtt}, 0, 3); w.until != t0.Add(ms(7)) {
		t.Errorf("a 7 ms window waits until %v", w.until.Sub(t0))
	}
}

func TestPolicyHandoff(t *testing.T) {
	p := testPolicy()
	rtt := ms(20)
	now := t0.Add(rtt)
	f := &flight{start: t0, first: t0, stmts: 6}
	for _, c := range []struct {
		name     string
		v        groupView
		answered int
		want     int
	}{
		{"left together, scarce", groupView{now: now, rtt: rtt, flights: []flight{{start: t0.Add(ms(3)), stmts: 6}}}, 3, 0},
		{"left more than the gather time apart", groupView{now: now, rtt: rtt, flights: []flight{{start: t0.Add(ms(6)), stmts: 6}}}, 3, -1},
		{"the next of two", groupView{now: now, rtt: rtt, flights: []flight{{start: t0.Add(ms(9))}, {start: t0.Add(ms(1))}}}, 3, 1},
		{"too many statements together", groupView{now: now, rtt: rtt, flights: []flight{{start: t0.Add(ms(1)), stmts: 510}}}, 3, -1},
		// Plentiful: 3 callers x 3 ms to its return is 9 ms, under a round
		// trip; 9 callers x 3 ms is 27 ms, over it.
		{"plentiful, a short wait for it", groupView{now: now, rtt: rtt, plentiful: true, flights: []flight{{start: t0.Add(ms(3)), stmts: 6}}}, 3, 0},
		{"plentiful, too many callers would wait for it", groupView{now: now, rtt: rtt, plentiful: true, flights: []flight{{start: t0.Add(ms(3)), stmts: 6}}}, 9, -1},
		{"no round trip known", groupView{now: now, flights: []flight{{start: t0}}}, 3, -1},
	} {
		if got := p.handoff(c.v, f, c.answered); got != c.want {
			t.Errorf("%s: handoff to %d, want %d", c.name, got, c.want)
		}
	}
	never := testPolicy()
	never.window = -1
	if got := never.handoff(groupView{now: now, rtt: rtt, flights: []flight{{start: t0}}}, f, 1); got != -1 {
		t.Errorf("a negative window hands over to %d", got)
	}
}

// The cost model fits base + per x statements to the calls seen, once
// their sizes differ.
func TestCostModel(t *testing.T) {
	var m costModel
	if base, per := m.estimate(); base != 0 || per != 0 {
		t.Fatalf("no calls: %v %v", base, per)
	}
	for range 4 {
		m.add(1, ms(20.1))
	}
	if base, per := m.estimate(); base != 0 || per != 0 {
		t.Fatalf("calls of one size: %v %v", base, per)
	}
	for _, n := range []int{10, 50, 100, 200, 10, 100} {
		m.add(n, ms(20)+time.Duration(n)*ms(0.1))
	}
	if base, per := m.estimate(); (base-ms(20)).Abs() > ms(0.01) || (per-ms(0.1)).Abs() > time.Microsecond {
		t.Errorf("estimate %v + %v a statement, want 20ms + 100µs", base, per)
	}
}

// A caller without priority is shed, at once, when the calls needed to
// carry the work ahead of it, leaving at the budget's pace or as fast as
// D1 runs them, would keep it waiting more than MaxQueueWait (500 ms) past
// the next call, or past its deadline; it may come back once the excess
// has left.
func TestPolicyShed(t *testing.T) {
	p := testPolicy()
	pace := ms(250) // the default budget's
	for _, c := range []struct {
		name  string
		v     groupView
		left  time.Duration
		shed  bool
		retry time.Duration
	}{
		{"an idle queue", groupView{pace: pace}, 0, false, 0},
		{"the next call carries it, whatever the pace", groupView{stmts: 400, pace: 6 * time.Minute}, 0, false, 0},
		{"one more call: 250 ms", groupView{stmts: 800, pace: pace}, 0, false, 0},
		{"two more calls: 500 ms, no more than it may wait", groupView{stmts: 1500, pace: pace}, 0, false, 0},
		{"three more calls: 750 ms", groupView{stmts: 1600, pace: pace}, 0, true, ms(500)},
		{"the completions of the debts unpaid go first", groupView{stmts: 1000, owed: 600, pace: pace}, 0, true, ms(500)},
		{"and those of the callers queued to admit debts", groupView{stmts: 1000, owing: 600, pace: pace}, 0, true, ms(500)},
		// 4 calls in flight of 40 ms + 512 x 0.1 ms: one leaves every 22.8 ms.
		{"no pace: as fast as D1 runs the calls, 21 more", groupView{stmts: 512 * 21, base: ms(40), per: ms(0.1)}, 0, false, 0},
		{"no pace: as fast as D1 runs the calls, 23 more", groupView{stmts: 512 * 23, base: ms(40), per: ms(0.1)}, 0, true, ms(47.2)},
		{"no pace, no cost known: never", groupView{stmts: 1 << 20}, 0, false, 0},
		{"its deadline comes first", groupView{stmts: 800, pace: pace, rtt: ms(20)}, ms(260), true, ms(500)},
		{"its deadline allows", groupView{stmts: 800, pace: pace, rtt: ms(20)}, ms(280), false, 0},
	} {
		shed, retry := p.shed(c.v, 2, c.left)
		if shed != c.shed || shed && retry != c.retry {
			t.Errorf("%s: shed %v after %v, want %v after %v", c.name, shed, retry, c.shed, c.retry)
		}
	}
	never := p
	never.maxQueueWait = -1
	if shed, _ := never.shed(groupView{stmts: 1 << 20, pace: pace}, 2, 0); shed {
		t.Error("MaxQueueWait negative: shed")
	}
}
