package redis_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/store/memory"
	redisstore "github.com/sluicehq/sluice/store/redis"
)

// A concurrency limit's slots are one sorted set in the client's hash slot, its members the
// leases' slots scored by expiry, its TTL the last expiry's; refusals are never answered from
// the negative cache (a slot may free at any moment), which is on here.
func TestConcurrencyRedisLayout(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, redisstore.Options{Addrs: []string{srv.Addr}}) // Redis's clock; the negative cache on
	p := sluice.Policy{Name: "api-conc", Algorithm: sluice.Concurrency, Limit: 2, Period: 10 * time.Second}
	ctx := context.Background()
	take := func(id uint64, cost int64) sluice.Decision {
		t.Helper()
		var out [1]sluice.Decision
		if _, err := s.DecideAll(ctx, "customer-42", []sluice.Limit{{Policy: p, Cost: cost, Lease: id}}, out[:]); err != nil {
			t.Fatal(err)
		}
		return out[0]
	}
	if d := take(0xabc, 2); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("two slots: %+v", d)
	}
	key := "rate-limit:{customer-42}:api-conc:slots"
	members, err := srv.Do("ZRANGE", key, "0", "-1")
	if err != nil || members != "0000000000000abc\n0000000000000abc/2" {
		t.Fatalf("ZRANGE %s: %q %v, want the lease's two slots", key, members, err)
	}
	ttl, err := srv.Do("PTTL", key)
	if n, _ := strconv.Atoi(ttl); err != nil || n <= 9000 || n > 10000 {
		t.Fatalf("PTTL %q %v, want about the lease (10s)", ttl, err)
	}
	for range 3 {
		if d := take(0xdef, 1); d.Allowed || d.Cached() || d.RetryAfter != time.Second {
			t.Fatalf("full: %+v, want refused by Redis with a 1s hint", d)
		}
	}
	if err := s.Release(ctx, "customer-42", p, 0xabc); err != nil {
		t.Fatal(err)
	}
	if d := take(0xdef, 1); !d.Allowed {
		t.Fatalf("after the release: %+v (a cached refusal?)", d)
	}
	if got := s.Stats().CacheHits; got != 0 {
		t.Fatalf("%d answers from the negative cache, want none", got)
	}
	if err := s.Renew(ctx, "customer-42", p, 0xdef); err != nil {
		t.Fatal(err)
	}
	if err := s.Renew(ctx, "customer-42", sluice.Policy{Name: "x", Algorithm: sluice.FixedWindow, Limit: 1, Period: time.Second}, 1); err == nil ||
		!strings.Contains(err.Error(), "only concurrency policies hold leases") {
		t.Fatalf("renewing a fixed window: %v", err)
	}
}

// With Redis down and on_error local, the slots are taken from the instance's share of the limit
// in the memory store, released there, and the guard's Release still frees them.
func TestConcurrencyLocalFallback(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, redisstore.Options{Addrs: []string{srv.Addr}, Timeout: 100 * time.Millisecond})
	local := memory.New(memory.WithClock(sluice.NewManualClock(time.UnixMicro(1_800_000_000_000_000))))
	g, err := sluice.Guard(s, sluice.WithLocalFallback(local, 0.5))
	if err != nil {
		t.Fatal(err)
	}
	srv.Kill()
	p := sluice.Policy{Name: "conc", Algorithm: sluice.Concurrency, Limit: 4, Period: time.Minute} // 2 locally
	ctx := context.Background()
	take := func(id uint64) (bool, sluice.Decision) {
		var out [1]sluice.Decision
		ok, err := g.DecideAll(ctx, "client", []sluice.Limit{{Policy: p, Cost: 1, Lease: id}}, out[:])
		if err != nil {
			t.Fatal(err)
		}
		return ok, out[0]
	}
	for id := uint64(1); id <= 2; id++ {
		if ok, d := take(id); !ok || d.Fallback != sluice.FallbackLocal {
			t.Fatalf("slot %d with Redis down: %v %+v, want taken locally", id, ok, d)
		}
	}
	if ok, d := take(3); ok || d.Limit != 2 {
		t.Fatalf("third slot: %v %+v, want refused by the local share of 2", ok, d)
	}
	_ = g.(sluice.Leaser).Release(ctx, "client", p, 1) // Redis is down: its error, and the local slot freed
	if ok, _ := take(3); !ok {
		t.Fatal("after the release, a local slot is still taken")
	}
}

// A calendar rate limit beside a concurrency limit, from an instance whose clock is days off
// Redis's (the test clock): the windows passed around the instance's clock miss Redis's time, and
// the store asks once more around it, as for the rate limits alone; the charge counts in Redis's day.
func TestConcurrencyCalendarInstanceOff(t *testing.T) {
	srv := redistest.Start(t)
	t0 := time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC)
	clock := sluice.NewManualClock(t0)
	s := newStore(t, redisstore.Options{Addrs: []string{srv.Addr}, Clock: clock, NegativeCacheSize: -1})
	redisstore.SetInstanceClock(s, func() time.Time { return clock.Now().Add(5 * 24 * time.Hour) })
	daily := sluice.Policy{Name: "daily", Algorithm: sluice.FixedWindow, Limit: 3, Calendar: sluice.Day}
	conc := sluice.Policy{Name: "slots", Algorithm: sluice.Concurrency, Limit: 2, Period: time.Minute}
	var out [2]sluice.Decision
	ok, err := s.DecideAll(context.Background(), "k", []sluice.Limit{{Policy: daily, Cost: 2}, {Policy: conc, Cost: 1, Lease: 1}}, out[:])
	reset := time.Date(2026, 3, 11, 0, 0, 0, 0, time.UTC).Sub(t0)
	if err != nil || !ok || out[0].Remaining != 1 || out[0].ResetAfter != reset || !out[1].Allowed {
		t.Fatalf("instance 5 days ahead: %v %v %+v, want both allowed, 1 left of Redis's day, reset in %v", ok, err, out, reset)
	}
}
