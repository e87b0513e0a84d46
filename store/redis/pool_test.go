package redis_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/store/redis"
)

// TestPoolLockAndFence: one instance holds a pool's lock at a time, renews it, and another takes
// it only once it lapsed; take and publish are fenced by it, so a refresher that lost its lock
// neither resets the pooled counts nor publishes.
func TestPoolLockAndFence(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, redis.Options{Addrs: []string{redistest.Start(t).Addr}})
	p, err := s.Pool("partner")
	if err != nil {
		t.Fatal(err)
	}
	lead := func(id string, ttl time.Duration) bool {
		t.Helper()
		ok, err := p.Lead(ctx, id, ttl)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if !lead("a", 300*time.Millisecond) || lead("b", 300*time.Millisecond) || !lead("a", 300*time.Millisecond) {
		t.Fatal("a takes and renews the lock, b does not get it")
	}
	if _, ok, err := p.Take(ctx, "b", time.Minute); err != nil || ok {
		t.Fatalf("b's take while a holds the lock: %v, %v; want refused", ok, err)
	}
	g := redis.PoolGrant{Allotment: 60, Expires: time.Now().Add(time.Second), Epoch: "e"}
	if _, ok, err := p.Publish(ctx, "b", g, time.Second, 0, time.Time{}, time.Second); err != nil || ok {
		t.Fatalf("b's publish while a holds the lock: %v, %v; want refused", ok, err)
	}
	deadline := time.Now().Add(3 * time.Second)
	for !lead("b", 300*time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("b did not take the lapsed lock")
		}
		time.Sleep(20 * time.Millisecond) // polling for the TTL to lapse, as the refresh loop does
	}
	if _, ok, _ := p.Publish(ctx, "a", g, time.Second, 0, time.Time{}, time.Second); ok {
		t.Fatal("a published after losing the lock")
	}
}

// TestPoolCountsAndGrant: the instances' counts add up, the largest live use is kept, a take
// resets them; a published grant carries its version and lease (the key's TTL), and a shrink in
// flight (a smaller grant over a larger one) is kept, the largest, for its window only.
func TestPoolCountsAndGrant(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, redis.Options{Addrs: []string{redistest.Start(t).Addr}})
	p, err := s.Pool("partner")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ a, r, u int64 }{{3, 1, 20}, {5, 2, 35}, {0, 4, 10}} {
		if err := p.Push(ctx, c.a, c.r, c.u, time.Minute, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	if ok, err := p.Lead(ctx, "a", time.Minute); err != nil || !ok {
		t.Fatal(ok, err)
	}
	c, ok, err := p.Take(ctx, "a", time.Minute)
	if err != nil || !ok || c.Admitted != 8 || c.Refused != 7 || c.Used != 35 || c.UsedFor <= 50*time.Second || c.HasGrant {
		t.Fatalf("take: %+v, %v, %v; want 8 admitted, 7 refused, used 35 for about a minute, no grant", c, ok, err)
	}
	if c.Span != 0 {
		t.Fatalf("the first take's span %v; want 0, unknown (no take before)", c.Span)
	}
	first := time.Now()
	if c, _, _ = p.Take(ctx, "a", time.Minute); c.Admitted != 0 || c.Refused != 0 || c.Used != 0 {
		t.Fatalf("a second take: %+v; want the counts reset", c)
	}
	// The span is the time since the last take, whoever took: another instance taking the lock
	// over measures its first counts over it, not over a refresh interval of its own.
	if c.Span <= 0 || c.Span > time.Since(first)+time.Second {
		t.Fatalf("the second take's span %v; want the time since the first, at most %v", c.Span, time.Since(first))
	}
	exp := time.Now().Add(10 * time.Second).Truncate(time.Microsecond).UTC()
	publish := func(allot, from int64, window time.Duration) int64 {
		t.Helper()
		v, ok, err := p.Publish(ctx, "a", redis.PoolGrant{Allotment: allot, Learning: allot == 90, Expires: exp, Epoch: "e1"}, 5*time.Second, from, exp, window)
		if err != nil || !ok {
			t.Fatal(ok, err)
		}
		return v
	}
	if v := publish(90, 0, time.Second); v != 1 {
		t.Fatalf("the first grant's version %d", v)
	}
	g, ok, err := p.Read(ctx)
	if err != nil || !ok || g.Version != 1 || g.Allotment != 90 || !g.Learning || !g.Expires.Equal(exp) || g.Epoch != "e1" || g.TTL <= 4*time.Second || g.TTL > 5*time.Second {
		t.Fatalf("read: %+v, %v, %v", g, ok, err)
	}
	if v := publish(50, 90, 300*time.Millisecond); v != 2 {
		t.Fatalf("the second grant's version %d", v)
	}
	publish(40, 50, 300*time.Millisecond) // a second shrink within the first's window keeps the larger
	if c, _, _ = p.Take(ctx, "a", time.Minute); !c.HasGrant || c.Grant.Allotment != 40 || c.ShrinkFrom != 90 || !c.ShrinkExpires.Equal(exp) {
		t.Fatalf("take within the shrink's window: %+v; want the grant 40, the shrink from 90", c)
	}
	deadline := time.Now().Add(3 * time.Second)
	for c.ShrinkFrom != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the shrink still in flight: %+v", c)
		}
		time.Sleep(20 * time.Millisecond)
		c, _, _ = p.Take(ctx, "a", time.Minute)
	}
	if c.Grant.Allotment != 40 {
		t.Fatalf("after the shrink's window: %+v", c)
	}
	// A later, smaller shrink does not extend an earlier, larger one's time: each is held for its
	// own window (the larger would otherwise be held as long as shrinks follow within a window).
	publish(30, 40, 300*time.Millisecond)
	publish(20, 30, 10*time.Second)
	deadline = time.Now().Add(3 * time.Second)
	for c, _, _ = p.Take(ctx, "a", time.Minute); c.ShrinkFrom == 40; c, _, _ = p.Take(ctx, "a", time.Minute) {
		if time.Now().After(deadline) {
			t.Fatalf("the shrink from 40 extended by the later one: %+v", c)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if c.ShrinkFrom != 30 || c.Grant.Allotment != 20 {
		t.Fatalf("after the first of two shrinks ended: %+v; want the second's, from 30, still in flight", c)
	}
}
