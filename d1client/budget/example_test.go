package budget_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/d1idem/d1idem/d1client/budget"
)

// A client takes a call from the Account before sending it, and hands the
// answer's headers back: the account's remaining calls and reset time then
// set the pace of every client sharing the Account.
func ExampleAccount() {
	acct, err := budget.NewAccount(budget.Budget{}) // Cloudflare's limit, default burst and reserve
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := acct.Acquire(ctx, budget.Normal); err != nil {
		var r *budget.Refusal
		if errors.As(err, &r) && r.Cause == budget.CauseBudget {
			fmt.Println("not sent; a call may go in", r.Wait)
		}
		return
	}
	// ... send the call; its answer says what the account has left:
	h := http.Header{}
	h.Set("Ratelimit", `"default";r=1100;t=120`)
	h.Set("Ratelimit-Policy", `"burst";q=1200;w=300`)
	acct.Answered(h)

	st := acct.State()
	fmt.Println(st.Remaining, st.Quota, st.Window, st.InFlight)
	// Output:
	// 1100 1200 5m0s 0
}

// A Budget is a value: the zero Budget is Cloudflare's limit, and New,
// WithBurst and WithReserve make others, which Validate checks.
func ExampleBudget() {
	b := budget.New(600, 5*time.Minute).WithBurst(20).WithReserve(0.3)
	fmt.Println(b, b.Burst(), b.Reserve(), b.Kept(), b.Validate())
	fmt.Println(budget.Budget{}, budget.Unlimited())
	fmt.Println(budget.New(1, time.Minute).Validate() != nil)
	// Output:
	// 600 calls per 5m0s 20 0.3 7 <nil>
	// 1200 calls per 5m0s unlimited
	// true
}
