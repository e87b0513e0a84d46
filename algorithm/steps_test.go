package algorithm

import (
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"
)

const (
	µsec = time.Microsecond
	ms   = time.Millisecond
	sec  = time.Second
)

// step is one request at an explicit instant of a virtual clock whose 0 is a window boundary,
// and what must come of it. Allowed, RetryAfter, Delay and the error are always checked (their
// zero values mean refused, 0, 0 and no error); Remaining and ResetAfter only where the row sets
// them (left(n), after(d)). A row with n > 1 is that request n times at the same instant;
// Remaining and ResetAfter are then checked after the last.
type step struct {
	at        time.Duration
	cost      int64
	n         int
	allowed   bool
	retry     time.Duration
	delay     time.Duration
	remaining *int64
	reset     *time.Duration
	err       error // errors.Is target
}

func left(n int64) *int64                  { return &n }
func after(d time.Duration) *time.Duration { return &d }

// runSteps decides each row in order on one state under p (which must be valid) and checks the
// decision as the row says. On every decision it also checks what holds for any request:
// Decision.Limit is p.Capacity(); a refusal, a peek (cost 0) or an error leaves the state exactly
// as it was; a refusal's RetryAfter is exact (approved at now+RetryAfter, refused 1µs before).
func runSteps(t *testing.T, p Policy, rows []step) *State {
	t.Helper()
	if err := p.Validate(); err != nil {
		t.Fatalf("policy %+v: %v", p, err)
	}
	s := new(State)
	for i, r := range rows {
		for k := range max(r.n, 1) {
			where := fmt.Sprintf("row %d (at %v, cost %d)", i, r.at, r.cost)
			if r.n > 1 {
				where += fmt.Sprintf(" #%d of %d", k+1, r.n)
			}
			last := k == max(r.n, 1)-1
			now := us(r.at)
			before := clone(s)
			d, err := Decide(&p, s, now, r.cost)

			if r.err != nil {
				if !errors.Is(err, r.err) {
					t.Fatalf("%s: error %v, want one wrapping %v", where, err, r.err)
				}
			} else if err != nil {
				t.Fatalf("%s: unexpected error %v", where, err)
			}
			if d.Allowed != r.allowed {
				t.Fatalf("%s: Allowed %v, want %v (%+v)", where, d.Allowed, r.allowed, d)
			}
			if d.RetryAfter != r.retry {
				t.Errorf("%s: RetryAfter %v, want %v", where, d.RetryAfter, r.retry)
			}
			if d.Delay != r.delay {
				t.Errorf("%s: Delay %v, want %v", where, d.Delay, r.delay)
			}
			if d.Limit != p.Capacity() {
				t.Errorf("%s: Limit %d, want the capacity %d", where, d.Limit, p.Capacity())
			}
			if r.remaining != nil && last && d.Remaining != *r.remaining {
				t.Errorf("%s: Remaining %d, want %d", where, d.Remaining, *r.remaining)
			}
			if r.reset != nil && last && d.ResetAfter != *r.reset {
				t.Errorf("%s: ResetAfter %v, want %v", where, d.ResetAfter, *r.reset)
			}
			if (!d.Allowed || r.cost == 0 || err != nil) && !reflect.DeepEqual(s, before) {
				t.Fatalf("%s: a refusal, peek or error changed the state\nfrom %+v\n  to %+v", where, before, s)
			}
			if !d.Allowed && err == nil {
				checkRetryExact(t, where, &p, before, now, r.cost, d.RetryAfter)
			}
		}
	}
	return s
}

// checkRetryExact checks that a request refused on state s at now with RetryAfter retry is
// approved at now+retry and refused at now+retry-1µs, absent other traffic.
func checkRetryExact(t testing.TB, where string, p *Policy, s *State, now, cost int64, retry time.Duration) {
	t.Helper()
	if retry <= 0 || retry%µsec != 0 {
		t.Fatalf("%s: refused with RetryAfter %v, want a positive whole number of µs", where, retry)
	}
	at := now + us(retry)
	if d, err := Decide(p, clone(s), at, cost); err != nil || !d.Allowed {
		t.Fatalf("%s: RetryAfter %v, but at now+RetryAfter the same request gives %+v, %v", where, retry, d, err)
	}
	if d, err := Decide(p, clone(s), at-1, cost); err != nil || d.Allowed {
		t.Fatalf("%s: RetryAfter %v, but 1µs earlier the same request gives %+v, %v", where, retry, d, err)
	}
}

