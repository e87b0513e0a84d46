package sluice_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/store/memory"
)

// counted passes every call on to a real store, counting them: how many decisions reached the
// shared store.
type counted struct {
	sluice.Store
	calls atomic.Int64
}

func (c *counted) Decide(ctx context.Context, key string, p sluice.Policy, cost int64) (sluice.Decision, error) {
	c.calls.Add(1)
	return c.Store.Decide(ctx, key, p, cost)
}

func (c *counted) DecideAll(ctx context.Context, key string, limits []sluice.Limit, out []sluice.Decision) (bool, error) {
	c.calls.Add(1)
	return c.Store.DecideAll(ctx, key, limits, out)
}

// budgetFor gives every policy b.
func budgetFor(b sluice.LocalBudget) func(sluice.Policy) sluice.LocalBudget {
	return func(sluice.Policy) sluice.LocalBudget { return b }
}

// budgetWorld is a memory store on a manual clock, seen through a counter, as the shared store.
func budgetWorld(start time.Time) (*sluice.ManualClock, *memory.Store, *counted) {
	clock := sluice.NewManualClock(start)
	mem := memory.New(memory.WithClock(clock))
	return clock, mem, &counted{Store: mem}
}

// peek is the shared store's own view of (key, p), consuming nothing.
func peek(t *testing.T, st sluice.Store, key string, p sluice.Policy) sluice.Decision {
	t.Helper()
	d, err := st.Decide(context.Background(), key, p, 0)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func mustDecide(t *testing.T, st sluice.Store, key string, p sluice.Policy, cost int64) sluice.Decision {
	t.Helper()
	d, err := st.Decide(context.Background(), key, p, cost)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestBudgetTakenSpentExpiredAtWindowEnd: a fixed-window budget is taken in one consuming
// decision of its size, spent locally with no store call, taken again when empty, and expires
// at the end of the window it was counted in even though its max_age is longer.
func TestBudgetTakenSpentExpiredAtWindowEnd(t *testing.T) {
	clock, mem, shared := budgetWorld(time.UnixMicro(0).Add(100 * time.Millisecond))
	p := sluice.Policy{Name: "fw", Algorithm: sluice.FixedWindow, Limit: 100, Period: time.Second}
	b := sluice.Budgeted(shared, budgetFor(sluice.LocalBudget{Size: 10, MaxAge: time.Hour}), sluice.WithBudgetClock(clock))
	for i := range 10 {
		if d := mustDecide(t, b, "k", p, 1); !d.Allowed {
			t.Fatalf("request %d refused: %+v", i, d)
		}
	}
	if n := shared.calls.Load(); n != 1 {
		t.Fatalf("%d store calls for 10 requests with a budget of 10; want 1", n)
	}
	if d := peek(t, mem, "k", p); d.Remaining != 90 {
		t.Fatalf("store remaining %d after one budget of 10; want 90", d.Remaining)
	}
	mustDecide(t, b, "k", p, 1) // the 11th takes a second budget
	if n := shared.calls.Load(); n != 2 {
		t.Fatalf("%d store calls for 11 requests; want 2", n)
	}
	// 9 units left; the window ends in 900 ms: they die with it.
	clock.Advance(900 * time.Millisecond)
	mustDecide(t, b, "k", p, 1)
	if n := shared.calls.Load(); n != 3 {
		t.Fatalf("%d store calls: a budget of the last window was spent in the next one", n)
	}
	if d := peek(t, mem, "k", p); d.Remaining != 90 {
		t.Fatalf("store remaining %d in the new window; want 90 (one new budget)", d.Remaining)
	}
}

// TestBudgetExpiresAtMaxAge: a token-bucket budget is not spent after max_age.
func TestBudgetExpiresAtMaxAge(t *testing.T) {
	clock, _, shared := budgetWorld(time.UnixMicro(0))
	p := sluice.Policy{Name: "tb", Algorithm: sluice.TokenBucket, Limit: 10, Period: time.Second, Burst: 100}
	b := sluice.Budgeted(shared, budgetFor(sluice.LocalBudget{Size: 20, MaxAge: 50 * time.Millisecond}), sluice.WithBudgetClock(clock))
	mustDecide(t, b, "k", p, 1)
	clock.Advance(49 * time.Millisecond)
	mustDecide(t, b, "k", p, 1)
	if n := shared.calls.Load(); n != 1 {
		t.Fatalf("%d store calls before max_age; want 1", n)
	}
	clock.Advance(time.Millisecond)
	mustDecide(t, b, "k", p, 1)
	if n := shared.calls.Load(); n != 2 {
		t.Fatalf("%d store calls at max_age; want 2 (the budget expired)", n)
	}
}

// TestBudgetSlidingWindowEndsWithWindow: a sliding-window budget expires at the end of its
// window (the store's ResetAfter is a period later than that).
func TestBudgetSlidingWindowEndsWithWindow(t *testing.T) {
	clock, _, shared := budgetWorld(time.UnixMicro(0).Add(600 * time.Millisecond))
	p := sluice.Policy{Name: "sw", Algorithm: sluice.SlidingWindow, Limit: 100, Period: time.Second}
	b := sluice.Budgeted(shared, budgetFor(sluice.LocalBudget{Size: 10, MaxAge: time.Hour}), sluice.WithBudgetClock(clock))
	mustDecide(t, b, "k", p, 1)
	clock.Advance(399 * time.Millisecond)
	mustDecide(t, b, "k", p, 1)
	if n := shared.calls.Load(); n != 1 {
		t.Fatalf("%d store calls inside the window; want 1", n)
	}
	clock.Advance(time.Millisecond) // the next window
	mustDecide(t, b, "k", p, 1)
	if n := shared.calls.Load(); n != 2 {
		t.Fatalf("%d store calls: a budget outlived its window", n)
	}
}

// TestBudgetRefusalIsTheStoresOwn: when the store cannot give a whole budget, what it has left
// is taken; when it has nothing, the store decides the request itself, so the refusal and its
// RetryAfter are exactly the store's, as without budgets.
func TestBudgetRefusalIsTheStoresOwn(t *testing.T) {
	clock, mem, shared := budgetWorld(time.UnixMicro(0).Add(250 * time.Millisecond))
	p := sluice.Policy{Name: "fw", Algorithm: sluice.FixedWindow, Limit: 10, Period: time.Second}
	b := sluice.Budgeted(shared, budgetFor(sluice.LocalBudget{Size: 4, MaxAge: time.Hour}), sluice.WithBudgetClock(clock))
	for i := range 10 {
		if d := mustDecide(t, b, "k", p, 1); !d.Allowed {
			t.Fatalf("request %d of 10 refused: %+v", i, d)
		}
	}
	if d := peek(t, mem, "k", p); d.Remaining != 0 {
		t.Fatalf("store remaining %d; want 0 (4 + 4 + the 2 left)", d.Remaining)
	}
	clock.Advance(100 * time.Millisecond)
	d := mustDecide(t, b, "k", p, 1)
	want := mustDecide(t, mem, "k", p, 1) // the store's own answer (a refusal consumes nothing)
	if d.Allowed || d.RetryAfter != want.RetryAfter || d.RetryAfter != 650*time.Millisecond {
		t.Fatalf("refusal %+v; want the store's %+v (RetryAfter 650ms)", d, want)
	}
	// Refused again, while the store refuses budgets: decided by the store each time, exactly.
	clock.Advance(50 * time.Millisecond)
	if d := mustDecide(t, b, "k", p, 1); d.Allowed || d.RetryAfter != 600*time.Millisecond {
		t.Fatalf("second refusal %+v; want RetryAfter 600ms", d)
	}
	// The next window: budgets again.
	clock.Advance(600 * time.Millisecond)
	calls := shared.calls.Load()
	for range 4 {
		if d := mustDecide(t, b, "k", p, 1); !d.Allowed {
			t.Fatalf("refused in a fresh window: %+v", d)
		}
	}
	if n := shared.calls.Load() - calls; n != 1 {
		t.Fatalf("%d store calls for a budget's 4 requests in a fresh window; want 1", n)
	}
}

// TestBudgetDecideAllAllOrNothing: a request of two budgeted limits is served from both budgets
// or decided by the store whole; when one limit refuses, the other's budget keeps its units.
func TestBudgetDecideAllAllOrNothing(t *testing.T) {
	clock, mem, shared := budgetWorld(time.UnixMicro(0))
	wide := sluice.Policy{Name: "wide", Algorithm: sluice.FixedWindow, Limit: 100, Period: time.Hour}
	narrow := sluice.Policy{Name: "narrow", Algorithm: sluice.TokenBucket, Limit: 1, Period: time.Hour, Burst: 3}
	budgets := func(p sluice.Policy) sluice.LocalBudget {
		if p.Name == "wide" {
			return sluice.LocalBudget{Size: 10, MaxAge: time.Hour}
		}
		return sluice.LocalBudget{Size: 1, MaxAge: time.Hour}
	}
	b := sluice.Budgeted(shared, budgets, sluice.WithBudgetClock(clock))
	limits := []sluice.Limit{{Policy: wide, Cost: 1}, {Policy: narrow, Cost: 1}}
	out := make([]sluice.Decision, 2)
	for i := range 3 {
		ok, err := b.DecideAll(context.Background(), "k", limits, out)
		if err != nil || !ok {
			t.Fatalf("request %d: %v %v %+v", i, ok, err, out)
		}
	}
	ok, err := b.DecideAll(context.Background(), "k", limits, out)
	if err != nil || ok || out[1].Allowed || out[1].RetryAfter != time.Hour {
		t.Fatalf("4th request: %v %v %+v; want refused by narrow with RetryAfter 1h", ok, err, out)
	}
	// wide: one budget of 10 taken, 3 spent; the refusal consumed nothing of it locally or in
	// the store, so 7 more requests on wide alone are served from it.
	if d := peek(t, mem, "k", wide); d.Remaining != 90 {
		t.Fatalf("wide's store remaining %d; want 90", d.Remaining)
	}
	calls := shared.calls.Load()
	for range 7 {
		mustDecide(t, b, "k", wide, 1)
	}
	if n := shared.calls.Load() - calls; n != 0 {
		t.Fatalf("%d store calls for wide's 7 units left; want 0 (the refused request took none)", n)
	}
}

// TestBudgetValidate: the algorithms that take no budget and bad numbers are named.
func TestBudgetValidate(t *testing.T) {
	for _, c := range []struct {
		p    sluice.Policy
		b    sluice.LocalBudget
		want string
	}{
		{sluice.Policy{Algorithm: sluice.SlidingLog, Limit: 10, Period: time.Second}, sluice.LocalBudget{Size: 1, MaxAge: time.Second}, "local_budget is not supported by sliding-log"},
		{sluice.Policy{Algorithm: sluice.LeakyBucket, Limit: 10, Period: time.Second}, sluice.LocalBudget{Size: 1, MaxAge: time.Second}, "local_budget is not supported by leaky-bucket"},
		{sluice.Policy{Algorithm: sluice.FixedWindow, Limit: 10, Period: time.Second}, sluice.LocalBudget{Size: 0, MaxAge: time.Second}, "local_budget.size 0 must be > 0"},
		{sluice.Policy{Algorithm: sluice.FixedWindow, Limit: 10, Period: time.Second}, sluice.LocalBudget{Size: 11, MaxAge: time.Second}, "local_budget.size 11 must be ≤ the policy's limit 10"},
		{sluice.Policy{Algorithm: sluice.TokenBucket, Limit: 10, Period: time.Second, Burst: 20}, sluice.LocalBudget{Size: 21, MaxAge: time.Second}, "local_budget.size 21 must be ≤ the policy's burst 20"},
		{sluice.Policy{Algorithm: sluice.TokenBucket, Limit: 10, Period: time.Second}, sluice.LocalBudget{Size: 5}, "local_budget.max_age 0s must be ≥ 1ms"},
	} {
		err := c.b.Validate(c.p)
		if !errors.Is(err, sluice.ErrInvalidPolicy) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v %+v: %v; want %q", c.p.Algorithm, c.b, err, c.want)
		}
	}
	if err := (sluice.LocalBudget{Size: 20, MaxAge: time.Second}).Validate(sluice.Policy{Algorithm: sluice.TokenBucket, Limit: 10, Period: time.Second, Burst: 20}); err != nil {
		t.Error(err)
	}
}

// TestBudgetMemoryBounded: budgets of ever new keys do not grow memory past WithMaxBudgets;
// the requests that find no room are still decided, exactly.
func TestBudgetMemoryBounded(t *testing.T) {
	clock, _, shared := budgetWorld(time.UnixMicro(0))
	p := sluice.Policy{Name: "fw", Algorithm: sluice.FixedWindow, Limit: 100, Period: time.Hour}
	b := sluice.Budgeted(shared, budgetFor(sluice.LocalBudget{Size: 10, MaxAge: time.Hour}),
		sluice.WithBudgetClock(clock), sluice.WithMaxBudgets(64))
	for i := range 10000 {
		if d := mustDecide(t, b, fmt.Sprint("key-", i), p, 1); !d.Allowed {
			t.Fatalf("key %d refused", i)
		}
	}
	if n := b.Budgets(); n > 64 {
		t.Fatalf("%d budgets kept; want ≤ 64", n)
	}
}

// TestBudgetBoundSeveralInstances: several budgeted instances (wrappers) on one shared memory
// store, each hammered by goroutines on one key, the clock moving in steps between bursts: the
// admitted requests never exceed the documented bound — fixed window: the limit in every
// window; token bucket: C + r·T + min(r·MaxAge, I·Size) over every interval — in every round.
func TestBudgetBoundSeveralInstances(t *testing.T) {
	const instances, goroutines, steps = 4, 8, 40
	step := 25 * time.Millisecond
	// Requests per instance in a step, instance i at step s taking demand[(s+i·shift) % len]:
	// bursts and lulls, so that budgets are left over at times, to be spent (or not) later. The
	// token bucket's lull is long enough for the bucket to fill up again behind the budgets
	// left over.
	windows := []int{12, 3, 0, 5, 9, 1, 0, 2, 30}
	bucket := append(append([]int{2}, make([]int, 17)...), 50)
	for _, c := range []struct {
		p      sluice.Policy
		b      sluice.LocalBudget
		demand []int
		shift  int
	}{
		{sluice.Policy{Name: "fw", Algorithm: sluice.FixedWindow, Limit: 50, Period: 100 * time.Millisecond}, sluice.LocalBudget{Size: 8, MaxAge: time.Second}, windows, 1},
		{sluice.Policy{Name: "sw", Algorithm: sluice.SlidingWindow, Limit: 50, Period: 100 * time.Millisecond}, sluice.LocalBudget{Size: 8, MaxAge: time.Second}, windows, 1},
		{sluice.Policy{Name: "tb", Algorithm: sluice.TokenBucket, Limit: 100, Period: time.Second, Burst: 40}, sluice.LocalBudget{Size: 8, MaxAge: 60 * time.Millisecond}, bucket, 0},
		{sluice.Policy{Name: "tb", Algorithm: sluice.TokenBucket, Limit: 100, Period: time.Second, Burst: 40}, sluice.LocalBudget{Size: 8, MaxAge: 60 * time.Millisecond}, windows, 1},
	} {
		t.Run(c.p.Algorithm.String(), func(t *testing.T) {
			for round := range 5 {
				clock, _, shared := budgetWorld(time.UnixMicro(0).Add(time.Duration(round) * 7 * time.Millisecond))
				var wrappers []*sluice.BudgetStore
				for range instances {
					wrappers = append(wrappers, sluice.Budgeted(shared, budgetFor(c.b), sluice.WithBudgetClock(clock)))
				}
				admitted := make([]int64, steps) // per step; the clock stands still during one
				requests := make([]int64, steps)
				at := make([]time.Time, steps)
				for s := range steps {
					at[s] = clock.Now()
					var n atomic.Int64
					var wg sync.WaitGroup
					left := make([]atomic.Int64, instances) // requests each instance gets in this step
					for i := range left {
						left[i].Store(int64(c.demand[(s+i*c.shift)%len(c.demand)]))
						requests[s] += left[i].Load()
					}
					for i := range instances * goroutines {
						wg.Add(1)
						go func() {
							defer wg.Done()
							inst := i % instances
							for left[inst].Add(-1) >= 0 {
								d, err := wrappers[inst].Decide(context.Background(), "hot", c.p, 1)
								if err != nil {
									t.Error(err)
									return
								}
								if d.Allowed {
									n.Add(1)
								}
							}
						}()
					}
					wg.Wait()
					admitted[s] = n.Load()
					clock.Advance(step)
				}
				checkBound(t, round, c.p, c.b, instances, at, admitted, requests)
			}
		})
	}
}

// checkBound checks the admitted requests per step (at[s]: the instant of step s) against the
// documented bound of p's algorithm.
func checkBound(t *testing.T, round int, p sluice.Policy, b sluice.LocalBudget, instances int64, at []time.Time, admitted, requests []int64) {
	t.Helper()
	switch p.Algorithm {
	case sluice.FixedWindow, sluice.SlidingWindow:
		// Every aligned window admits at most the limit (the sliding window's own per-window
		// bound; its weighted estimate is checked by the store at every take).
		per, asked := map[int64]int64{}, map[int64]int64{}
		for s, a := range admitted {
			w := at[s].UnixMicro() / p.Period.Microseconds()
			per[w] += a
			asked[w] += requests[s]
		}
		for w, n := range per {
			if n > p.Limit {
				t.Errorf("round %d: window %d admitted %d; the bound is the limit %d", round, w, n, p.Limit)
			}
			// A request is refused only once the window's quota is all taken, of which at
			// most each instance's last budget goes unspent.
			if want := min(asked[w], p.Limit-instances*b.Size); p.Algorithm == sluice.FixedWindow && n < want {
				t.Errorf("round %d: window %d admitted only %d of %d requests; want ≥ %d", round, w, n, asked[w], want)
			}
		}
	case sluice.TokenBucket:
		// Over [at[i], at[j]]: admitted·period ≤ C·period + limit·T + min(limit·MaxAge, I·Size·period).
		period := int64(p.Period)
		extra := min(p.Limit*int64(b.MaxAge), instances*b.Size*period)
		for i := range admitted {
			var sum int64
			for j := i; j < len(admitted); j++ {
				sum += admitted[j]
				span := int64(at[j].Sub(at[i]))
				if sum*period > p.Capacity()*period+p.Limit*span+extra {
					t.Errorf("round %d: %d admitted over %v; the bound is %d + %v·%d/%v + min(%d·%v/%v, %d·%d)",
						round, sum, at[j].Sub(at[i]), p.Capacity(), at[j].Sub(at[i]), p.Limit, p.Period, p.Limit, b.MaxAge, p.Period, instances, b.Size)
				}
			}
		}
	}
}

// TestBudgetDecideAllConcurrent: requests of two budgeted limits and requests of one of them
// alone, from many goroutines through four instances on one shared store: neither limit admits
// beyond itself (a fixed window of an hour: its limit), and requests of both are admitted only
// within the narrower one.
func TestBudgetDecideAllConcurrent(t *testing.T) {
	for round := range 5 {
		clock, _, shared := budgetWorld(time.UnixMicro(0))
		wide := sluice.Policy{Name: "wide", Algorithm: sluice.FixedWindow, Limit: 120, Period: time.Hour}
		narrow := sluice.Policy{Name: "narrow", Algorithm: sluice.FixedWindow, Limit: 40, Period: time.Hour}
		budgets := func(p sluice.Policy) sluice.LocalBudget {
			return sluice.LocalBudget{Size: 4 + p.Limit/40, MaxAge: time.Hour} // 7 and 5
		}
		var wrappers []*sluice.BudgetStore
		for range 4 {
			wrappers = append(wrappers, sluice.Budgeted(shared, budgets, sluice.WithBudgetClock(clock)))
		}
		var both, wideOnly atomic.Int64
		var wg sync.WaitGroup
		for g := range 32 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				b := wrappers[g%4]
				out := make([]sluice.Decision, 2)
				limits := []sluice.Limit{{Policy: narrow, Cost: 1}, {Policy: wide, Cost: 1}}
				for i := range 12 {
					if g%2 == 0 && i%2 == 0 {
						d, err := b.Decide(context.Background(), "k", wide, 1)
						if err != nil {
							t.Error(err)
							return
						}
						if d.Allowed {
							wideOnly.Add(1)
						}
						continue
					}
					ok, err := b.DecideAll(context.Background(), "k", limits, out)
					if err != nil {
						t.Error(err)
						return
					}
					if ok != (out[0].Allowed && out[1].Allowed) {
						t.Errorf("DecideAll %v with decisions %+v", ok, out)
					}
					if ok {
						both.Add(1)
					}
				}
			}()
		}
		wg.Wait()
		if n := both.Load(); n > narrow.Limit {
			t.Errorf("round %d: %d requests of both limits admitted; narrow's limit is %d", round, n, narrow.Limit)
		}
		if n := both.Load() + wideOnly.Load(); n > wide.Limit {
			t.Errorf("round %d: %d requests admitted under wide; its limit is %d", round, n, wide.Limit)
		}
		if both.Load() == 0 || wideOnly.Load() == 0 {
			t.Errorf("round %d: %d of both, %d of wide alone admitted", round, both.Load(), wideOnly.Load())
		}
	}
}

