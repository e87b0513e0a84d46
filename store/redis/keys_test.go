package redis_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/store/memory"
	"github.com/sluicehq/sluice/store/redis"
)

// DecideAll with limits under several keys (sluice.Limit.Key) on Redis: one script on a single
// server or within one slot of a cluster; across a cluster's slots, checks then commits.

// owner returns the index of the cluster master that holds key's slot (the others answer MOVED).
func owner(t *testing.T, cluster *redistest.Cluster, key string) int {
	t.Helper()
	for i, srv := range cluster.Servers {
		if _, err := srv.Do("EXISTS", key); err == nil {
			return i
		} else if !strings.Contains(err.Error(), "MOVED") {
			t.Fatal(err)
		}
	}
	t.Fatalf("no master holds %q", key)
	return -1
}

// twoNodes returns two keys of the form prefix-N whose state keys (under policy, with the default
// prefix) lie on different masters, and those masters.
func twoNodes(t *testing.T, cluster *redistest.Cluster, prefix, policy string) (a, b string, na, nb int) {
	t.Helper()
	a = prefix + "-0"
	na = owner(t, cluster, "rate-limit:{"+a+"}:"+policy)
	for i := 1; ; i++ {
		b = fmt.Sprintf("%s-%d", prefix, i)
		if nb = owner(t, cluster, "rate-limit:{"+b+"}:"+policy); nb != na {
			return a, b, na, nb
		}
	}
}

// On a single server, limits under several keys are one script call, and each counts under its
// own key.
func TestDecideAllKeysSingleServerOneCall(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, redis.Options{Addrs: []string{srv.Addr}, NegativeCacheSize: -1})
	p := sluice.Policy{Name: "p", Algorithm: sluice.FixedWindow, Limit: 5, Period: time.Hour}
	limits := []sluice.Limit{{Policy: p, Cost: 1}, {Key: "route:/a", Policy: p, Cost: 2}, {Key: "tenant:t", Policy: p, Cost: 3}}
	out := make([]sluice.Decision, 3)
	before := s.Stats().Calls
	if ok, err := s.DecideAll(bg, "client", limits, out); err != nil || !ok {
		t.Fatalf("DecideAll: %v %v", ok, err)
	}
	if calls := s.Stats().Calls - before; calls != 1 {
		t.Fatalf("%d script calls, want 1", calls)
	}
	for key, want := range map[string]string{"client": "4", "route:/a": "3", "tenant:t": "2"} {
		d, err := s.Decide(bg, key, p, 0)
		if err != nil || fmt.Sprint(d.Remaining) != want {
			t.Errorf("%s: %d left (%v), want %s", key, d.Remaining, err, want)
		}
		if n := mustInt(t, srv, "EXISTS", "rate-limit:{"+key+"}:p:v2"); n != 1 {
			t.Errorf("the state of %s is not under its own key", key)
		}
	}
}

