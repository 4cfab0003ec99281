package idem

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/internal/d1test"
)

// placeholder finds the numbered parameters of a statement.
var placeholder = regexp.MustCompile(`\?(\d+)`)

// params returns how many parameters a statement takes.
func params(sql string) int {
	n := 0
	for _, m := range placeholder.FindAllStringSubmatch(sql, -1) {
		i, _ := strconv.Atoi(m[1])
		n = max(n, i)
	}
	return n
}

// reservedRows returns every row of the empty principal, as stored.
func reservedRows(t testing.TB, db *d1client.Client) string {
	t.Helper()
	res, err := db.Query(context.Background(), "SELECT * FROM idempotency_keys WHERE principal = '' ORDER BY key")
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprint(res.Rows)
}

// testNow is the injected clock's time of these tests.
var testNow = time.UnixMilli(1_767_225_600_000)

// forgeAttempts are the writes a holder of a ledger-only bridge's secret
// was seen to forge the ring with, through the ledger's own statements:
// a forced release of the ring row (its epoch moves on and it turns
// pending), then a completion of it with any ring; a sweep with a negative
// retention, which reaches the year-9999 rows; a claim of the empty
// principal; the fenced delete of a moved reservation.
func forgeAttempts(s ledgerSQL, r Ring) []d1client.Statement {
	epoch, body := r.Epoch(), `{"format":"d1idem-ring/1","version":9,"phase":"stable","homes":["evil"]}`
	var out []d1client.Statement
	for _, key := range []string{ringKey, homeKey} {
		for _, gen := range []int64{epoch, epoch + 1, 1, 2} {
			out = append(out,
				s.release("", key, gen, DefaultTTL, releaseForce, testNow),
				s.complete(&Reservation{Key: key, Generation: gen}, 200, &body, "{}", testNow),
				s.renew(&Reservation{Key: key, Generation: gen}, testNow),
				s.movedDelete("", key, gen, r.digest(), -1_000_000_000_000, testNow),
				s.movedDelete("", key, gen, key, -1_000_000_000_000, testNow))
		}
		out = append(out, s.begin("", key, "fp", DefaultTTL, testNow)...)
		out = append(out, s.begin("", key, key, -1_000_000_000_000, testNow)...)
	}
	return append(out, s.sweep(-1_000_000_000_000_000, MaxSweepBatch, testNow))
}

// No statement the ledger sends (the texts a ledger-only bridge accepts)
// changes a row of the empty principal, whatever its parameters: the ring
// and identity rows stay as the operator recorded them. First the attacks
// of the review, then every statement with random parameters drawn from
// the values that name those rows.
func TestLedgerStatementsNeverWriteRingRows(t *testing.T) {
	d1test.ForEach(t, func(t *testing.T, b *d1test.Backend) {
		for _, injected := range []bool{false, true} {
			db := b.NewClientSchema(t)
			cfg := Config{Logger: slog.New(slog.DiscardHandler)}
			if injected {
				cfg.Clock = func() time.Time { return testNow }
			}
			l, err := NewSharded([]Home{{ID: "a", DB: db}}, cfg)
			if err != nil {
				t.Fatal(err)
			}
			st, err := l.Admin().InitRing(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			before := reservedRows(t, db)
			check := func(s d1client.Statement) {
				t.Helper()
				_, _ = db.Exec(context.Background(), []d1client.Statement{s})
				if after := reservedRows(t, db); after != before {
					t.Fatalf("%q with %v changed the reserved rows:\n%s\nto\n%s", s.SQL, s.Params, before, after)
				}
			}
			for _, s := range forgeAttempts(l.sql, st.Ring) {
				check(s)
			}
			rng := rand.New(rand.NewPCG(1, 2))
			epoch := st.Ring.Epoch()
			names := []any{"", ringKey, homeKey}
			others := []any{"a", st.Ring.digest(), epoch, epoch + 1, int64(1), int64(0), int64(-1e15), int64(1e15), true}
			for _, sql := range bridgeStatements() {
				for range 24 {
					ps := make([]any, params(sql))
					for i := range ps {
						if rng.IntN(2) == 0 {
							ps[i] = names[rng.IntN(len(names))]
						} else {
							ps[i] = others[rng.IntN(len(others))]
						}
					}
					check(d1client.Statement{SQL: sql, Params: ps})
				}
			}
		}
	})
}
