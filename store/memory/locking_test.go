package memory

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/sluicehq/sluice"
)

// The stores the locking tests run on: many keys over the default shards, and every key in one
// shard and one probe chain (so that lookups race with insertions, removals and resizes of the
// very places they read).
var lockingStores = []struct {
	name     string
	hashMask uint64
	opts     []Option
}{
	{"sharded", ^uint64(0), nil},
	{"one chain", 0, []Option{WithShards(1)}},
}

// Decisions from many goroutines on a key held under a policy are each decided on the state the
// one before left, as under one lock, while other goroutines add keys (growing the tables),
// add policies to held keys (the clients' further slots), decide over several keys at once and
// sweep: under a limit no decision reaches, each decision's Remaining is the limit less the
// number decided so far on that key, so the Remaining values a key gave are exactly
// limit-1, limit-2, ... with none twice (a decision lost, or a key's state lost and started
// afresh, would give one twice).
func TestParallelDecisionsAreSerialPerKey(t *testing.T) {
	for _, tc := range lockingStores {
		for _, nkeys := range []int{3, 1500} {
			t.Run(fmt.Sprintf("%s/keys=%d", tc.name, nkeys), func(t *testing.T) {
				clock := sluice.NewManualClock(time.UnixMicro(1_000_000))
				s := New(append([]Option{WithClock(clock)}, tc.opts...)...)
				s.hashMask = tc.hashMask
				const limit = 1 << 40
				policies := []sluice.Policy{
					{Name: "a", Algorithm: sluice.FixedWindow, Limit: limit, Period: time.Hour},
					{Name: "b", Algorithm: sluice.TokenBucket, Limit: limit, Period: time.Hour},
					{Name: "c", Algorithm: sluice.SlidingWindow, Limit: limit, Period: time.Hour},
				}
				const goroutines, perGoroutine = 8, 3000
				seen := make([]map[string][]int64, goroutines) // per goroutine: key|policy → Remaining values
				var wg, sweeper sync.WaitGroup
				stop := make(chan struct{})
				sweeper.Add(1)
				go untilStopped(&sweeper, stop, s.Sweep)
				for g := range goroutines {
					wg.Add(1)
					go func() {
						defer wg.Done()
						ctx := context.Background()
						rng := rand.New(rand.NewPCG(uint64(g), uint64(nkeys)))
						seen[g] = map[string][]int64{}
						record := func(key string, p *sluice.Policy, d sluice.Decision) {
							if !d.Allowed {
								t.Errorf("%s under %s refused under a limit no decision reaches", key, p.Name)
							}
							seen[g][key+"|"+p.Name] = append(seen[g][key+"|"+p.Name], d.Remaining)
						}
						for range perGoroutine {
							key := fmt.Sprint("k", rng.IntN(nkeys))
							p := &policies[rng.IntN(len(policies))]
							// Two keys under one call: two shards' locks or one. (Not one key twice
							// under one policy: both limits would decide on the state as it was.)
							if other := fmt.Sprint("k", rng.IntN(nkeys)); rng.IntN(8) == 0 && other != key {
								limits := []sluice.Limit{{Policy: *p, Cost: 1}, {Key: other, Policy: policies[0], Cost: 1}}
								out := make([]sluice.Decision, 2)
								if ok, err := s.DecideAll(ctx, key, limits, out); !ok || err != nil {
									t.Errorf("DecideAll %s, %s: %v %v", key, other, ok, err)
									return
								}
								record(key, p, out[0])
								record(other, &policies[0], out[1])
								continue
							}
							d, err := s.Decide(ctx, key, *p, 1)
							if err != nil {
								t.Error(err)
								return
							}
							record(key, p, d)
						}
					}()
				}
				wg.Wait()
				close(stop)
				sweeper.Wait()
				all := map[string][]int64{}
				for _, m := range seen {
					for k, v := range m {
						all[k] = append(all[k], v...)
					}
				}
				for k, v := range all {
					slices.Sort(v)
					for i, r := range v {
						if want := limit - int64(len(v)-i); r != want {
							t.Fatalf("%s: Remaining values %v..., want %d decisions serialised (limit-%d .. limit-1)", k, v[:min(len(v), 8)], len(v), len(v))
						}
					}
				}
				if n := s.Len(); n != len(all) {
					t.Errorf("Len = %d, want %d key-and-policy pairs", n, len(all))
				}
				checkTables(t, s)
			})
		}
	}
}

