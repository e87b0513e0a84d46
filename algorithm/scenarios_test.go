package algorithm

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"
)

// Typical traffic and the edges every algorithm shares, run on all five algorithms.

// steadyBurstTraffic is the trace "5/s for 10s; 40 in 1s; 5/s for 10s": evenly spaced, each
// segment's first request at its start. It returns the instants (µs) and each one's segment.
func steadyBurstTraffic() (at []int64, segment []int) {
	add := func(seg int, start, n, gap int64) {
		for i := range n {
			at, segment = append(at, start+i*gap), append(segment, seg)
		}
	}
	add(0, 0, 50, 200_000)          // 5/s for 10s: 0, 0.2s, ..., 9.8s
	add(1, 10_000_000, 40, 25_000)  // 40 in 1s: 10s, 10.025s, ..., 10.975s
	add(2, 11_000_000, 50, 200_000) // 5/s for 10s: 11s, ..., 20.8s
	return at, segment
}

func TestSteadyBurstSteady(t *testing.T) {
	// Approved per segment, worked out by hand:
	//   fixed-window: 5 per aligned second, so 5 of the 40 in [10s, 11s).
	//   sliding-log: at 10s the requests at 9.2..9.8s still count (4), so 10.0s fits; then one
	//     more each time one of them expires: 10.2, 10.4, 10.6, 10.8s. At 11s the one at 10s expires.
	//   sliding-window: prev = 5 makes the request at a window's start count 6 > 5, so each second
	//     after the first takes 4 (at e = 0.2..0.8s; then prev = 4 and it takes e = 0, 0.4, 0.6, 0.8);
	//     in the burst's second, with prev = 4: e = 0, 0.25, 0.5, 0.75 (cur ≤ 4e).
	//   token-bucket (40, 5/s): full at 10s; request i of the burst finds tat - now = 0.175i s ≤
	//     39·0.2s, and the third segment 7s ≤ 7.8s: all admitted.
	//   leaky-bucket (room 40·0.2s = 8s): request i of the burst waits 0.2i - 0.025i = 0.175i s,
	//     at most 6.825s; after the burst tat = 18s, so each request of the third segment at
	//     11s + 0.2j waits 18 + 0.2j - 11 - 0.2j = 7s exactly. The largest delay is 7s.
	cases := []struct {
		alg      Algorithm
		burst    int64
		admitted [3]int
	}{
		{FixedWindow, 0, [3]int{50, 5, 50}},
		{SlidingLog, 0, [3]int{50, 5, 50}},
		{SlidingWindow, 0, [3]int{41, 4, 40}},
		{TokenBucket, 40, [3]int{50, 40, 50}},
		{LeakyBucket, 40, [3]int{50, 40, 50}},
	}
	at, segment := steadyBurstTraffic()
	for _, c := range cases {
		t.Run(c.alg.String(), func(t *testing.T) {
			p := Policy{Algorithm: c.alg, Limit: 5, Period: sec, Burst: c.burst}
			s := new(State)
			var admitted [3]int
			var maxDelay time.Duration
			for i, now := range at {
				d, err := Decide(&p, s, now, 1)
				if err != nil {
					t.Fatalf("request %d at %v: %v", i, micros(now), err)
				}
				if d.Allowed {
					admitted[segment[i]]++
				}
				maxDelay = max(maxDelay, d.Delay)
				if c.alg != LeakyBucket {
					continue
				}
				var want time.Duration
				switch segment[i] {
				case 1:
					want = time.Duration(i-50) * 175 * ms
				case 2:
					want = 7 * sec
				}
				if d.Delay != want {
					t.Errorf("request %d at %v: Delay %v, want %v", i, micros(now), d.Delay, want)
				}
			}
			if admitted != c.admitted {
				t.Errorf("admitted per segment %v, want %v", admitted, c.admitted)
			}
			if c.alg == LeakyBucket && maxDelay != 7*sec {
				t.Errorf("largest delay %v, want 7s", maxDelay)
			}
		})
	}
}

