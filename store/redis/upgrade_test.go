package redis_test

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/store/redis"
)

// A rolling upgrade from the version that kept each state in a hash (HMGET, HSET, PEXPIRE) to the
// one that keeps it in a string (GET, SET … PX): instances of both decide on one Redis at once.
// The old version is its own scripts, kept verbatim under testdata/lua-v1 (this repository's
// store/redis/lua at commit 077f9f1, the last of the hash format), run the way its store ran them: KEYS
// prefix{client}:policy and …:log, the same arguments.

// oldInstance decides as an instance of the old version does.
type oldInstance struct {
	t      *testing.T
	c      rueidis.Client
	single map[algorithm.Algorithm]*rueidis.Lua
}

func newOldInstance(t *testing.T, addrs ...string) *oldInstance {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: addrs, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	read := func(name string) string {
		b, err := os.ReadFile("testdata/lua-v1/" + name)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	files := map[algorithm.Algorithm]string{algorithm.FixedWindow: "fixed_window.lua", algorithm.SlidingLog: "sliding_log.lua",
		algorithm.SlidingWindow: "sliding_window.lua", algorithm.TokenBucket: "token_bucket.lua", algorithm.LeakyBucket: "leaky_bucket.lua"}
	o := &oldInstance{t: t, c: c, single: map[algorithm.Algorithm]*rueidis.Lua{}}
	for a, f := range files {
		o.single[a] = rueidis.NewLuaScript(read("common.lua") + "\n" + read(f) + "\n" + read("single.lua"))
	}
	return o
}

// decide runs the old single script on key under p at now (µs) with an hour of TTL slack, as the
// old store did on a virtual clock; it reports whether the request was allowed.
func (o *oldInstance) decide(key string, p sluice.Policy, cost int64, now int64) bool {
	o.t.Helper()
	k := redis.DefaultPrefix + "{" + key + "}:" + p.Name
	args := []string{strconv.Itoa(int(p.Algorithm)), strconv.FormatInt(p.Limit, 10), strconv.FormatInt(p.PeriodMicros(), 10),
		strconv.FormatInt(p.Burst, 10), strconv.FormatInt(cost, 10), strconv.FormatInt(now, 10), strconv.FormatInt(int64(time.Hour/time.Microsecond), 10)}
	r, err := o.single[p.Algorithm].Exec(context.Background(), o.c, []string{k, k + ":log"}, args).AsIntSlice()
	if err != nil {
		o.t.Fatalf("old instance, %s: %v", k, err)
	}
	return r[0] == 1
}

// upgradePolicies are one policy of each algorithm, each of capacity 10, whose quota does not come
// back within the test (an hour's period, decided at one instant).
func upgradePolicies() []sluice.Policy {
	return []sluice.Policy{
		{Name: "fw", Algorithm: sluice.FixedWindow, Limit: 10, Period: time.Hour},
		{Name: "sl", Algorithm: sluice.SlidingLog, Limit: 10, Period: time.Hour},
		{Name: "sw", Algorithm: sluice.SlidingWindow, Limit: 10, Period: time.Hour},
		{Name: "tb", Algorithm: sluice.TokenBucket, Limit: 10, Period: time.Hour},
		{Name: "lb", Algorithm: sluice.LeakyBucket, Limit: 1, Period: time.Hour, Burst: 9},
	}
}

// TestRollingUpgrade: old and new instances on one Redis, on the same clients, at one instant.
// Before the upgrade the old instances spend 4 of a capacity of 10. A new instance then takes over
// that state (it finds no string, reads the old hash): it approves exactly the 6 left, never a
// fresh 10. While old instances still run, each version counts on its own key from there: the old
// ones approve their 6 as well, so a client gets at most 4 + 6 + 6 = 16 (≤ 2 × the limit, the
// documented bound) — except under the sliding log, whose list both versions share, which stays
// exact (4 + 6). Once the old instances are gone, the new state alone decides, exactly.
func TestRollingUpgrade(t *testing.T) {
	srv := redistest.Start(t)
	t0 := time.UnixMicro(1_800_000_000_000_000 + 1_234_567)
	now := t0.UnixMicro()
	old := newOldInstance(t, srv.Addr)
	st := openStore(t, srv, redis.Options{Clock: sluice.NewManualClock(t0), NegativeCacheSize: -1, Timeout: 5 * time.Second})
	for _, p := range upgradePolicies() {
		t.Run(p.Algorithm.String(), func(t *testing.T) {
			key := "upgrade-" + p.Algorithm.String()
			capacity := p.Capacity()
			const before = 4
			for i := range before {
				if !old.decide(key, p, 1, now) {
					t.Fatalf("old instance, request %d of %d before the upgrade: refused", i+1, before)
				}
			}
			// The new instance's first decision sees the old instances' approvals.
			d, err := st.Decide(bg, key, p, 0)
			if err != nil || d.Remaining != capacity-before {
				t.Fatalf("new instance, a peek after the old instances' %d approvals: %+v %v; want %d left", before, d, err, capacity-before)
			}
			// Both versions at once, alternating, until neither approves. (The new instance takes
			// the old state over at its first approval, which comes first here: at 4 spent.)
			var oldApproved, newApproved int64
			for range 2 * capacity {
				d, err := st.Decide(bg, key, p, 1)
				if err != nil {
					t.Fatal(err)
				}
				if d.Allowed {
					newApproved++
				}
				if old.decide(key, p, 1, now) {
					oldApproved++
				}
			}
			total := before + oldApproved + newApproved
			if p.Algorithm == sluice.SlidingLog {
				if total != capacity {
					t.Fatalf("sliding log, one list for both versions: %d approved (old %d + %d, new %d); want exactly %d", total, before, oldApproved, newApproved, capacity)
				}
			} else {
				if newApproved != capacity-before {
					t.Fatalf("new instance approved %d during the overlap; want %d, what the old instances' state had left", newApproved, capacity-before)
				}
				if total > 2*capacity {
					t.Fatalf("%d approved during the rolling upgrade (old %d + %d, new %d); the documented bound is 2 × %d", total, before, oldApproved, newApproved, capacity)
				}
			}
			// The old instances are gone: the new state alone decides, and it is spent.
			if d, err := st.Decide(bg, key, p, 1); err != nil || d.Allowed {
				t.Fatalf("new instance after the upgrade: %+v %v; want refused (spent)", d, err)
			}
			if p.Algorithm != sluice.SlidingLog {
				k := redis.DefaultPrefix + "{" + key + "}:" + p.Name
				if typ := mustDo(t, srv, "TYPE", k+":v2"); typ != "string" {
					t.Fatalf("the new state %s:v2 is a %s; want a string", k, typ)
				}
				if pttl := mustInt(t, srv, "PTTL", k+":v2"); pttl <= 0 {
					t.Fatalf("the new state has PTTL %d; want a TTL", pttl)
				}
			}
		})
	}

	// DecideAll (the multi script) takes over the old states as well, all or nothing: an old
	// instance spent 8 of 10 under the fixed window, so 3 more are refused under every limit and
	// write nothing, 2 are approved.
	t.Run("DecideAll", func(t *testing.T) {
		ps := upgradePolicies()
		for range 8 {
			old.decide("upgrade-all", ps[0], 1, now)
		}
		limits := []sluice.Limit{{Policy: ps[0], Cost: 3}, {Policy: ps[3], Cost: 3}}
		out := make([]sluice.Decision, len(limits))
		if ok, err := st.DecideAll(bg, "upgrade-all", limits, out); err != nil || ok || out[0].Allowed || out[0].Remaining != 2 {
			t.Fatalf("DecideAll of 3 after the old instance's 8 of 10: %v %v %+v; want refused with 2 left", ok, err, out)
		}
		limits[0].Cost, limits[1].Cost = 2, 2
		if ok, err := st.DecideAll(bg, "upgrade-all", limits, out); err != nil || !ok || out[0].Remaining != 0 || out[1].Remaining != 8 {
			t.Fatalf("DecideAll of 2: %v %v %+v; want approved, 0 and 8 left", ok, err, out)
		}
	})

	// A state the old instances wrote under another limit (a reload between the versions) is taken
	// over with what was used: 10 of 10 spent, raised to 20, 10 more.
	t.Run("other policy", func(t *testing.T) {
		p := upgradePolicies()[3]
		for range 10 {
			old.decide("upgrade-reloaded", p, 1, now)
		}
		q := p
		q.Limit = 20
		if d, err := st.Decide(bg, "upgrade-reloaded", q, 1); err != nil || !d.Allowed || d.Remaining != 9 {
			t.Fatalf("after a reload to %d: %+v %v; want the 10 used kept, 9 left", q.Limit, d, err)
		}
		if keys := mustDo(t, srv, "KEYS", "*{upgrade-reloaded}*"); !strings.Contains(keys, ":tb:v2") {
			t.Fatalf("keys %q", keys)
		}
	})
}

// TestRollingUpgradeCluster: on a Redis Cluster the new scripts read the old hash too, although
// it is not among their KEYS: it shares the string's hash tag, so its slot.
func TestRollingUpgradeCluster(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	t0 := time.UnixMicro(1_800_000_000_000_000 + 1_234_567)
	old := newOldInstance(t, cluster.Addrs()...)
	st, err := redis.New(redis.Options{Addrs: cluster.Addrs(), Clock: sluice.NewManualClock(t0), NegativeCacheSize: -1, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for _, p := range upgradePolicies() {
		for i := range 3 { // clients on several masters
			key := "upgrade-" + p.Algorithm.String() + "-" + strconv.Itoa(i)
			for range 4 {
				old.decide(key, p, 1, t0.UnixMicro())
			}
			if d, err := st.Decide(bg, key, p, 1); err != nil || !d.Allowed || d.Remaining != p.Capacity()-5 {
				t.Fatalf("%s: the new instance after the old one's 4: %+v %v; want approved, %d left", key, d, err, p.Capacity()-5)
			}
		}
	}
}
