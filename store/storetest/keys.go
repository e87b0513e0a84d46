package storetest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
)

// The conformance of DecideAll with limits under several keys (sluice.Limit.Key).

// MultiLimit is one limit of a MultiStep: a policy of its trace (by index), the key it counts
// under ("" for the step's), its cost, its bound on a hold, and whether it is a dry run.
type MultiLimit struct {
	Policy   int
	Key      string
	Cost     int64
	MaxDelay time.Duration
	DryRun   bool
}

// MultiStep is one DecideAll of a MultiTrace: at µs since the epoch, under Key, of Limits.
type MultiStep struct {
	At     int64
	Key    string
	Limits []MultiLimit
}

// MultiTrace is policies and DecideAll calls on them, in time order; each call's limits have
// distinct (key, policy) pairs.
type MultiTrace struct {
	Name     string
	Policies []sluice.Policy
	Steps    []MultiStep
}

// ReplayMulti runs tr on a fresh store and on the pure core (DecideAll's semantics: every limit
// decided on a copy of its key's state, the copies kept only if every enforced limit allows),
// and fails at the first call whose answer, or any of whose decisions, differs.
func (s Suite) ReplayMulti(t *testing.T, tr MultiTrace) {
	t.Helper()
	clock := sluice.NewManualClock(time.UnixMicro(0))
	store := s.New(t, clock)
	ref := map[[2]string]*algorithm.State{}
	ctx := context.Background()
	for i, st := range tr.Steps {
		clock.Set(time.UnixMicro(st.At))
		limits := make([]sluice.Limit, len(st.Limits))
		for j, l := range st.Limits {
			limits[j] = sluice.Limit{Key: l.Key, Policy: tr.Policies[l.Policy], Cost: l.Cost, MaxDelay: l.MaxDelay, DryRun: l.DryRun}
		}
		want := make([]sluice.Decision, len(limits))
		wantOK, wantErr := decideAllRef(ref, st, limits, want)
		got := make([]sluice.Decision, len(limits))
		gotOK, gotErr := store.DecideAll(ctx, st.Key, limits, got)
		if (wantErr == nil) != (gotErr == nil) || (wantErr != nil && !sameKind(wantErr, gotErr)) {
			t.Fatalf("%s step %d %+v: error %v, want %v", tr.Name, i, st, gotErr, wantErr)
		}
		if wantErr != nil {
			continue
		}
		for j := range got {
			if s.CachedRefusals && !want[j].Allowed && got[j].Cached() && got[j].Remaining <= want[j].Remaining {
				got[j].Remaining, got[j].Source = want[j].Remaining, sluice.FromStore
			}
		}
		if gotOK != wantOK || !slices.Equal(got, want) {
			t.Fatalf("%s step %d %+v (policies %+v):\n got %v %+v\nwant %v %+v", tr.Name, i, st, tr.Policies, gotOK, got, wantOK, want)
		}
	}
}

// decideAllRef is DecideAll on the core, on the states in ref by (key, policy name).
func decideAllRef(ref map[[2]string]*algorithm.State, st MultiStep, limits []sluice.Limit, out []sluice.Decision) (bool, error) {
	for j := range limits {
		if err := algorithm.CheckCost(&limits[j].Policy, limits[j].Cost, &out[j]); err != nil {
			return false, err
		}
	}
	trial := make([]algorithm.State, len(limits))
	all := true
	for j := range limits {
		l := &limits[j]
		if s := ref[[2]string{l.EffectiveKey(st.Key), l.Policy.Name}]; s != nil {
			trial[j] = *s
			trial[j].Log = slices.Clone(s.Log)
		}
		if err := algorithm.DecideWithin(&l.Policy, &trial[j], st.At, l.Cost, l.MaxDelayMicros(), &out[j]); err != nil {
			return false, err
		}
		all = all && (out[j].Allowed || l.DryRun)
	}
	if all {
		for j := range limits {
			if out[j].Allowed && limits[j].Cost > 0 {
				ref[[2]string{limits[j].EffectiveKey(st.Key), limits[j].Policy.Name}] = &trial[j]
			}
		}
	}
	return all, nil
}

