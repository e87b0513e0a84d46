package redis_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/store/redis"
)

// TestBudgetInstancesOneRedis: several instances, each its own Redis client under its own
// sluice.Budgeted, hammer one key of one real Redis from many goroutines: the admitted requests
// never exceed the documented bound, in every round (a fresh key each). Fixed and sliding
// window: the limit in each window the round touched (by Redis's clock); token bucket: over the
// round's length T, C + r·T (every budget of the round was taken in it, from a full bucket).
// And the budgets are used: far fewer Redis calls than admitted requests.
//
// Redis runs on this machine, so its clock and the test's are one.
func TestBudgetInstancesOneRedis(t *testing.T) {
	srv := redistest.Start(t)
	const instances, goroutines, perGoroutine, rounds = 4, 16, 30, 4
	var stores []*redis.Store
	for range instances {
		stores = append(stores, openStore(t, srv, redis.Options{Timeout: 2 * time.Second}))
	}
	for _, c := range []struct {
		p sluice.Policy
		b sluice.LocalBudget
	}{
		{sluice.Policy{Name: "fw", Algorithm: sluice.FixedWindow, Limit: 400, Period: time.Hour}, sluice.LocalBudget{Size: 20, MaxAge: time.Minute}},
		{sluice.Policy{Name: "sw", Algorithm: sluice.SlidingWindow, Limit: 400, Period: time.Hour}, sluice.LocalBudget{Size: 20, MaxAge: time.Minute}},
		{sluice.Policy{Name: "tb", Algorithm: sluice.TokenBucket, Limit: 200, Period: time.Second, Burst: 300}, sluice.LocalBudget{Size: 20, MaxAge: 200 * time.Millisecond}},
	} {
		t.Run(c.p.Algorithm.String(), func(t *testing.T) {
			for round := range rounds {
				var wrappers []*sluice.BudgetStore
				calls := int64(0)
				for _, s := range stores {
					wrappers = append(wrappers, sluice.Budgeted(s, func(sluice.Policy) sluice.LocalBudget { return c.b }))
					calls -= int64(s.Stats().Calls)
				}
				key := fmt.Sprintf("hot-%d", round)
				var admitted atomic.Int64
				var wg sync.WaitGroup
				startRedis := redisTime(t, srv)
				start := time.Now()
				for g := range instances * goroutines {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for range perGoroutine {
							d, err := wrappers[g%instances].Decide(context.Background(), key, c.p, 1)
							if err != nil {
								t.Error(err)
								return
							}
							if d.Allowed {
								admitted.Add(1)
							}
						}
					}()
				}
				wg.Wait()
				span := time.Since(start)
				endRedis := redisTime(t, srv)
				for _, s := range stores {
					calls += int64(s.Stats().Calls)
				}
				n := admitted.Load()
				var bound int64
				switch c.p.Algorithm {
				case sluice.TokenBucket:
					bound = c.p.Capacity() + c.p.Limit*int64(span)/int64(c.p.Period)
				default:
					period := c.p.Period.Microseconds()
					bound = c.p.Limit * (endRedis/period - startRedis/period + 1)
				}
				if n > bound {
					t.Errorf("round %d: %d admitted in %v; the bound is %d", round, n, span, bound)
				}
				if n < c.p.Limit/2 {
					t.Errorf("round %d: only %d admitted of %d requests", round, n, instances*goroutines*perGoroutine)
				}
				// A refused request is one Redis call of its own (the store refuses it itself);
				// the admitted ones share a call per budget.
				if refused := int64(instances*goroutines*perGoroutine) - n; (calls-refused)*4 > n {
					t.Errorf("round %d: %d Redis calls for %d admitted and %d refused: the budgets (size %d) were barely used", round, calls, n, refused, c.b.Size)
				}
				t.Logf("round %d: %d admitted (bound %d) in %v, %d Redis calls", round, n, bound, span, calls)
			}
		})
	}
}

// TestBudgetStoreFailureAnsweredAtOnce: when Redis hangs while many requests wait for one
// instance's budget, the one taking it fails after the store's timeout, and the others then ask
// the store each itself, at once: every request has its answer (ErrStoreUnavailable, for the
// failure mode) within about two timeouts, not one timeout after another.
func TestBudgetStoreFailureAnsweredAtOnce(t *testing.T) {
	srv := redistest.Start(t)
	const timeout = 300 * time.Millisecond
	st := openStore(t, srv, redis.Options{Timeout: timeout})
	p := sluice.Policy{Name: "tb", Algorithm: sluice.TokenBucket, Limit: 1000, Period: time.Second}
	b := sluice.Budgeted(st, func(sluice.Policy) sluice.LocalBudget { return sluice.LocalBudget{Size: 10, MaxAge: time.Second} })
	if _, err := b.Decide(context.Background(), "warm", p, 1); err != nil { // connected
		t.Fatal(err)
	}
	mustDo(t, srv, "CLIENT", "PAUSE", "5000", "ALL")
	t.Cleanup(func() { _, _ = srv.Do("CLIENT", "UNPAUSE") })
	const n = 16
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = b.Decide(context.Background(), "hot", p, 1)
		}()
	}
	// A caller that gives up meanwhile (waiting for the budget, or taking it) has the error a
	// store call it gave up on would give: ErrStoreUnavailable.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := b.Decide(ctx, "hot", p, 1); !errors.Is(err, sluice.ErrStoreUnavailable) {
		t.Errorf("a caller whose deadline passed: %v; want ErrStoreUnavailable", err)
	}
	wg.Wait()
	took := time.Since(start)
	for i, err := range errs {
		if !errors.Is(err, sluice.ErrStoreUnavailable) {
			t.Errorf("request %d: %v; want ErrStoreUnavailable", i, err)
		}
	}
	t.Logf("%d requests answered in %v", n, took)
	if took > 4*timeout {
		t.Errorf("%d requests waiting for a budget on a hung Redis took %v; want about 2 timeouts (%v)", n, took, 2*timeout)
	}
}