// On a cluster: limits whose keys share a slot are one script call; limits in several slots are
// a check per slot then a commit per slot (or, with one slot of enforced limits, its commit
// first), and a refusal found by the checks writes nothing anywhere. Between the checks and the
// commits a concurrent request may spend a slot's quota: committing the slot with the least
// quota left first, a race for that slot's last unit leaves nothing consumed; a race for
// another slot's is refused with the slots committed before it consumed (what sluice.Store
// documents).
func TestDecideAllAcrossClusterSlots(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	clock := sluice.NewManualClock(time.UnixMicro(1_800_000_000_000_000))
	s := newStore(t, redis.Options{Addrs: cluster.Addrs(), Clock: clock, NegativeCacheSize: -1})
	other := newStore(t, redis.Options{Addrs: cluster.Addrs(), Clock: clock, NegativeCacheSize: -1}) // another instance
	p := sluice.Policy{Name: "p", Algorithm: sluice.FixedWindow, Limit: 5, Period: time.Hour}
	remaining := func(key string) int64 {
		t.Helper()
		d, err := s.Decide(bg, key, p, 0)
		if err != nil {
			t.Fatal(err)
		}
		return d.Remaining
	}
	spend := func(st *redis.Store, key string, cost int64) {
		t.Helper()
		if d, err := st.Decide(bg, key, p, cost); err != nil || !d.Allowed {
			t.Fatalf("spending %d of %s: %+v %v", cost, key, d, err)
		}
	}
	out := make([]sluice.Decision, 2)
	call := func(key string, limits []sluice.Limit) (bool, uint64) {
		t.Helper()
		before := s.Stats().Calls
		ok, err := s.DecideAll(bg, key, limits, out)
		if err != nil {
			t.Fatal(err)
		}
		return ok, s.Stats().Calls - before
	}
	pair := func(a, b string, dryB bool) []sluice.Limit {
		return []sluice.Limit{{Policy: p, Cost: 1}, {Key: b, Policy: p, Cost: 1, DryRun: dryB}}
	}

	// One slot ("x}1" and "x}2" both have the hash tag "x"): one call, as for one key.
	if ok, calls := call("x}1", pair("x}1", "x}2", false)); !ok || calls != 1 || remaining("x}1") != 4 || remaining("x}2") != 4 {
		t.Fatalf("two keys in one slot: %v in %d calls, %d and %d left; want allowed in 1 call, 4 and 4", ok, calls, remaining("x}1"), remaining("x}2"))
	}

	a, b, _, _ := twoNodes(t, cluster, "two", p.Name)
	// Allowed: two checks, two commits.
	if ok, calls := call(a, pair(a, b, false)); !ok || calls != 4 || remaining(a) != 4 || remaining(b) != 4 {
		t.Fatalf("two slots, allowed: %v in %d calls, %d and %d left; want allowed in 4, 4 and 4", ok, calls, remaining(a), remaining(b))
	}
	// Refused by a check: b spent; two checks and nothing written on a.
	spend(s, b, 4)
	if ok, calls := call(a, pair(a, b, false)); ok || calls != 2 || !out[0].Allowed || out[1].Allowed || remaining(a) != 4 {
		t.Fatalf("two slots, b spent: %v in %d calls, %+v, a %d left; want refused by b in 2 calls, a 4", ok, calls, out, remaining(a))
	}

	// One slot of enforced limits, a dry run in another: no checks; the enforced slot's commit
	// decides, then the dry run's commit (allowed) or check (refused).
	a, b, _, _ = twoNodes(t, cluster, "dry", p.Name)
	if ok, calls := call(a, pair(a, b, true)); !ok || calls != 2 || remaining(a) != 4 || remaining(b) != 4 {
		t.Fatalf("enforced and dry run in two slots: %v in %d calls, %d and %d left; want allowed in 2, 4 and 4", ok, calls, remaining(a), remaining(b))
	}
	spend(s, a, 4)
	if ok, calls := call(a, pair(a, b, true)); ok || calls != 2 || out[0].Allowed || !out[1].Allowed || out[1].Remaining != 3 || remaining(b) != 4 {
		t.Fatalf("enforced spent, dry run in another slot: %v in %d calls, %+v, b %d left; want refused in 2, the dry run's decision filled, b 4",
			ok, calls, out, remaining(b))
	}

	// A race for the last unit of the slot with the least quota left (b: 1 left, a: 5): b is
	// committed first, refuses, and nothing is consumed on a.
	a, b, _, _ = twoNodes(t, cluster, "race-first", p.Name)
	spend(s, b, 4)
	redis.SetBetweenPhases(s, func() { spend(other, b, 1) })
	if ok, calls := call(a, pair(a, b, false)); ok || calls != 3 || out[1].Allowed || remaining(a) != 5 || remaining(b) != 0 {
		t.Fatalf("race for b's last unit, b committed first: %v in %d calls, %+v, a %d b %d left; want refused in 3 calls, a 5, b 0",
			ok, calls, out, remaining(a), remaining(b))
	}
	// A race for the slot committed second (a: 1 left, so first; b: 5, all taken meanwhile): a is
	// committed, b refuses, and the refused request has consumed a's last unit.
	a, b, _, _ = twoNodes(t, cluster, "race-second", p.Name)
	spend(s, a, 4)
	redis.SetBetweenPhases(s, func() { spend(other, b, 5) })
	if ok, calls := call(a, pair(a, b, false)); ok || calls != 4 || !out[0].Allowed || out[1].Allowed || remaining(a) != 0 || remaining(b) != 0 {
		t.Fatalf("race for b's quota, a committed first: %v in %d calls, %+v, a %d b %d left; want refused in 4 calls with a consumed (0 left), b 0",
			ok, calls, out, remaining(a), remaining(b))
	}
	redis.SetBetweenPhases(s, nil)
}

