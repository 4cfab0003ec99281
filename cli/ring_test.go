package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/internal/d1test"
)

// transcript runs command lines on the first n databases and records each
// with its output, as a golden file shows them.
type transcript struct {
	t testing.TB
	e *shardEnv
	b strings.Builder
	// mask, if set, replaces what differs from run to run in an output.
	mask func(string) string
}

func (tr *transcript) run(n int, args ...string) result {
	tr.t.Helper()
	r := tr.e.run(tr.t, n, args...)
	out := r.stdout + r.stderr
	if tr.mask != nil {
		out = tr.mask(out)
	}
	fmt.Fprintf(&tr.b, "$ d1idem %s  # on %d databases\n%s", strings.Join(args, " "), n, out)
	if r.code != 0 {
		fmt.Fprintf(&tr.b, "[exit %d]\n", r.code)
	}
	tr.b.WriteString("\n")
	return r
}

func (tr *transcript) note(format string, args ...any) {
	fmt.Fprintf(&tr.b, "# "+format+"\n\n", args...)
}

// TestRingGolden: what ring status, init, grow and advance print through a
// change from 2 databases to 3, with a clock the test moves.
func TestRingGolden(t *testing.T) {
	e := newShardEnv(t, d1test.Local(t), 3)
	tr := &transcript{t: t, e: e}
	e.must(t, 3, "schema", "apply")
	tr.run(2, "ring", "status")
	tr.run(2, "ring", "init")
	e.serve(t, e.ledger(t), "order-1", time.Second, principals(30)...)
	tr.note("30 principals served, one key each; the clock is 30s on")
	tr.run(3, "ring", "status")
	tr.run(3, "ring", "grow", "--add", "ledger-c")
	e.clk.Advance(time.Hour)
	tr.note("an hour later")
	tr.run(3, "ring", "status")
	tr.run(3, "ring", "advance")
	e.clk.Advance(47 * time.Hour)
	tr.note("47 hours later")
	tr.run(3, "ring", "advance")
	tr.run(3, "ring", "status")
	tr.run(3, "ring", "advance")
	golden(t, "ring", tr.b.String())
}

// TestRingRefusals: each refusal of the ring operations is one line that
// says what to do, and changes nothing.
func TestRingRefusals(t *testing.T) {
	e := newLocalShardEnv(t, 3)
	e.must(t, 3, "schema", "apply")
	expect := func(n int, code int, want string, args ...string) {
		t.Helper()
		r := e.run(t, n, args...)
		if r.code != code || !strings.Contains(r.stderr, want) || strings.Count(r.stderr, "\n") != 1 {
			t.Errorf("d1idem %v: want exit %d and %q; %s", args, code, want, r)
		}
	}
	expect(3, exitError, "ring grow: no ring is recorded in these databases: run 'd1idem ring init"+e.hint(3)+"' once, before the first request",
		"ring", "grow", "--add", "ledger-c")
	expect(3, exitError, "ring advance: no ring is recorded in these databases", "ring", "advance")
	e.must(t, 2, "ring", "init")
	expect(2, exitError, "ring init: the databases hold a ring this command did not expect (home ledger-a already holds v1 stable [ledger-a ledger-b]): another operator changed it first, or the databases disagree; see 'd1idem ring status",
		"ring", "init")
	expect(3, exitUsage, "ring grow: --add ledger-z is not one of the databases named (ledger-a, ledger-b, ledger-c): name it with --database or --database-id too", "ring", "grow", "--add", "ledger-z")
	expect(3, exitUsage, "ring grow: --add ledger-b is already in the ring (version 1: ledger-a, ledger-b)", "ring", "grow", "--add", "ledger-b")

	// The ring not recorded everywhere (ledger-b joined, but lacks it, as
	// after an init whose write failed there): grow says to advance first,
	// and advance records it.
	if _, err := e.client(t, "ledger-b").Query(context.Background(), "DELETE FROM idempotency_keys WHERE principal = '' AND key = 'd1idem:ring'"); err != nil {
		t.Fatal(err)
	}
	expect(3, exitError, "ring grow: the current ring is not recorded in every database yet: run 'd1idem ring advance"+e.hint(3)+"' to record it there, then grow again",
		"ring", "grow", "--add", "ledger-c")
	if r := e.must(t, 3, "ring", "advance"); !strings.HasPrefix(r.stdout, "Recorded version 1, stable, in ledger-b.\n") {
		t.Errorf("ring advance: %s", r)
	}
	if r := e.must(t, 3, "ring", "advance"); !strings.HasPrefix(r.stdout, "Nothing to do: version 1, stable, is recorded in every database of it.\n") {
		t.Errorf("ring advance again: %s", r)
	}

	// The new database unreachable: grow changes nothing and says why.
	heal := e.failing("ledger-c", false)
	if r := e.run(t, 3, "ring", "grow", "--add", "ledger-c"); r.code != exitError || !strings.Contains(r.stderr, "ring grow: home ledger-c: ") {
		t.Errorf("ring grow with ledger-c down: %s", r)
	}
	expect(3, exitError, "ring status: 1 database could not be read: ledger-c: D1 transient server error (HTTP 500", "ring", "status")
	heal()
	if r := e.must(t, 3, "ring", "status"); !strings.Contains(r.stdout, "ring  version 1, stable") {
		t.Errorf("after a refused grow, the ring is unchanged: %s", r)
	}
	e.must(t, 3, "ring", "grow", "--add", "ledger-c")
	expect(3, exitError, "ring grow: version 2 is still moving: the old route can be dropped at 2026-03-03T02:59:00.000Z (in 47h59m, with the 24h retention and 30s TTL given)",
		"ring", "grow", "--add", "ledger-c")
	expect(3, exitError, "ring advance: not yet: until 2026-03-03T02:59:00.000Z (in 47h59m, with the 24h retention and 30s TTL given)", "ring", "advance", "--retention", "24h")
	// With a longer retention the drop is later.
	expect(3, exitError, "ring advance: not yet: until 2026-03-07T02:59:00.000Z (in 6d, with the 3d retention and 30s TTL given) the moved principals' old homes may hold keys that must replay from there; run 'd1idem ring advance"+e.hint(3)+" --retention 72h' again then",
		"ring", "advance", "--retention", "72h")
	// A keys command that does not name every database of the ring.
	expect(2, exitError, "keys get: the ring names a database not given here (\"ledger-c\")", "keys", "get", "--principal", e.moved(t, 2), "--key", "k")
}