// A period that is not a whole number of µs per unit: 3 per second, T = 333333.33µs.
// A greedy client (retrying exactly at RetryAfter) gets the k-th token after the first burst
// at ⌈k·T⌉µs, exactly, for an hour: nothing drifts.
func TestFractionalIntervalNoDrift(t *testing.T) {
	const hour = 3600_000_000
	for _, c := range []struct {
		alg   Algorithm
		burst int64
		// first: how many the bucket holds at once (the token bucket's capacity); admitted: how
		// many a greedy client gets in [0, 1h].
		first    int64
		admitted int64
	}{
		// Capacity C: C at once, then the k-th token at ⌈k·T⌉: C + 10800 in the hour.
		{TokenBucket, 0, 3, 3 + 10800},
		{TokenBucket, 7, 7, 7 + 10800},
		// A queue of B: request k starts at ⌈k·T⌉, and is admitted (at most) B·T earlier; in the
		// hour the requests 0..10800+B are admitted.
		{LeakyBucket, 2, 0, 2 + 10801},
	} {
		t.Run(fmt.Sprintf("%v burst %d", c.alg, c.burst), func(t *testing.T) {
			p := Policy{Algorithm: c.alg, Limit: 3, Period: sec, Burst: c.burst}
			s := new(State)
			var now, admitted, refused int64
			for now <= hour {
				d, err := Decide(&p, s, now, 1)
				if err != nil {
					t.Fatal(err)
				}
				if !d.Allowed {
					refused++
					checkRetryExact(t, fmt.Sprintf("at %dµs", now), &p, s, now, 1, d.RetryAfter)
					now += us(d.RetryAfter)
					continue
				}
				k := admitted - c.first + 1 // the k-th after the first burst (token bucket)
				if c.alg == LeakyBucket {
					k = admitted // request k starts at ⌈k·T⌉
					if start := now + us(d.Delay); start != (k*1_000_000+2)/3 {
						t.Fatalf("request %d admitted at %dµs starts at %dµs, want ⌈%d·T⌉ = %d", k, now, start, k, (k*1_000_000+2)/3)
					}
				} else if k > 0 && now != (k*1_000_000+2)/3 {
					t.Fatalf("token %d taken at %dµs, want ⌈%d·T⌉ = %d", k, now, k, (k*1_000_000+2)/3)
				}
				admitted++
			}
			if admitted != c.admitted {
				t.Errorf("admitted %d in an hour, want %d", admitted, c.admitted)
			}
			if refused > admitted+1 {
				t.Errorf("refused %d: a greedy client should be refused about once per approval", refused)
			}
		})
	}
}

// A steady fast stream (one request per ms) on a token bucket of 3 per second: by any instant t,
// exactly 3 + ⌊3t/1s⌋ are admitted, and every 3 seconds of the stream after the first hold exactly 9.
func TestFractionalIntervalSteadyStream(t *testing.T) {
	p := Policy{Algorithm: TokenBucket, Limit: 3, Period: sec}
	s := new(State)
	const n = 60_000 // 60s
	admittedBy := make([]int64, n+1)
	var admitted int64
	for i := range int64(n + 1) {
		now := i * 1000
		d, err := Decide(&p, s, now, 1)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			admitted++
		}
		admittedBy[i] = admitted
		if want := min(i+1, 3) + 3*now/1_000_000; admitted != want { // the first 3 go at 0, 1, 2ms
			t.Fatalf("by %dms admitted %d, want %d", i, admitted, want)
		}
	}
	for a := 1000; a+3000 <= n; a++ { // [a, a+3s) in ms
		if got := admittedBy[a+2999] - admittedBy[a-1]; got != 9 {
			t.Fatalf("[%dms, %dms): admitted %d, want 9", a, a+3000, got)
		}
	}
}

func policiesForEdges() []Policy {
	return []Policy{
		{Name: "fixed", Algorithm: FixedWindow, Limit: 10, Period: sec},
		{Name: "log", Algorithm: SlidingLog, Limit: 10, Period: sec},
		{Name: "window", Algorithm: SlidingWindow, Limit: 10, Period: sec},
		{Name: "token", Algorithm: TokenBucket, Limit: 5, Period: sec, Burst: 10},
		{Name: "leaky", Algorithm: LeakyBucket, Limit: 10, Period: sec, Burst: 9},
	}
}

