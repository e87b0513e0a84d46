package memory

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/store/storetest"
)

// DecideAll with limits under several keys (sluice.Limit.Key) on the memory store.

func keysPolicy(name string) sluice.Policy {
	return sluice.Policy{Name: name, Algorithm: sluice.FixedWindow, Limit: 5, Period: time.Hour}
}

// shardOf returns the index of key's shard in s.
func shardOf(s *Store, key string) uint64 {
	return s.hash.String(key) & s.hashMask & s.mask
}

// keysIn returns n keys of the form prefix-N whose shard in s is shard.
func keysIn(s *Store, shard uint64, prefix string, n int) []string {
	var keys []string
	for i := 0; len(keys) < n; i++ {
		if k := fmt.Sprintf("%s-%d", prefix, i); shardOf(s, k) == shard {
			keys = append(keys, k)
		}
	}
	return keys
}

// At the key bound, a DecideAll under several keys makes room in every shard for the states new
// there before it writes any, never by evicting or dropping a key of the call (any of them, not
// only the call's own key), and if a shard has no room it fails with ErrFull having written
// nothing in any shard.
func TestDecideAllKeysAtTheBound(t *testing.T) {
	ctx := context.Background()
	x := keysPolicy("x")
	remaining := func(s *Store, key string) int64 {
		t.Helper()
		d, err := s.Decide(ctx, key, x, 0)
		if err != nil {
			t.Fatal(err)
		}
		return d.Remaining
	}
	fill := func(s *Store, keys ...string) {
		t.Helper()
		for _, k := range keys {
			if d, err := s.Decide(ctx, k, x, 1); err != nil || !d.Allowed {
				t.Fatalf("filling %s: %+v %v", k, d, err)
			}
		}
	}
	three := func(key, other, fresh string) []sluice.Limit {
		return []sluice.Limit{{Policy: x, Cost: 1}, {Key: other, Policy: x, Cost: 1}, {Key: fresh, Policy: x, Cost: 1}}
	}
	out := make([]sluice.Decision, 3)

	t.Run("only-keys-of-the-call-to-evict", func(t *testing.T) {
		// One shard of 2, holding a and b; a call on a, b and a new d: the only clients to evict
		// are the call's own, so ErrFull, and nothing is written (b keeps its state).
		s := New(WithClock(sluice.NewManualClock(time.UnixMicro(0))), WithShards(1), WithMaxKeys(2))
		fill(s, "a", "b")
		if _, err := s.DecideAll(ctx, "a", three("a", "b", "d"), out); !errors.Is(err, ErrFull) {
			t.Fatalf("a new state, only the call's keys to evict: %v, want ErrFull", err)
		}
		if ga, gb, n := remaining(s, "a"), remaining(s, "b"), s.Len(); ga != 4 || gb != 4 || n != 2 || s.Evictions() != 0 {
			t.Fatalf("a %d, b %d left, %d keys, %d evictions; want 4, 4, 2 and none", ga, gb, n, s.Evictions())
		}
		checkTables(t, s)
	})
	t.Run("another-key-is-evicted", func(t *testing.T) {
		// One shard of 3, holding a, b and c: c, the one key not in the call, is evicted.
		s := New(WithClock(sluice.NewManualClock(time.UnixMicro(0))), WithShards(1), WithMaxKeys(3))
		fill(s, "a", "b", "c")
		if ok, err := s.DecideAll(ctx, "a", three("a", "b", "d"), out); err != nil || !ok {
			t.Fatalf("a new state, c to evict: %v %v", ok, err)
		}
		if ga, gb, gc, gd := remaining(s, "a"), remaining(s, "b"), remaining(s, "c"), remaining(s, "d"); ga != 3 || gb != 3 || gc != 5 || gd != 4 || s.Evictions() != 1 {
			t.Fatalf("a %d, b %d, c %d, d %d left, %d evictions; want 3, 3, 5 (evicted), 4 and one", ga, gb, gc, gd, s.Evictions())
		}
		checkTables(t, s)
	})
	t.Run("idle-key-of-the-call-is-kept", func(t *testing.T) {
		// Rejecting when full, one shard of 2: a holds a state, b an idle one (its window has
		// passed). b's idle state may not be dropped to make room: it is the call's.
		clock := sluice.NewManualClock(time.UnixMicro(0))
		s := New(WithClock(clock), WithShards(1), WithMaxKeys(2), WithRejectWhenFull(), WithSweepInterval(1000*time.Hour))
		fill(s, "b")
		clock.Set(time.UnixMicro(int64(time.Hour / time.Microsecond)))
		fill(s, "a")
		if _, err := s.DecideAll(ctx, "a", three("a", "b", "d"), out); !errors.Is(err, ErrFull) {
			t.Fatalf("room only by dropping the call's idle b: %v, want ErrFull", err)
		}
		if ga, n := remaining(s, "a"), s.Len(); ga != 4 || n != 2 {
			t.Fatalf("a %d left, %d keys; want 4 and 2 (nothing written, b's idle state kept)", ga, n)
		}
		checkTables(t, s)
	})
	t.Run("two-shards", func(t *testing.T) {
		// Two shards of 2. Shard 1 holds k1 and k1b, shard 0 holds k0. A call on k0, k1 and new
		// keys in each shard: shard 0 has room, shard 1 evicts k1b.
		s := New(WithClock(sluice.NewManualClock(time.UnixMicro(0))), WithShards(2), WithMaxKeys(4))
		zero, one := keysIn(s, 0, "zero", 2), keysIn(s, 1, "one", 3)
		fill(s, zero[0], one[0], one[1])
		four := []sluice.Limit{{Policy: x, Cost: 1}, {Key: one[0], Policy: x, Cost: 1}, {Key: one[2], Policy: x, Cost: 1}, {Key: zero[1], Policy: x, Cost: 1}}
		if ok, err := s.DecideAll(ctx, zero[0], four, make([]sluice.Decision, 4)); err != nil || !ok {
			t.Fatalf("room in shard 0, one key to evict in shard 1: %v %v", ok, err)
		}
		want := map[string]int64{zero[0]: 3, one[0]: 3, one[2]: 4, zero[1]: 4, one[1]: 5}
		for k, w := range want {
			if got := remaining(s, k); got != w {
				t.Errorf("%s: %d left, want %d", k, got, w)
			}
		}
		if s.Evictions() != 1 {
			t.Errorf("%d evictions, want 1 (%s)", s.Evictions(), one[1])
		}
		// Now both shards are full: shard 0 with zero[0] and zero[1], shard 1 with one[0] and
		// one[2]. A call on zero[0], one[0], one[2] and a new key in shard 1: shard 1 could make
		// room only by evicting the call's keys, so ErrFull, and nothing is written in shard 0
		// either, which needed no room.
		fresh := keysIn(s, 1, "fresh", 1)[0]
		next := []sluice.Limit{{Policy: x, Cost: 1}, {Key: one[0], Policy: x, Cost: 1}, {Key: one[2], Policy: x, Cost: 1}, {Key: fresh, Policy: x, Cost: 1}}
		if _, err := s.DecideAll(ctx, zero[0], next, make([]sluice.Decision, 4)); !errors.Is(err, ErrFull) {
			t.Fatalf("no room in shard 1 but by evicting the call's keys: %v, want ErrFull", err)
		}
		for k, w := range map[string]int64{zero[0]: 3, one[0]: 3, one[2]: 4} {
			if got := remaining(s, k); got != w {
				t.Errorf("after ErrFull: %s has %d left, want %d (nothing written)", k, got, w)
			}
		}
		if s.Len() != 4 || s.Evictions() != 1 {
			t.Errorf("after ErrFull: %d keys, %d evictions; want 4 and 1", s.Len(), s.Evictions())
		}
		checkTables(t, s)
	})
}