// TestRingLostGolden: what ring status, advance and grow say when a
// database of the ring lost its identity (emptied after it answered keys),
// and what keys get says for a principal it held; none of them records the
// ring there again.
func TestRingLostGolden(t *testing.T) {
	e := newShardEnv(t, d1test.Local(t), 3)
	tr := &transcript{t: t, e: e}
	e.must(t, 3, "schema", "apply")
	e.must(t, 2, "ring", "init")
	e.serve(t, e.ledger(t), "order-1", time.Second, principals(4)...)
	if _, err := e.client(t, "ledger-b").Query(context.Background(), "DELETE FROM idempotency_keys"); err != nil {
		t.Fatal(err)
	}
	tr.note("4 principals served; then ledger-b emptied (DELETE FROM idempotency_keys): its identity, ring and keys are gone")
	tr.run(2, "ring", "status")
	tr.run(2, "ring", "advance")
	tr.run(3, "ring", "grow", "--add", "ledger-c")
	var p string
	for _, q := range principals(4) {
		if p == "" && idem.Rendezvous(q, e.ids[:2]) == "ledger-b" {
			p = q
		}
	}
	tr.run(2, "keys", "get", "--principal", p, "--key", "order-1")
	tr.run(2, "ring", "status", "--json")
	golden(t, "ring_lost", tr.b.String())
	for _, r := range e.ids[1:] {
		if keys, err := e.client(t, r).Query(context.Background(), "SELECT key FROM idempotency_keys"); err != nil || len(keys.Rows) != 0 {
			t.Errorf("%s after the refusals: %v %v", r, keys, err)
		}
	}
}

// TestRingGrowPartial: a grow whose new ring reaches the coordinating
// database but not every other says which, and that advance finishes it.
func TestRingGrowPartial(t *testing.T) {
	e := newLocalShardEnv(t, 3)
	e.must(t, 3, "schema", "apply")
	e.must(t, 2, "ring", "init")
	heal := e.failing("ledger-b", true) // reads pass, the ring's write fails
	r := e.run(t, 3, "ring", "grow", "--add", "ledger-c")
	heal()
	if r.code != exitError || !strings.HasPrefix(r.stderr, "d1idem: ring grow: version 2 is recorded in 2 of its 3 databases (ledger-b: D1 transient server error") ||
		!strings.HasSuffix(r.stderr, "run 'd1idem ring advance"+e.hint(3)+"' to record it in the others; the ledger stays exactly-once meanwhile\n") ||
		!strings.Contains(r.stdout, "ledger-b  error: D1 transient server error") {
		t.Errorf("partial grow: %s", r)
	}
	if r := e.must(t, 3, "ring", "status"); !strings.Contains(r.stdout, "ledger-b  version 1, stable (behind version 2, moving: 'd1idem ring advance' records it)") {
		t.Errorf("ring status after a partial grow: %s", r)
	}
	// advance records it there, and says the drop is not due yet.
	if r := e.run(t, 3, "ring", "advance"); r.code != exitError || r.stdout != "Recorded version 2, moving, in ledger-b.\n" || !strings.Contains(r.stderr, "ring advance: not yet: until ") {
		t.Errorf("ring advance after a partial grow: %s", r)
	}
	if r := e.must(t, 3, "ring", "status"); strings.Contains(r.stdout, "behind") {
		t.Errorf("ring status after advance: %s", r)
	}
}

