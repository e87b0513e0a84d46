package algorithm

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"
)

// Property tests: random traces (reproducible) on every algorithm, each decision checked against
// the reference model (model_test.go) and against the properties the design promises. The fuzz
// targets (fuzz_test.go) run the same checks on traces the fuzzer makes.

// request is one request of a trace: cost at now (µs).
type request struct{ now, cost int64 }

// record is a request, the state before it (a deep copy), and what Decide made of it.
type record struct {
	request
	before, after *State
	d             Decision
	err           error
}

// replay decides reqs in order on a new key under p and records every decision.
func replay(p *Policy, reqs []request) []record {
	s := new(State)
	recs := make([]record, len(reqs))
	for i, r := range reqs {
		before := clone(s)
		d, err := Decide(p, s, r.now, r.cost)
		recs[i] = record{request: r, before: before, after: clone(s), d: d, err: err}
	}
	return recs
}

func (r *record) String() string {
	return fmt.Sprintf("request (now %d, cost %d) on %+v -> %+v, %v", r.now, r.cost, r.before, r.d, r.err)
}

// checkAll runs every check that holds for a trace whose clock never runs backward.
func checkAll(t testing.TB, p *Policy, recs []record) {
	t.Helper()
	checkDecisionShape(t, p, recs)
	checkStateInvariants(t, p, recs)
	checkAgainstModel(t, p, recs)
	checkRefusalsKeepState(t, p, recs)
	checkRetryAfterExact(t, p, recs)
	checkRefusalsCacheable(t, p, recs)
	checkRemainingExact(t, p, recs)
	checkResetAfter(t, p, recs)
	checkAdmissionBounds(t, p, recs)
	checkLeakySpacing(t, p, recs)
}

// checkClockBackward checks a trace whose clock may step back. Whatever the clock does, the
// decisions keep their shape, the state its invariants, refusals change nothing, RetryAfter and
// ResetAfter stay exact, and a request approved at an instant earlier than one already seen would
// have been approved at the latest instant seen too: going back in time never frees quota.
func checkClockBackward(t testing.TB, p *Policy, recs []record) {
	t.Helper()
	checkDecisionShape(t, p, recs)
	checkStateInvariants(t, p, recs)
	checkRefusalsKeepState(t, p, recs)
	checkRetryAfterExact(t, p, recs)
	checkResetAfter(t, p, recs)
	latest := int64(-1 << 63)
	for i := range recs {
		r := &recs[i]
		if r.now < latest && r.err == nil && r.d.Allowed {
			if d, err := Decide(p, clone(r.before), latest, r.cost); err != nil || !d.Allowed {
				t.Fatalf("step %d: %v\napproved after the clock stepped back from %d, where it gives %+v, %v", i, r, latest, d, err)
			}
		}
		latest = max(latest, r.now)
	}
}

// checkStateInvariants checks what State's documentation promises of every state written.
func checkStateInvariants(t testing.TB, p *Policy, recs []record) {
	t.Helper()
	for i := range recs {
		r := &recs[i]
		s := r.after
		bad := func(why string) { t.Fatalf("step %d: %v\nwrote %+v: %s", i, r, s, why) }
		if s.Alg == 0 {
			if !reflect.DeepEqual(s, new(State)) {
				bad("a state of no algorithm should be the zero State")
			}
			continue
		}
		if s.Alg != p.Algorithm {
			bad("written by another algorithm")
		}
		switch s.Alg {
		case FixedWindow, SlidingWindow:
			if s.Count <= 0 || s.Count > p.Limit || s.Prev < 0 || s.Prev > p.Limit {
				bad("counts outside (0, limit]")
			}
		case SlidingLog:
			var sum int64
			for j, e := range s.Log {
				sum += e.Cost
				if e.Cost <= 0 || (j > 0 && e.At < s.Log[j-1].At) {
					bad("log entries must have positive costs, oldest first")
				}
			}
			if sum != s.Count || sum > p.Limit {
				bad("Count must be the sum of the log's costs")
			}
		case TokenBucket, LeakyBucket:
			if s.Frac < 0 || s.Frac >= p.Limit {
				bad("0 ≤ Frac < Limit")
			}
		}
	}
}