// Many goroutines deciding limits under overlapping sets of keys, named in different orders,
// on a store of few shards at its key bound (so that calls lock several shards, evict, and
// wait for each other), beside Decide, one-key DecideAll and Sweep: none deadlocks, the race
// detector finds nothing, and the tables stay consistent.
func TestDecideAllKeysNoDeadlock(t *testing.T) {
	policies := []sluice.Policy{keysPolicy("x"), {Name: "y", Algorithm: sluice.TokenBucket, Limit: 1000, Period: time.Second}}
	for round := range 3 {
		s := New(WithShards(8), WithMaxKeys(8*5))
		const goroutines, iterations, keys = 32, 400, 24
		var wg sync.WaitGroup
		start := make(chan struct{})
		for g := range goroutines {
			wg.Go(func() {
				r := rand.New(rand.NewPCG(uint64(round), uint64(g)))
				ctx := context.Background()
				out := make([]sluice.Decision, 8)
				<-start
				for range iterations {
					switch r.IntN(10) {
					case 0:
						s.Decide(ctx, fmt.Sprint("k", r.IntN(keys)), policies[r.IntN(2)], 1)
						continue
					case 1:
						s.DecideAll(ctx, fmt.Sprint("k", r.IntN(keys)), []sluice.Limit{{Policy: policies[0], Cost: 1}, {Policy: policies[1], Cost: 1}}, out[:2])
						continue
					case 2:
						if g == 0 {
							s.Sweep()
							continue
						}
					}
					key := fmt.Sprint("k", r.IntN(keys))
					var limits []sluice.Limit
					for _, k := range r.Perm(keys)[:1+r.IntN(4)] {
						limits = append(limits, sluice.Limit{Key: fmt.Sprint("k", k), Policy: policies[r.IntN(2)], Cost: 1})
					}
					limits = append(limits, sluice.Limit{Policy: policies[0], Cost: 1, DryRun: r.IntN(2) == 0})
					seen := map[[2]string]bool{}
					distinct := limits[:0]
					for _, l := range limits {
						if pair := [2]string{l.EffectiveKey(key), l.Policy.Name}; !seen[pair] {
							seen[pair] = true
							distinct = append(distinct, l)
						}
					}
					if _, err := s.DecideAll(ctx, key, distinct, out[:len(distinct)]); err != nil && !errors.Is(err, ErrFull) {
						t.Error(err)
						return
					}
				}
			})
		}
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		close(start)
		select {
		case <-done:
		case <-time.After(30 * time.Second): // a watchdog, not synchronisation: the calls take about a second
			t.Fatalf("round %d: DecideAll under several keys has not returned in 30s: a deadlock", round)
		}
		checkTables(t, s)
		if s.Evictions() == 0 {
			t.Errorf("round %d: no eviction: the key bound was never reached", round)
		}
	}
}

// The conformance suite's concurrent DecideAll under several keys, on few shards (so that calls
// lock several shards at once), with more goroutines, repeated.
func TestConcurrentDecideAllKeysRepeated(t *testing.T) {
	for range 3 {
		storetest.ConcurrentDecideAllKeys(t, func(t *testing.T, c sluice.Clock) sluice.Store { return New(WithClock(c), WithShards(4)) }, 64, 2, false)
	}
}
