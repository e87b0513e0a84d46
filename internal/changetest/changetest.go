// Package changetest drives a store through changes of a policy's numbers under the same name,
// as a configuration reload or a per-client override makes them: the same state read under
// another limit, burst, period or algorithm. A changed limit or burst keeps what was used; a
// changed period or algorithm starts the key afresh (algorithm.State). Every decision is
// compared with package algorithm's on a virtual clock, and the first one after each change
// with the number worked out by hand, so that a store that restarted or lost the use fails.
package changetest

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
)

// T0 is the instant the scenarios start at: a midnight (UTC) and so a window boundary of every
// period they use.
var T0 = time.Date(2026, 6, 10, 0, 0, 0, 0, time.UTC)

// change is one scenario: 5 units used of the base policy at T0, then the changed policy (or the
// two alternating) decided every quarter period, a peek and a request of cost 1 each time.
type change struct {
	name      string
	to        func(p sluice.Policy) sluice.Policy
	buckets   bool                              // only for the token and the leaky bucket
	alternate bool                              // the base and the changed policy take turns
	peeks     bool                              // after the change, only peeks (no request, no settlement)
	remaining func(changed sluice.Policy) int64 // the first peek's Remaining after the change, by hand
}

// left returns a remaining of n whatever the policy; fresh, the new policy's whole capacity.
func left(n int64) func(sluice.Policy) int64 { return func(sluice.Policy) int64 { return n } }

func fresh(p sluice.Policy) int64 { return p.Capacity() }

// raise raises p's limit from 5 to 8 (and the leaky bucket's room with it).
func raise(p sluice.Policy) sluice.Policy {
	p.Limit = 8
	if p.Algorithm == sluice.LeakyBucket {
		p.Burst = 7
	}
	return p
}

var changes = []change{
	{name: "limit raised", remaining: left(3), to: raise}, // 5 of 8
	// Peeks alone: the first one converts a bucket, and the use drains at 8 a second from then on.
	{name: "limit raised then peeks", peeks: true, remaining: left(3), to: raise},
	{name: "limit lowered", remaining: left(0), to: func(p sluice.Policy) sluice.Policy { // 5 of 3
		p.Limit = 3
		if p.Algorithm == sluice.LeakyBucket {
			p.Burst = 2
		}
		return p
	}},
	{name: "limits alternating", alternate: true, remaining: left(3), to: raise},
	// The token bucket's 5 of a burst of 7: 2 left; the leaky bucket's queue of 5 in a room of 7: 3.
	{name: "burst raised", buckets: true, to: func(p sluice.Policy) sluice.Policy { p.Burst = 7; return p }, remaining: func(p sluice.Policy) int64 {
		if p.Algorithm == sluice.LeakyBucket {
			return 3
		}
		return 2
	}},
	{name: "burst lowered", buckets: true, remaining: left(0), to: func(p sluice.Policy) sluice.Policy { p.Burst = 2; return p }},
	{name: "period changed", remaining: fresh, to: func(p sluice.Policy) sluice.Policy {
		if p.Calendar != sluice.NoCalendar {
			p.Calendar = sluice.Week
		} else {
			p.Period = 2 * time.Second
		}
		return p
	}},
	{name: "algorithm changed", remaining: fresh, to: func(p sluice.Policy) sluice.Policy {
		switch {
		case p.Calendar != sluice.NoCalendar && p.Algorithm == sluice.FixedWindow:
			p.Algorithm = sluice.SlidingWindow
		case p.Calendar != sluice.NoCalendar:
			p.Algorithm = sluice.FixedWindow
		case p.Algorithm == sluice.FixedWindow:
			p.Algorithm = sluice.SlidingLog
		default:
			p.Algorithm, p.Burst = sluice.FixedWindow, 0
		}
		return p
	}},
}

// bases are the policies the scenarios start from: each algorithm at 5 a second (the leaky
// bucket: one served and 4 queued), and the calendar windows at 5 a day.
func bases() []sluice.Policy {
	var out []sluice.Policy
	for _, a := range algorithm.Algorithms {
		p := sluice.Policy{Name: "changed", Algorithm: a, Limit: 5, Period: time.Second}
		if a == sluice.LeakyBucket {
			p.Burst = 4
		}
		out = append(out, p)
	}
	for _, a := range []sluice.Algorithm{sluice.FixedWindow, sluice.SlidingWindow} {
		out = append(out, sluice.Policy{Name: "changed", Algorithm: a, Limit: 5, Calendar: sluice.Day})
	}
	return out
}