// checkDecisionShape checks what every decision looks like, whatever the algorithm.
func checkDecisionShape(t testing.TB, p *Policy, recs []record) {
	t.Helper()
	for i := range recs {
		r := &recs[i]
		d := r.d
		switch {
		case r.cost < 0:
			if !errors.Is(r.err, ErrInvalidCost) || d.Allowed || d.RetryAfter != Never {
				t.Fatalf("step %d: %v: want refused, Never, ErrInvalidCost", i, r)
			}
			continue
		case r.err != nil:
			if !errors.Is(r.err, ErrCostExceedsLimit) || d.Allowed || d.RetryAfter != Never || d.Limit != p.Capacity() {
				t.Fatalf("step %d: %v: an error must be ErrCostExceedsLimit with a refusal, Never and Limit %d", i, r, p.Capacity())
			}
			continue
		}
		if d.Limit != p.Capacity() {
			t.Fatalf("step %d: %v: Limit %d, want %d", i, r, d.Limit, p.Capacity())
		}
		if d.Remaining < 0 || d.Remaining > p.Capacity() {
			t.Fatalf("step %d: %v: Remaining %d outside [0, %d]", i, r, d.Remaining, p.Capacity())
		}
		if d.Allowed != (d.RetryAfter == 0) || d.RetryAfter < 0 {
			t.Fatalf("step %d: %v: RetryAfter must be 0 exactly when allowed, positive otherwise", i, r)
		}
		if d.ResetAfter < 0 || d.Delay < 0 || (d.Delay != 0 && (p.Algorithm != LeakyBucket || !d.Allowed)) {
			t.Fatalf("step %d: %v: bad ResetAfter or Delay", i, r)
		}
		for _, x := range []time.Duration{d.RetryAfter, d.ResetAfter, d.Delay} {
			if x%time.Microsecond != 0 {
				t.Fatalf("step %d: %v: %v is not a whole number of µs", i, r, x)
			}
		}
	}
}

// checkAgainstModel compares every decision with the reference model's, field by field; the
// model's RetryAfter is found by bisection, so it checks the code's formulas independently.
func checkAgainstModel(t testing.TB, p *Policy, recs []record) {
	t.Helper()
	m := newModel(p)
	for i := range recs {
		r := &recs[i]
		if r.cost < 0 || r.cost > modelCapacity(p) {
			continue // checked by checkDecisionShape
		}
		if r.err != nil {
			t.Fatalf("step %d: %v: unexpected error", i, r)
		}
		want := Decision{Limit: p.Capacity(), Allowed: m.admits(r.now, r.cost), At: r.now}
		if want.Allowed {
			want.Delay = micros(m.delay(r.now))
			if r.cost > 0 {
				m.admit(r.now, r.cost)
			}
		} else {
			want.RetryAfter = micros(firstAdmitted(m, r.now, r.cost) - r.now)
		}
		want.Remaining = m.remaining(r.now)
		want.ResetAfter = micros(m.fullAt(r.now) - r.now)
		if r.d != want {
			t.Fatalf("step %d: %v\nthe model says %+v", i, r, want)
		}
	}
}

// checkRefusalsKeepState: a refusal, a peek or an error leaves the state exactly as it was
// (deep: the sliding log's entries too).
func checkRefusalsKeepState(t testing.TB, p *Policy, recs []record) {
	t.Helper()
	for i := range recs {
		r := &recs[i]
		if (!r.d.Allowed || r.cost == 0 || r.err != nil) && !reflect.DeepEqual(r.before, r.after) {
			t.Fatalf("step %d: %v changed the state to %+v", i, r, r.after)
		}
	}
}

// checkRetryAfterExact: the same request on the same state is approved at now+RetryAfter and
// refused 1µs before.
func checkRetryAfterExact(t testing.TB, p *Policy, recs []record) {
	t.Helper()
	for i := range recs {
		r := &recs[i]
		if !r.d.Allowed && r.err == nil {
			checkRetryExact(t, fmt.Sprintf("step %d: %v", i, r), p, r.before, r.now, r.cost, r.d.RetryAfter)
		}
	}
}