// someTraffic puts a few approved requests on s at 0..900ms.
func someTraffic(t *testing.T, p *Policy, s *State) {
	t.Helper()
	for i := range int64(4) {
		if _, err := Decide(p, s, i*300_000, 2); err != nil {
			t.Fatal(err)
		}
	}
}

func TestCostAboveCapacityIsAnError(t *testing.T) {
	for _, p := range policiesForEdges() {
		t.Run(p.Algorithm.String(), func(t *testing.T) {
			s := new(State)
			someTraffic(t, &p, s)
			before := clone(s)
			cost := p.Capacity() + 1
			if p.Algorithm == LeakyBucket {
				cost = 1 << 62 // the queue takes any cost it can drain before the clock ends
			}
			for _, now := range []int64{900_000, 5_000_000, 1 << 50} {
				d, err := Decide(&p, s, now, cost)
				if !errors.Is(err, ErrCostExceedsLimit) {
					t.Fatalf("cost %d at %d: error %v, want ErrCostExceedsLimit", cost, now, err)
				}
				if d.Allowed || d.RetryAfter != Never || d.Limit != p.Capacity() {
					t.Errorf("cost %d: %+v, want refused, RetryAfter Never, Limit %d", cost, d, p.Capacity())
				}
				if !strings.Contains(err.Error(), fmt.Sprintf("cost %d", cost)) || !strings.Contains(err.Error(), fmt.Sprintf("%q", p.Name)) {
					t.Errorf("error %q should name the cost and the policy", err)
				}
				if !reflect.DeepEqual(s, before) {
					t.Fatalf("an impossible cost changed the state: %+v -> %+v", before, s)
				}
			}
			if p.Algorithm != LeakyBucket { // exactly the capacity is not an error
				if _, err := Decide(&p, new(State), 0, p.Capacity()); err != nil {
					t.Errorf("cost = capacity %d on a fresh key: %v", p.Capacity(), err)
				}
			}
		})
	}
}

func TestNegativeCostIsAnError(t *testing.T) {
	for _, p := range policiesForEdges() {
		t.Run(p.Algorithm.String(), func(t *testing.T) {
			s := new(State)
			someTraffic(t, &p, s)
			before := clone(s)
			for _, cost := range []int64{-1, -5, -1 << 63} {
				d, err := Decide(&p, s, 950_000, cost)
				if !errors.Is(err, ErrInvalidCost) || d.Allowed {
					t.Errorf("cost %d: %+v, %v; want refused with ErrInvalidCost", cost, d, err)
				}
				if !reflect.DeepEqual(s, before) {
					t.Fatalf("cost %d changed the state", cost)
				}
			}
		})
	}
}

// A cost of 0 reports the decision a cost-1 request's quota would see and changes nothing.
func TestPeekChangesNothing(t *testing.T) {
	for _, p := range policiesForEdges() {
		t.Run(p.Algorithm.String(), func(t *testing.T) {
			s := new(State)
			for now := int64(0); now < 3_000_000; now += 37_000 {
				before := clone(s)
				peek, err := Decide(&p, s, now, 0)
				if err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(s, before) {
					t.Fatalf("at %d a peek changed the state %+v -> %+v", now, before, s)
				}
				if again, _ := Decide(&p, s, now, 0); again != peek {
					t.Fatalf("at %d two peeks differ: %+v, %+v", now, peek, again)
				}
				// A peek's Remaining is what a cost-1 request sees before it is decided.
				d, err := Decide(&p, s, now, 1)
				if err != nil {
					t.Fatal(err)
				}
				if want := peek.Remaining - 1; d.Allowed && d.Remaining != want {
					t.Fatalf("at %d: Remaining %d after a request, %d before it (peek)", now, d.Remaining, peek.Remaining)
				}
				if !d.Allowed && (peek.Remaining != 0 || d.Remaining != 0) {
					t.Fatalf("at %d: refused with Remaining %d (peek: %d), want 0", now, d.Remaining, peek.Remaining)
				}
			}
		})
	}
}

