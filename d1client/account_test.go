package d1client

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/d1idem/d1idem/d1client/budget"
)

// A Budget without a reserve is refused by New with the accepted range,
// as ErrInvalid naming Config.Budget: without one, work without Priority
// could take every call, and a completion meeting the empty budget would
// fail.
func TestReserveZeroRefused(t *testing.T) {
	for _, b := range []budget.Budget{budget.Budget{}.WithReserve(0), budget.New(10, time.Second).WithBurst(1).WithReserve(0), budget.Unlimited().WithReserve(0)} {
		if _, err := New(Config{BaseURL: testBaseURL, AccountID: testAccount, DatabaseID: testDatabase, Budget: b}); !errors.Is(err, ErrInvalid) ||
			!strings.Contains(err.Error(), "Config.Budget: reserve is 0; accepted: 0.01 to 0.9") {
			t.Errorf("New with %v and no reserve: %v", b, err)
		}
	}
}

// Clients given one Account share what any of them learns: the headers of
// one client's answer pace the other, and a 971 blocks both.
func TestClientsShareTheAccount(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		acct, err := budget.NewAccount(budget.Unlimited())
		if err != nil {
			t.Fatal(err)
		}
		spent := func(req *http.Request) (*http.Response, error) {
			res, err := ok1(t)(req)
			if err == nil {
				res.Header = rateHeaders(0, 60, 1200, 300)
			}
			return res, err
		}
		a, trA := mockClient(t, spent, func(c *Config) { c.Budget, c.Account = budget.Budget{}, acct })
		b, trB := mockClient(t, ok1(t), func(c *Config) { c.Budget, c.Account = budget.Budget{}, acct })
		if _, err := a.Exec(context.Background(), readStmt); err != nil {
			t.Fatal(err)
		}
		if a.Account() != b.Account() || b.Account().State().Remaining != 0 {
			t.Fatalf("b sees %+v", b.Account().State())
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err = b.Exec(ctx, readStmt)
		var e *Error
		if !errors.As(err, &e) || !errors.Is(err, ErrBudget) || e.RetryAfter < 59*time.Second {
			t.Fatalf("b: %v", err)
		}
		if w := b.BudgetWait(); w < 59*time.Second {
			t.Errorf("BudgetWait = %v", w)
		}
		if trA.GetTotalCallCount() != 1 || trB.GetTotalCallCount() != 0 {
			t.Fatalf("calls: a %d, b %d", trA.GetTotalCallCount(), trB.GetTotalCallCount())
		}
		// A client with an Account of its own is not held back.
		c, _ := mockClient(t, ok1(t))
		if _, err := c.Exec(ctx, readStmt); err != nil {
			t.Fatal(err)
		}
		// A 971 seen by one client blocks the other.
		acct2, _ := budget.NewAccount(budget.Unlimited())
		x, _ := mockClient(t, replay(t, "rate_limit_971"), func(c *Config) { c.Budget, c.Account = budget.Budget{}, acct2 })
		y, trY := mockClient(t, ok1(t), func(c *Config) { c.Budget, c.Account = budget.Budget{}, acct2 })
		if _, err := x.Exec(ctx, readStmt); !errors.Is(err, ErrRateLimited) {
			t.Fatalf("x: %v", err)
		}
		if _, err := y.Exec(ctx, readStmt); !errors.Is(err, ErrRateLimited) || trY.GetTotalCallCount() != 0 {
			t.Fatalf("y: %v after %d calls", err, trY.GetTotalCallCount())
		}
	})
}
