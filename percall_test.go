package sluice_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/store/memory"
	redisstore "github.com/sluicehq/sluice/store/redis"
)

// Two tenants' contracts, as a per-tenant lookup would return them.
var (
	gold   = sluice.Policy{Name: "gold", Algorithm: sluice.FixedWindow, Limit: 3, Period: time.Hour}
	silver = sluice.Policy{Name: "silver", Algorithm: sluice.TokenBucket, Limit: 1, Period: time.Hour, Burst: 2}
	daily  = sluice.Policy{Name: "daily", Algorithm: sluice.FixedWindow, Limit: 5, Period: 24 * time.Hour}
)

// redisStore opens a store on a real redis-server of its own.
func redisStore(t *testing.T, opts redisstore.Options) (*redisstore.Store, *redistest.Server) {
	t.Helper()
	srv := redistest.Start(t)
	opts.Addrs = []string{srv.Addr}
	st, err := redisstore.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st, srv
}

// stores runs f on the memory store and on real Redis.
func stores(t *testing.T, f func(t *testing.T, store sluice.Store)) {
	t.Run("memory", func(t *testing.T) { f(t, memory.New()) })
	t.Run("redis", func(t *testing.T) {
		st, _ := redisStore(t, redisstore.Options{Timeout: 5 * time.Second}) // room for a loaded machine
		f(t, st)
	})
}

// One Limiter without a policy decides each call under the policy it is given: each (key,
// policy name) its own state, the same state a Limiter of that policy (NewLimiter) on the store
// keeps; an unnamed policy is named by its numbers as NewLimiter names it, so both ways share it.
func TestAllowPolicyPerCall(t *testing.T) {
	stores(t, func(t *testing.T, store sluice.Store) {
		ctx := context.Background()
		lim, err := sluice.New(store)
		if err != nil {
			t.Fatal(err)
		}
		step := func(key string, p sluice.Policy, cost int64, allowed bool, remaining int64) {
			t.Helper()
			d, err := lim.AllowPolicy(ctx, key, p, cost)
			if err != nil || d.Allowed != allowed || d.Remaining != remaining {
				t.Fatalf("AllowPolicy(%s, %q, %d) = %+v, %v; want allowed %v, remaining %d", key, p.Name, cost, d, err, allowed, remaining)
			}
		}
		step("a", gold, 2, true, 1)
		step("a", silver, 1, true, 1) // a's silver state is not its gold one
		step("b", gold, 3, true, 0)   // nor is b's
		step("a", gold, 2, false, 1)
		step("a", gold, 1, true, 0)
		step("a", gold, 0, true, 0) // a peek

		// A Limiter of gold on the same store sees a's gold state.
		own, err := sluice.NewLimiter(store, gold)
		if err != nil {
			t.Fatal(err)
		}
		if d, err := own.Allow(ctx, "a"); err != nil || d.Allowed {
			t.Fatalf("NewLimiter(gold).Allow(a) = %+v, %v; want the refusal of a's spent gold quota", d, err)
		}

		unnamed := sluice.Policy{Algorithm: sluice.FixedWindow, Limit: 2, Period: time.Minute}
		step("c", unnamed, 1, true, 1)
		byNumbers, err := sluice.NewLimiter(store, unnamed)
		if err != nil {
			t.Fatal(err)
		}
		if byNumbers.Policy().Name != "fixed-window/2/1m0s/0" {
			t.Fatalf("NewLimiter named an unnamed policy %q, want fixed-window/2/1m0s/0", byNumbers.Policy().Name)
		}
		if d, _ := byNumbers.Allow(ctx, "c"); !d.Allowed || d.Remaining != 0 {
			t.Fatalf("the unnamed policy by NewLimiter: %+v, want the per-call calls' state (remaining 0)", d)
		}
		if p, err := lim.CheckPolicy(unnamed); err != nil || p.Name != "fixed-window/2/1m0s/0" {
			t.Fatalf("CheckPolicy(unnamed) = %q, %v", p.Name, err)
		}
		step("c", unnamed, 1, false, 0)
	})
}

