package algorithm

import (
	"testing"
	"time"
)

// A changed period or algorithm must not misread the state written under the old numbers (a
// window index under another period once locked a key out for centuries): the key starts afresh.
func TestChangedPeriodOrAlgorithmStartsAfresh(t *testing.T) {
	for _, a := range Algorithms {
		old := Policy{Name: "p", Algorithm: a, Limit: 3, Period: time.Second}
		changes := []Policy{
			{Name: "p", Algorithm: a, Limit: 3, Period: time.Minute},
			{Name: "p", Algorithm: a, Limit: 7, Period: 2 * time.Second},
			{Name: "p", Algorithm: Algorithms[(int(a))%len(Algorithms)], Limit: 3, Period: time.Second},
		}
		if a == LeakyBucket { // room for the three requests in the queue
			old.Burst, changes[0].Burst, changes[1].Burst = 2, 2, 2
		}
		for _, changed := range changes {
			var s State
			now := int64(10_000_000)
			for i := 0; i < 3; i++ {
				if d, _ := Decide(&old, &s, now, 1); !d.Allowed {
					t.Fatalf("%v: request %d under the old policy refused", a, i)
				}
			}
			d, err := Decide(&changed, &s, now, 1)
			if err != nil || !d.Allowed || d.Remaining != changed.Capacity()-1 || d.Delay != 0 {
				t.Errorf("%v: first request after %v %v/%v became %v %v/%v: %+v %v, want a fresh key",
					a, old.Algorithm, old.Limit, old.Period, changed.Algorithm, changed.Limit, changed.Period, d, err)
			}
		}
	}
}

// A changed limit or burst keeps what was used. Each algorithm, 5 units of 5 used at 10s (a
// window boundary): raised to 8, exactly 3 more pass; lowered to 3, every request is refused
// until the use has room under 3, at an exact instant. The leaky bucket's 5 is one request served
// and 4 queued (burst 4), and its raise and cut move the queue's room with the limit.
func TestChangedLimitKeepsWhatWasUsed(t *testing.T) {
	const now = 10_000_000
	for _, a := range Algorithms {
		old := Policy{Name: "p", Algorithm: a, Limit: 5, Period: time.Second}
		raised, lowered := old, old
		raised.Limit, lowered.Limit = 8, 3
		if a == LeakyBucket {
			old.Burst, raised.Burst, lowered.Burst = 4, 7, 2
		}
		used := func() *State {
			s := new(State)
			for i := 0; i < 5; i++ {
				if d, _ := Decide(&old, s, now, 1); !d.Allowed {
					t.Fatalf("%v: request %d of 5 refused", a, i)
				}
			}
			return s
		}
		s := used()
		if d, _ := Decide(&raised, s, now, 0); d.Remaining != 3 {
			t.Errorf("%v: 5 of 5 used, raised to 8: remaining %d, want 3", a, d.Remaining)
		}
		for i := 0; i < 3; i++ {
			if d, _ := Decide(&raised, s, now, 1); !d.Allowed || d.Remaining != int64(2-i) {
				t.Errorf("%v: raised to 8, request %d: %+v, want allowed, %d left", a, i+1, d, 2-i)
			}
		}
		if d, _ := Decide(&raised, s, now, 1); d.Allowed {
			t.Errorf("%v: raised to 8, a fourth request: %+v, want refused", a, d)
		}

		// Lowered to 3: refused until the use fits. The windows and the log free their 5 at the
		// window's end (1s); the sliding window's previous 5 weigh until 5·(1 - e) ≤ 2, e = 0.6s;
		// a bucket's 5 units, drained at 3 a second, leave room for one (of 3) after 1s.
		wantRetry := map[Algorithm]time.Duration{FixedWindow: time.Second, SlidingLog: time.Second,
			SlidingWindow: 1600 * time.Millisecond, TokenBucket: time.Second, LeakyBucket: time.Second}[a]
		s = used()
		d, _ := Decide(&lowered, s, now, 1)
		if d.Allowed || d.Remaining != 0 || d.RetryAfter != wantRetry {
			t.Errorf("%v: 5 of 5 used, lowered to 3: %+v, want refused, retry after %v", a, d, wantRetry)
		}
		late := now + int64(wantRetry/time.Microsecond)
		if d, _ := Decide(&lowered, s, late-1, 1); d.Allowed {
			t.Errorf("%v: lowered to 3, a µs before the retry: %+v, want refused", a, d)
		}
		if d, _ := Decide(&lowered, s, late, 1); !d.Allowed {
			t.Errorf("%v: lowered to 3, at the retry: %+v, want allowed", a, d)
		}
	}
}

