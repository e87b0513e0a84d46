package sluice_test

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/store/memory"
)

// One Limiter for every tenant's contract: each call passes the policy that applies, as a lookup
// of the application's own returns it. State is kept per (key, policy name).
func ExampleLimiter_AllowPolicy() {
	lim, err := sluice.New(memory.New())
	if err != nil {
		panic(err)
	}
	plans := map[string]sluice.Policy{
		"free": {Name: "free", Algorithm: sluice.FixedWindow, Limit: 2, Period: time.Hour},
		"pro":  {Name: "pro", Algorithm: sluice.TokenBucket, Limit: 100, Period: time.Second, Burst: 200},
	}
	ctx := context.Background()
	for _, c := range []struct{ customer, plan string }{{"ann", "free"}, {"ann", "free"}, {"ann", "free"}, {"bob", "pro"}} {
		d, err := lim.AllowPolicy(ctx, c.customer, plans[c.plan], 1)
		if err != nil {
			panic(err)
		}
		fmt.Printf("%s on %s: allowed %v, remaining %d\n", c.customer, c.plan, d.Allowed, d.Remaining)
	}
	// Output:
	// ann on free: allowed true, remaining 1
	// ann on free: allowed true, remaining 0
	// ann on free: allowed false, remaining 0
	// bob on pro: allowed true, remaining 199
}

// "10 a second and 10,000 a day", and the tenant's own quota across its users: decided at once,
// all or nothing, so a refusal by one limit takes nothing from the others.
func ExampleLimiter_AllowAll() {
	lim, _ := sluice.New(memory.New())
	perSecond := sluice.Policy{Name: "per-second", Algorithm: sluice.SlidingWindow, Limit: 10, Period: time.Second}
	daily := sluice.Policy{Name: "daily", Algorithm: sluice.FixedWindow, Limit: 10_000, Period: 24 * time.Hour}
	tenant := sluice.Policy{Name: "tenant", Algorithm: sluice.FixedWindow, Limit: 3, Period: time.Hour}
	limits := []sluice.Limit{
		{Policy: perSecond, Cost: 1},
		{Policy: daily, Cost: 1},
		{Key: "tenant:acme", Policy: tenant, Cost: 1}, // counted under the tenant's key, not the user's
	}
	ctx := context.Background()
	for _, user := range []string{"ann", "bob", "cat", "dan"} {
		ok, ds, err := lim.AllowAll(ctx, user, limits)
		if err != nil {
			panic(err)
		}
		fmt.Printf("%s: %v (daily left %d, tenant left %d)\n", user, ok, ds[1].Remaining, ds[2].Remaining)
	}
	d, _ := lim.AllowPolicy(ctx, "dan", daily, 0) // a peek: dan's refusal took nothing from his daily
	fmt.Println("dan's daily:", d.Remaining)
	// Output:
	// ann: true (daily left 9999, tenant left 2)
	// bob: true (daily left 9999, tenant left 1)
	// cat: true (daily left 9999, tenant left 0)
	// dan: false (daily left 9999, tenant left 0)
	// dan's daily: 10000
}

// A Limiter made by New has no policy of its own: Allow says so.
func ExampleNew() {
	lim, _ := sluice.New(memory.New(), sluice.WithFailureMode(sluice.FailOpen))
	_, err := lim.Allow(context.Background(), "ann")
	fmt.Println(err == sluice.ErrNoPolicy)
	// Output: true
}
