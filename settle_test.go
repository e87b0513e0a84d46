package sluice_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// TestReservation: a reservation charges its estimate, settles once with the real cost (more
// charged beyond the limit, less refunded), and every later Settle, Commit or Cancel does nothing.
func TestReservation(t *testing.T) {
	ctx := context.Background()
	lim, clock := newLimiter(t, sluice.Policy{Name: "tokens", Algorithm: sluice.TokenBucket, Limit: 1000, Period: time.Minute})
	r, err := lim.Reserve(ctx, "c", 400)
	if err != nil || !r.OK() || r.Decision().Remaining != 600 {
		t.Fatalf("reserve 400: %+v %v", r.Decision(), err)
	}
	clock.Advance(time.Millisecond)
	if err := r.Settle(ctx, 100); err != nil {
		t.Fatal(err)
	}
	if d, _ := lim.AllowN(ctx, "c", 0); d.Remaining != 900 {
		t.Fatalf("remaining %d after settling 400 to 100, want 900", d.Remaining)
	}
	// Settled: nothing more happens, whatever is asked.
	for _, f := range []func(context.Context) error{r.Cancel, r.Commit, func(ctx context.Context) error { return r.Settle(ctx, 5000) }} {
		if err := f(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if d, _ := lim.AllowN(ctx, "c", 0); d.Remaining != 900 {
		t.Fatalf("remaining %d after settling again, want 900 (once only)", d.Remaining)
	}
	// A larger real cost: the balance goes below zero, and the next request waits it out exactly.
	r2, _ := lim.Reserve(ctx, "c", 100)
	if err := r2.Settle(ctx, 1800); err != nil {
		t.Fatal(err)
	}
	d, _ := lim.AllowN(ctx, "c", 1)
	// 1,000 tokens a minute, 60ms each: 1,800 taken from 900 leaves -900, so the 1 needs 901 tokens
	// refilled, 54.06s, of which the 1ms since the first reservation has gone.
	if d.Allowed || d.RetryAfter != 901*60*time.Millisecond-time.Millisecond {
		t.Fatalf("after a settlement beyond the limit: %+v, want refused for 54.059s", d)
	}
	// A refused reservation charged nothing: its Cancel gives nothing back.
	r3, _ := lim.Reserve(ctx, "c", 1)
	if r3.OK() {
		t.Fatal("reserved while in debt")
	}
	if err := r3.Cancel(ctx); err != nil {
		t.Fatal(err)
	}
	if d2, _ := lim.AllowN(ctx, "c", 1); d2.RetryAfter != d.RetryAfter {
		t.Fatalf("a refused reservation's Cancel changed the key: %+v", d2)
	}
	if err := r.Settle(ctx, -1); !errors.Is(err, sluice.ErrInvalidCost) {
		t.Fatalf("Settle(-1): %v", err)
	}
}

// TestReservationAfterTheWindow: a reservation cancelled after its window rolled gives nothing
// back (the new window never counted it), and Limiter.Settle takes the charge as the current
// window's.
func TestReservationAfterTheWindow(t *testing.T) {
	ctx := context.Background()
	lim, clock := newLimiter(t, sluice.Policy{Name: "logins", Algorithm: sluice.FixedWindow, Limit: 5, Period: 15 * time.Minute})
	r, _ := lim.Reserve(ctx, "c", 1)
	clock.Advance(15 * time.Minute)
	lim.AllowN(ctx, "c", 3)
	if err := r.Cancel(ctx); err != nil {
		t.Fatal(err)
	}
	if d, _ := lim.AllowN(ctx, "c", 0); d.Remaining != 2 {
		t.Fatalf("remaining %d after cancelling last window's reservation, want 2 (nothing refunded)", d.Remaining)
	}
	if err := lim.Settle(ctx, "c", 3, 1); err != nil {
		t.Fatal(err)
	}
	if d, _ := lim.AllowN(ctx, "c", 0); d.Remaining != 4 {
		t.Fatalf("remaining %d after Limiter.Settle(3, 1), want 4", d.Remaining)
	}
}

// TestReservationConcurrent: one reservation settled by many goroutines at once settles once.
func TestReservationConcurrent(t *testing.T) {
	ctx := context.Background()
	lim, _ := newLimiter(t, sluice.Policy{Name: "p", Algorithm: sluice.SlidingLog, Limit: 100, Period: time.Minute})
	r, _ := lim.Reserve(ctx, "c", 50)
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() { _ = r.Settle(ctx, 10) })
	}
	wg.Wait()
	if d, _ := lim.AllowN(ctx, "c", 0); d.Remaining != 90 {
		t.Fatalf("remaining %d, want 90 (one settlement of 50 to 10)", d.Remaining)
	}
}

// TestSettleConcurrencyRefused: a concurrency limit holds slots, not units: settling one is
// refused (ErrInvalidPolicy), and the store keeps no state for it (a later peek sees the key as
// never seen).
func TestSettleConcurrencyRefused(t *testing.T) {
	ctx := context.Background()
	lim, _ := newLimiter(t, sluice.Policy{Name: "conc", Algorithm: sluice.Concurrency, Limit: 2, Period: time.Minute})
	for _, c := range []struct{ reserved, actual int64 }{{1, 2}, {2, 1}} {
		if err := lim.Settle(ctx, "c", c.reserved, c.actual); !errors.Is(err, sluice.ErrInvalidPolicy) {
			t.Errorf("Settle(reserved %d, actual %d) of a concurrency limit: %v, want ErrInvalidPolicy", c.reserved, c.actual, err)
		}
	}
	if d, err := lim.AllowN(ctx, "c", 0); err != nil || d.Remaining != 2 || d.ResetAfter != 0 {
		t.Fatalf("peek after the refused settlements: %+v %v, want the key as never seen", d, err)
	}
}