// However far back the clock jumps, an exhausted key stays exhausted: a backward step never
// frees quota, never moves RetryAfter's target instant earlier, and changes no state.
func TestClockBackwardNeverFreesQuota(t *testing.T) {
	for _, p := range policiesForEdges() {
		t.Run(p.Algorithm.String(), func(t *testing.T) {
			s := new(State)
			const at = 10_500_000 // exhaust the key here
			var target int64      // when a request may come again, seen from at
			for {
				d, err := Decide(&p, s, at, 1)
				if err != nil {
					t.Fatal(err)
				}
				if !d.Allowed {
					target = at + us(d.RetryAfter)
					break
				}
			}
			before := clone(s)
			for _, back := range []int64{1, 999, 500_000, 999_999, 1_000_000, 1_000_001, 3_600_000_000, 1 << 50} {
				now := at - back
				d, err := Decide(&p, s, now, 1)
				if err != nil || d.Allowed {
					t.Fatalf("%dµs back: %+v, %v; want refused", back, d, err)
				}
				if now+us(d.RetryAfter) < target {
					t.Errorf("%dµs back: retry at %d, before %d, when it is retried from the present", back, now+us(d.RetryAfter), target)
				}
				if d.Remaining != 0 {
					t.Errorf("%dµs back: Remaining %d, want 0", back, d.Remaining)
				}
				if peek, _ := Decide(&p, s, now, 0); peek.Remaining != 0 {
					t.Errorf("%dµs back: a peek's Remaining %d, want 0", back, peek.Remaining)
				}
				if !reflect.DeepEqual(s, before) {
					t.Fatalf("%dµs back: the state changed %+v -> %+v", back, before, s)
				}
			}
		})
	}
}

func TestDecideBeforeFirstUseIsFull(t *testing.T) {
	for _, p := range policiesForEdges() {
		for _, now := range []int64{0, 1, -1, 1_700_000_000_000_000, -(1 << 52), 1 << 53} {
			d, err := Decide(&p, new(State), now, 0)
			if err != nil || !d.Allowed || d.Remaining != p.Capacity() || d.ResetAfter != 0 || d.Delay != 0 {
				t.Errorf("%v at %d on a new key: %+v, %v; want allowed with Remaining %d", p.Algorithm, now, d, err, p.Capacity())
			}
			if !IsIdle(&p, new(State), now) {
				t.Errorf("%v at %d: a new key is not idle", p.Algorithm, now)
			}
		}
	}
}

// A state written by another algorithm means nothing to this one: the key starts afresh.
func TestStateOfAnotherAlgorithmStartsAfresh(t *testing.T) {
	for _, from := range policiesForEdges() {
		for _, to := range policiesForEdges() {
			if from.Algorithm == to.Algorithm {
				continue
			}
			s := new(State)
			for range 30 {
				Decide(&from, s, 1_000_000, 1)
			}
			d, err := Decide(&to, s, 1_000_000, 0)
			if err != nil || d.Remaining != to.Capacity() || d.ResetAfter != 0 {
				t.Errorf("%v after %v: %+v, %v; want a full quota", to.Algorithm, from.Algorithm, d, err)
			}
			fresh, _ := Decide(&to, new(State), 1_000_000, 1)
			if d, _ := Decide(&to, s, 1_000_000, 1); d != fresh {
				t.Errorf("%v after %v: %+v, want as on a new key %+v", to.Algorithm, from.Algorithm, d, fresh)
			}
		}
	}
}

// At the very ends of int64 time nothing may panic. (Exactness is promised for |now| < 2^62,
// which the property and fuzz traces reach; within a window of MaxInt64 the window and token
// arithmetic overflows: see the package's report.)
func TestExtremeInstantsDoNotPanic(t *testing.T) {
	instants := []int64{math.MinInt64, math.MinInt64 + 1, -(1 << 62), -1, 0, 1 << 62, math.MaxInt64 - 1_000_000_000_000, math.MaxInt64 - 1, math.MaxInt64}
	for _, p := range policiesForEdges() {
		for _, a := range instants {
			for _, b := range instants {
				s := new(State)
				for _, now := range []int64{a, b, a, b} {
					for _, cost := range []int64{1, 0, p.Capacity(), math.MaxInt64} {
						Decide(&p, s, now, cost)
						IsIdle(&p, s, now)
					}
				}
			}
		}
	}
}
