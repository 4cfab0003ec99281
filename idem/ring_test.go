package idem

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
)

// The routing function is part of the recorded format: these values were
// computed by Node's crypto (SHA-256 of principal, 0x00, ID; the first 8
// bytes big-endian), independently of this package.
func TestRendezvousVectors(t *testing.T) {
	two, three := []string{"db-0", "db-1"}, []string{"db-0", "db-1", "db-2"}
	for _, v := range []struct {
		principal, score0, in3, in2 string
	}{
		{"acct_1", "e169b32dfc25194f", "db-0", "db-0"},
		{"acct_2", "2d2782e9b982ced0", "db-1", "db-1"},
		{"acct_3", "59720cceb285663", "db-1", "db-1"},
		{"user:42", "98910cb82db3582", "db-1", "db-1"},
		{"é", "a72825e8fb2700a", "db-1", "db-1"},
		{"a\x00b", "e88abc87ad6f9baa", "db-0", "db-0"},
		{"acct_5", "", "db-2", "db-0"},
		{"acct_6", "", "db-2", "db-0"},
		{"acct_7", "", "db-2", "db-1"},
	} {
		if v.score0 != "" {
			if got := fmt.Sprintf("%x", score(v.principal, "db-0")); got != v.score0 {
				t.Errorf("score(%q, db-0) = %s, want %s", v.principal, got, v.score0)
			}
		}
		if got := Rendezvous(v.principal, three); got != v.in3 {
			t.Errorf("Rendezvous(%q, 3 homes) = %s, want %s", v.principal, got, v.in3)
		}
		if got := Rendezvous(v.principal, two); got != v.in2 {
			t.Errorf("Rendezvous(%q, 2 homes) = %s, want %s", v.principal, got, v.in2)
		}
	}
	if got := Rendezvous("p", nil); got != "" {
		t.Errorf("Rendezvous over no IDs = %q", got)
	}
}

// Adding homes moves about the new homes' share of the principals, each to
// a new home, and the order of the IDs does not matter.
func TestRendezvousMovesOnlyToNewHomes(t *testing.T) {
	const n = 20000
	for _, c := range []struct{ from, to int }{{1, 2}, {2, 3}, {3, 5}, {4, 8}} {
		var from, to []string
		for i := range c.to {
			id := fmt.Sprintf("%08x-home-%d", i*2654435761, i)
			to = append(to, id)
			if i < c.from {
				from = append(from, id)
			}
		}
		rev := slices.Clone(to)
		slices.Reverse(rev)
		moved := 0
		per := map[string]int{}
		for i := range n {
			p := fmt.Sprintf("principal-%d", i)
			a, b := Rendezvous(p, from), Rendezvous(p, to)
			if b != Rendezvous(p, rev) {
				t.Fatalf("%s: the order of the IDs changed its home", p)
			}
			per[b]++
			if a != b {
				moved++
				if slices.Contains(from, b) {
					t.Fatalf("%s moved from %s to %s, an old home", p, a, b)
				}
			}
		}
		want := float64(n) * float64(c.to-c.from) / float64(c.to)
		if f := float64(moved); f < 0.9*want || f > 1.1*want {
			t.Errorf("%d -> %d homes moved %d of %d principals, want about %.0f", c.from, c.to, moved, n, want)
		}
		for id, k := range per {
			if share := float64(n) / float64(c.to); float64(k) < 0.9*share || float64(k) > 1.1*share {
				t.Errorf("%d homes: %s holds %d principals, want about %.0f", c.to, id, k, share)
			}
		}
	}
}

func TestRingEncoding(t *testing.T) {
	rings := []Ring{
		{Version: 1, Phase: RingStable, Homes: []string{"a"}},
		{Version: 2, Phase: RingMoving, Homes: []string{"a", "b", "c"}, Previous: []string{"a", "c"}},
		{Version: 2, Phase: RingStable, Homes: []string{"a", "b", "c"}},
	}
	for i, r := range rings {
		if want := int64([]int{2, 3, 4}[i]); r.Epoch() != want {
			t.Errorf("%s: epoch %d, want %d", r, r.Epoch(), want)
		}
		back, err := decodeRing(r.Epoch(), r.digest(), r.encode())
		if err != nil || !back.equal(r) {
			t.Errorf("%s: decoded %s, %v", r, back, err)
		}
	}
	if got := rings[1].encode(); got != `{"format":"d1idem-ring/1","version":2,"phase":"moving","homes":["a","b","c"],"previous":["a","c"]}` {
		t.Errorf("encoding %s", got)
	}
	for _, bad := range []struct {
		epoch     int64
		body, why string
	}{
		{2, `{"format":"d1idem-ring/2","version":1,"phase":"stable","homes":["a"]}`, "format"},
		{2, `{"format":"d1idem-ring/1","version":1,"phase":"stable","homes":["b","a"]}`, "sorted"},
		{2, `{"format":"d1idem-ring/1","version":1,"phase":"stable","homes":["a","a"]}`, "sorted"},
		{2, `{"format":"d1idem-ring/1","version":1,"phase":"stable","homes":[]}`, "no homes"},
		{1, `{"format":"d1idem-ring/1","version":1,"phase":"moving","homes":["a","b"],"previous":["a"]}`, "version 1"},
		{3, `{"format":"d1idem-ring/1","version":2,"phase":"moving","homes":["a","b"],"previous":["c"]}`, "not a home"},
		{3, `{"format":"d1idem-ring/1","version":2,"phase":"moving","homes":["a","b"],"previous":["a","b"]}`, "adds no home"},
		{4, `{"format":"d1idem-ring/1","version":2,"phase":"stable","homes":["a"],"previous":["a"]}`, "previous"},
		{3, `{"format":"d1idem-ring/1","version":2,"phase":"stable","homes":["a"]}`, "epoch"},
		{2, `{"format":"d1idem-ring/1","version":1,"phase":"paused","homes":["a"]}`, "phase"},
		{2, `{"format":"d1idem-ring/1","version":1,"phase":"stable","homes":["a\u0001"]}`, "control"},
		{2, `not json`, "invalid"},
	} {
		if _, err := decodeRing(bad.epoch, "", bad.body); err == nil || !strings.Contains(err.Error(), bad.why) {
			t.Errorf("decodeRing(%d, %s) = %v, want an error about %q", bad.epoch, bad.body, err, bad.why)
		}
	}
}