// FuzzedMultiTraces returns n random traces of up to steps DecideAll calls each, drawn from
// random stream number stream: three small policies of random algorithms, calls of one to four limits on three keys (each
// limit under the call's key or under its own, the call's key sometimes one no limit uses), now
// and then a dry run, a bound on a leaky bucket's hold, or a cost that can never fit.
func FuzzedMultiTraces(stream uint64, n, steps int) []MultiTrace {
	r := rand.New(rand.NewPCG(stream, stream^0x6b375))
	keys := []string{"k0", "k1", "k2"}
	var out []MultiTrace
	for i := 0; i < n; i++ {
		tr := MultiTrace{Name: fmt.Sprintf("fuzz-keys-%d", i)}
		shortest := int64(1 << 62)
		for j := 0; j < 3; j++ {
			a := algorithm.Algorithms[r.IntN(len(algorithm.Algorithms))]
			p := sluice.Policy{Name: fmt.Sprintf("p%d", j), Algorithm: a, Limit: 1 + r.Int64N(8), Period: time.Duration(1+r.Int64N(3000)) * time.Millisecond}
			if a == sluice.TokenBucket || a == sluice.LeakyBucket {
				p.Burst = r.Int64N(10)
			}
			tr.Policies = append(tr.Policies, p)
			if p.PeriodMicros() < shortest { // (min is this package's minute)
				shortest = p.PeriodMicros()
			}
		}
		at := r.Int64N(3 * shortest)
		for k := r.IntN(steps) + 1; k > 0; k-- {
			switch r.IntN(6) {
			case 0: // a long pause
				at += r.Int64N(3 * shortest)
			case 1, 2: // same instant
			default:
				at += r.Int64N(shortest/4 + 1)
			}
			st := MultiStep{At: at, Key: keys[r.IntN(len(keys))]}
			if r.IntN(4) == 0 {
				st.Key = "none" // a call whose own key no limit counts under
			}
			seen := map[[2]string]bool{}
			for m := 1 + r.IntN(4); m > 0; m-- {
				l := MultiLimit{Policy: r.IntN(len(tr.Policies)), Cost: r.Int64N(3)}
				switch r.IntN(4) {
				case 0: // the call's own key
				case 1:
					l.Key = st.Key // the same, named
				default:
					l.Key = keys[r.IntN(len(keys))]
				}
				if st.Key == "none" && l.Key == "" || l.Key == "none" {
					l.Key = keys[r.IntN(len(keys))]
				}
				pair := [2]string{l.Key, tr.Policies[l.Policy].Name}
				if l.Key == "" {
					pair[0] = st.Key
				}
				if seen[pair] {
					continue
				}
				seen[pair] = true
				if r.IntN(40) == 0 {
					l.Cost = 20 // never fits
				}
				l.DryRun = r.IntN(5) == 0
				if tr.Policies[l.Policy].Algorithm == sluice.LeakyBucket && r.IntN(3) == 0 {
					l.MaxDelay = sluice.NoDelay
					if r.IntN(2) == 0 {
						l.MaxDelay = time.Duration(r.Int64N(tr.Policies[l.Policy].PeriodMicros())) * time.Microsecond
					}
				}
				st.Limits = append(st.Limits, l)
			}
			tr.Steps = append(tr.Steps, st)
		}
		out = append(out, tr)
	}
	return out
}

