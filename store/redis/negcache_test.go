package redis_test

import (
	"context"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/store/redis"
)

// TestNegativeCacheRefundOnOtherInstance: two instances on one Redis. Redis holds 10 of 10;
// instance A refuses, and then answers its cached refusal (RetryAfter the rest of the hour). Instance
// B settles a refund of the charge: A must admit again — what Redis would answer — well within a
// second, not after the cached RetryAfter (it used to refuse for the whole window).
func TestNegativeCacheRefundOnOtherInstance(t *testing.T) {
	srv := redistest.Start(t)
	a := openStore(t, srv, redis.Options{Timeout: 2 * time.Second})
	b := openStore(t, srv, redis.Options{Timeout: 2 * time.Second})
	refundReachesCache(t, a, b, "client")
	if got := mustDo(t, srv, "PUBSUB", "CHANNELS", "*"); !strings.Contains(got, "rate-limit:refunds") {
		t.Errorf("the stores listen on %q, want rate-limit:refunds", got)
	}
}

// TestNegativeCacheRefundOnOtherInstanceCluster: the same on a Redis Cluster, where the two
// instances' subscriptions and the settlement's PUBLISH may be on different nodes (PUBLISH
// reaches every node's subscribers), for keys in several slots.
func TestNegativeCacheRefundOnOtherInstanceCluster(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	open := func() *redis.Store {
		st, err := redis.New(redis.Options{Addrs: c.Addrs(), Timeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(st.Close)
		return st
	}
	a, b := open(), open()
	for _, key := range []string{"x", "y", "z", "w"} {
		refundReachesCache(t, a, b, key)
	}
}

// refundReachesCache fills key's quota through b, has a refuse it from its cache, refunds through
// b, and waits for a to admit.
func refundReachesCache(t *testing.T, a, b *redis.Store, key string) {
	t.Helper()
	ctx := context.Background()
	p := sluice.Policy{Name: "hourly", Algorithm: sluice.FixedWindow, Limit: 10, Period: time.Hour}
	charge, err := b.Decide(ctx, key, p, 10)
	if err != nil || !charge.Allowed {
		t.Fatalf("10 of 10 through B: %+v, %v", charge, err)
	}
	first, err := a.Decide(ctx, key, p, 1)
	if err != nil || first.Allowed || first.Cached() {
		t.Fatalf("A, Redis full: %+v, %v; want refused by Redis", first, err)
	}
	// The window is the clock's hour, so the wait left is whatever remains of it (seconds, in
	// the last minute of an hour): the cached refusal must say the same wait as Redis's, less
	// the moment between them, not a fixed figure.
	d, err := a.Decide(ctx, key, p, 1)
	if err != nil || d.Allowed || !d.Cached() || d.RetryAfter <= 0 || d.RetryAfter > first.RetryAfter || first.RetryAfter-d.RetryAfter > time.Second {
		t.Fatalf("A again: %+v, %v; want its cached refusal, with Redis's RetryAfter %v less the moment since", d, err, first.RetryAfter)
	}
	if err := b.Settle(ctx, key, p, charge.At, 10, 5); err != nil {
		t.Fatalf("B refunds 5: %v", err)
	}
	start := time.Now()
	for {
		d, err := a.Decide(ctx, key, p, 1)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			break
		}
		if time.Since(start) > 5*time.Second { // (far below the RetryAfter; a loaded machine's margin)
			t.Fatalf("A still refuses %v after B's refund (cached %v, RetryAfter %v): Redis would admit", time.Since(start), d.Cached(), d.RetryAfter)
		}
		runtime.Gosched()
	}
	t.Logf("%s: A admitted %v after B's refund", key, time.Since(start))
}

// TestNegativeCacheOffWhileUnsubscribed: while a store is not subscribed to the refunds'
// channel (its subscription's connection dropped: CLIENT KILL TYPE pubsub), its cache answers
// nothing: every refusal is Redis's, so a refund it did not hear of cannot be missed.
func TestNegativeCacheOffWhileUnsubscribed(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	a := openStore(t, srv, redis.Options{Timeout: 2 * time.Second})
	p := sluice.Policy{Name: "hourly", Algorithm: sluice.FixedWindow, Limit: 1, Period: time.Hour}
	if d, err := a.Decide(ctx, "c", p, 1); err != nil || !d.Allowed {
		t.Fatal(d, err)
	}
	_, _ = a.Decide(ctx, "c", p, 1)
	if d, _ := a.Decide(ctx, "c", p, 1); !d.Cached() {
		t.Fatalf("%+v: want a cached refusal", d)
	}
	// Unsubscribe it behind its back: the subscription's connection is killed; while it is
	// down, the cache must not answer. Kill every pubsub client until a refusal is Redis's.
	var sawRedis atomic.Bool
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Go(func() {
		for !sawRedis.Load() {
			select {
			case <-stop:
				return
			default:
			}
			_, _ = srv.Do("CLIENT", "KILL", "TYPE", "pubsub")
			runtime.Gosched()
		}
	})
	defer func() { close(stop); wg.Wait() }()
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); {
		d, err := a.Decide(ctx, "c", p, 1)
		if err == nil && !d.Cached() && !d.Allowed {
			sawRedis.Store(true)
			return
		}
	}
	t.Fatal("the cache kept answering while its subscription was being killed")
}