// A Limiter made by New has no policy of its own: Allow, AllowN, AllowNWithin, Wait, WaitN,
// Reserve and Settle say so (ErrNoPolicy) and decide nothing; Policy is the zero Policy.
func TestNewHasNoPolicy(t *testing.T) {
	ctx := context.Background()
	lim, err := sluice.New(memory.New())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lim.Allow(ctx, "a"); !errors.Is(err, sluice.ErrNoPolicy) {
		t.Errorf("Allow: %v, want ErrNoPolicy", err)
	}
	if _, err := lim.AllowN(ctx, "a", 2); !errors.Is(err, sluice.ErrNoPolicy) {
		t.Errorf("AllowN: %v, want ErrNoPolicy", err)
	}
	if _, err := lim.AllowNWithin(ctx, "a", 1, time.Second); !errors.Is(err, sluice.ErrNoPolicy) {
		t.Errorf("AllowNWithin: %v, want ErrNoPolicy", err)
	}
	if err := lim.Wait(ctx, "a"); !errors.Is(err, sluice.ErrNoPolicy) {
		t.Errorf("Wait: %v, want ErrNoPolicy", err)
	}
	if r, err := lim.Reserve(ctx, "a", 3); !errors.Is(err, sluice.ErrNoPolicy) || r.OK() {
		t.Errorf("Reserve: ok %v, %v, want ErrNoPolicy", r.OK(), err)
	}
	if err := lim.Settle(ctx, "a", 3, 1); !errors.Is(err, sluice.ErrNoPolicy) {
		t.Errorf("Settle: %v, want ErrNoPolicy", err)
	}
	if !strings.Contains(sluice.ErrNoPolicy.Error(), "AllowPolicy") {
		t.Errorf("ErrNoPolicy does not say what to do instead: %v", sluice.ErrNoPolicy)
	}
	if lim.Policy() != (sluice.Policy{}) {
		t.Errorf("Policy() = %+v, want the zero Policy", lim.Policy())
	}
	if _, err := sluice.New(nil); err == nil || !strings.Contains(err.Error(), "store is nil") {
		t.Errorf("New(nil): %v", err)
	}
	if _, err := sluice.New(memory.New(), sluice.WithBreaker(0, time.Second)); err == nil || !strings.Contains(err.Error(), "sluice: New: breaker threshold 0") {
		t.Errorf("New with a bad breaker: %v", err)
	}
}

