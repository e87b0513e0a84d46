package sluice_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/store/memory"
)

func newLimiter(t *testing.T, p sluice.Policy) (*sluice.Limiter, *sluice.ManualClock) {
	t.Helper()
	clock := sluice.NewManualClock(time.UnixMicro(0))
	lim, err := sluice.NewLimiter(memory.New(memory.WithClock(clock)), p, sluice.WithSleep(clock.Sleep))
	if err != nil {
		t.Fatal(err)
	}
	return lim, clock
}

func TestNewLimiterRejectsInvalidPolicies(t *testing.T) {
	for _, tc := range []struct {
		p    sluice.Policy
		want string
	}{
		{sluice.Policy{Name: "gold", Algorithm: sluice.TokenBucket, Limit: 0, Period: time.Second}, `policy "gold": limit 0 must be > 0`},
		{sluice.Policy{Algorithm: sluice.TokenBucket, Limit: -3, Period: time.Second}, "limit -3 must be > 0"},
		{sluice.Policy{Algorithm: sluice.FixedWindow, Limit: 5, Period: 999 * time.Microsecond}, "period 999µs must be ≥ 1ms"},
		{sluice.Policy{Algorithm: sluice.FixedWindow, Limit: 5, Period: time.Second + 1}, "whole number of microseconds"},
		{sluice.Policy{Algorithm: sluice.TokenBucket, Limit: 5, Period: time.Second, Burst: -5}, "burst -5 must be ≥ 0"},
		{sluice.Policy{Algorithm: sluice.SlidingLog, Limit: 5, Period: time.Second, Burst: 2}, "burst 2 has no meaning for sliding-log"},
		{sluice.Policy{Limit: 5, Period: time.Second}, "algorithm is missing"},
		{sluice.Policy{Algorithm: 42, Limit: 5, Period: time.Second}, "unknown algorithm 42"},
	} {
		_, err := sluice.NewLimiter(memory.New(), tc.p)
		if !errors.Is(err, sluice.ErrInvalidPolicy) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NewLimiter(%+v): error %v, want ErrInvalidPolicy saying %q", tc.p, err, tc.want)
		}
	}
	if _, err := sluice.NewLimiter(nil, sluice.Policy{Algorithm: sluice.FixedWindow, Limit: 1, Period: time.Second}); err == nil {
		t.Error("NewLimiter with a nil store: no error")
	}
}

func TestUnnamedPoliciesDoNotShareState(t *testing.T) {
	store := memory.New()
	a, _ := sluice.NewLimiter(store, sluice.Policy{Algorithm: sluice.FixedWindow, Limit: 1, Period: time.Hour})
	b, _ := sluice.NewLimiter(store, sluice.Policy{Algorithm: sluice.FixedWindow, Limit: 2, Period: time.Hour})
	if a.Policy().Name == b.Policy().Name {
		t.Fatalf("two unnamed policies got one name %q", a.Policy().Name)
	}
	ctx := context.Background()
	a.Allow(ctx, "c")
	if d, _ := b.Allow(ctx, "c"); !d.Allowed || d.Remaining != 1 {
		t.Fatalf("b after a spent its quota: %+v, want b's own full quota", d)
	}
}

func TestAllowNCostsAndPeeks(t *testing.T) {
	lim, _ := newLimiter(t, sluice.Policy{Name: "reports", Algorithm: sluice.FixedWindow, Limit: 10, Period: time.Minute})
	ctx := context.Background()
	if d, _ := lim.AllowN(ctx, "c", 5); !d.Allowed || d.Remaining != 5 {
		t.Fatalf("report of cost 5: %+v", d)
	}
	if d, _ := lim.AllowN(ctx, "c", 0); !d.Allowed || d.Remaining != 5 {
		t.Fatalf("peek: %+v, want Remaining 5 unchanged", d)
	}
	d, err := lim.AllowN(ctx, "c", 11)
	if !errors.Is(err, sluice.ErrCostExceedsLimit) || d.Allowed || d.RetryAfter != sluice.Never {
		t.Fatalf("cost 11 of 10: %+v %v, want Never and ErrCostExceedsLimit", d, err)
	}
	if _, err := lim.AllowN(ctx, "c", -1); !errors.Is(err, sluice.ErrInvalidCost) {
		t.Fatalf("cost -1: %v, want ErrInvalidCost", err)
	}
	if d, _ := lim.AllowN(ctx, "c", 5); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("second report: %+v (errors must not have consumed quota)", d)
	}
}