// checkRefusalsCacheable: whatever else happens, the same or a larger cost is refused before
// now+RetryAfter, so a refusal may be cached until then. The trace's own later requests are the
// "whatever else".
func checkRefusalsCacheable(t testing.TB, p *Policy, recs []record) {
	t.Helper()
	for i := range recs {
		r := &recs[i]
		if r.d.Allowed || r.err != nil {
			continue
		}
		until := r.now + us(r.d.RetryAfter)
		for j := i + 1; j < len(recs) && recs[j].now < until; j++ {
			if q := &recs[j]; q.cost >= r.cost && q.d.Allowed {
				t.Fatalf("step %d: %v\nrefused until %d, yet step %d: %v", i, r, until, j, q)
			}
		}
	}
}

// checkRemainingExact: after a decision, exactly Remaining requests of cost 1 are approved at the
// same instant, and the next is refused.
func checkRemainingExact(t testing.TB, p *Policy, recs []record) {
	t.Helper()
	for i := range recs {
		r := &recs[i]
		if r.err != nil || r.d.Remaining > 64 {
			continue
		}
		s := clone(r.after)
		for k := range r.d.Remaining + 1 {
			d, err := Decide(p, s, r.now, 1)
			if err != nil || d.Allowed != (k < r.d.Remaining) {
				t.Fatalf("step %d: %v\nRemaining %d, but cost-1 request %d after it gives %+v, %v", i, r, r.d.Remaining, k+1, d, err)
			}
		}
	}
}

// checkResetAfter: at now+ResetAfter the key is idle, as if never seen (full quota; for the leaky
// bucket Remaining = Burst+1), and 1µs earlier it is not.
func checkResetAfter(t testing.TB, p *Policy, recs []record) {
	t.Helper()
	for i := range recs {
		r := &recs[i]
		if r.err != nil {
			continue
		}
		at := r.now + us(r.d.ResetAfter)
		if !IsIdle(p, clone(r.after), at) {
			t.Fatalf("step %d: %v\nnot idle at now+ResetAfter", i, r)
		}
		d, err := Decide(p, clone(r.after), at, 0)
		fresh, _ := Decide(p, new(State), at, 0)
		if err != nil || d != fresh || d.Remaining != p.Capacity() {
			t.Fatalf("step %d: %v\nat now+ResetAfter a peek gives %+v, %v; on a new key %+v", i, r, d, err, fresh)
		}
		if r.d.ResetAfter == 0 {
			continue
		}
		if IsIdle(p, clone(r.after), at-1) {
			t.Fatalf("step %d: %v\nalready idle 1µs before now+ResetAfter", i, r)
		}
		if d, _ := Decide(p, clone(r.after), at-1, 0); d.Remaining == p.Capacity() && d.ResetAfter == 0 {
			t.Fatalf("step %d: %v\nfull quota 1µs before now+ResetAfter: %+v", i, r, d)
		}
	}
}

// approved returns the approved requests of positive cost, in order.
func approved(recs []record) []request {
	var a []request
	for _, r := range recs {
		if r.d.Allowed && r.err == nil && r.cost > 0 {
			a = append(a, r.request)
		}
	}
	return a
}