// On a cluster, a commit that fails after another slot's commit fails the call with
// ErrStoreUnavailable, and that other slot keeps the cost: a's node answers, b's hangs (SIGSTOP)
// between the checks and the commits. b's commit, which reaches Redis only after the store gave
// up on it, writes nothing (its deadline).
func TestDecideAllAcrossClusterSlotsCommitFails(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	const timeout = 300 * time.Millisecond
	p := sluice.Policy{Name: "p", Algorithm: sluice.TokenBucket, Limit: 5, Period: time.Hour} // no refill within the test
	s := newStore(t, redis.Options{Addrs: cluster.Addrs(), Timeout: timeout, NegativeCacheSize: -1})
	a, b, _, nb := twoNodes(t, cluster, "hang", p.Name)
	out := make([]sluice.Decision, 2)
	limits := []sluice.Limit{{Policy: p, Cost: 1}, {Key: b, Policy: p, Cost: 1}}
	// Warm up: the scripts are loaded and the client knows the slots; a and b have 4 left each
	// (equal: a, the first, is committed first).
	var err error
	if !pollUntil(time.Now().Add(5*time.Second), func() bool { _, err = s.DecideAll(bg, a, limits, out); return err == nil }) {
		t.Fatalf("warm-up: %v", err)
	}
	f := newFreezer(t, cluster.Servers[nb])
	var ran, failed int64
	redis.SetBetweenPhases(s, func() { ran, failed = scriptsRun(t, cluster.Servers[nb]); f.freeze() })
	ok, err := s.DecideAll(bg, a, limits, out) // returns when the store gives up on b's commit
	redis.SetBetweenPhases(s, nil)
	f.thaw()
	mustDo(t, cluster.Servers[nb], "PING") // what was queued on the resumed node's sockets has run
	ranNow, failedNow := scriptsRun(t, cluster.Servers[nb])
	t.Logf("%d script calls ran late on b's node, %d of them replied an error", ranNow-ran, failedNow-failed)
	if ranNow-ran != failedNow-failed {
		t.Errorf("of the %d script calls that ran late on b's node, %d replied an error; want all (deadline passed)", ranNow-ran, failedNow-failed)
	}
	if ok || !errors.Is(err, sluice.ErrStoreUnavailable) {
		t.Fatalf("b's node hung during its commit: %v %v, want ErrStoreUnavailable", ok, err)
	}
	for key, want := range map[string]int64{a: 3, b: 4} {
		d, err := s.Decide(context.Background(), key, p, 0)
		if err != nil || d.Remaining != want {
			t.Errorf("%s: %d left (%v), want %d", key, d.Remaining, err, want)
		}
	}
}