func TestFixedWindow(t *testing.T) {
	t.Run("100 at 59s and 100 at 60s all pass", func(t *testing.T) {
		runSteps(t, Policy{Algorithm: FixedWindow, Limit: 100, Period: time.Minute}, []step{
			{at: 59 * sec, cost: 0, allowed: true, remaining: left(100), reset: after(0)},
			{at: 59 * sec, cost: 1, n: 100, allowed: true, remaining: left(0), reset: after(1 * sec)},
			{at: 59 * sec, cost: 1, retry: 1 * sec, remaining: left(0), reset: after(1 * sec)},
			{at: 60*sec - µsec, cost: 1, retry: 1 * µsec},
			{at: 60 * sec, cost: 1, n: 100, allowed: true, remaining: left(0), reset: after(60 * sec)},
			{at: 60 * sec, cost: 1, retry: 60 * sec},
			{at: 119*sec + 999999*µsec, cost: 1, retry: 1 * µsec, reset: after(1 * µsec)},
			{at: 120 * sec, cost: 0, allowed: true, remaining: left(100), reset: after(0)},
			{at: 120 * sec, cost: 1, allowed: true, remaining: left(99), reset: after(60 * sec)},
		})
	})
	t.Run("cost: a report costs 5", func(t *testing.T) {
		runSteps(t, Policy{Algorithm: FixedWindow, Limit: 12, Period: sec}, []step{
			{at: 100 * ms, cost: 5, allowed: true, remaining: left(7), reset: after(900 * ms)},
			{at: 200 * ms, cost: 5, allowed: true, remaining: left(2)},
			{at: 300 * ms, cost: 5, retry: 700 * ms, remaining: left(2)}, // 10+5 > 12
			{at: 300 * ms, cost: 2, allowed: true, remaining: left(0)},   // but 2 fit
			{at: 300 * ms, cost: 13, retry: Never, err: ErrCostExceedsLimit},
			{at: 5 * sec, cost: 13, retry: Never, err: ErrCostExceedsLimit}, // never, not later
			{at: 1 * sec, cost: 12, allowed: true, remaining: left(0)},      // exactly the limit fits
		})
	})
	t.Run("peek and invalid cost", func(t *testing.T) {
		runSteps(t, Policy{Algorithm: FixedWindow, Limit: 2, Period: sec}, []step{
			{at: 0, cost: 0, allowed: true, remaining: left(2), reset: after(0)},
			{at: 0, cost: 1, n: 2, allowed: true, remaining: left(0)},
			{at: 10 * ms, cost: 0, allowed: true, remaining: left(0), reset: after(990 * ms)}, // a full window still peeks
			{at: 10 * ms, cost: -1, retry: Never, err: ErrInvalidCost},
		})
	})
	t.Run("windows are epoch-aligned, also before 0", func(t *testing.T) {
		runSteps(t, Policy{Algorithm: FixedWindow, Limit: 1, Period: sec}, []step{
			{at: -1500 * ms, cost: 1, allowed: true, reset: after(500 * ms)}, // window [-2s, -1s)
			{at: -1001 * ms, cost: 1, retry: 1 * ms},
			{at: -1 * sec, cost: 1, allowed: true},
			{at: -1 * µsec, cost: 1, retry: 1 * µsec},
			{at: 0, cost: 1, allowed: true},
		})
	})
	t.Run("clock backward never frees quota", func(t *testing.T) {
		runSteps(t, Policy{Algorithm: FixedWindow, Limit: 2, Period: sec}, []step{
			{at: 1500 * ms, cost: 1, n: 2, allowed: true},
			{at: 500 * ms, cost: 1, retry: 1500 * ms, remaining: left(0), reset: after(1500 * ms)}, // window 0 had nothing, yet refused
			{at: -7 * sec, cost: 1, retry: 9 * sec},
			{at: 2 * sec, cost: 1, allowed: true},
			{at: 1999 * ms, cost: 1, allowed: true, remaining: left(0)}, // back into window 1: counted in window 2
			{at: 1999 * ms, cost: 1, retry: 1001 * ms},
		})
	})
}

