package idem

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"testing"

	"github.com/d1idem/d1idem/internal/d1test"
)

// Two operators growing the ring at once: the coordinator decides. The
// loser, whose status was read before the winner wrote, is refused there
// and writes nowhere else.
func TestRecordRacingOperators(t *testing.T) {
	ctx := context.Background()
	b := d1test.Local(t)
	var homes []Home
	for range 4 {
		homes = append(homes, Home{DB: b.NewClientSchema(t)})
	}
	ledger := func(hs ...Home) *Ledger {
		l, err := NewSharded(hs, Config{Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	all := ledger(homes...)
	ids := all.shards.ids
	byID := func(id string) Home { return Home{DB: all.shards.homes[id].db} }
	if _, err := ledger(byID(ids[0]), byID(ids[1])).Admin().InitRing(ctx); err != nil {
		t.Fatal(err)
	}
	a, b2 := all.Admin(), ledger(homes...).Admin()
	stale, err := b2.RingStatus(ctx) // read before the winner writes
	if err != nil {
		t.Fatal(err)
	}
	won, err := a.Grow(ctx, ids[2])
	if err != nil {
		t.Fatal(err)
	}
	lost := Ring{Version: 2, Phase: RingMoving, Homes: []string{ids[0], ids[1], ids[3]}, Previous: []string{ids[0], ids[1]}}
	err = b2.record(ctx, &stale, ids[0], lost)
	if !errors.Is(err, ErrRingConflict) {
		t.Fatalf("the losing operator: %v, want ErrRingConflict", err)
	}
	st, err := a.RingStatus(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range st.Homes {
		want := &won.Ring
		if h.ID == ids[3] {
			want = nil // the loser's new home was never written
		}
		if (h.Ring == nil) != (want == nil) || (h.Ring != nil && !h.Ring.equal(*want)) {
			t.Errorf("home %s holds %v, want %v", h.ID, h.Ring, want)
		}
	}
	// Growing again while Moving is refused, as is growing by a home
	// that holds keys or one this ledger does not have.
	if _, err := a.Grow(ctx, ids[3]); err == nil {
		t.Error("Grow while Moving")
	}
	if _, err := a.Grow(ctx, "nope"); err == nil {
		t.Error("Grow by an unknown home")
	}
	if !slices.Equal(won.Ring.Previous, []string{ids[0], ids[1]}) {
		t.Errorf("previous %v", won.Ring.Previous)
	}
}