// The ring row's fingerprint is the digest of its body: two rings of one
// epoch differ in it, and a row whose fingerprint is not its body's digest
// is unreadable.
func TestRingDigest(t *testing.T) {
	a := Ring{Version: 1, Phase: RingStable, Homes: []string{"a", "b"}}
	b := Ring{Version: 1, Phase: RingStable, Homes: []string{"b", "c"}}
	if a.Epoch() != b.Epoch() || a.digest() == b.digest() {
		t.Fatalf("two rings of one epoch share the digest %s", a.digest())
	}
	if d := a.digest(); len(d) != 64 || a.digest() != d {
		t.Fatalf("digest %q is not 64 hex digits, or not the same twice", d)
	}
	if _, err := decodeRing(a.Epoch(), b.digest(), a.encode()); err == nil || !strings.Contains(err.Error(), "fingerprint") {
		t.Errorf("a ring row under another ring's digest: %v", err)
	}
	m := Ring{Version: 2, Phase: RingMoving, Homes: []string{"a", "b", "c"}, Previous: []string{"a", "b"}}
	if p := m.predecessor(); !p.equal(a) {
		t.Errorf("predecessor of %s is %s, want %s", m, p, a)
	}
	if got := a.drops(b); !slices.Equal(got, []string{"a"}) {
		t.Errorf("%s drops %v of %s", b, got, a)
	}
	if got := a.drops(m); got != nil {
		t.Errorf("%s drops %v of %s", m, got, a)
	}
}

// The identity row names the home and the ring it joined; it reads back,
// and one under another ID or format is unreadable.
func TestHomeIdentityEncoding(t *testing.T) {
	r := Ring{Version: 1, Phase: RingStable, Homes: []string{"a", "b"}}
	body := encodeHome("a", r)
	joined, err := decodeHome("a", body)
	if err != nil || !joined.equal(r) {
		t.Fatalf("decodeHome = %+v, %v", joined, err)
	}
	if _, err := decodeHome("b", body); err == nil {
		t.Error("an identity row whose fingerprint is another ID was read")
	}
	if _, err := decodeHome("a", strings.Replace(body, homeFormat, "d1idem-home/9", 1)); err == nil {
		t.Error("an identity row of another format was read")
	}
}

// Rings recorded by different databases must agree: one ring per epoch,
// and a newer ring holds every home of an older one.
func TestConsistentRings(t *testing.T) {
	v1 := Ring{Version: 1, Phase: RingStable, Homes: []string{"a", "b"}}
	other := Ring{Version: 1, Phase: RingStable, Homes: []string{"b", "c"}}
	v2 := Ring{Version: 2, Phase: RingMoving, Homes: []string{"a", "b", "c"}, Previous: []string{"a", "b"}}
	dropper := Ring{Version: 3, Phase: RingStable, Homes: []string{"b", "c"}}
	for _, c := range []struct {
		rings map[string]Ring
		want  string
	}{
		{map[string]Ring{"a": v1, "b": v1}, ""},
		{map[string]Ring{"a": v1, "b": v2, "c": v2}, ""},
		{map[string]Ring{"a": v1, "b": other}, "both at epoch 2"},
		{map[string]Ring{"a": v2, "b": dropper}, "drops [a]"},
	} {
		var homes []HomeRing
		for _, id := range slices.Sorted(maps.Keys(c.rings)) {
			r := c.rings[id]
			homes = append(homes, HomeRing{ID: id, Ring: &r})
		}
		err := consistent(homes)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%v: %v", c.rings, err)
		case c.want != "" && (!errors.Is(err, ErrRingConflict) || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%v: %v, want %q", c.rings, err, c.want)
		}
	}
}

func TestRingRoutes(t *testing.T) {
	r := Ring{Version: 2, Phase: RingMoving, Homes: []string{"db-0", "db-1", "db-2"}, Previous: []string{"db-0", "db-1"}}
	for p, want := range map[string][2]string{
		"acct_1": {"db-0", ""},     // unmoved
		"acct_5": {"db-2", "db-0"}, // moved from db-0
		"acct_7": {"db-2", "db-1"}, // moved from db-1
	} {
		if got, old := r.Home(p), r.PreviousHome(p); got != want[0] || old != want[1] {
			t.Errorf("%s: home %s, previous %q; want %s, %q", p, got, old, want[0], want[1])
		}
	}
	r.Phase, r.Previous = RingStable, nil
	if old := r.PreviousHome("acct_5"); old != "" {
		t.Errorf("a stable ring gave a previous home %q", old)
	}
}