func TestSlidingLog(t *testing.T) {
	t.Run("the second 100 wait for the first to expire", func(t *testing.T) {
		runSteps(t, Policy{Algorithm: SlidingLog, Limit: 100, Period: time.Minute}, []step{
			{at: 59 * sec, cost: 1, n: 100, allowed: true, remaining: left(0), reset: after(60 * sec)},
			// The first approved at 59s counts until 119s: Retry-After at 60s is 59s, exactly.
			{at: 60 * sec, cost: 1, n: 100, retry: 59 * sec, remaining: left(0), reset: after(59 * sec)},
			{at: 119*sec - µsec, cost: 1, retry: 1 * µsec},
			{at: 119 * sec, cost: 0, allowed: true, remaining: left(100), reset: after(0)},
			{at: 119 * sec, cost: 1, n: 100, allowed: true, remaining: left(0)},
		})
	})
	t.Run("cost: entries expire oldest first until the cost fits", func(t *testing.T) {
		runSteps(t, Policy{Algorithm: SlidingLog, Limit: 5, Period: sec}, []step{
			{at: 0, cost: 2, allowed: true, remaining: left(3), reset: after(1 * sec)},
			{at: 300 * ms, cost: 2, allowed: true, remaining: left(1), reset: after(1 * sec)},
			{at: 600 * ms, cost: 1, allowed: true, remaining: left(0), reset: after(1 * sec)}, // the newest counts until 1.6s
			{at: 700 * ms, cost: 1, retry: 300 * ms},                                          // the 2 at 0 expire at 1s
			{at: 700 * ms, cost: 2, retry: 300 * ms},                                          // 3 left then, and 3+2 ≤ 5
			{at: 700 * ms, cost: 4, retry: 600 * ms},                                          // needs the 2 at 300ms gone too: at 1.3s
			{at: 700 * ms, cost: 5, retry: 900 * ms},                                          // needs all gone: at 1.6s
			{at: 700 * ms, cost: 6, retry: Never, err: ErrCostExceedsLimit},
			{at: 1 * sec, cost: 0, allowed: true, remaining: left(2), reset: after(600 * ms)},
			{at: 1 * sec, cost: 2, allowed: true, remaining: left(0), reset: after(1 * sec)},
			{at: 1 * sec, cost: -3, retry: Never, err: ErrInvalidCost},
		})
	})
	t.Run("same-instant entries expire together", func(t *testing.T) {
		runSteps(t, Policy{Algorithm: SlidingLog, Limit: 3, Period: sec}, []step{
			{at: 0, cost: 1, n: 2, allowed: true},
			{at: 400 * ms, cost: 1, allowed: true},
			{at: 500 * ms, cost: 2, retry: 500 * ms}, // needs both entries at 0 gone
			{at: 1 * sec, cost: 2, allowed: true, remaining: left(0), reset: after(1 * sec)},
		})
	})
	t.Run("clock backward never frees quota", func(t *testing.T) {
		runSteps(t, Policy{Algorithm: SlidingLog, Limit: 2, Period: sec}, []step{
			{at: 0, cost: 1, allowed: true},
			{at: 900 * ms, cost: 1, allowed: true},
			{at: 1100 * ms, cost: 1, allowed: true},   // the entry at 0 has expired
			{at: 500 * ms, cost: 1, retry: 1400 * ms}, // the entries at 0.9s and 1.1s, still ahead, count
			{at: 1050 * ms, cost: 1, retry: 850 * ms},
			{at: 1900 * ms, cost: 1, allowed: true, reset: after(1 * sec)},
			{at: 1800 * ms, cost: 1, retry: 300 * ms}, // the entry at 1.1s counts until 2.1s
		})
	})
}