// checkAdmissionBounds checks each algorithm's bound on what it admits over time.
func checkAdmissionBounds(t testing.TB, p *Policy, recs []record) {
	t.Helper()
	period, limit, capacity := p.PeriodMicros(), p.Limit, p.Capacity()
	a := approved(recs)
	perWindow := map[int64]int64{}
	nextWindow := map[int64]int64{} // window id -> the next window's (calendar windows are named by their start)
	for _, r := range a {
		id, _, end := p.WindowOf(r.now)
		perWindow[id] += r.cost
		nextWindow[id], _, _ = p.WindowOf(end)
	}
	switch p.Algorithm {
	case TokenBucket:
		// Over [t1, t2] a bucket admits at most its capacity plus the refill, limit·(t2-t1)/period:
		// admitted·period ≤ capacity·period + limit·(t2-t1), in exact integers.
		for i := range a {
			var sum int64
			for j := i; j < len(a); j++ {
				sum += a[j].cost
				if !mul(sum, period).lessEq(mul(capacity, period).add(mul(limit, a[j].now-a[i].now))) {
					t.Fatalf("token bucket admitted %d over [%d, %d], more than %d + %d·%dµs/%dµs",
						sum, a[i].now, a[j].now, capacity, limit, a[j].now-a[i].now, period)
				}
			}
		}
	case SlidingLog:
		// In any rolling window (t - period, t]: at most limit. The fullest ends at an approval.
		for j := range a {
			var sum int64
			for i := j; i >= 0 && a[i].now > a[j].now-period; i-- {
				sum += a[i].cost
			}
			if sum > limit {
				t.Fatalf("sliding log admitted %d in (%d, %d], limit %d", sum, a[j].now-period, a[j].now, limit)
			}
		}
	case FixedWindow, SlidingWindow:
		for w, n := range perWindow {
			if n > limit {
				t.Fatalf("%v admitted %d in window %d, limit %d", p.Algorithm, n, w, limit)
			}
			if w1 := nextWindow[w]; n+perWindow[w1] > 2*limit {
				t.Fatalf("%v admitted %d in windows %d and %d, more than 2·limit %d", p.Algorithm, n+perWindow[w1], w, w1, 2*limit)
			}
		}
		if p.Algorithm == FixedWindow {
			break
		}
		// At each approval, the estimate counting it is within the limit:
		// prev·(L - e) + cur·L ≤ limit·L, L the (current) window's length.
		cur := map[int64]int64{}
		for _, r := range a {
			w, start, end := p.WindowOf(r.now)
			pw, _, _ := p.WindowOf(start - 1)
			cur[w] += r.cost
			n, e := end-start, r.now-start
			if !mul(cur[pw], n-e).add(mul(cur[w], n)).lessEq(mul(limit, n)) {
				t.Fatalf("sliding window approved at %d with prev %d, cur %d (e = %d): over the limit %d", r.now, cur[pw], cur[w], e, limit)
			}
		}
	}
}

// checkLeakySpacing: the leaky bucket serves at limit per period: a request approved at now is
// started at now+Delay, and consecutive starts are at least cost·T apart (T = period/limit), less
// under 1µs of rounding when T is not a whole µs: (start2 - start1)·limit ≥ cost1·period - limit.
// And no request waits longer than the queue's room, Burst·T (rounded up to a µs).
func checkLeakySpacing(t testing.TB, p *Policy, recs []record) {
	t.Helper()
	if p.Algorithm != LeakyBucket {
		return
	}
	period, limit := p.PeriodMicros(), p.Limit
	var prev *record
	for i := range recs {
		r := &recs[i]
		if !r.d.Allowed || r.err != nil || r.cost == 0 {
			continue
		}
		if us(r.d.Delay)*limit >= p.Burst*period+limit {
			t.Fatalf("step %d: %v: Delay beyond Burst·T = %d·%d/%dµs", i, r, p.Burst, period, limit)
		}
		if prev != nil {
			s1, s2 := prev.now+us(prev.d.Delay), r.now+us(r.d.Delay)
			if (s2-s1)*limit < prev.cost*period-limit {
				t.Fatalf("step %d: %v starts at %d, only %dµs after the previous one (%v), which takes %d·%d/%dµs",
					i, r, s2, s2-s1, prev, prev.cost, period, limit)
			}
		}
		prev = r
	}
}

// randomTrace makes n requests on p: bursts at one instant, gaps around T = period/limit and
// around the period, landings exactly on and next to window boundaries, and costs from 0 to a
// little over the capacity.
func randomTrace(rng *rand.Rand, p *Policy, n int) []request {
	period := p.PeriodMicros()
	interval := max(1, period/p.Limit)
	capacity := p.Capacity()
	var now int64
	switch rng.IntN(4) {
	case 1:
		now = rng.Int64N(period)
	case 2:
		now = 1_700_000_000_000_000 + rng.Int64N(period) // a Unix time in µs
	case 3:
		now = -rng.Int64N(10 * period)
	}
	reqs := make([]request, n)
	for i := range reqs {
		switch x := rng.IntN(20); {
		case x < 6: // same instant
		case x < 12:
			now += rng.Int64N(2*interval + 1)
		case x < 16:
			now += rng.Int64N(period + 1)
		case x < 17:
			now += rng.Int64N(3*period + 1)
		case x < 19: // on, or 1µs either side of, the next window boundary
			now = (floorDiv(now, period)+1)*period + rng.Int64N(3) - 1
		default:
			now += interval
		}
		var cost int64 = 1
		switch x := rng.IntN(20); {
		case x < 2:
			cost = 0
		case x < 6:
			cost = 1 + rng.Int64N(capacity)
		case x < 7:
			cost = capacity
		case x < 8 && p.Algorithm != LeakyBucket:
			cost = capacity + 1 + rng.Int64N(2) // never fits: an error
		case x < 8:
			cost = capacity + rng.Int64N(3)
		}
		if rng.IntN(200) == 0 {
			cost = -1 - rng.Int64N(3)
		}
		reqs[i] = request{now, cost}
	}
	return reqs
}

