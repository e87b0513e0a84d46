package algorithm

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
)

// A caller that holds a leaky-bucket request for at most maxDelay (DecideWithin) gets, on every
// state, exactly the decision "approved and held no longer than maxDelay" — and a request it
// refuses for its hold changes nothing, and its RetryAfter is exact. 20 requests at once on 10/s
// with room for 100, held at most 200ms: 3 approved (held 0, 100ms, 200ms), 17 refused, and the
// queue is 300ms deep, not 2s.
func TestDecideWithinMaxDelay(t *testing.T) {
	p := Policy{Algorithm: LeakyBucket, Limit: 10, Period: sec, Burst: 100}
	var s State
	approved := 0
	for i := range 20 {
		d, err := decideWithin(&p, &s, 0, 1, 200_000)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			approved++
			if d.Delay > 200*ms {
				t.Fatalf("request %d approved with a hold of %v > 200ms", i, d.Delay)
			}
		} else if want := 100 * ms; i == 3 && d.RetryAfter != want {
			t.Fatalf("request %d: RetryAfter %v, want %v (when its hold would be 200ms)", i, d.RetryAfter, want)
		}
	}
	if approved != 3 {
		t.Fatalf("approved %d of 20, want 3", approved)
	}
	if until := gcraUntil(&s, 0); until != 300_000 {
		t.Fatalf("queue %d µs deep after 17 refusals, want 300000: the refusals consumed", until)
	}
	d, _ := decideWithin(&p, &s, 100_000, 1, 200_000)
	if !d.Allowed || d.Delay != 200*ms {
		t.Fatalf("at the RetryAfter the request passes, held 200ms: %+v", d)
	}
}

// decideWithin is DecideWithin returning its Decision.
func decideWithin(p *Policy, s *State, now, cost, maxDelay int64) (Decision, error) {
	var d Decision
	err := DecideWithin(p, s, now, cost, maxDelay, &d)
	return d, err
}

func TestDecideWithinProperties(t *testing.T) {
	for _, p := range propertyPolicies() {
		if p.Algorithm != LeakyBucket {
			continue
		}
		t.Run(fmt.Sprintf("%d per %v burst %d", p.Limit, p.Period, p.Burst), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(p.Limit), uint64(p.PeriodMicros())))
			for range 40 {
				reqs := randomTrace(rng, &p, 120)
				bound := rng.Int64N(3 * p.PeriodMicros())
				if rng.IntN(5) == 0 {
					bound = 0 // no hold at all
				}
				checkWithin(t, &p, reqs, bound)
			}
		})
	}
}

// checkWithin replays reqs with DecideWithin(bound) and checks each decision against Decide's on
// the same state: approved iff Decide approves with a Delay ≤ bound (then the same decision); a
// refusal changes nothing and its RetryAfter is exact.
func checkWithin(t *testing.T, p *Policy, reqs []request, bound int64) {
	t.Helper()
	var s State
	last := int64(-1 << 62)
	for _, r := range reqs {
		if r.now < last {
			continue // RetryAfter is exact for a clock that does not run backward
		}
		last = r.now
		before := *clone(&s)
		plain := *clone(&s)
		want, wantErr := Decide(p, &plain, r.now, r.cost)
		got, err := decideWithin(p, &s, r.now, r.cost, bound)
		if (err == nil) != (wantErr == nil) {
			t.Fatalf("bound %d, %v: error %v, Decide's %v", bound, r, err, wantErr)
		}
		if err != nil {
			continue
		}
		fits := want.Allowed && want.Delay.Microseconds() <= bound
		if got.Allowed != fits {
			t.Fatalf("bound %d, %v on %+v: allowed %v, want %v (Decide: %+v)", bound, r, before, got.Allowed, fits, want)
		}
		if got.Allowed {
			if got.Delay != want.Delay || got.RetryAfter != 0 || !reflect.DeepEqual(luaLike(&s), luaLike(&plain)) {
				t.Fatalf("bound %d, %v: approved %+v, Decide %+v", bound, r, got, want)
			}
			continue
		}
		if !reflect.DeepEqual(luaLike(&s), luaLike(&before)) {
			t.Fatalf("bound %d, %v: a refusal changed the state %+v -> %+v", bound, r, before, s)
		}
		if r.cost == 0 {
			continue
		}
		retry := got.RetryAfter.Microseconds()
		at := *clone(&before)
		if d, _ := decideWithin(p, &at, r.now+retry, r.cost, bound); !d.Allowed {
			t.Fatalf("bound %d, %v: refused with RetryAfter %v, but refused again then: %+v", bound, r, got.RetryAfter, d)
		}
		at = *clone(&before)
		if d, _ := decideWithin(p, &at, r.now+retry-1, r.cost, bound); d.Allowed {
			t.Fatalf("bound %d, %v: refused with RetryAfter %v, but approved 1µs earlier", bound, r, got.RetryAfter)
		}
	}
}

// luaLike is a state's stored fields, without the derived cache.
func luaLike(s *State) State {
	c := *s
	c.cache = derived{}
	return c
}