// Run runs every scenario on st, whose clock is clock (set here: the store must decide at its
// time), each under a key of its own beginning with prefix: through Decide, and through DecideAll
// beside a limit that never refuses. A DecideAll that refuses writes nothing, not even a bucket's
// conversion to the changed limit; one that approves (or peeks) writes it.
func Run(t *testing.T, st sluice.Store, clock *sluice.ManualClock, prefix string) {
	for _, all := range []bool{false, true} {
		for _, base := range bases() {
			for _, ch := range changes {
				if ch.buckets && base.Algorithm != sluice.TokenBucket && base.Algorithm != sluice.LeakyBucket {
					continue
				}
				run(t, st, clock, fmt.Sprintf("%s-%v-%v-%s-all-%v", prefix, base.Algorithm, base.Calendar, ch.name, all), all, base, ch)
			}
		}
	}
}

// roomy is the limit that never refuses beside the one under test in a DecideAll.
var roomy = sluice.Policy{Name: "roomy", Algorithm: sluice.TokenBucket, Limit: 1 << 40, Period: time.Second}

// run runs one scenario on key.
func run(t *testing.T, st sluice.Store, clock *sluice.ManualClock, key string, all bool, base sluice.Policy, ch change) {
	ctx := context.Background()
	changed := ch.to(base)
	var model algorithm.State
	decide := func(p sluice.Policy, cost int64) (sluice.Decision, error) {
		if !all {
			return st.Decide(ctx, key, p, cost)
		}
		out := make([]sluice.Decision, 2)
		_, err := st.DecideAll(ctx, key, []sluice.Limit{{Policy: p, Cost: cost}, {Policy: roomy, Cost: cost}}, out)
		return out[0], err
	}
	step := func(p sluice.Policy, at time.Time, cost int64, what string) sluice.Decision {
		t.Helper()
		clock.Set(at)
		d, err := decide(p, cost)
		if err != nil {
			t.Fatalf("%s: %s: %v", key, what, err)
		}
		trial := model
		want, _ := algorithm.Decide(&p, &trial, at.UnixMicro(), cost)
		if !all || want.Allowed {
			model = trial
		}
		d.Source = want.Source // (a refusal may come from a store's negative cache)
		if d != want {
			t.Fatalf("%s: %s at %v under limit %d burst %d: %+v, want %+v", key, what, at.Sub(T0), p.Limit, p.Burst, d, want)
		}
		return d
	}
	for i := range 5 {
		if d := step(base, T0, 1, fmt.Sprintf("request %d of 5", i+1)); !d.Allowed {
			t.Fatalf("%s: request %d of 5 refused: %+v", key, i+1, d)
		}
	}
	if d, want := step(changed, T0, 0, "the first peek after the change"), ch.remaining(changed); d.Remaining != want {
		t.Fatalf("%s: the first peek after the change: remaining %d, want %d", key, d.Remaining, want)
	}
	quarter := changed.Period / 4
	if quarter == 0 {
		quarter = 6 * time.Hour // a calendar day's
	}
	// settle settles at now a reservation made at T0 or now, under p, as the model does.
	settle := func(p sluice.Policy, now time.Time, at int64, reserved, actual int64) {
		t.Helper()
		clock.Set(now)
		if err := st.(sluice.Settler).Settle(ctx, key, p, at, reserved, actual); err != nil {
			t.Fatalf("%s: settling %d of %d at %v: %v", key, actual, reserved, now.Sub(T0), err)
		}
		if _, err := algorithm.Settle(&p, &model, at, now.UnixMicro(), reserved, actual); err != nil {
			t.Fatal(err)
		}
	}
	for k := range 9 {
		p := changed
		if ch.alternate && k%2 == 1 {
			p = base
		}
		at := T0.Add(time.Duration(k) * quarter)
		switch {
		case ch.peeks:
		case k == 1: // a refund of a request made before the change, under the new numbers
			settle(p, at, T0.UnixMicro(), 2, 1)
		case k == 3: // an extra charge
			settle(p, at, at.UnixMicro(), 1, 2)
		}
		step(p, at, 0, fmt.Sprintf("a peek after %d quarters", k))
		if !ch.peeks {
			step(p, at, 1, fmt.Sprintf("a request after %d quarters", k))
		}
	}
}