// decideAllKeys: limits of one request under several keys — the client's (the call's key), a
// route's and a tenant's — decided together, all or nothing across the keys, each on the very
// state a call under that key uses.
func decideAllKeys(t *testing.T, newStore NewStore) {
	clock := sluice.NewManualClock(time.UnixMicro(0))
	store := newStore(t, clock)
	ctx := context.Background()
	perClient := sluice.Policy{Name: "per-client", Algorithm: sluice.TokenBucket, Limit: 3, Period: time.Second}
	perRoute := sluice.Policy{Name: "per-route", Algorithm: sluice.FixedWindow, Limit: 2, Period: time.Minute}
	perTenant := sluice.Policy{Name: "per-tenant", Algorithm: sluice.SlidingLog, Limit: 1, Period: time.Minute}
	remaining := func(key string, p sluice.Policy) int64 {
		t.Helper()
		d, err := store.Decide(ctx, key, p, 0)
		if err != nil {
			t.Fatal(err)
		}
		return d.Remaining
	}
	limits := []sluice.Limit{
		{Policy: perClient, Cost: 1},
		{Key: "route:/orders", Policy: perRoute, Cost: 1},
		{Key: "tenant:t1", Policy: perTenant, Cost: 1, DryRun: true},
	}
	out := make([]sluice.Decision, 3)
	// 1st: all allow, all consume, each under its own key.
	if ok, err := store.DecideAll(ctx, "client-a", limits, out); err != nil || !ok || !out[0].Allowed || !out[1].Allowed || !out[2].Allowed {
		t.Fatalf("1st request: %v %v %+v", ok, err, out)
	}
	if c, r, tn := remaining("client-a", perClient), remaining("route:/orders", perRoute), remaining("tenant:t1", perTenant); c != 2 || r != 1 || tn != 0 {
		t.Fatalf("after the 1st: client %d, route %d, tenant %d left; want 2, 1, 0 (each under its own key)", c, r, tn)
	}
	if d := remaining("client-a", perRoute); d != 2 {
		t.Fatalf("per-route under the client's key: %d left, want 2 (the route's limit counts under the route's key)", d)
	}
	// 2nd: the dry-run tenant limit refuses, the request passes; the route's window is now spent.
	if ok, err := store.DecideAll(ctx, "client-a", limits, out); err != nil || !ok || !out[0].Allowed || !out[1].Allowed || out[2].Allowed {
		t.Fatalf("2nd request: %v %v %+v, want passed with the dry-run limit refusing", ok, err, out)
	}
	// 3rd, from another client on the same route: the route refuses, so nothing is consumed on
	// any key — neither that client's bucket nor the tenant's log (both of which allow).
	clock.Set(time.UnixMicro(61 * sec)) // the tenant's log is empty again; the route's window is a new one
	for range 2 {
		if ok, err := store.DecideAll(ctx, "route:/orders", []sluice.Limit{{Policy: perRoute, Cost: 1}}, out[:1]); err != nil || !ok {
			t.Fatalf("filling the route's window under its own key: %v %v", ok, err)
		}
	}
	ok, err := store.DecideAll(ctx, "client-b", limits, out)
	if err != nil || ok || !out[0].Allowed || out[1].Allowed || !out[2].Allowed {
		t.Fatalf("3rd request on a spent route: %v %v %+v, want refused by the route only", ok, err, out)
	}
	if c, tn := remaining("client-b", perClient), remaining("tenant:t1", perTenant); c != 3 || tn != 1 {
		t.Fatalf("after a refusal by the route: client-b %d, tenant %d left; want 3 and 1 (nothing consumed on any key)", c, tn)
	}
	// The call's key need not be any limit's: every limit named its own.
	keyed := []sluice.Limit{{Key: "client-b", Policy: perClient, Cost: 1}, {Key: "tenant:t1", Policy: perTenant, Cost: 1}}
	if ok, err := store.DecideAll(ctx, "unused", keyed, out[:2]); err != nil || !ok {
		t.Fatalf("every limit under its own key: %v %v %+v", ok, err, out[:2])
	}
	if c, tn, u := remaining("client-b", perClient), remaining("tenant:t1", perTenant), remaining("unused", perClient); c != 2 || tn != 0 || u != 3 {
		t.Fatalf("client-b %d, tenant %d, the call's own key %d left; want 2, 0, 3", c, tn, u)
	}
	// One policy under two keys in one call: two counters (two descriptors), all or nothing.
	// k1 has one left and k2 none: refused, and k1 keeps its one.
	perDescriptor := sluice.Policy{Name: "per-descriptor", Algorithm: sluice.FixedWindow, Limit: 2, Period: time.Hour}
	both := []sluice.Limit{{Key: "d:k1", Policy: perDescriptor, Cost: 1}, {Key: "d:k2", Policy: perDescriptor, Cost: 1}}
	if ok, err := store.DecideAll(ctx, "unused", both[:1], out[:1]); err != nil || !ok {
		t.Fatalf("k1: %v %v", ok, err)
	}
	if ok, err := store.DecideAll(ctx, "d:k2", []sluice.Limit{{Policy: perDescriptor, Cost: 2}}, out[:1]); err != nil || !ok {
		t.Fatalf("k2: %v %v", ok, err)
	}
	if ok, err := store.DecideAll(ctx, "unused", both, out[:2]); err != nil || ok || !out[0].Allowed || out[1].Allowed {
		t.Fatalf("one policy, k1 with 1 left and k2 spent: %v %v %+v, want refused by k2 only", ok, err, out[:2])
	}
	if k1, k2 := remaining("d:k1", perDescriptor), remaining("d:k2", perDescriptor); k1 != 1 || k2 != 0 {
		t.Fatalf("k1 %d, k2 %d left after a refusal by k2; want 1 and 0", k1, k2)
	}
	// A cost that can never fit one limit is an error, and nothing is consumed on any key.
	bad := []sluice.Limit{{Key: "d:k1", Policy: perDescriptor, Cost: 1}, {Key: "route:/other", Policy: perRoute, Cost: 3}}
	if _, err := store.DecideAll(ctx, "client-c", bad, out[:2]); !errors.Is(err, sluice.ErrCostExceedsLimit) {
		t.Fatalf("cost 3 on a limit of 2 under another key: %v, want ErrCostExceedsLimit", err)
	}
	if k1 := remaining("d:k1", perDescriptor); k1 != 1 {
		t.Fatalf("k1 %d left after an impossible request, want 1", k1)
	}
	// A single limit under its own key is Decide's decision of that key.
	if ok, err := store.DecideAll(ctx, "client-c", []sluice.Limit{{Key: "d:k1", Policy: perDescriptor, Cost: 1}}, out[:1]); err != nil || !ok || out[0].Remaining != 0 {
		t.Fatalf("one limit under its own key: %v %v %+v, want allowed with 0 left", ok, err, out[0])
	}
	if c := remaining("client-c", perDescriptor); c != 2 {
		t.Fatalf("the call's key holds %d under the limit's policy, want 2 (untouched)", c)
	}
}