// A policy given per call is validated per call: an invalid one is an error wrapping
// ErrInvalidPolicy that names the field (and, in AllowAll, the limit), and nothing is decided —
// not even the other, valid limits of the call.
func TestPerCallPoliciesValidated(t *testing.T) {
	ctx := context.Background()
	lim, _ := sluice.New(memory.New())
	bad := sluice.Policy{Name: "broken", Algorithm: sluice.SlidingLog, Limit: 5, Period: time.Second, Burst: 2}
	if d, err := lim.AllowPolicy(ctx, "a", bad, 1); !errors.Is(err, sluice.ErrInvalidPolicy) || !strings.Contains(err.Error(), `policy "broken": burst 2 has no meaning`) || d.Allowed {
		t.Fatalf("AllowPolicy(bad) = %+v, %v", d, err)
	}
	if err := lim.WaitPolicy(ctx, "a", sluice.Policy{Algorithm: sluice.FixedWindow, Limit: 0, Period: time.Second}, 1); !errors.Is(err, sluice.ErrInvalidPolicy) || !strings.Contains(err.Error(), "limit 0 must be > 0") {
		t.Fatalf("WaitPolicy(limit 0): %v", err)
	}
	// Bounds that only Validate knows (the stores' own last-line check does not): a bucket that
	// would take centuries to refill, a time zone without a calendar.
	for _, c := range []struct {
		p    sluice.Policy
		want string
	}{
		{sluice.Policy{Name: "eons", Algorithm: sluice.TokenBucket, Limit: 1, Period: 1000 * time.Hour, Burst: 1 << 40}, "is over 285 years"},
		{sluice.Policy{Name: "zoned", Algorithm: sluice.FixedWindow, Limit: 1, Period: time.Hour, Location: time.UTC}, "time zone UTC has no meaning without a calendar"},
	} {
		if d, err := lim.AllowPolicy(ctx, "a", c.p, 1); !errors.Is(err, sluice.ErrInvalidPolicy) || !strings.Contains(err.Error(), c.want) || d.Allowed {
			t.Errorf("AllowPolicy(%s) = %+v, %v; want ErrInvalidPolicy saying %q", c.p.Name, d, err, c.want)
		}
	}
	ok, ds, err := lim.AllowAll(ctx, "a", []sluice.Limit{{Policy: gold, Cost: 1}, {Policy: bad, Cost: 1}})
	if ok || !errors.Is(err, sluice.ErrInvalidPolicy) || !strings.Contains(err.Error(), "limits[1]") || len(ds) != 2 || ds[0].Allowed {
		t.Fatalf("AllowAll with an invalid limit: %v %+v %v", ok, ds, err)
	}
	if d, _ := lim.AllowPolicy(ctx, "a", gold, 0); d.Remaining != 3 {
		t.Fatalf("gold after the refused calls: remaining %d, want 3 (nothing decided)", d.Remaining)
	}
	// The same (key, policy) twice in one call would count one state twice.
	_, _, err = lim.AllowAll(ctx, "a", []sluice.Limit{{Policy: gold, Cost: 1}, {Key: "a", Policy: gold, Cost: 1}})
	if err == nil || !strings.Contains(err.Error(), `limits[0] and limits[1] both count policy "gold" under one key`) {
		t.Fatalf("AllowAll with a (key, policy) twice: %v", err)
	}
	if _, err := lim.DecideAll(ctx, "a", []sluice.Limit{{Policy: gold, Cost: 1}}, nil); err == nil || !strings.Contains(err.Error(), "0 decisions for 1 limits") {
		t.Fatalf("DecideAll with a short out: %v", err)
	}
	if ok, ds, err := lim.AllowAll(ctx, "a", nil); !ok || len(ds) != 0 || err != nil {
		t.Fatalf("AllowAll of no limits: %v %v %v, want ok", ok, ds, err)
	}
	if d, _ := lim.AllowPolicy(ctx, "a", gold, 0); d.Remaining != 3 {
		t.Fatalf("gold after the refused calls: remaining %d, want 3 (nothing decided)", d.Remaining)
	}
}

// AllowAll is all or nothing across policies and keys: a request counted against its client's
// hourly quota, its tenant's daily one (another key) and a dry-run policy passes only if both
// enforced ones allow, and a refusal by one consumes nothing from the other, nor from the dry run.
func TestAllowAllAllOrNothing(t *testing.T) {
	stores(t, func(t *testing.T, store sluice.Store) {
		ctx := context.Background()
		lim, _ := sluice.New(store)
		watch := sluice.Policy{Name: "watch", Algorithm: sluice.FixedWindow, Limit: 100, Period: time.Hour}
		request := func(client string, cost int64) []sluice.Limit {
			return []sluice.Limit{
				{Policy: gold, Cost: cost},                      // the client's own
				{Key: "tenant:acme", Policy: daily, Cost: cost}, // shared by the tenant's clients
				{Policy: watch, Cost: cost, DryRun: true},       // counted, never refusing
			}
		}
		for i, c := range []struct {
			client    string
			cost      int64
			ok        bool
			remaining [3]int64
		}{
			{"alice", 2, true, [3]int64{1, 3, 98}},
			{"alice", 2, false, [3]int64{1, 1, 96}}, // gold refuses: the others say what they would leave, and keep it
			{"bob", 3, true, [3]int64{0, 0, 97}},
			{"carol", 1, false, [3]int64{2, 0, 99}}, // the tenant's daily refuses carol's fresh gold
			{"alice", 1, false, [3]int64{0, 0, 97}},
		} {
			ok, ds, err := lim.AllowAll(ctx, c.client, request(c.client, c.cost))
			if err != nil || ok != c.ok {
				t.Fatalf("step %d (%s, cost %d): ok %v, %v; want %v", i, c.client, c.cost, ok, err, c.ok)
			}
			for j, d := range ds {
				if d.Remaining != c.remaining[j] {
					t.Errorf("step %d (%s, cost %d): limit %d remaining %d, want %d (%+v)", i, c.client, c.cost, j, d.Remaining, c.remaining[j], d)
				}
			}
		}
		// What the refusals left: alice's gold 1, the tenant's daily 0, alice's watch 98: only
		// the approved requests consumed.
		if d, _ := lim.AllowPolicy(ctx, "alice", gold, 0); d.Remaining != 1 {
			t.Errorf("alice's gold: %d left, want 1", d.Remaining)
		}
		if d, _ := lim.AllowPolicy(ctx, "tenant:acme", daily, 0); d.Remaining != 0 {
			t.Errorf("the tenant's daily: %d left, want 0", d.Remaining)
		}
		if d, _ := lim.AllowPolicy(ctx, "alice", watch, 0); d.Remaining != 98 {
			t.Errorf("alice's watch: %d left, want 98", d.Remaining)
		}
	})
}