func TestSlidingWindow(t *testing.T) {
	t.Run("80 before, 20 now, 15s in: 20 more fit", func(t *testing.T) {
		// estimate = 80·(60-15)/60 + 20 = 80; the 21st waits until 80·(60-e)/60 + 41 ≤ 100, i.e. e =
		// 60 - 59·60/80 = 15.75s: RetryAfter 750ms exactly.
		runSteps(t, Policy{Algorithm: SlidingWindow, Limit: 100, Period: time.Minute}, []step{
			{at: 30 * sec, cost: 1, n: 80, allowed: true, remaining: left(20), reset: after(90 * sec)},
			{at: 61 * sec, cost: 1, n: 20, allowed: true, remaining: left(1), reset: after(119 * sec)}, // 100-20-⌈80·59/60⌉
			{at: 75 * sec, cost: 0, allowed: true, remaining: left(20), reset: after(105 * sec)},
			{at: 75 * sec, cost: 1, n: 20, allowed: true, remaining: left(0)},
			{at: 75 * sec, cost: 1, retry: 750 * ms, remaining: left(0), reset: after(105 * sec)},
			{at: 75*sec + 749999*µsec, cost: 1, retry: 1 * µsec},
			{at: 75*sec + 750*ms, cost: 1, allowed: true},
		})
	})
	t.Run("a full window waits into the next one", func(t *testing.T) {
		// cur = 10 = limit: not in this window; in the next, 10·(1s-e)/1s + 1 ≤ 10 at e = 100ms.
		runSteps(t, Policy{Algorithm: SlidingWindow, Limit: 10, Period: sec}, []step{
			{at: 500 * ms, cost: 1, n: 10, allowed: true, remaining: left(0), reset: after(1500 * ms)},
			{at: 600 * ms, cost: 1, retry: 500 * ms, reset: after(1400 * ms)},
			{at: 600 * ms, cost: 10, retry: 1400 * ms, reset: after(1400 * ms)}, // prev must weigh 0: at 2s
			{at: 1 * sec, cost: 0, allowed: true, remaining: left(0), reset: after(1 * sec)},
			{at: 1100*ms - µsec, cost: 1, retry: 1 * µsec},
			{at: 1100 * ms, cost: 1, allowed: true, remaining: left(0), reset: after(1900 * ms)},
			{at: 1500 * ms, cost: 0, allowed: true, remaining: left(4)}, // 10 - 1 - ⌈10·0.5⌉
			{at: 1500 * ms, cost: 5, retry: 100 * ms},                   // 10·(1-e) + 6 ≤ 10 at e = 0.6
			{at: 11 * sec, cost: 10, allowed: true, remaining: left(0)},
			{at: 11 * sec, cost: 11, retry: Never, err: ErrCostExceedsLimit},
			{at: 11 * sec, cost: -1, retry: Never, err: ErrInvalidCost},
		})
	})
	t.Run("fractional weights round against the client", func(t *testing.T) {
		// limit 3 per 1000003µs: prev = 3, 1µs into the window the weight is 1000002/1000003.
		runSteps(t, Policy{Algorithm: SlidingWindow, Limit: 3, Period: 1000003 * µsec}, []step{
			{at: 0, cost: 1, n: 3, allowed: true},
			{at: 1000004 * µsec, cost: 0, allowed: true, remaining: left(0)}, // ⌈3·1000002/1000003⌉ = 3
			// 3·(P-e) + 1·P ≤ 3·P ⇔ e ≥ P/3 = 333334.33µs: the first whole µs is 333335.
			{at: 1000004 * µsec, cost: 1, retry: (1000003 + 333335 - 1000004) * µsec},
			{at: (1000003 + 333335) * µsec, cost: 1, allowed: true},
		})
	})
	t.Run("clock backward never frees quota", func(t *testing.T) {
		runSteps(t, Policy{Algorithm: SlidingWindow, Limit: 2, Period: sec}, []step{
			{at: 0, cost: 1, n: 2, allowed: true},
			{at: 2500 * ms, cost: 1, n: 2, allowed: true}, // window 2, prev (window 1) empty
			{at: 1500 * ms, cost: 1, retry: 2 * sec},      // decided as at 2s: cur = 2 fills window 2; 2·(1-e)+1 ≤ 2 at 3.5s
			{at: 3500 * ms, cost: 1, allowed: true},       // prev 2 weighs 0.5: 1+1 ≤ 2
			{at: 3400 * ms, cost: 1, retry: 600 * ms},     // 2·0.6+2 > 2; in window 4, prev 1 + 1 ≤ 2
		})
		// Back into an earlier window, the decision is made at the start of the recorded one.
		runSteps(t, Policy{Algorithm: SlidingWindow, Limit: 10, Period: sec}, []step{
			{at: 500 * ms, cost: 1, n: 4, allowed: true},
			{at: 1500 * ms, cost: 1, allowed: true, remaining: left(7)},  // 10 - 1 - ⌈4·0.5⌉
			{at: 700 * ms, cost: 0, allowed: true, remaining: left(5)},   // as at 1s: 10 - 1 - 4
			{at: 700 * ms, cost: 6, retry: 550 * ms, remaining: left(5)}, // 4·(1-e) + 1 + 6 ≤ 10 at e = 0.25s: at 1.25s
			{at: 700 * ms, cost: 5, allowed: true, remaining: left(0)},
		})
	})
}