// The burst alone changing keeps a bucket's use too: a bucket drained under burst 5 is not
// refilled by a reload to burst 6, and one cut to burst 3 refuses until 3 units have drained.
func TestChangedBurstKeepsWhatWasUsed(t *testing.T) {
	for _, a := range []Algorithm{TokenBucket, LeakyBucket} {
		p := Policy{Name: "p", Algorithm: a, Limit: 1, Period: time.Hour, Burst: 5}
		var s State
		n := 5
		if a == LeakyBucket {
			n = 6 // one served, five queued
		}
		for i := 0; i < n; i++ {
			if d, _ := Decide(&p, &s, 0, 1); !d.Allowed {
				t.Fatalf("%v: request %d refused", a, i)
			}
		}
		up, down := p, p
		up.Burst, down.Burst = 6, 3
		if d, _ := Decide(&down, clone(&s), 0, 1); d.Allowed || d.RetryAfter != 3*time.Hour {
			t.Errorf("%v: burst cut from 5 to 3 with all used: %+v, want refused for 3h", a, d)
		}
		if d, _ := Decide(&up, &s, 0, 1); !d.Allowed || d.Remaining != 0 {
			t.Errorf("%v: burst raised from 5 to 6 with all used: %+v, want exactly one more", a, d)
		}
	}
}

// Two limits alternating on one key (an override applied and removed, again and again) never
// lose or invent use: a bucket converted back and forth at one instant is the state it was, and
// over time every limit decides on the same use.
func TestAlternatingLimitsKeepTheUse(t *testing.T) {
	for _, a := range Algorithms {
		lo := Policy{Name: "p", Algorithm: a, Limit: 3, Period: time.Second}
		hi := lo
		hi.Limit = 7
		if a == LeakyBucket {
			lo.Burst, hi.Burst = 2, 6
		}
		var s State
		for i := 0; i < 2; i++ {
			Decide(&lo, &s, 0, 1)
		}
		before := *clone(&s)
		Decide(&hi, &s, 0, 0)
		Decide(&lo, &s, 0, 0)
		if s.TAT != before.TAT || s.Frac != before.Frac || s.Count != before.Count || s.Window != before.Window || s.Limit != lo.Limit {
			t.Errorf("%v: converted to 7 and back to 3 at one instant: %+v, was %+v", a, s, before)
		}
		// Alternate every 100ms, one request under each: both limits always read the same use,
		// so whenever the lower one has room the higher one has exactly 4 more (its capacity is
		// 4 more); the fixed window admits 7 in each of its 4 windows (up to 3 under 3, the rest under 7), 5 in
		// the first, which starts with the 2 used above.
		approved := 0
		for i := 0; i < 40; i++ {
			p := &lo
			if i%2 == 1 {
				p = &hi
			}
			now := int64(i) * 100_000
			dl, _ := Decide(&lo, clone(&s), now, 0)
			dh, _ := Decide(&hi, clone(&s), now, 0)
			if dl.Remaining > 0 && dh.Remaining != dl.Remaining+4 {
				t.Errorf("%v at %dms: remaining %d under 3, %d under 7; want 4 apart", a, now/1000, dl.Remaining, dh.Remaining)
			}
			if d, err := Decide(p, &s, now, 1); err != nil {
				t.Fatal(err)
			} else if d.Allowed {
				approved++
			}
		}
		if a == FixedWindow && approved != 26 {
			t.Errorf("%v: %d approved in 4 windows, want 5 + 3·7", a, approved)
		}
	}
}

// A state written under a shorter period, then read by a leaky bucket (a reload that changed the
// period, or the algorithm): the cached reciprocal of the old period must not be used. It once
// sent a correction loop round ~2^64/period times.
func TestStaleCacheIsNotUsed(t *testing.T) {
	var s State
	short := Policy{Name: "p", Algorithm: FixedWindow, Limit: 1, Period: time.Millisecond}
	if _, err := Decide(&short, &s, 1_000_000, 1); err != nil {
		t.Fatal(err)
	}
	leaky := Policy{Name: "p", Algorithm: LeakyBucket, Limit: 1, Period: 3 * time.Second, Burst: 1}
	done := make(chan Decision)
	go func() { d, _ := Decide(&leaky, &s, 2_000_000, 0); done <- d }()
	select {
	case d := <-done:
		if !d.Allowed || d.Remaining != 2 {
			t.Fatalf("peek on a fresh leaky bucket: %+v, want allowed with 2 remaining", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Decide did not return: the stale reciprocal sent divP into a near-endless loop")
	}
}

// A State rebuilt from its exported fields (no cache) decides as the original.
func TestStateWithoutCache(t *testing.T) {
	p := Policy{Name: "p", Algorithm: TokenBucket, Limit: 3, Period: time.Second, Burst: 2}
	var a State
	for now := int64(0); now < 3_000_000; now += 100_000 {
		b := State{Alg: a.Alg, Limit: a.Limit, Period: a.Period, TAT: a.TAT, Frac: a.Frac}
		da, _ := Decide(&p, &a, now, 1)
		db, _ := Decide(&p, &b, now, 1)
		if da != db || a.TAT != b.TAT || a.Frac != b.Frac {
			t.Fatalf("at %dµs: with cache %+v (tat %d+%d), rebuilt %+v (tat %d+%d)", now, da, a.TAT, a.Frac, db, b.TAT, b.Frac)
		}
	}
}