// propertyPolicies covers each algorithm with whole and fractional intervals, the smallest
// period, capacities of 1, and bursts below, at and above the limit.
func propertyPolicies() []Policy {
	var ps []Policy
	for _, alg := range []Algorithm{FixedWindow, SlidingLog, SlidingWindow} {
		ps = append(ps,
			Policy{Algorithm: alg, Limit: 1, Period: ms},
			Policy{Algorithm: alg, Limit: 3, Period: sec},
			Policy{Algorithm: alg, Limit: 7, Period: 1000003 * µsec},
			Policy{Algorithm: alg, Limit: 20, Period: 1500 * ms},
			Policy{Algorithm: alg, Limit: 100, Period: time.Minute},
		)
	}
	for _, alg := range []Algorithm{TokenBucket, LeakyBucket} {
		ps = append(ps,
			Policy{Algorithm: alg, Limit: 1, Period: ms},
			Policy{Algorithm: alg, Limit: 3, Period: sec},
			Policy{Algorithm: alg, Limit: 3, Period: sec, Burst: 2},
			Policy{Algorithm: alg, Limit: 5, Period: sec, Burst: 20},
			Policy{Algorithm: alg, Limit: 7, Period: 1000001 * µsec, Burst: 3},
			Policy{Algorithm: alg, Limit: 20, Period: 2 * sec, Burst: 30},
			Policy{Algorithm: alg, Limit: 6, Period: 1001 * µsec, Burst: 1},
		)
	}
	return ps
}

func TestProperties(t *testing.T) {
	traces, steps := 40, 120
	if testing.Short() {
		traces = 8
	}
	for _, p := range propertyPolicies() {
		t.Run(fmt.Sprintf("%v/%d per %v burst %d", p.Algorithm, p.Limit, p.Period, p.Burst), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(uint64(p.Algorithm), uint64(p.Limit)<<32|uint64(p.PeriodMicros())))
			for range traces {
				checkAll(t, &p, replay(&p, randomTrace(rng, &p, steps)))
			}
		})
	}
}

// TestClockBackwardProperties runs random traces whose clock steps back now and then.
func TestClockBackwardProperties(t *testing.T) {
	for _, p := range propertyPolicies() {
		rng := rand.New(rand.NewPCG(11, uint64(p.Algorithm)<<32|uint64(p.Limit)))
		for range 15 {
			reqs := randomTrace(rng, &p, 80)
			for i := range reqs { // step back by up to two periods, now and then
				if i > 0 && rng.IntN(6) == 0 {
					back := rng.Int64N(2*p.PeriodMicros() + 1)
					for j := i; j < len(reqs); j++ {
						reqs[j].now -= back
					}
				}
			}
			checkClockBackward(t, &p, replay(&p, reqs))
		}
	}
}

// TestApprovalOnlyEasierWithTime: on any state, a request approved at t is approved at any later
// instant too (absent other traffic). With refusals changing nothing, this is why a clock that
// steps back can never free quota: the past is never more generous than the present.
func TestApprovalOnlyEasierWithTime(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	for _, p := range propertyPolicies() {
		for range 10 {
			recs := replay(&p, randomTrace(rng, &p, 60))
			for i := range recs {
				r := &recs[i]
				if r.err != nil || !r.d.Allowed {
					continue
				}
				for _, later := range []int64{1, 2, p.PeriodMicros() / p.Limit, p.PeriodMicros() - 1, rng.Int64N(3 * p.PeriodMicros())} {
					if d, err := Decide(&p, clone(r.before), r.now+later, r.cost); err != nil || !d.Allowed {
						t.Fatalf("%v: approved at %d but not %dµs later: %+v, %v", p.Algorithm, r.now, later, d, err)
					}
				}
			}
		}
	}
}