func TestTokenBucket(t *testing.T) {
	t.Run("a bucket of 20 refilling 5/s", func(t *testing.T) {
		runSteps(t, Policy{Algorithm: TokenBucket, Limit: 5, Period: sec, Burst: 20}, []step{
			{at: 0, cost: 0, allowed: true, remaining: left(20), reset: after(0)},
			{at: 0, cost: 1, allowed: true, remaining: left(19), reset: after(200 * ms)},
			{at: 0, cost: 1, n: 19, allowed: true, remaining: left(0), reset: after(4 * sec)},
			{at: 0, cost: 1, retry: 200 * ms, remaining: left(0), reset: after(4 * sec)},
			{at: 200*ms - µsec, cost: 1, retry: 1 * µsec},
			{at: 200 * ms, cost: 1, allowed: true, remaining: left(0), reset: after(4 * sec)},
			{at: 400 * ms, cost: 1, allowed: true, remaining: left(0)},
			{at: 600 * ms, cost: 1, allowed: true, remaining: left(0)},
			{at: 800 * ms, cost: 1, allowed: true, remaining: left(0)},
			{at: 1 * sec, cost: 1, allowed: true, remaining: left(0), reset: after(4 * sec)},
			{at: 1 * sec, cost: 1, retry: 200 * ms},
			{at: 3 * sec, cost: 0, allowed: true, remaining: left(10), reset: after(2 * sec)},
			// Idle for an hour: full again, and not one token more than 20.
			{at: time.Hour + sec, cost: 0, allowed: true, remaining: left(20), reset: after(0)},
			{at: time.Hour + sec, cost: 1, n: 20, allowed: true, remaining: left(0)},
			{at: time.Hour + sec, cost: 1, retry: 200 * ms},
		})
	})
	t.Run("cost: a report costs 5", func(t *testing.T) {
		runSteps(t, Policy{Algorithm: TokenBucket, Limit: 5, Period: sec, Burst: 20}, []step{
			{at: 0, cost: 5, allowed: true, remaining: left(15), reset: after(1 * sec)},
			{at: 0, cost: 5, n: 3, allowed: true, remaining: left(0), reset: after(4 * sec)},
			{at: 0, cost: 5, retry: 1 * sec},
			{at: 500 * ms, cost: 5, retry: 500 * ms, remaining: left(2)},
			{at: 500 * ms, cost: 2, allowed: true, remaining: left(0)},
			{at: 500 * ms, cost: 21, retry: Never, err: ErrCostExceedsLimit},
			{at: 9 * sec, cost: 21, retry: Never, err: ErrCostExceedsLimit},
			{at: 9 * sec, cost: 20, allowed: true, remaining: left(0), reset: after(4 * sec)},
			{at: 9 * sec, cost: -5, retry: Never, err: ErrInvalidCost},
		})
	})
	t.Run("burst 0 means a capacity of limit", func(t *testing.T) {
		runSteps(t, Policy{Algorithm: TokenBucket, Limit: 4, Period: sec}, []step{
			{at: 0, cost: 1, n: 4, allowed: true, remaining: left(0), reset: after(1 * sec)},
			{at: 0, cost: 1, retry: 250 * ms},
			{at: 0, cost: 5, retry: Never, err: ErrCostExceedsLimit},
		})
	})
	t.Run("fractional interval: 3 per second", func(t *testing.T) {
		// T = 333333.33µs. A token comes back at k·T; the first whole µs at or after it is ⌈k·T⌉.
		runSteps(t, Policy{Algorithm: TokenBucket, Limit: 3, Period: sec}, []step{
			{at: 0, cost: 1, n: 3, allowed: true, remaining: left(0), reset: after(1 * sec)},
			{at: 0, cost: 1, retry: 333334 * µsec},
			{at: 333334 * µsec, cost: 1, allowed: true, reset: after(1 * sec)}, // tat = 4T = 1333333.33µs
			{at: 333334 * µsec, cost: 1, retry: 333333 * µsec},                 // ⌈2T⌉ = 666667
			{at: 666667 * µsec, cost: 1, allowed: true},
			{at: 666667 * µsec, cost: 1, retry: 333333 * µsec}, // 3T = 1s
			{at: 1 * sec, cost: 1, allowed: true},
			{at: 1 * sec, cost: 2, retry: 666667 * µsec}, // two tokens at 5T = 1666666.67µs
		})
	})
	t.Run("clock backward never frees quota", func(t *testing.T) {
		runSteps(t, Policy{Algorithm: TokenBucket, Limit: 1, Period: sec, Burst: 2}, []step{
			{at: 10 * sec, cost: 1, n: 2, allowed: true, reset: after(2 * sec)},
			{at: 5 * sec, cost: 1, retry: 6 * sec, remaining: left(0), reset: after(7 * sec)},
			{at: 11 * sec, cost: 1, allowed: true},
			{at: 10500 * ms, cost: 1, retry: 1500 * ms, remaining: left(0)},
		})
	})
}

