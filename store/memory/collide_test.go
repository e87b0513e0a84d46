package memory

import (
	"context"
	"fmt"
	"testing"
	"time"
	"unsafe"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/store/storetest"
)

// collidingStore hashes every key to 0: one shard, one chain. Keys are told apart by their own
// text, so decisions must still be exactly the core's.
func collidingStore(opts ...Option) *Store {
	s := New(opts...)
	s.hashMask = 0
	return s
}

func TestConformanceAllKeysCollide(t *testing.T) {
	storetest.Run(t, func(t *testing.T, c sluice.Clock) sluice.Store { return collidingStore(WithClock(c)) })
}

func TestCollidingKeysSweepAndEvict(t *testing.T) {
	clock := sluice.NewManualClock(time.UnixMicro(0))
	s := collidingStore(WithClock(clock), WithMaxKeys(256*5), WithSweepInterval(time.Hour)) // 5 per shard
	ctx := context.Background()
	short := sluice.Policy{Name: "short", Algorithm: sluice.FixedWindow, Limit: 1, Period: time.Second}
	long := sluice.Policy{Name: "long", Algorithm: sluice.FixedWindow, Limit: 1, Period: time.Hour}
	for i := 0; i < 3; i++ {
		s.Decide(ctx, fmt.Sprint("k", i), short, 1)
	}
	s.Decide(ctx, "k0", long, 1)
	if got := s.Len(); got != 4 {
		t.Fatalf("Len = %d, want 4", got)
	}
	clock.Set(time.UnixMicro(1_000_000))
	s.Sweep()
	if got := s.Len(); got != 1 {
		t.Fatalf("Len after the short windows ended = %d, want 1 (k0 under long)", got)
	}
	if d, _ := s.Decide(ctx, "k0", long, 1); d.Allowed {
		t.Fatal("k0 under long lost its state when its short slot was swept")
	}
	for i := 0; i < 10; i++ {
		if d, err := s.Decide(ctx, fmt.Sprint("new", i), long, 1); err != nil || !d.Allowed {
			t.Fatalf("new key %d: %+v %v", i, d, err)
		}
	}
	if got := s.Len(); got != 5 {
		t.Fatalf("Len at the bound = %d, want 5", got)
	}
	if s.Evictions() != 6 {
		t.Fatalf("Evictions = %d, want 6", s.Evictions())
	}
}

// The layout comment on client holds: 192-byte objects start on a cache line; every field a
// counter or bucket decision writes (the client's lock, the first slot's expiry and the state's
// Window, Count, Prev, TAT and Frac) lies in the first line, and nothing it only reads (the key's header and bytes, the
// policy's name, the further slots) does, so those lines stay shared in every core's cache.
func TestClientLayout(t *testing.T) {
	if size := unsafe.Sizeof(client{}); size <= 176 || size > 192 {
		t.Errorf("client is %d bytes, want 177..192 (the 192-byte size class)", size)
	}
	first := unsafe.Offsetof(client{}.first)
	state := first + unsafe.Offsetof(slot{}.state)
	written := map[string][2]uintptr{
		"mu":      {unsafe.Offsetof(client{}.mu), unsafe.Sizeof(client{}.mu)},
		"expires": {first + unsafe.Offsetof(slot{}.expires), 8},
		"Window":  {state + unsafe.Offsetof(algorithm.State{}.Window), 8},
		"Count":   {state + unsafe.Offsetof(algorithm.State{}.Count), 8},
		"Prev":    {state + unsafe.Offsetof(algorithm.State{}.Prev), 8},
		"TAT":     {state + unsafe.Offsetof(algorithm.State{}.TAT), 8},
		"Frac":    {state + unsafe.Offsetof(algorithm.State{}.Frac), 8},
	}
	for name, f := range written {
		if f[0]+f[1] > 64 {
			t.Errorf("%s, which a decision writes, ends at byte %d, past the first cache line", name, f[0]+f[1])
		}
	}
	readOnly := map[string]uintptr{
		"key":    unsafe.Offsetof(client{}.key),
		"inline": unsafe.Offsetof(client{}.inline),
		"more":   unsafe.Offsetof(client{}.more),
		"dead":   unsafe.Offsetof(client{}.dead),
		"policy": first + unsafe.Offsetof(slot{}.policy),
		"Period": state + unsafe.Offsetof(algorithm.State{}.Period),
		"cache":  state + unsafe.Offsetof(algorithm.State{}.Period) + 8,
	}
	for name, off := range readOnly {
		if off < 64 {
			t.Errorf("%s, which a decision only reads, starts at byte %d, in the line it writes", name, off)
		}
	}
	if size := unsafe.Sizeof(shard{}); size != 64 {
		t.Errorf("shard is %d bytes, want one 64-byte cache line", size)
	}
}
