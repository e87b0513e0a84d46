package memory_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/store/memory"
	"github.com/sluicehq/sluice/store/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T, c sluice.Clock) sluice.Store { return memory.New(memory.WithClock(c)) })
}

// Few shards and a tiny sweep interval make every shard hold many keys and sweep often: the
// conformance must not depend on either.
func TestConformanceOneShardFrequentSweeps(t *testing.T) {
	storetest.Run(t, func(t *testing.T, c sluice.Clock) sluice.Store {
		return memory.New(memory.WithClock(c), memory.WithShards(1), memory.WithSweepInterval(time.Microsecond))
	})
}

func TestConcurrentExactRepeated(t *testing.T) {
	for i := 0; i < 5; i++ {
		storetest.ConcurrentExact(t, func(t *testing.T, c sluice.Clock) sluice.Store { return memory.New(memory.WithClock(c)) }, 64, 4)
	}
}

var policies = func() []sluice.Policy {
	var ps []sluice.Policy
	for _, a := range algorithm.Algorithms {
		p := sluice.Policy{Name: a.String(), Algorithm: a, Limit: 10, Period: time.Second}
		if a == sluice.TokenBucket || a == sluice.LeakyBucket {
			p.Burst = 10
		}
		ps = append(ps, p)
	}
	return ps
}()

// Keys whose state is back to "never seen" are dropped at the next sweep of their shard, which a
// decision on the shard after the sweep interval triggers; active keys stay.
func TestIdleKeysAreDropped(t *testing.T) {
	clock := sluice.NewManualClock(time.UnixMicro(0))
	s := memory.New(memory.WithClock(clock), memory.WithShards(1), memory.WithSweepInterval(time.Second))
	ctx := context.Background()
	for _, p := range policies {
		for i := 0; i < 100; i++ {
			if _, err := s.Decide(ctx, fmt.Sprint("client-", i), p, 1); err != nil {
				t.Fatal(err)
			}
		}
	}
	if got := s.Len(); got != 500 {
		t.Fatalf("Len after 100 clients on 5 policies = %d, want 500", got)
	}
	// The longest reset: a sliding window's count stays until the end of the next window (2s).
	clock.Set(time.UnixMicro(2_000_000))
	if _, err := s.Decide(ctx, "active", policies[0], 1); err != nil {
		t.Fatal(err)
	}
	if got := s.Len(); got != 1 {
		t.Fatalf("Len after every old key went idle = %d, want 1 (the active one)", got)
	}
}

// A key is not dropped a microsecond before its state is idle.
func TestKeyKeptUntilIdle(t *testing.T) {
	clock := sluice.NewManualClock(time.UnixMicro(0))
	s := memory.New(memory.WithClock(clock), memory.WithShards(1), memory.WithSweepInterval(time.Microsecond))
	ctx := context.Background()
	tb := policies[3] // token bucket 10/s, capacity 10
	for i := 0; i < 10; i++ {
		s.Decide(ctx, "c", tb, 1)
	}
	clock.Set(time.UnixMicro(999_999))
	s.Sweep()
	if d, _ := s.Decide(ctx, "c", tb, 0); d.Remaining != 9 {
		t.Fatalf("Remaining 1µs before full = %d, want 9 (state must not be dropped early)", d.Remaining)
	}
	clock.Set(time.UnixMicro(1_000_000))
	s.Sweep()
	if got := s.Len(); got != 0 {
		t.Fatalf("Len when the bucket is full again = %d, want 0", got)
	}
}

// Peeks, refusals and impossible costs on unseen keys store nothing: client input alone cannot
// grow the store.
func TestUnseenKeysCostNothing(t *testing.T) {
	s := memory.New(memory.WithClock(sluice.NewManualClock(time.UnixMicro(0))))
	ctx := context.Background()
	for _, p := range policies {
		for i := 0; i < 50; i++ {
			s.Decide(ctx, fmt.Sprint("peek-", i), p, 0)
			s.Decide(ctx, fmt.Sprint("huge-", i), p, 1<<60) // beyond every policy, the leaky queue's drain time included
		}
	}
	if got := s.Len(); got != 0 {
		t.Fatalf("Len after peeks and impossible costs = %d, want 0", got)
	}
}

func TestMaxKeysEvictsNearestReset(t *testing.T) {
	clock := sluice.NewManualClock(time.UnixMicro(0))
	s := memory.New(memory.WithClock(clock), memory.WithShards(1), memory.WithMaxKeys(100))
	ctx := context.Background()
	p := sluice.Policy{Name: "fw", Algorithm: sluice.FixedWindow, Limit: 1, Period: time.Hour}
	for i := 0; i < 1000; i++ {
		d, err := s.Decide(ctx, fmt.Sprint("k", i), p, 1)
		if err != nil || !d.Allowed {
			t.Fatalf("new key %d at the bound: %+v %v, want allowed (an old key is evicted)", i, d, err)
		}
	}
	if got := s.Len(); got != 100 {
		t.Fatalf("Len = %d, want the bound 100", got)
	}
	if got := s.Evictions(); got != 900 {
		t.Fatalf("Evictions = %d, want 900", got)
	}
}