// Wait sleeps exactly RetryAfter (on the virtual clock) and then succeeds.
func TestWaitSleepsExactlyRetryAfter(t *testing.T) {
	lim, clock := newLimiter(t, sluice.Policy{Name: "tb", Algorithm: sluice.TokenBucket, Limit: 5, Period: time.Second, Burst: 2})
	ctx := context.Background()
	for i := 0; i < 2; i++ {
		if err := lim.Wait(ctx, "c"); err != nil {
			t.Fatal(err)
		}
	}
	if got := clock.Now(); !got.Equal(time.UnixMicro(0)) {
		t.Fatalf("two requests within the burst moved the clock to %v", got)
	}
	if err := lim.Wait(ctx, "c"); err != nil {
		t.Fatal(err)
	}
	if got := clock.Now().Sub(time.UnixMicro(0)); got != 200*time.Millisecond {
		t.Fatalf("the third request waited %v, want exactly 200ms", got)
	}
}

// A leaky-bucket Wait returns after the request's Delay.
func TestWaitHonoursLeakyBucketDelay(t *testing.T) {
	lim, clock := newLimiter(t, sluice.Policy{Name: "lb", Algorithm: sluice.LeakyBucket, Limit: 10, Period: time.Second, Burst: 5})
	ctx := context.Background()
	for i := 0; i < 4; i++ {
		start := clock.Now()
		if err := lim.Wait(ctx, "c"); err != nil {
			t.Fatal(err)
		}
		// Each request of a burst at one instant is served 100ms after the one before it; since
		// Wait advances the clock by the delay, every wait after the first is 100ms.
		if got, want := clock.Now().Sub(start), time.Duration(min(i, 1))*100*time.Millisecond; got != want {
			t.Fatalf("request %d waited %v, want %v", i, got, want)
		}
	}
}

func TestWaitErrors(t *testing.T) {
	lim, _ := newLimiter(t, sluice.Policy{Name: "fw", Algorithm: sluice.FixedWindow, Limit: 1, Period: time.Hour})
	if err := lim.WaitN(context.Background(), "c", 2); !errors.Is(err, sluice.ErrCostExceedsLimit) {
		t.Fatalf("WaitN of a cost that never fits: %v, want ErrCostExceedsLimit at once", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	lim.Allow(context.Background(), "c")
	if err := lim.Wait(ctx, "c"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait with a cancelled context: %v", err)
	}
}

// With the real timer: a deadline sooner than the wait fails at once; a cancel during the wait
// ends it.
func TestWaitRealTimer(t *testing.T) {
	lim, err := sluice.NewLimiter(memory.New(), sluice.Policy{Name: "tb-hourly", Algorithm: sluice.TokenBucket, Limit: 1, Period: time.Hour})
	// (A bucket, not a window: an hourly window's end could come within the test's minute.)
	if err != nil {
		t.Fatal(err)
	}
	lim.Allow(context.Background(), "c")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := lim.Wait(ctx, "c"); !errors.Is(err, sluice.ErrWaitExceedsDeadline) {
		t.Fatalf("Wait with a deadline before the next window: %v, want ErrWaitExceedsDeadline", err)
	}
	ctx2, cancel2 := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	var waitErr error
	go func() { defer wg.Done(); waitErr = lim.Wait(ctx2, "c") }()
	cancel2()
	wg.Wait()
	if !errors.Is(waitErr, context.Canceled) {
		t.Fatalf("Wait cancelled while waiting: %v", waitErr)
	}
}

// Many goroutines Waiting on one key are each admitted once, in order, and none early.
func TestWaitConcurrent(t *testing.T) {
	lim, err := sluice.NewLimiter(memory.New(), sluice.Policy{Name: "tb", Algorithm: sluice.TokenBucket, Limit: 1000, Period: time.Second, Burst: 10})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var wg sync.WaitGroup
	for i := 0; i < 40; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := lim.Wait(context.Background(), "c"); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	// 10 at once, then 30 more at 1 per ms: at least 30ms must have passed.
	if elapsed := time.Since(start); elapsed < 30*time.Millisecond {
		t.Fatalf("40 Waits on a bucket of 10 refilling 1/ms finished in %v, want ≥ 30ms", elapsed)
	}
}