// A key swept while another goroutine is deciding on it is decided either before the sweep (and
// then it is not idle, and is kept) or after it, on a fresh state that is kept: a lookup that
// found the client before the sweep removed it must not decide on it, since a decision on a
// removed client is lost and the key's next decision would start afresh.
//
// The test holds the client's lock, so that a sweep (which then waits for it, holding the shard's
// lock) and then a decision (which has found the client, and waits for it too) queue on it in
// that order; released, the lock goes to the sweep first. A token bucket of 1 per day approves
// the decision and refuses the next one, as under one lock.
func TestSweptClientIsNotDecidedOn(t *testing.T) {
	for _, tc := range lockingStores {
		t.Run(tc.name, func(t *testing.T) {
			clock := sluice.NewManualClock(time.UnixMicro(0))
			s := New(append([]Option{WithClock(clock), WithSweepInterval(1000 * time.Hour)}, tc.opts...)...)
			s.hashMask = tc.hashMask
			p := sluice.Policy{Name: "daily", Algorithm: sluice.TokenBucket, Limit: 1, Period: 24 * time.Hour}
			ctx := context.Background()
			for round := range 50 {
				key := fmt.Sprint("k", round)
				if d, _ := s.Decide(ctx, key, p, 1); !d.Allowed {
					t.Fatalf("round %d: the first request refused", round)
				}
				clock.Advance(48 * time.Hour) // the key is idle: the sweep will remove it
				h := s.hash.String(key) & s.hashMask
				c := s.shards[h&s.mask].find(h, key)
				c.mu.Lock()
				var wg sync.WaitGroup
				wg.Add(2)
				go func() { defer wg.Done(); s.Sweep() }()
				waitForWaiters(&c.mu, 1)
				var decided sluice.Decision
				go func() { defer wg.Done(); decided, _ = s.Decide(ctx, key, p, 1) }()
				waitForWaiters(&c.mu, 2)
				c.mu.Unlock()
				wg.Wait()
				if !decided.Allowed {
					t.Fatalf("round %d: the request racing the sweep refused", round)
				}
				if d, _ := s.Decide(ctx, key, p, 1); d.Allowed {
					t.Fatalf("round %d: a second request within the day approved: the first was decided on a removed client", round)
				}
			}
		})
	}
}

// waitForWaiters waits until n goroutines are parked on mu, reading the waiter count that
// sync.Mutex keeps above its three flag bits.
func waitForWaiters(mu *sync.Mutex, n int32) {
	state := (*int32)(unsafe.Pointer(mu))
	for atomic.LoadInt32(state)>>3 < n {
		runtime.Gosched()
	}
}

// Eviction at the key bound, sweeps that empty tables and shrink them, and insertions that grow
// them again, all at once with decisions from many goroutines: the tables stay consistent, the
// bound holds, and each key's decisions under a limit none reaches form runs limit-1,
// limit-2, ... each started by the key's first decision or by an eviction (a state lost or
// decided twice would show as a value more often than a run start allows).
func TestParallelEvictionAndSweeps(t *testing.T) {
	for _, tc := range lockingStores {
		t.Run(tc.name, func(t *testing.T) {
			clock := sluice.NewManualClock(time.UnixMicro(0))
			const bound = 64
			// Four shards at most (16 keys each), so that a new key finds one to evict.
			s := New(append([]Option{WithClock(clock), WithMaxKeys(bound), WithSweepInterval(time.Millisecond), WithShards(4)}, tc.opts...)...)
			s.hashMask = tc.hashMask
			const limit = 1 << 40
			long := sluice.Policy{Name: "long", Algorithm: sluice.FixedWindow, Limit: limit, Period: 1000 * time.Hour}
			short := sluice.Policy{Name: "short", Algorithm: sluice.TokenBucket, Limit: 1, Period: time.Millisecond}
			const goroutines, perGoroutine, nkeys = 8, 3000, 300
			seen := make([]map[string][]int64, goroutines)
			var wg, helpers sync.WaitGroup
			stop := make(chan struct{})
			helpers.Add(2)
			// The clock: short states go idle, decisions sweep their shards.
			go untilStopped(&helpers, stop, func() { clock.Advance(100 * time.Microsecond); runtime.Gosched() })
			go untilStopped(&helpers, stop, s.Sweep)
			for g := range goroutines {
				wg.Add(1)
				go func() {
					defer wg.Done()
					ctx := context.Background()
					rng := rand.New(rand.NewPCG(uint64(g), 7))
					seen[g] = map[string][]int64{}
					for range perGoroutine {
						key := fmt.Sprint("k", rng.IntN(nkeys))
						if rng.IntN(2) == 0 {
							if _, err := s.Decide(ctx, key, short, 1); err != nil {
								t.Error(err)
								return
							}
							continue
						}
						d, err := s.Decide(ctx, key, long, 1)
						if err != nil {
							t.Error(err)
							return
						}
						seen[g][key] = append(seen[g][key], d.Remaining)
					}
				}()
			}
			wg.Wait()
			close(stop)
			helpers.Wait()
			runs := 0
			for key := range seen[0] {
				counts := map[int64]int{}
				for g := range seen {
					for _, r := range seen[g][key] {
						counts[r]++
					}
				}
				runs += counts[limit-1]
				for r, n := range counts {
					if r < limit-1 && n > counts[r+1] {
						t.Fatalf("%s: Remaining %d given %d times, %d given %d times: not runs from a fresh state", key, r, n, r+1, counts[r+1])
					}
				}
			}
			if runs > nkeys+int(s.Evictions()) {
				t.Errorf("%d fresh starts of the long policy, more than %d keys and %d evictions allow", runs, nkeys, s.Evictions())
			}
			if n := s.Len(); n > bound {
				t.Errorf("Len = %d, over the bound %d", n, bound)
			}
			checkTables(t, s)
		})
	}
}

// untilStopped calls f over and over until stop is closed, then marks wg done.
func untilStopped(wg *sync.WaitGroup, stop <-chan struct{}, f func()) {
	defer wg.Done()
	for {
		select {
		case <-stop:
			return
		default:
			f()
		}
	}
}
