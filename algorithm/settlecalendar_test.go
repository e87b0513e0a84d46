package algorithm

import (
	"math/rand/v2"
	"testing"
	"time"
)

// Settlements of calendar policies (settlecalendar.go) at explicit instants across Berlin's
// 23-hour 2026-03-29: a larger real cost goes beyond the limit until the local midnight, a
// smaller one refunds while its window counts, and the sliding window's previous day is refunded
// by its weight. Before, a calendar policy's settlement divided by a period it has not (a panic).
func TestSettleCalendarSteps(t *testing.T) {
	loc, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	at := func(s string) int64 { return int64(local(t, loc, s) / µsec) }
	type step struct {
		now, cost         int64
		settle            bool
		at, reserved, act int64
		allowed           bool
		remaining         int64 // a request's, or a peek's after a settlement
		retry             int64 // a refusal's, µs
	}
	req := func(now string, cost int64, allowed bool, remaining, retry int64) step {
		return step{now: at(now), cost: cost, allowed: allowed, remaining: remaining, retry: retry}
	}
	settle := func(now, when string, reserved, act, remaining int64) step {
		return step{now: at(now), settle: true, at: at(when), reserved: reserved, act: act, remaining: remaining}
	}
	h := int64(time.Hour / time.Microsecond)
	fixed := Policy{Algorithm: FixedWindow, Limit: 10, Calendar: Day, Location: loc}
	sliding := Policy{Algorithm: SlidingWindow, Limit: 10, Calendar: Day, Location: loc}
	for _, c := range []struct {
		name  string
		p     Policy
		steps []step
	}{
		{"fixed window: an extra charge lasts until local midnight, the short day's", fixed, []step{
			req("2026-03-29 01:00:00", 1, true, 9, 0),
			settle("2026-03-29 01:00:00", "2026-03-29 01:00:00", 1, 14, 0), // 14 > 10: in debt
			req("2026-03-29 22:00:00", 1, false, 0, 2*h),                   // 22:00 to 24:00 local: 2 h
			req("2026-03-30 00:00:00", 1, true, 9, 0),                      // a new day, a new count
			settle("2026-03-30 00:00:00", "2026-03-29 01:00:00", 1, 0, 9),  // yesterday's charge: nothing to refund
		}},
		{"fixed window: a smaller real cost refunds in its day", fixed, []step{
			req("2026-03-29 03:00:00", 8, true, 2, 0),
			settle("2026-03-29 23:59:59", "2026-03-29 03:00:00", 8, 3, 7),
			settle("2026-03-29 23:59:59", "2026-03-29 03:00:00", 8, 0, 10), // never below 0
		}},
		{"sliding window: the previous day's charge refunded at its weight, an extra in the current one", sliding, []step{
			req("2026-03-29 20:00:00", 10, true, 0, 0),
			// Monday 12:00 is 12 h into a 24-hour day: the previous (23-hour) day weighs ½.
			settle("2026-03-30 12:00:00", "2026-03-29 20:00:00", 10, 4, 8), // prev 4, weighted: 2
			req("2026-03-30 12:00:00", 8, true, 0, 0),
			settle("2026-03-30 12:00:00", "2026-03-30 12:00:00", 8, 9, 0), // 9 + 2 > 10
			// Refused until 9 + prev·(24h - e)/24h ≤ 9, i.e. the day's end, and then 9 + 1 fits.
			req("2026-03-30 13:00:00", 1, false, 0, 11*h),
			// Tuesday: Monday's 9 weigh (24h - e)/24h; its charge refunds while it counts.
			settle("2026-03-31 06:00:00", "2026-03-30 12:00:00", 8, 1, 8),  // prev 9 - 7 = 2, weighted ¾: ceil(1.5)
			settle("2026-04-01 06:00:00", "2026-03-30 12:00:00", 8, 0, 10), // two days on: forgotten
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var s State
			for i, st := range c.steps {
				if st.settle {
					if _, err := Settle(&c.p, &s, st.at, st.now, st.reserved, st.act); err != nil {
						t.Fatalf("step %d: %v", i, err)
					}
					if d, _ := Decide(&c.p, clone(&s), st.now, 0); d.Remaining != st.remaining {
						t.Fatalf("step %d %+v: remaining %d after the settlement, want %d", i, st, d.Remaining, st.remaining)
					}
					continue
				}
				d, err := Decide(&c.p, &s, st.now, st.cost)
				if err != nil || d.Allowed != st.allowed || d.Remaining != st.remaining || d.RetryAfter != micros(st.retry) {
					t.Fatalf("step %d %+v: got %+v, %v", i, st, d, err)
				}
			}
		})
	}
}

// With no other traffic between them, a calendar policy's charge and its settlement leave the key
// as a charge of the real cost would, and a settlement of the reserved cost changes nothing.
func TestSettleCalendarIsAChargeOfTheRealCost(t *testing.T) {
	loc, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(13, 29))
	base := int64(local(t, loc, "2026-03-27 00:00:00") / µsec)
	for i := range 3000 {
		p := Policy{Algorithm: []Algorithm{FixedWindow, SlidingWindow}[i%2], Limit: 1 + rng.Int64N(50),
			Calendar: []Calendar{Day, Week, Month}[rng.IntN(3)], Location: loc}
		var s State
		now := base
		for range rng.IntN(4) { // some earlier traffic
			now += rng.Int64N(30 * int64(time.Hour/time.Microsecond))
			if _, err := Decide(&p, &s, now, rng.Int64N(p.Limit+1)); err != nil {
				t.Fatal(err)
			}
		}
		now += rng.Int64N(30 * int64(time.Hour/time.Microsecond))
		reserved := rng.Int64N(p.Limit + 1)
		actual := rng.Int64N(3 * p.Limit)
		plain := clone(&s)
		d, err := Decide(&p, &s, now, reserved)
		if err != nil {
			t.Fatal(err)
		}
		if !d.Allowed {
			continue
		}
		again := clone(&s)
		if changed, err := Settle(&p, again, now, now, reserved, reserved); err != nil || changed {
			t.Fatalf("%+v: settling the reserved cost changed %v (%v)", p, changed, err)
		}
		if _, err := Settle(&p, &s, now, now, reserved, actual); err != nil {
			t.Fatal(err)
		}
		// The same key charged actual at now directly: by a Decide where it fits, else beyond the
		// limit as only a settlement charges; compare what a peek reports at a few instants.
		want := clone(plain)
		if d, _ := Decide(&p, want, now, actual); !d.Allowed {
			chargeCalendar(&p, want, now, actual)
		}
		if reserved == 0 && actual == 0 {
			continue
		}
		for _, later := range []int64{0, 1, int64(time.Hour / time.Microsecond), 40 * int64(time.Hour/time.Microsecond)} {
			a, _ := Decide(&p, clone(&s), now+later, 0)
			b, _ := Decide(&p, clone(want), now+later, 0)
			if a != b {
				t.Fatalf("%+v reserved %d actual %d at +%d µs: settled %+v, charged %+v", p, reserved, actual, later, a, b)
			}
		}
	}
}