// TestRingFix: the ring errors of idem become one line with the command
// that fixes them.
func TestRingFix(t *testing.T) {
	app := &cli.App{Name: "d1idem"}
	for _, tc := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("idem: claim: %w", idem.ErrRingUnsettled), "keys get: the ring changed while the command ran (an operator is changing it): see 'd1idem ring status', then run it again"},
		{fmt.Errorf("idem: grow: %w (home a holds v1)", idem.ErrRingIncomplete), "keys get: the current ring is not recorded in every database yet: run 'd1idem ring advance' to record it there, then grow again"},
		{fmt.Errorf("idem: %w", idem.ErrNoRing), "keys get: no ring is recorded in these databases: run 'd1idem ring init' once, before the first request"},
		{fmt.Errorf("idem: %w: %q", idem.ErrUnknownHome, "db-9"), `keys get: the ring names a database not given here ("db-9"): name every database of the ring ('d1idem ring status' lists them)`},
		{fmt.Errorf("idem: grow: %w: home a already holds v2", idem.ErrRingConflict), "keys get: the databases hold a ring this command did not expect (home a already holds v2): another operator changed it first"},
		{fmt.Errorf("idem: advance ring: %w: home \"b\", a database of v1, holds no identity", idem.ErrHomeLost), `keys get: a database of the ring lost its identity: it was replaced or wiped: home "b", a database of v1, holds no identity; with wrangler: 'wrangler d1 time-travel restore DATABASE --timestamp=TIME', TIME before the loss`},
	} {
		parent := cli.NewContext(app, nil, nil)
		parent.Command = &cli.Command{Name: "keys"}
		c := cli.NewContext(app, nil, parent)
		c.Command = &cli.Command{Name: "get"}
		got := ringFix(c, tc.err)
		if !strings.HasPrefix(got.Error(), tc.want) || strings.Contains(got.Error(), "\n") {
			t.Errorf("ringFix(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
	if ringFix(nil, nil) != nil {
		t.Error("ringFix(nil) is not nil")
	}
}

// TestRingOfOne: ring commands on one database make a ring of one (an
// existing ledger, ready to grow) and grow it; given only some of a ring's
// databases, ring status lists the others as not given and exits 1 with
// one line.
func TestRingOfOne(t *testing.T) {
	e := newShardEnv(t, d1test.Local(t), 2)
	e.must(t, 2, "schema", "apply")
	if r := e.must(t, 1, "ring", "init"); !strings.HasPrefix(r.stdout, "Recorded version 1 of the ring, stable, over 1 database: ledger-a.\n") {
		t.Errorf("ring init on one database: %s", r)
	}
	if r := e.run(t, 1, "ring", "grow", "--add", "ledger-b"); r.code != exitUsage ||
		r.stderr != "d1idem: ring grow: --add ledger-b is not one of the databases named (ledger-a): name it with --database or --database-id too\n" {
		t.Errorf("ring grow naming only the ring: %s", r)
	}
	if r := e.must(t, 2, "ring", "grow", "--add", "ledger-b"); !strings.Contains(r.stdout, "ring    version 2, moving from 1 database (ledger-a) to 2 (ledger-a, ledger-b)\n") {
		t.Errorf("ring grow from one database: %s", r)
	}
	r := e.run(t, 1, "ring", "status")
	if r.code != exitError || !strings.Contains(r.stdout, "ledger-b  not given here: name it too") ||
		r.stderr != "d1idem: ring status: version 2 names a database not given here (ledger-b): name every database of the ring, as the application's replicas have them\n" {
		t.Errorf("ring status on one database of two: %s", r)
	}
	r = e.run(t, 1, "ring", "status", "--json")
	var st ringStatusJSON
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || len(st.Databases) != 2 || st.Databases[1].ID != "ledger-b" || st.Databases[1].Error == nil {
		t.Errorf("ring status --json on one database of two: %v %s", err, r)
	}
	expect := e.run(t, 1, "ring", "advance")
	if expect.code != exitError || !strings.Contains(expect.stderr, `ring advance: the ring names a database not given here ("ledger-b")`) {
		t.Errorf("ring advance on one database of two: %s", expect)
	}
}