// Unnamed policies passed per call do not share state unless their numbers are the same, and the
// caller's limits are not modified by their naming. Calendar policies are named by their calendar
// and zone: a day and a month of one limit, whose periods are both 0, are two states (the name by
// numbers alone, "fixed-window/2/0s/0", was one).
func TestUnnamedPerCallPolicies(t *testing.T) {
	ctx := context.Background()
	lim, _ := sluice.New(memory.New())
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	day := sluice.Policy{Algorithm: sluice.FixedWindow, Limit: 2, Calendar: algorithm.Day, Location: berlin}
	month := sluice.Policy{Algorithm: sluice.FixedWindow, Limit: 2, Calendar: algorithm.Month}
	perMinute := sluice.Policy{Algorithm: sluice.FixedWindow, Limit: 2, Period: time.Minute}
	perHour := sluice.Policy{Algorithm: sluice.FixedWindow, Limit: 2, Period: time.Hour}
	limits := []sluice.Limit{{Policy: perMinute, Cost: 2}, {Policy: perHour, Cost: 1}}
	ok, ds, err := lim.AllowAll(ctx, "a", limits)
	if err != nil || !ok || ds[0].Remaining != 0 || ds[1].Remaining != 1 {
		t.Fatalf("2 a minute and 2 an hour: %v %+v %v; want each its own state", ok, ds, err)
	}
	if limits[0].Policy.Name != "" || limits[1].Policy.Name != "" {
		t.Fatalf("AllowAll named the caller's policies: %q, %q", limits[0].Policy.Name, limits[1].Policy.Name)
	}
	for _, c := range []struct {
		p    sluice.Policy
		name string
	}{
		{day, "fixed-window/2/day/Europe/Berlin"},
		{month, "fixed-window/2/month/UTC"},
		{perMinute, "fixed-window/2/1m0s/0"},
		{sluice.Policy{Algorithm: sluice.TokenBucket, Limit: 5, Period: time.Second, Burst: 20}, "token-bucket/5/1s/20"},
	} {
		if p, err := lim.CheckPolicy(c.p); err != nil || p.Name != c.name {
			t.Errorf("CheckPolicy(%+v).Name = %q, %v; want %q", c.p, p.Name, err, c.name)
		}
		if own, err := sluice.NewLimiter(memory.New(), c.p); err != nil || own.Policy().Name != c.name {
			t.Errorf("NewLimiter(%+v).Policy().Name = %q, %v; want %q", c.p, own.Policy().Name, err, c.name)
		}
	}
}