func TestLeakyBucket(t *testing.T) {
	t.Run("a queue of 2 behind the one being served", func(t *testing.T) {
		runSteps(t, Policy{Algorithm: LeakyBucket, Limit: 5, Period: sec, Burst: 2}, []step{
			{at: 0, cost: 0, allowed: true, remaining: left(3), reset: after(0)},
			{at: 0, cost: 1, allowed: true, delay: 0, remaining: left(2), reset: after(200 * ms)},
			{at: 0, cost: 1, allowed: true, delay: 200 * ms, remaining: left(1), reset: after(400 * ms)},
			{at: 0, cost: 1, allowed: true, delay: 400 * ms, remaining: left(0), reset: after(600 * ms)},
			{at: 0, cost: 1, retry: 200 * ms, remaining: left(0), reset: after(600 * ms)},
			{at: 200*ms - µsec, cost: 1, retry: 1 * µsec},
			{at: 200 * ms, cost: 1, allowed: true, delay: 400 * ms, remaining: left(0)},
			{at: 300 * ms, cost: 0, retry: 100 * ms, remaining: left(0)}, // a peek is refused when the queue is full
			{at: 2 * sec, cost: 1, allowed: true, remaining: left(2)},
			{at: 2 * sec, cost: -1, retry: Never, err: ErrInvalidCost},
		})
	})
	t.Run("cost: a report drains 5 times as long", func(t *testing.T) {
		runSteps(t, Policy{Algorithm: LeakyBucket, Limit: 5, Period: sec, Burst: 5}, []step{
			{at: 0, cost: 5, allowed: true, remaining: left(1), reset: after(1 * sec)}, // 1s ahead = Burst·T: one more fits
			{at: 0, cost: 1, allowed: true, delay: 1 * sec, remaining: left(0), reset: after(1200 * ms)},
			{at: 0, cost: 1, retry: 200 * ms},
			{at: 0, cost: 100, retry: 200 * ms}, // a leaky bucket refuses on the queue ahead, not on the cost
			{at: 200 * ms, cost: 100, allowed: true, delay: 1 * sec, remaining: left(0), reset: after(21 * sec)},
			// A cost whose drain time no clock reaches can never be approved.
			{at: 200 * ms, cost: 1 << 62, retry: Never, err: ErrCostExceedsLimit},
		})
	})
	t.Run("burst 0: one at a time, no queue", func(t *testing.T) {
		runSteps(t, Policy{Algorithm: LeakyBucket, Limit: 3, Period: sec}, []step{
			{at: 0, cost: 1, allowed: true, remaining: left(0), reset: after(333334 * µsec)},
			{at: 0, cost: 1, retry: 333334 * µsec},
			{at: 333334 * µsec, cost: 1, allowed: true, remaining: left(0)}, // tat was 333333.33µs
			{at: 333334 * µsec, cost: 1, retry: 333334 * µsec},              // a late arrival moves the schedule on
		})
	})
	t.Run("delay rounds up to a whole µs", func(t *testing.T) {
		runSteps(t, Policy{Algorithm: LeakyBucket, Limit: 3, Period: sec, Burst: 3}, []step{
			{at: 0, cost: 1, allowed: true},
			{at: 0, cost: 1, allowed: true, delay: 333334 * µsec},
			{at: 0, cost: 1, allowed: true, delay: 666667 * µsec},
			{at: 0, cost: 1, allowed: true, delay: 1 * sec},
			{at: 0, cost: 1, retry: 333334 * µsec},
			{at: 1 * µsec, cost: 1, retry: 333333 * µsec},
		})
	})
	t.Run("clock backward never frees quota", func(t *testing.T) {
		runSteps(t, Policy{Algorithm: LeakyBucket, Limit: 1, Period: sec, Burst: 1}, []step{
			{at: 10 * sec, cost: 1, allowed: true},
			{at: 10 * sec, cost: 1, allowed: true, delay: 1 * sec, reset: after(2 * sec)},
			{at: 9 * sec, cost: 1, retry: 2 * sec, remaining: left(0), reset: after(3 * sec)},
			{at: 11 * sec, cost: 1, allowed: true, delay: 1 * sec},
		})
	})
}
