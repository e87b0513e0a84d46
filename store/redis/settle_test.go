package redis_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/store/memory"
	redisstore "github.com/sluicehq/sluice/store/redis"
)

// TestSettleOnRedisClock: with no test clock, a decision's At is Redis's TIME when its script
// ran, and a settlement is decided on Redis's clock too: a refund in the window still running,
// none for a charge whose window has ended, an extra charge beyond the limit, and the key's TTL
// following the state it leaves.
func TestSettleOnRedisClock(t *testing.T) {
	srv := redistest.Start(t)
	st := newStore(t, redisstore.Options{Addrs: []string{srv.Addr}})
	ctx := context.Background()
	p := sluice.Policy{Name: "tokens", Algorithm: sluice.FixedWindow, Limit: 1000, Period: 1000 * time.Hour} // (a window that rolls during the test: once in 40 years)
	before := redisTime(t, srv)
	d, err := st.Decide(ctx, "c", p, 400)
	after := redisTime(t, srv)
	if err != nil || !d.Allowed || d.At < before || d.At > after {
		t.Fatalf("decision %+v, %v: At should be Redis TIME within [%d, %d]", d, err, before, after)
	}
	if err := st.Settle(ctx, "c", p, d.At, 400, 150); err != nil {
		t.Fatal(err)
	}
	if pk, _ := st.Decide(ctx, "c", p, 0); pk.Remaining != 850 {
		t.Fatalf("remaining %d after settling 400 to 150, want 850", pk.Remaining)
	}
	// A charge made a period before, in a window that has ended: nothing to give back.
	if err := st.Settle(ctx, "c", p, d.At-p.PeriodMicros(), 100, 0); err != nil {
		t.Fatal(err)
	}
	if pk, _ := st.Decide(ctx, "c", p, 0); pk.Remaining != 850 {
		t.Fatalf("remaining %d after a refund of an ended window's charge, want 850", pk.Remaining)
	}
	// 1,000 more than reserved: beyond the limit, refused until the window ends.
	if err := st.Settle(ctx, "c", p, d.At, 0, 1000); err != nil {
		t.Fatal(err)
	}
	if d2, _ := st.Decide(ctx, "c", p, 1); d2.Allowed || d2.RetryAfter <= 0 || d2.RetryAfter > p.Period {
		t.Fatalf("after a charge beyond the limit: %+v, want refused until the window ends", d2)
	}
	if ttl := mustInt(t, srv, "PTTL", "rate-limit:{c}:tokens:v2"); ttl <= 0 || ttl > p.Period.Milliseconds() {
		t.Fatalf("PTTL %d, want the window's rest", ttl)
	}
	// SettleNow: the settlement's own instant.
	if err := st.Settle(ctx, "c", p, sluice.SettleNow, 1000, 0); err != nil {
		t.Fatal(err)
	}
	if pk, _ := st.Decide(ctx, "c", p, 0); pk.Remaining != 850 {
		t.Fatalf("remaining %d after refunding the extra, want 850", pk.Remaining)
	}
}

// TestSettleBadInputAndOutage: bad amounts are the caller's errors, with nothing sent; a Redis
// that does not answer fails the settlement with ErrStoreUnavailable, changing nothing.
func TestSettleBadInputAndOutage(t *testing.T) {
	srv := redistest.Start(t)
	st := newStore(t, redisstore.Options{Addrs: []string{srv.Addr}, Timeout: 200 * time.Millisecond})
	ctx := context.Background()
	p := sluice.Policy{Name: "t", Algorithm: sluice.FixedWindow, Limit: 10, Period: 1000 * time.Hour}
	d, err := st.Decide(ctx, "c", p, 5)
	if err != nil {
		t.Fatal(err)
	}
	calls := st.Stats().Calls
	for _, c := range [][2]int64{{-1, 0}, {5, -1}, {1 << 54, 0}} {
		if err := st.Settle(ctx, "c", p, d.At, c[0], c[1]); !errors.Is(err, sluice.ErrInvalidCost) {
			t.Errorf("Settle(%d, %d): %v, want ErrInvalidCost", c[0], c[1], err)
		}
	}
	if err := st.Settle(ctx, "c", sluice.Policy{Name: "bad"}, d.At, 1, 0); !errors.Is(err, sluice.ErrInvalidPolicy) {
		t.Errorf("Settle with an invalid policy: %v", err)
	}
	if st.Stats().Calls != calls {
		t.Fatal("bad input reached Redis")
	}
	srv.Stop()
	defer srv.Cont()
	if err := st.Settle(ctx, "c", p, d.At, 5, 0); !errors.Is(err, sluice.ErrStoreUnavailable) {
		t.Fatalf("Settle while Redis hangs: %v, want ErrStoreUnavailable", err)
	}
	srv.Cont()
	// The call given up on wrote nothing (its deadline passed before Redis ran it).
	if pk, err := st.Decide(ctx, "c", p, 0); err != nil || pk.Remaining != 5 {
		t.Fatalf("after a settlement given up on: %+v %v, want remaining 5", pk, err)
	}
}