// A cached refusal is forgotten when DecideAll consumes on its key and policy (it did not use to
// be: a later refusal from the cache then reported more Remaining than there was).
func TestDecideAllForgetsCachedRefusals(t *testing.T) {
	srv := redistest.Start(t)
	clock := sluice.NewManualClock(time.UnixMicro(1_800_000_000_000_000))
	s := newStore(t, redis.Options{Addrs: []string{srv.Addr}, Clock: clock})
	p := sluice.Policy{Name: "p", Algorithm: sluice.FixedWindow, Limit: 2, Period: time.Hour}
	q := sluice.Policy{Name: "q", Algorithm: sluice.FixedWindow, Limit: 9, Period: time.Hour}
	if d, err := s.Decide(bg, "c", p, 1); err != nil || !d.Allowed {
		t.Fatal(d, err)
	}
	for range 2 { // refused, then answered from the cache
		if d, err := s.Decide(bg, "c", p, 2); err != nil || d.Allowed || d.Remaining != 1 {
			t.Fatalf("cost 2 with 1 left: %+v %v", d, err)
		}
	}
	if s.Stats().CacheHits != 1 {
		t.Fatalf("%d cache hits, want 1", s.Stats().CacheHits)
	}
	for _, tc := range []struct {
		name string
		key  string
		l    sluice.Limit
	}{{"under the call's key", "c", sluice.Limit{Policy: p, Cost: 1}}, {"under its own key", "other", sluice.Limit{Key: "c", Policy: p, Cost: 1}}} {
		if tc.key == "other" { // refill c's window, spend one, and cache a refusal again
			clock.Set(clock.Now().Add(time.Hour))
			s.Decide(bg, "c", p, 1)
			s.Decide(bg, "c", p, 2)
		}
		out := make([]sluice.Decision, 2)
		if ok, err := s.DecideAll(bg, tc.key, []sluice.Limit{tc.l, {Policy: q, Cost: 1}}, out); err != nil || !ok {
			t.Fatalf("%s: DecideAll: %v %v", tc.name, ok, err)
		}
		d, err := s.Decide(bg, "c", p, 2)
		if err != nil || d.Allowed || d.Cached() || d.Remaining != 0 {
			t.Fatalf("%s: cost 2 after DecideAll took the last unit: %+v %v, want refused by Redis with 0 left", tc.name, d, err)
		}
	}
}

// The local fallback decides the limits of a DecideAll under the same keys as Redis would, each
// with its share, all or nothing across them.
func TestLocalFallbackDecidesEveryKey(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, redis.Options{Addrs: []string{srv.Addr}, Timeout: 100 * time.Millisecond})
	clock := sluice.NewManualClock(time.UnixMicro(1_800_000_000_000_000))
	local := memory.New(memory.WithClock(clock))
	g, err := sluice.Guard(s, sluice.WithLocalFallback(local, 0.5))
	if err != nil {
		t.Fatal(err)
	}
	srv.Kill()
	p := sluice.Policy{Name: "p", Algorithm: sluice.FixedWindow, Limit: 4, Period: time.Hour} // 2 locally
	route := sluice.Policy{Name: "route", Algorithm: sluice.FixedWindow, Limit: 6, Period: time.Hour}
	limits := []sluice.Limit{{Policy: p, Cost: 1}, {Key: "route:/a", Policy: route, Cost: 1}}
	out := make([]sluice.Decision, 2)
	for i := range 2 {
		if ok, err := g.DecideAll(bg, "client", limits, out); err != nil || !ok || out[0].Fallback != sluice.FallbackLocal {
			t.Fatalf("request %d with Redis down: %v %v %+v, want allowed locally", i, ok, err, out)
		}
	}
	// The local states are under each limit's own key, with the local share's numbers.
	if d, _ := local.Decide(bg, "route:/a", sluice.Policy{Name: "route", Algorithm: sluice.FixedWindow, Limit: 3, Period: time.Hour}, 0); d.Remaining != 1 {
		t.Fatalf("the route's local state: %d left, want 1 (2 of its local 3 taken)", d.Remaining)
	}
	if d, _ := local.Decide(bg, "client", sluice.Policy{Name: "route", Algorithm: sluice.FixedWindow, Limit: 3, Period: time.Hour}, 0); d.Remaining != 3 {
		t.Fatalf("the route's policy under the client's key: %d left, want 3 (untouched)", d.Remaining)
	}
	// The client's local 2 are spent: refused, and the route consumes nothing.
	if ok, err := g.DecideAll(bg, "client", limits, out); err != nil || ok || out[0].Allowed || !out[1].Allowed {
		t.Fatalf("third request: %v %v %+v, want refused by the client's limit", ok, err, out)
	}
	if d, _ := local.Decide(bg, "route:/a", sluice.Policy{Name: "route", Algorithm: sluice.FixedWindow, Limit: 3, Period: time.Hour}, 0); d.Remaining != 1 {
		t.Fatalf("the route's local state after a refusal: %d left, want 1", d.Remaining)
	}
}