func TestMaxKeysRejectWhenFull(t *testing.T) {
	clock := sluice.NewManualClock(time.UnixMicro(0))
	s := memory.New(memory.WithClock(clock), memory.WithShards(1), memory.WithMaxKeys(10), memory.WithRejectWhenFull())
	ctx := context.Background()
	p := sluice.Policy{Name: "fw", Algorithm: sluice.FixedWindow, Limit: 5, Period: time.Second}
	for i := 0; i < 10; i++ {
		if _, err := s.Decide(ctx, fmt.Sprint("k", i), p, 1); err != nil {
			t.Fatal(err)
		}
	}
	_, err := s.Decide(ctx, "one-too-many", p, 1)
	if !errors.Is(err, memory.ErrFull) {
		t.Fatalf("new key at a full store: err %v, want ErrFull", err)
	}
	// Known keys still decide at the bound.
	if d, err := s.Decide(ctx, "k3", p, 1); err != nil || !d.Allowed || d.Remaining != 3 {
		t.Fatalf("known key at the bound: %+v %v", d, err)
	}
	// Once old keys are idle, a new key takes an idle one's place.
	clock.Set(time.UnixMicro(1_000_000))
	if _, err := s.Decide(ctx, "one-too-many", p, 1); err != nil {
		t.Fatalf("new key after the others went idle: %v", err)
	}
}

// A policy whose algorithm changes under the same name starts afresh rather than misreading state.
func TestAlgorithmChangeStartsAfresh(t *testing.T) {
	s := memory.New(memory.WithClock(sluice.NewManualClock(time.UnixMicro(0))))
	ctx := context.Background()
	fw := sluice.Policy{Name: "api", Algorithm: sluice.FixedWindow, Limit: 5, Period: time.Second}
	for i := 0; i < 5; i++ {
		s.Decide(ctx, "c", fw, 1)
	}
	tb := sluice.Policy{Name: "api", Algorithm: sluice.TokenBucket, Limit: 5, Period: time.Second}
	if d, err := s.Decide(ctx, "c", tb, 1); err != nil || !d.Allowed || d.Remaining != 4 {
		t.Fatalf("first token-bucket decision after a fixed-window state: %+v %v, want a full bucket", d, err)
	}
}

// The hot path allocates nothing on a known key, for every algorithm but the sliding log.
func TestNoAllocationsOnKnownKeys(t *testing.T) {
	s := memory.New()
	ctx := context.Background()
	for _, p := range policies {
		if p.Algorithm == sluice.SlidingLog {
			continue
		}
		s.Decide(ctx, "known", p, 1)
		if n := testing.AllocsPerRun(1000, func() { s.Decide(ctx, "known", p, 1) }); n != 0 {
			t.Errorf("%v: %v allocations per decision, want 0", p.Algorithm, n)
		}
		// DecideAll: one limit (Decide's path), several of one key, and (up to four) under
		// several keys, which lock several shards; on limits high enough that every call is
		// approved and writes.
		p.Limit = 1 << 40
		if p.Burst > 0 {
			p.Burst = 1 << 40
		}
		loose := sluice.Policy{Name: "loose", Algorithm: sluice.FixedWindow, Limit: 1 << 40, Period: time.Hour}
		out := make([]sluice.Decision, 3)
		for _, tc := range []struct {
			name   string
			limits []sluice.Limit
		}{
			{"one limit", []sluice.Limit{{Policy: p, Cost: 1}}},
			{"one key", []sluice.Limit{{Policy: p, Cost: 1}, {Policy: loose, Cost: 1}}},
			{"keyed like the call", []sluice.Limit{{Policy: p, Cost: 1}, {Key: "known", Policy: loose, Cost: 1}}},
			{"several keys", []sluice.Limit{{Policy: p, Cost: 1}, {Key: "other", Policy: loose, Cost: 1}, {Key: "third", Policy: p, Cost: 1}}},
		} {
			o := out[:len(tc.limits)]
			if ok, err := s.DecideAll(ctx, "known", tc.limits, o); !ok || err != nil {
				t.Fatalf("%v, DecideAll, %s: %v %v, want approved", p.Algorithm, tc.name, ok, err)
			}
			if n := testing.AllocsPerRun(1000, func() { s.DecideAll(ctx, "known", tc.limits, o) }); n != 0 {
				t.Errorf("%v, DecideAll, %s: %v allocations per call, want 0", p.Algorithm, tc.name, n)
			}
		}
	}
}