// TestSettleFailureModes: a reservation settles where its decision charged. One the local
// fallback made while Redis hung settles on the local store; one Redis made, settled while Redis
// hangs, is dropped with ErrStoreUnavailable, its estimate standing; one FailOpen let through
// unchecked settles nothing.
func TestSettleFailureModes(t *testing.T) {
	srv := redistest.Start(t)
	st := newStore(t, redisstore.Options{Addrs: []string{srv.Addr}, Timeout: 100 * time.Millisecond})
	ctx := context.Background()
	p := sluice.Policy{Name: "tokens", Algorithm: sluice.FixedWindow, Limit: 100, Period: 1000 * time.Hour}
	local := memory.New()
	lim, err := sluice.NewLimiter(st, p, sluice.WithLocalFallback(local, 1), sluice.WithBreaker(1, time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	onRedis, err := lim.Reserve(ctx, "c", 30)
	if err != nil || onRedis.Decision().Fallback != sluice.NoFallback {
		t.Fatalf("reserve on Redis: %+v %v", onRedis.Decision(), err)
	}
	srv.Stop()
	defer srv.Cont()
	onLocal, err := lim.Reserve(ctx, "c", 40)
	if err != nil || onLocal.Decision().Fallback != sluice.FallbackLocal {
		t.Fatalf("reserve while Redis hangs: %+v %v, want the local fallback's", onLocal.Decision(), err)
	}
	if err := onLocal.Settle(ctx, 10); err != nil {
		t.Fatal(err)
	}
	if d, _ := local.Decide(ctx, "c", p, 0); d.Remaining != 90 {
		t.Fatalf("local remaining %d after settling the local reservation 40 to 10, want 90", d.Remaining)
	}
	if err := onRedis.Settle(ctx, 0); !errors.Is(err, sluice.ErrStoreUnavailable) {
		t.Fatalf("settling a Redis reservation while Redis hangs: %v, want ErrStoreUnavailable (dropped)", err)
	}
	if d, _ := local.Decide(ctx, "c", p, 0); d.Remaining != 90 {
		t.Fatalf("a dropped settlement reached the local store: remaining %d", d.Remaining)
	}
	srv.Cont()
	other := newStore(t, redisstore.Options{Addrs: []string{srv.Addr}}) // another instance's view of Redis
	if d, err := other.Decide(ctx, "c", p, 0); err != nil || d.Remaining != 70 {
		t.Fatalf("Redis remaining %d (%v) after the dropped settlement, want 70: the estimate stands", d.Remaining, err)
	}

	open, err := sluice.NewLimiter(st, p, sluice.WithFailureMode(sluice.FailOpen), sluice.WithBreaker(1, time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	r, err := open.Reserve(ctx, "c", 5)
	if err != nil || r.Decision().Fallback != sluice.FallbackOpen {
		t.Fatalf("fail-open reserve: %+v %v", r.Decision(), err)
	}
	if err := r.Settle(ctx, 50); err != nil {
		t.Fatalf("settling a fail-open reservation: %v, want nil (nothing was charged)", err)
	}
	srv.Cont()
	if d, _ := other.Decide(ctx, "c", p, 0); d.Remaining != 70 {
		t.Fatalf("remaining %d after a fail-open reservation settled, want 70", d.Remaining)
	}
}