// TestBudgetUnderAChangedLimit: a budget taken under one limit is dropped when the policy's limit
// changes (a reload, an override); what it took stays used in the store, which keeps what was
// used under the new limit. Limit 10, a budget of 4 taken for one request (3 unspent); raised to
// 12, the next request takes a new budget from the 8 the store has left: 1 + 8 requests pass in
// the window in all, the 3 dropped units counting until it ends.
func TestBudgetUnderAChangedLimit(t *testing.T) {
	clock, mem, shared := budgetWorld(time.UnixMicro(0))
	p := sluice.Policy{Name: "fw", Algorithm: sluice.FixedWindow, Limit: 10, Period: time.Second}
	b := sluice.Budgeted(shared, budgetFor(sluice.LocalBudget{Size: 4, MaxAge: time.Hour}), sluice.WithBudgetClock(clock))
	if d := mustDecide(t, b, "k", p, 1); !d.Allowed {
		t.Fatalf("the first request: %+v", d)
	}
	p.Limit = 12
	if d := peek(t, mem, "k", p); d.Remaining != 8 {
		t.Fatalf("the store under 12 with a budget of 4 taken: remaining %d, want 8", d.Remaining)
	}
	passed := 0
	for range 12 {
		if mustDecide(t, b, "k", p, 1).Allowed {
			passed++
		}
	}
	if passed != 8 {
		t.Fatalf("%d requests passed under 12 after a budget of 4 was taken under 10; want 8", passed)
	}
}