// The Limiter's failure mode applies to per-call policies as to its own: with Redis killed,
// fail-closed is ErrStoreUnavailable, fail-open approves (FallbackOpen), local decides on the
// in-process share of each policy given (FallbackLocal), all or nothing; and the breaker opens.
func TestPerCallFailureModes(t *testing.T) {
	st, srv := redisStore(t, redisstore.Options{Timeout: 2 * time.Second}) // a killed server refuses at once
	ctx := context.Background()
	closed, _ := sluice.New(st, sluice.WithBreaker(3, time.Hour))
	open, _ := sluice.New(st, sluice.WithFailureMode(sluice.FailOpen))
	local, err := sluice.New(st, sluice.WithLocalFallback(memory.New(), 0.5))
	if err != nil {
		t.Fatal(err)
	}
	perMinute := sluice.Policy{Name: "per-minute", Algorithm: sluice.FixedWindow, Limit: 4, Period: time.Minute}
	if d, err := closed.AllowPolicy(ctx, "a", perMinute, 1); err != nil || !d.Allowed || d.Fallback != sluice.NoFallback {
		t.Fatalf("Redis up: %+v, %v", d, err)
	}
	srv.Kill()
	for i := 0; i < 3; i++ {
		if d, err := closed.AllowPolicy(ctx, "a", perMinute, 1); !errors.Is(err, sluice.ErrStoreUnavailable) || d.Allowed {
			t.Fatalf("fail-closed, Redis down: %+v, %v; want ErrStoreUnavailable", d, err)
		}
	}
	if closed.StoreAvailable() {
		t.Fatal("three failures of per-call decisions did not open the breaker")
	}
	if _, err := closed.AllowPolicy(ctx, "a", perMinute, 1); !errors.Is(err, sluice.ErrStoreUnavailable) || !strings.Contains(err.Error(), "breaker open") {
		t.Fatalf("fail-closed, breaker open: %v", err)
	}
	if ok, _, err := closed.AllowAll(ctx, "a", []sluice.Limit{{Policy: perMinute, Cost: 1}}); ok || !errors.Is(err, sluice.ErrStoreUnavailable) {
		t.Fatalf("fail-closed AllowAll: %v %v", ok, err)
	}
	if d, err := open.AllowPolicy(ctx, "a", perMinute, 1); err != nil || !d.Allowed || d.Fallback != sluice.FallbackOpen {
		t.Fatalf("fail-open: %+v, %v", d, err)
	}
	if ok, ds, err := open.AllowAll(ctx, "a", []sluice.Limit{{Policy: perMinute, Cost: 1}, {Policy: gold, Cost: 1}}); !ok || err != nil || ds[1].Fallback != sluice.FallbackOpen {
		t.Fatalf("fail-open AllowAll: %v %+v %v", ok, ds, err)
	}
	// Local: half of 4 a minute is 2; half of gold's 3 an hour is 1, and AllowAll stays all or
	// nothing on the local store: the second request is refused by gold and takes nothing from
	// per-minute.
	want := []struct {
		ok        bool
		remaining [2]int64
	}{{true, [2]int64{1, 0}}, {false, [2]int64{0, 0}}}
	for i, w := range want {
		ok, ds, err := local.AllowAll(ctx, "b", []sluice.Limit{{Policy: perMinute, Cost: 1}, {Policy: gold, Cost: 1}})
		if err != nil || ok != w.ok || ds[0].Remaining != w.remaining[0] || ds[1].Remaining != w.remaining[1] || ds[0].Fallback != sluice.FallbackLocal {
			t.Fatalf("local AllowAll %d: %v %+v %v; want %v, remaining %v", i, ok, ds, err, w.ok, w.remaining)
		}
	}
	if d, err := local.AllowPolicy(ctx, "b", perMinute, 1); err != nil || !d.Allowed || d.Remaining != 0 || d.Fallback != sluice.FallbackLocal {
		t.Fatalf("local AllowPolicy: %+v, %v; want the last of the local 2", d, err)
	}
	if d, _ := local.AllowPolicy(ctx, "b", perMinute, 1); d.Allowed {
		t.Fatalf("local AllowPolicy beyond the share: %+v", d)
	}
}