// ConcurrentDecideAllKeys hammers DecideAll with limits under several keys from many goroutines
// at one frozen instant, for every algorithm: each call takes one, two or three of a few keys,
// in either order, with a tight limit (the algorithm) and a loose one (a fixed window ten times
// larger) under each key. About a third of the calls take one key, enough for every key's tight
// limit to be spent by the end. Then on every key the loose limit has consumed exactly the
// tight one's limit (the two of one key are all or nothing, and the tight one never approves
// beyond itself), and the calls approved that took the key number at most that limit — exactly
// it on a store that decides across keys atomically (every store but a Redis Cluster whose keys
// lie in several slots: see Suite.SplitAcrossKeys).
func ConcurrentDecideAllKeys(t *testing.T, newStore NewStore, goroutines, rounds int, split bool) {
	clock := sluice.NewManualClock(time.UnixMicro(1_000_000_000))
	store := newStore(t, clock)
	ctx := context.Background()
	const limit, keys = 20, 4
	iterations := 2*3*keys*limit/goroutines + 3
	for _, a := range algorithm.Algorithms {
		tight := sluice.Policy{Name: "tight-" + a.String(), Algorithm: a, Limit: limit, Period: time.Hour}
		if a == sluice.LeakyBucket {
			tight.Burst = limit - 1
		}
		loose := sluice.Policy{Name: "loose-" + a.String(), Algorithm: sluice.FixedWindow, Limit: 10 * limit, Period: time.Hour}
		for round := 0; round < rounds; round++ {
			name := func(k int) string { return fmt.Sprintf("keys-%d-%d", round, k) }
			// set is the keys of goroutine g's call i, in the order its limits name them.
			set := func(g, i int) []int {
				k := (g + i) % keys
				switch i % 3 {
				case 0:
					return []int{k}
				case 1:
					if g%2 == 0 {
						return []int{k, (k + 1) % keys}
					}
					return []int{(k + 1) % keys, k}
				}
				if g%2 == 0 {
					return []int{k, (k + 2) % keys, (k + 1) % keys}
				}
				return []int{(k + 1) % keys, k, (k + 2) % keys}
			}
			var singles [keys]int
			for g := 0; g < goroutines; g++ {
				for i := 0; i < iterations; i++ {
					if s := set(g, i); len(s) == 1 {
						singles[s[0]]++
					}
				}
			}
			for k, n := range singles {
				if n < limit {
					t.Fatalf("key %d is alone in %d calls, fewer than its limit %d: the test cannot know it is spent", k, n, limit)
				}
			}
			var approved [keys]atomic.Int64
			var wg sync.WaitGroup
			start := make(chan struct{})
			for g := 0; g < goroutines; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					out := make([]sluice.Decision, 6)
					<-start
					for i := 0; i < iterations; i++ {
						ks := set(g, i)
						key := "unused" // odd goroutines: every limit names its key
						if g%2 == 0 {
							key = name(ks[0]) // even ones: the first key is the call's
						}
						var limits []sluice.Limit
						for _, k := range ks {
							lk := name(k)
							if lk == key {
								lk = ""
							}
							limits = append(limits, sluice.Limit{Key: lk, Policy: loose, Cost: 1}, sluice.Limit{Key: lk, Policy: tight, Cost: 1})
						}
						ok, err := store.DecideAll(ctx, key, limits, out[:len(limits)])
						if err != nil {
							t.Error(err)
							return
						}
						if ok {
							for _, k := range ks {
								approved[k].Add(1)
							}
						}
					}
				}()
			}
			close(start)
			wg.Wait()
			if t.Failed() {
				return
			}
			var fewer int64
			for k := range keys {
				fewer += limit - approved[k].Load()
			}
			if fewer > 0 {
				t.Logf("%v round %d: %d approvals fewer than an atomic store's (calls refused after consuming on some keys)", a, round, fewer)
			}
			for k := range keys {
				if d, err := store.Decide(ctx, name(k), loose, 0); err != nil || d.Remaining != 9*limit {
					t.Fatalf("%v round %d key %d: the loose limit has %d left (%v), want %d: its key consumed other than its tight limit's %d",
						a, round, k, d.Remaining, err, 9*limit, limit)
				}
				got := approved[k].Load()
				if got > limit || (!split && got != limit) {
					t.Fatalf("%v round %d key %d: %d calls approved, want %s %d", a, round, k, got, map[bool]string{true: "at most", false: "exactly"}[split], limit)
				}
			}
		}
	}
}
