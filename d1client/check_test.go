package d1client

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/d1idem/d1idem/d1client/budget"
)

// execChecked runs a coalesced call of sql whose check (see Check) says
// whether it can commit, and sends its error on the returned channel.
func execChecked(c *Client, sql string, canCommit bool, checked *int) chan error {
	done := make(chan error, 1)
	go func() {
		_, err := c.Exec(context.Background(), stmt(sql), Coalesce(),
			Check(Statement{SQL: "SELECT generation FROM t WHERE k = ?", Params: []any{sql}}, func(Result) bool {
				*checked++
				return canCommit
			}))
		done <- err
	}()
	return done
}

// A fenced caller among many that shared a call is found by their checks
// in one call, and the others are sent again together in one more: three
// calls in all, where halving took eleven (TestSharedBatchFailureCostsAFewCalls).
func TestSharedBatchFailureFoundByChecks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, g := gcClient(t, budget.Unlimited(), CoalesceConfig{MaxInFlight: 1})
		busy := execAsync(c, normalWork, "SELECT 'busy'")
		g.sent()
		checked := make([]int, 32)
		var done []chan error
		for i := range 32 {
			sql := fmt.Sprintf("INSERT INTO t VALUES (%d)", i)
			if i == 19 {
				sql = "INSERT INTO missing_table VALUES (19)" // its guard fails
			}
			done = append(done, execChecked(c, sql, i != 19, &checked[i]))
		}
		synctest.Wait()
		g.answerAll()
		wantOneFailing(t, busy, done, 19)
		for i := range done {
			if checked[i] != 1 {
				t.Errorf("caller %d's check ran %d times, want once", i, checked[i])
			}
		}
		if sizes, _ := g.sizes(time.Now()); !slices.Equal(sizes, []int{1, 32, 32, 31}) {
			t.Errorf("calls of %v statements; want the 32 together, their 32 checks, the 31 that can commit", sizes)
		}
	})
}

// When every check passes, the failure is another statement's: the
// callers are halved as without checks, after the one call of checks.
func TestSharedBatchFailureChecksPassThenHalving(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, g := gcClient(t, budget.Unlimited(), CoalesceConfig{MaxInFlight: 1})
		busy := execAsync(c, normalWork, "SELECT 'busy'")
		g.sent()
		var checked [4]int
		var done []chan error
		for i := range 4 {
			sql := fmt.Sprintf("INSERT INTO t VALUES (%d)", i)
			if i == 2 {
				sql = "INSERT INTO missing_table VALUES (2)"
			}
			done = append(done, execChecked(c, sql, true, &checked[i]))
			g.sent()
		}
		g.answerAll()
		wantOneFailing(t, busy, done, 2)
		if sizes, _ := g.sizes(time.Now()); !slices.Equal(sizes, []int{1, 4, 4, 2, 2, 1, 1}) {
			t.Errorf("calls of %v statements; want the four together, their checks, then halves with no checks again", sizes)
		}
		if checked != [4]int{1, 1, 1, 1} {
			t.Errorf("checks ran %v times; want once each", checked)
		}
	})
}

// A check must be read-only: anything else is refused before it is sent.
func TestCheckMustBeReadOnly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, g := gcClient(t, budget.Unlimited(), CoalesceConfig{})
		_, err := c.Exec(context.Background(), stmt("INSERT INTO t VALUES (1)"), Coalesce(),
			Check(Statement{SQL: "DELETE FROM t"}, func(Result) bool { return true }))
		if !errors.Is(err, ErrInvalid) {
			t.Fatalf("Exec with a writing check: %v, want ErrInvalid", err)
		}
		if calls := g.sent(); len(calls) != 0 {
			t.Fatalf("%d calls sent", len(calls))
		}
	})
}

// SentAt is when the call that carried the statements went out, not when
// they were queued: a caller queued behind a call in flight for 3 s is
// sent when it returns.
func TestSentAtIsTheSendNotTheQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, g := gcClient(t, budget.Unlimited(), CoalesceConfig{MaxInFlight: 1})
		busy := execAsync(c, normalWork, "SELECT 'busy'")
		g.sent()
		queued := time.Now()
		var sent time.Time
		done := make(chan error, 1)
		go func() {
			_, err := c.Exec(context.Background(), stmt("SELECT 1"), Coalesce(), SentAt(&sent))
			done <- err
		}()
		time.Sleep(3 * time.Second)
		g.answerAll()
		time.Sleep(time.Second) // the runner waits up to a round trip for its callers to return
		g.answerAll()
		if err := errors.Join(<-busy, <-done); err != nil {
			t.Fatal(err)
		}
		calls := g.sent()
		if len(calls) != 2 || !sent.Equal(calls[1].at) || sent.Sub(queued) < 3*time.Second {
			t.Fatalf("SentAt %v after the queueing; want the second call's send, %v after", sent.Sub(queued), calls[len(calls)-1].at.Sub(queued))
		}
	})
}