// The default clock is the wall clock (windows are epoch-aligned) and never runs backward.
func TestDefaultClockFollowsWallClock(t *testing.T) {
	s := memory.New()
	p := sluice.Policy{Name: "fw", Algorithm: sluice.FixedWindow, Limit: 1, Period: time.Hour}
	before := time.Now()
	d, _ := s.Decide(context.Background(), "c", p, 1)
	after := time.Now()
	// ResetAfter is the time to the end of the current hour of the wall clock.
	lo := before.Truncate(time.Hour).Add(time.Hour).Sub(after)
	hi := after.Truncate(time.Hour).Add(time.Hour).Sub(before)
	if d.ResetAfter < lo-time.Millisecond || d.ResetAfter > hi+time.Millisecond {
		t.Fatalf("ResetAfter %v not within [%v, %v]: the store's clock is not the wall clock", d.ResetAfter, lo, hi)
	}
}

// DecideAll at the key bound is all or nothing too: it makes room for every new state before it
// writes any, never by evicting the key it decides for, and if it cannot it fails with ErrFull
// having consumed nothing.
func TestDecideAllAtTheBound(t *testing.T) {
	ctx := context.Background()
	p := func(name string) sluice.Policy {
		return sluice.Policy{Name: name, Algorithm: sluice.FixedWindow, Limit: 5, Period: time.Hour}
	}
	remaining := func(s *memory.Store, key, policy string) int64 {
		d, err := s.Decide(ctx, key, p(policy), 0)
		if err != nil {
			t.Fatal(err)
		}
		return d.Remaining
	}
	out := make([]sluice.Decision, 2)

	// Rejecting when full: one known state and one new one at a full shard. The known one must
	// not be consumed when the new one finds no room.
	s := memory.New(memory.WithClock(sluice.NewManualClock(time.UnixMicro(0))), memory.WithShards(1), memory.WithMaxKeys(2), memory.WithRejectWhenFull())
	for _, key := range []string{"a", "b"} {
		if ok, err := s.DecideAll(ctx, key, []sluice.Limit{{Policy: p("x"), Cost: 1}}, out[:1]); err != nil || !ok {
			t.Fatalf("filling: %v %v", ok, err)
		}
	}
	_, err := s.DecideAll(ctx, "a", []sluice.Limit{{Policy: p("x"), Cost: 1}, {Policy: p("y"), Cost: 1}}, out)
	if !errors.Is(err, memory.ErrFull) {
		t.Fatalf("a new state at a full shard: %v, want ErrFull", err)
	}
	if got := remaining(s, "a", "x"); got != 4 {
		t.Fatalf("a's known limit has %d left after a DecideAll that failed, want 4 (nothing consumed)", got)
	}

	// Evicting when full: the only other client is evicted, never the key being decided.
	s = memory.New(memory.WithClock(sluice.NewManualClock(time.UnixMicro(0))), memory.WithShards(1), memory.WithMaxKeys(3))
	for _, l := range [][2]string{{"a", "x"}, {"a", "y"}, {"b", "x"}} {
		if ok, err := s.DecideAll(ctx, l[0], []sluice.Limit{{Policy: p(l[1]), Cost: 1}}, out[:1]); err != nil || !ok {
			t.Fatalf("filling: %v %v", ok, err)
		}
	}
	// a under x, y (known) and z, w (new): two places are needed, one can be freed (b's):
	// ErrFull, and a keeps both its states unconsumed beyond the first request.
	four := []sluice.Limit{{Policy: p("x"), Cost: 1}, {Policy: p("y"), Cost: 1}, {Policy: p("z"), Cost: 1}, {Policy: p("w"), Cost: 1}}
	_, err = s.DecideAll(ctx, "a", four, make([]sluice.Decision, 4))
	if !errors.Is(err, memory.ErrFull) {
		t.Fatalf("two new states, one place to free: %v, want ErrFull", err)
	}
	if gx, gy := remaining(s, "a", "x"), remaining(s, "a", "y"); gx != 4 || gy != 4 {
		t.Fatalf("a's states after a failed DecideAll: x %d, y %d left, want 4 and 4 (not consumed, not evicted)", gx, gy)
	}
	// One new state: b is evicted to make room, and a's three states are all there.
	if ok, err := s.DecideAll(ctx, "a", four[:3], make([]sluice.Decision, 3)); err != nil || !ok {
		t.Fatalf("one new state, one place to free: %v %v", ok, err)
	}
	if gx, gy, gz := remaining(s, "a", "x"), remaining(s, "a", "y"), remaining(s, "a", "z"); gx != 3 || gy != 3 || gz != 4 {
		t.Fatalf("a's states: x %d, y %d, z %d left, want 3, 3, 4", gx, gy, gz)
	}
	if got := remaining(s, "b", "x"); got != 5 || s.Evictions() != 1 {
		t.Fatalf("b has %d left after %d evictions, want 5 (evicted once)", got, s.Evictions())
	}
}