// RunConcurrency checks that a concurrency policy's slots in use are kept under another limit:
// 2 of 2 held, raised to 3, one more; lowered to 1, none until both are given back. st must take
// concurrency policies (a sluice.Leaser).
func RunConcurrency(t *testing.T, st sluice.Store, clock *sluice.ManualClock, prefix string) {
	ctx := context.Background()
	clock.Set(T0)
	leaser := st.(sluice.Leaser)
	two := sluice.Policy{Name: "changed", Algorithm: sluice.Concurrency, Limit: 2, Period: 10 * time.Second}
	acquire := func(key string, p sluice.Policy, id uint64) sluice.Decision {
		t.Helper()
		out := make([]sluice.Decision, 1)
		if _, err := st.DecideAll(ctx, key, []sluice.Limit{{Policy: p, Cost: 1, Lease: id}}, out); err != nil {
			t.Fatalf("%s: lease %d under limit %d: %v", key, id, p.Limit, err)
		}
		return out[0]
	}
	for _, to := range []int64{3, 1} {
		key := fmt.Sprintf("%s-concurrency-to-%d", prefix, to)
		for id := uint64(1); id <= 2; id++ {
			if d := acquire(key, two, id); !d.Allowed {
				t.Fatalf("%s: lease %d of 2 refused: %+v", key, id, d)
			}
		}
		p := two
		p.Limit = to
		if to == 3 {
			if d := acquire(key, p, 3); !d.Allowed || d.Remaining != 0 {
				t.Fatalf("%s: 2 of 2 held, raised to 3: %+v, want exactly one more", key, d)
			}
			if d := acquire(key, p, 4); d.Allowed {
				t.Fatalf("%s: raised to 3, a fourth: %+v, want refused", key, d)
			}
			continue
		}
		for id := uint64(1); id <= 2; id++ {
			if d := acquire(key, p, 3); d.Allowed {
				t.Fatalf("%s: lowered to 1 with %d held: %+v, want refused", key, 3-id, d)
			}
			if err := leaser.Release(ctx, key, p, id); err != nil {
				t.Fatal(err)
			}
		}
		if d := acquire(key, p, 3); !d.Allowed || d.Remaining != 0 {
			t.Fatalf("%s: lowered to 1, both given back: %+v, want allowed", key, d)
		}
	}
}

// RunRacing has 16 goroutines request one key at one instant, each alternating a limit of 50 and
// one of 100 (an override applied and removed while requests race): whatever the interleaving,
// exactly 100 are approved, as both read and write one use. For each rate algorithm (the leaky
// bucket with room for its limit).
func RunRacing(t *testing.T, st sluice.Store, clock *sluice.ManualClock, prefix string) {
	clock.Set(T0.Add(time.Hour))
	for _, base := range bases()[:len(algorithm.Algorithms)] {
		lo, hi := base, base
		lo.Limit, hi.Limit, lo.Period, hi.Period = 50, 100, time.Hour, time.Hour
		if base.Algorithm == sluice.LeakyBucket {
			lo.Burst, hi.Burst = 49, 99
		}
		key := fmt.Sprintf("%s-racing-%v", prefix, base.Algorithm)
		var approved atomic.Int64
		var wg sync.WaitGroup
		for g := range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 25 {
					p := lo
					if (g+i)%2 == 1 {
						p = hi
					}
					d, err := st.Decide(context.Background(), key, p, 1)
					if err != nil {
						t.Error(err)
						return
					}
					if d.Allowed {
						approved.Add(1)
					}
				}
			}()
		}
		wg.Wait()
		if n := approved.Load(); n != 100 {
			t.Errorf("%s: %d of 400 approved under limits 50 and 100 alternating; want exactly 100", key, n)
		}
	}
}
