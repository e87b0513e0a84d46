package redis_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/redistest"
	redisstore "github.com/sluicehq/sluice/store/redis"
	"github.com/sluicehq/sluice/store/storetest"
)

// newStore opens a store on opts, with a generous timeout unless opts sets one: these tests are
// about decisions, and under the race detector on a loaded CI machine a call can take longer
// than the 50 ms default (the failure tests, which are about timeouts, set their own).
func newStore(t testing.TB, opts redisstore.Options) *redisstore.Store {
	t.Helper()
	if opts.Timeout == 0 {
		opts.Timeout = 5 * time.Second
	}
	s, err := redisstore.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// The conformance suite on one real Redis: every decision of the golden and fuzzed traces equals
// the pure core's, on a virtual clock passed to the scripts. The negative cache is off here: it
// answers refusals locally, which the suite would not see (it is tested on its own).
func TestConformanceSingleRedis(t *testing.T) {
	srv := redistest.Start(t)
	n := 0
	storetest.Run(t, func(t *testing.T, c sluice.Clock) sluice.Store {
		n++ // a fresh prefix per trace: a fresh store
		return newStore(t, redisstore.Options{Addrs: []string{srv.Addr}, Clock: c, Prefix: fmt.Sprintf("t%d:", n), NegativeCacheSize: -1})
	})
}

// The same suite on a real 3-master Redis Cluster: keys spread over the masters' slots, one
// client's keys share a slot, and there is never a CROSSSLOT. Limits of one call under keys in
// several slots are decided across them, which under concurrency is not atomic (SplitAcrossKeys).
func TestConformanceCluster(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	n := 0
	storetest.Suite{SplitAcrossKeys: true, New: func(t *testing.T, c sluice.Clock) sluice.Store {
		n++
		return newStore(t, redisstore.Options{Addrs: cluster.Addrs(), Clock: c, Prefix: fmt.Sprintf("t%d:", n), NegativeCacheSize: -1})
	}}.Run(t)
	// The keys did spread: every master holds some.
	for _, s := range cluster.Servers {
		if n, err := s.Do("DBSIZE"); err != nil || n == "0" {
			t.Errorf("master %s holds %s keys (%v), want some: keys are not spread over slots", s.Addr, n, err)
		}
	}
}

// The negative cache answers the same refusals as Redis would: the conformance traces with it on
// give the same decisions, RetryAfter and ResetAfter included (on a virtual clock, which does not
// move during a call, the time the request was sent is Redis's time) — all but Remaining, which a
// cached refusal reports as of the refusal it remembers, so at most the truth.
func TestConformanceWithNegativeCache(t *testing.T) {
	srv := redistest.Start(t)
	n := 0
	storetest.Suite{CachedRefusals: true, New: func(t *testing.T, c sluice.Clock) sluice.Store {
		n++
		return newStore(t, redisstore.Options{Addrs: []string{srv.Addr}, Clock: c, Prefix: fmt.Sprintf("t%d:", n)})
	}}.Run(t)
}

func TestConnectByURLWithACLUser(t *testing.T) {
	srv := redistest.Start(t, "--requirepass", "default-secret")
	// An ACL user that may run scripts on rate-limit keys only.
	if out, err := srv.DoAuth("default-secret", "ACL", "SETUSER", "sluice", "on", ">s3cret", "~rate-limit:*", "+@scripting", "+@read", "+@write", "+time", "+@connection", "+cluster"); err != nil {
		t.Fatalf("ACL SETUSER: %v %s", err, out)
	}
	p := sluice.Policy{Name: "api", Algorithm: sluice.FixedWindow, Limit: 2, Period: time.Minute}
	s := newStore(t, redisstore.Options{URL: "redis://sluice:s3cret@" + srv.Addr + "/0"})
	lim, err := sluice.NewLimiter(s, p)
	if err != nil {
		t.Fatal(err)
	}
	if d, err := lim.Allow(context.Background(), "c"); err != nil || !d.Allowed || d.Remaining != 1 {
		t.Fatalf("decision as ACL user: %+v %v", d, err)
	}
	// A wrong password fails at New, with an error that says the store is unavailable.
	_, err = redisstore.New(redisstore.Options{URL: "redis://sluice:wrong@" + srv.Addr})
	if !errors.Is(err, sluice.ErrStoreUnavailable) {
		t.Fatalf("wrong password: %v, want ErrStoreUnavailable", err)
	}
	for _, bad := range []redisstore.Options{
		{},
		{URL: "http://" + srv.Addr},
		{URL: "redis://" + srv.Addr, Addrs: []string{srv.Addr}},
	} {
		if _, err := redisstore.New(bad); err == nil {
			t.Errorf("New(%+v): no error", bad)
		}
	}
}

// TestRedisAcceptsEveryValidPolicy: the Redis store takes every policy the core does (it used to
// refuse a sliding window or bucket whose (limit or burst) × period passed 2^51 µs, e.g. 100,000
// a day), and decides it exactly as the core, decision for decision, on one server and on a
// cluster: large contracts, limits of 2^53, periods of 292 years, costs of all the capacity.
func TestRedisAcceptsEveryValidPolicy(t *testing.T) {
	policies := []sluice.Policy{
		{Name: "daily", Algorithm: sluice.SlidingWindow, Limit: 100_000, Period: 24 * time.Hour},
		{Name: "monthly", Algorithm: sluice.TokenBucket, Limit: 1_000_000, Period: 30 * 24 * time.Hour, Burst: 1_000_000},
		{Name: "hourly", Algorithm: sluice.LeakyBucket, Limit: 700_000, Period: time.Hour, Burst: 699_999},
		{Name: "hourly-deep", Algorithm: sluice.LeakyBucket, Limit: 700_000, Period: time.Hour, Burst: 1_000_000_000_000},
		{Name: "daily-tb", Algorithm: sluice.TokenBucket, Limit: 100_000_000, Period: 24 * time.Hour},
		{Name: "daily-fw", Algorithm: sluice.FixedWindow, Limit: 1_000_000_000, Period: 24 * time.Hour},
	}
	for _, a := range algorithm.Algorithms {
		p := storetest.LargestPolicy(a)
		p.Name = "largest-" + a.String()
		policies = append(policies, p)
	}
	run := func(t *testing.T, addrs []string) {
		clock := sluice.NewManualClock(time.UnixMicro(0))
		s := newStore(t, redisstore.Options{Addrs: addrs, Clock: clock, NegativeCacheSize: -1})
		ctx := context.Background()
		for _, p := range policies {
			lim, err := sluice.NewLimiter(s, p)
			if err != nil {
				t.Fatalf("NewLimiter(%s): %v", p.Name, err)
			}
			var st algorithm.State
			period, most := p.PeriodMicros(), storetest.MaxCost(&p)
			t0 := int64(1_800_000_000_000_000)
			steps := []storetest.Step{{At: t0, Cost: most}, {At: t0, Cost: 1}, {At: t0 + 1, Cost: most / 2}, {At: t0 + period/3, Cost: 0},
				{At: t0 + period/3, Cost: most / 3}, {At: t0 + period/2, Cost: 1}, {At: t0 + period, Cost: most}, {At: t0 + 2*period + 7, Cost: 1}}
			for i, step := range steps {
				clock.Set(time.UnixMicro(step.At))
				want, wantErr := algorithm.Decide(&p, &st, step.At, step.Cost)
				got, err := lim.AllowN(ctx, "c", step.Cost)
				if err != nil || wantErr != nil {
					t.Fatalf("%s step %d %+v: %v (core: %v)", p.Name, i, step, err, wantErr)
				}
				if got != want {
					t.Fatalf("%s step %d %+v:\n got %+v\nwant %+v", p.Name, i, step, got, want)
				}
			}
		}
	}
	t.Run("single", func(t *testing.T) { run(t, []string{redistest.Start(t).Addr}) })
	t.Run("cluster", func(t *testing.T) { run(t, redistest.StartCluster(t, 3).Addrs()) })
}

// rediss:// connects over TLS, verifying the server against the CA given in Options.TLS; a
// client that does not trust that CA is refused.
func TestConnectOverTLS(t *testing.T) {
	srv, tlsConfig := redistest.StartTLS(t)
	s := newStore(t, redisstore.Options{URL: "rediss://" + srv.Addr, TLS: tlsConfig})
	lim, err := sluice.NewLimiter(s, sluice.Policy{Name: "api", Algorithm: sluice.TokenBucket, Limit: 5, Period: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if d, err := lim.Allow(context.Background(), "c"); err != nil || !d.Allowed || d.Remaining != 4 {
		t.Fatalf("decision over TLS: %+v %v", d, err)
	}
	if keys, _ := srv.Do("KEYS", "*"); !strings.Contains(keys, "rate-limit:{c}:api") {
		t.Fatalf("keys on the TLS server: %q", keys)
	}
	// (A generous timeout: a handshake slower than the dial timeout would be "no answer", which
	// New waits for in the background; this is about the refusal.)
	if _, err := redisstore.New(redisstore.Options{URL: "rediss://" + srv.Addr, Timeout: 5 * time.Second}); !errors.Is(err, sluice.ErrStoreUnavailable) {
		t.Fatalf("rediss:// without trusting the test CA: %v, want ErrStoreUnavailable", err)
	}
}