// Many goroutines deciding per-call policies at once, all or nothing across two policies and a
// shared key, approve exactly what the quotas hold: the tenant's 300 a day, no more, no less,
// with every client's own 40 an hour respected.
func TestPerCallConcurrent(t *testing.T) {
	stores(t, func(t *testing.T, store sluice.Store) {
		ctx := context.Background()
		lim, _ := sluice.New(store)
		client := sluice.Policy{Name: "client", Algorithm: sluice.SlidingWindow, Limit: 40, Period: time.Hour}
		tenant := sluice.Policy{Name: "tenant", Algorithm: sluice.FixedWindow, Limit: 300, Period: 24 * time.Hour}
		const clients, tries = 16, 60 // 16×40 = 640 > 300: the tenant's quota runs out first
		var approved atomic.Int64
		perClient := make([]int64, clients)
		var wg sync.WaitGroup
		errs := make(chan error, clients)
		for c := 0; c < clients; c++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				key := "client-" + string(rune('a'+c))
				limits := []sluice.Limit{{Policy: client, Cost: 1}, {Key: "tenant:acme", Policy: tenant, Cost: 1}}
				for i := 0; i < tries; i++ {
					ok, _, err := lim.AllowAll(ctx, key, limits)
					if err != nil {
						errs <- err
						return
					}
					if ok {
						approved.Add(1)
						perClient[c]++
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		if approved.Load() != 300 {
			t.Fatalf("approved %d, want exactly the tenant's 300", approved.Load())
		}
		for c, n := range perClient {
			if n > 40 {
				t.Errorf("client %d: %d approved, over its 40", c, n)
			}
		}
		if d, _ := lim.AllowPolicy(ctx, "tenant:acme", tenant, 0); d.Remaining != 0 {
			t.Fatalf("the tenant's quota: %d left, want 0", d.Remaining)
		}
	})
}

// A valid named policy per call decides without allocating, as the Limiter's own does; an
// unnamed one too, once its name is known; DecideAll of named policies as well.
func TestPerCallDoesNotAllocate(t *testing.T) {
	ctx := context.Background()
	lim, _ := sluice.New(memory.New())
	unnamed := sluice.Policy{Algorithm: sluice.TokenBucket, Limit: 1000, Period: time.Millisecond, Burst: 1000}
	limits := []sluice.Limit{{Policy: gold, Cost: 0}, {Policy: silver, Cost: 0}}
	out := make([]sluice.Decision, 2)
	lim.AllowPolicy(ctx, "a", gold, 0)
	lim.AllowPolicy(ctx, "a", unnamed, 0)
	lim.DecideAll(ctx, "a", limits, out)
	for _, c := range []struct {
		name string
		f    func()
	}{
		{"AllowPolicy named", func() { lim.AllowPolicy(ctx, "a", gold, 0) }},
		{"AllowPolicy unnamed", func() { lim.AllowPolicy(ctx, "a", unnamed, 1) }},
		{"DecideAll named", func() { lim.DecideAll(ctx, "a", limits, out) }},
	} {
		if n := testing.AllocsPerRun(100, c.f); n != 0 {
			t.Errorf("%s: %v allocations per call, want 0", c.name, n)
		}
	}
}

// The per-call path against the fixed-policy path, on the memory store (what they add to a
// decision) and on real Redis (where the network dominates).
func BenchmarkPerCall(b *testing.B) {
	ctx := context.Background()
	p := sluice.Policy{Name: "api", Algorithm: sluice.TokenBucket, Limit: 1 << 40, Period: time.Second, Burst: 1 << 40}
	unnamed := p
	unnamed.Name = ""
	run := func(b *testing.B, store sluice.Store) {
		fixed, _ := sluice.NewLimiter(store, p)
		lim, _ := sluice.New(store)
		limits := []sluice.Limit{{Policy: p, Cost: 1}}
		out := make([]sluice.Decision, 1)
		fixed.AllowN(ctx, "k", 1) // the key's state exists before any is measured
		for _, c := range []struct {
			name string
			f    func() error
		}{
			{"fixed/AllowN", func() error { _, err := fixed.AllowN(ctx, "k", 1); return err }},
			{"per-call/AllowPolicy", func() error { _, err := lim.AllowPolicy(ctx, "k", p, 1); return err }},
			{"per-call/AllowPolicy-unnamed", func() error { _, err := lim.AllowPolicy(ctx, "k", unnamed, 1); return err }},
			{"per-call/DecideAll", func() error { _, err := lim.DecideAll(ctx, "k", limits, out); return err }},
			{"per-call/AllowAll", func() error { _, _, err := lim.AllowAll(ctx, "k", limits); return err }},
		} {
			b.Run(c.name, func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					if err := c.f(); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
	b.Run("memory", func(b *testing.B) { run(b, memory.New()) })
	b.Run("redis", func(b *testing.B) {
		srv := redistest.Start(b)
		st, err := redisstore.New(redisstore.Options{Addrs: []string{srv.Addr}, Timeout: 5 * time.Second})
		if err != nil {
			b.Fatal(err)
		}
		defer st.Close()
		run(b, st)
	})
}
