package redis

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/redistest"
)

// The scripts against the pure core: every decision a script makes on a real redis-server must
// equal algorithm.DecideInto's on a Go State with the same history, field for field, and the
// state the script stores must equal the Go State.

// luaSlack is the TTL slack of the traces: they run on virtual time, so their keys must not
// expire on Redis's real clock while a test runs.
const luaSlack = int64(time.Hour / time.Microsecond)

type luaEnv struct {
	t      testing.TB
	srv    *redistest.Server
	c      rueidis.Client
	single map[algorithm.Algorithm]*rueidis.Lua
	multi  *rueidis.Lua
}

func newLuaEnv(t testing.TB) *luaEnv {
	t.Helper()
	srv := redistest.Start(t)
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	e := &luaEnv{t: t, srv: srv, c: c, single: map[algorithm.Algorithm]*rueidis.Lua{}, multi: rueidis.NewLuaScript(multiScript())}
	for _, a := range algorithm.Algorithms {
		e.single[a] = rueidis.NewLuaScript(singleScript(a))
	}
	return e
}

func luaPolicy(a algorithm.Algorithm, limit, periodMicros, burst int64) algorithm.Policy {
	return algorithm.Policy{Algorithm: a, Limit: limit, Period: time.Duration(periodMicros) * time.Microsecond, Burst: burst}
}

func i64(n int64) string { return strconv.FormatInt(n, 10) }

// luaArgs is a policy's ARGV (alg, limit, period, burst) followed by cost.
func luaArgs(p *algorithm.Policy, cost int64) []string {
	return []string{strconv.Itoa(int(p.Algorithm)), i64(p.Limit), i64(p.PeriodMicros()), i64(p.Burst), i64(cost)}
}

// run runs the single script of p's algorithm on key (and key:log), without a deadline; now ""
// means Redis TIME. It returns the decision's six numbers, having checked the seventh, the
// script's time: now, when given.
func (e *luaEnv) run(key string, p *algorithm.Policy, cost int64, now string, slack int64) ([]int64, error) {
	args := append(luaArgs(p, cost), now, i64(slack))
	got, err := e.single[p.Algorithm].Exec(context.Background(), e.c, []string{key, key + ":log"}, args).AsIntSlice()
	return e.trimTime(got, err, now)
}

// trimTime checks and drops a reply's last number, the script's time.
func (e *luaEnv) trimTime(got []int64, err error, now string) ([]int64, error) {
	e.t.Helper()
	if err != nil {
		return got, err
	}
	if len(got)%6 != 1 {
		e.t.Fatalf("script replied %d numbers; want 6n+1", len(got))
	}
	if time := got[len(got)-1]; now != "" && i64(time) != now {
		e.t.Fatalf("script replied time %d; want now %s", time, now)
	}
	return got[:len(got)-1], nil
}

// luaMultiArgs are multi.lua's arguments of one limit: single.lua's, no bound on the hold, enforced.
func luaMultiArgs(p *algorithm.Policy, cost int64) []string {
	return append(luaArgs(p, cost), "-1", "0")
}

// runMulti runs the multi script for limits ps with costs on keys, without a deadline.
func (e *luaEnv) runMulti(keys []string, ps []algorithm.Policy, costs []int64, now string, slack int64) ([]int64, error) {
	var ks []string
	args := []string{strconv.Itoa(len(ps)), now, i64(slack)}
	for i := range ps {
		ks = append(ks, keys[i], keys[i]+":log")
		args = append(args, luaMultiArgs(&ps[i], costs[i])...)
	}
	got, err := e.multi.Exec(context.Background(), e.c, ks, append(args, "")).AsIntSlice()
	return e.trimTime(got, err, now)
}

// luaWant is d as the scripts reply it.
func luaWant(d *algorithm.Decision) []int64 {
	allowed, retry := int64(0), int64(d.RetryAfter/time.Microsecond)
	if d.Allowed {
		allowed = 1
	}
	if d.RetryAfter == algorithm.Never {
		retry = -1
	}
	return []int64{allowed, d.Limit, d.Remaining, retry, int64(d.ResetAfter / time.Microsecond), int64(d.Delay / time.Microsecond)}
}

// step decides cost at now on key under p in Redis and on s in Go, and fails unless they agree.
// It returns the decision; ok is false if CheckCost refused the request (the script is not run
// then, as the store does not run it).
func (e *luaEnv) step(key string, p *algorithm.Policy, s *algorithm.State, now, cost int64, history *strings.Builder) ([]int64, bool) {
	e.t.Helper()
	var d algorithm.Decision
	if algorithm.CheckCost(p, cost, &d) != nil {
		return nil, false
	}
	gs := s
	if s.Alg != p.Algorithm || s.Limit != p.Limit || s.Period != p.PeriodMicros() {
		c := luaUncached(s)
		gs = &c
	}
	if err := algorithm.DecideInto(p, gs, now, cost, &d); err != nil {
		e.t.Fatalf("%s: Go: %v", key, err)
	}
	if gs != s && gs.Alg != 0 && gs.Alg == p.Algorithm && gs.Limit == p.Limit && gs.Period == p.PeriodMicros() {
		*s = *gs // renewed by an approval, with its cache
	}
	want := luaWant(&d)
	got, err := e.run(key, p, cost, i64(now), luaSlack)
	fmt.Fprintf(history, "  %v %d/%dµs burst %d, now %d, cost %d: %v\n", p.Algorithm, p.Limit, p.PeriodMicros(), p.Burst, now, cost, want)
	if err != nil {
		e.t.Fatalf("%s: script: %v\nhistory:\n%s", key, err, history)
	}
	if !slices.Equal(got, want) {
		e.t.Fatalf("%s: script replied %v, Go decided %v {allowed capacity remaining retry reset delay}\nhistory:\n%s", key, got, want, history)
	}
	return got, true
}

// luaUncached returns a copy of s without its derived cache. The core's leakyBucket divides
// by the policy's period through the cache of a state written under another period
// (State.divP, reached with a state that is not current): with a smaller one, its correction
// loop runs for ~2^64/period iterations. Until that is fixed, step decides on a copy without the
// cache when the state is not current (so that divP divides: the decision is the same), and
// keeps the copy only if an approval renewed it (which sets the cache afresh): a current state
// needs its cache (gcraAdvance takes period/limit from it for a cost of 1).
func luaUncached(s *algorithm.State) algorithm.State {
	return algorithm.State{Window: s.Window, Count: s.Count, Prev: s.Prev, TAT: s.TAT, Frac: s.Frac,
		Alg: s.Alg, Limit: s.Limit, Period: s.Period, Log: s.Log}
}

// checkState fails unless the state stored under key is s: a hash at key, or for the sliding
// log a list at key:log (a header "alg:limit:period:count", then its entries), and nothing else.
func (e *luaEnv) checkState(key string, s *algorithm.State, history fmt.Stringer) {
	e.t.Helper()
	ctx := context.Background()
	h, err := e.c.Do(ctx, e.c.B().Hgetall().Key(key).Build()).AsStrMap()
	if err != nil {
		e.t.Fatal(err)
	}
	list, err := e.c.Do(ctx, e.c.B().Lrange().Key(key+":log").Start(0).Stop(-1).Build()).AsStrSlice()
	if err != nil {
		e.t.Fatal(err)
	}
	want := map[string]string{}
	var wantList []string
	if s.Alg != 0 {
		stamp := map[string]string{"alg": strconv.Itoa(int(s.Alg)), "limit": i64(s.Limit), "period": i64(s.Period)}
		switch s.Alg {
		case algorithm.FixedWindow:
			want = stamp
			want["w"], want["count"] = i64(s.Window), i64(s.Count)
		case algorithm.SlidingWindow:
			want = stamp
			want["w"], want["count"], want["prev"] = i64(s.Window), i64(s.Count), i64(s.Prev)
		case algorithm.SlidingLog:
			wantList = []string{strconv.Itoa(int(s.Alg)) + ":" + i64(s.Limit) + ":" + i64(s.Period) + ":" + i64(s.Count)}
			for _, le := range s.Log {
				wantList = append(wantList, i64(le.At)+":"+i64(le.Cost))
			}
		case algorithm.TokenBucket, algorithm.LeakyBucket:
			want = stamp
			want["tat"], want["frac"] = i64(s.TAT), i64(s.Frac)
		}
	}
	if fmt.Sprint(h) != fmt.Sprint(want) || !slices.Equal(list, wantList) {
		e.t.Fatalf("%s: stored %v %q, Go state %v %q\nhistory:\n%s", key, h, list, want, wantList, history)
	}
}

// luaRandomPolicy returns a small policy of a: limit 1..12, period 1ms..3s, burst 0..14 for the buckets.
func luaRandomPolicy(r *rand.Rand, a algorithm.Algorithm) algorithm.Policy {
	periods := []int64{1000, 1001, 7919, 100_000, 333_333, 1_000_000, 3_000_000}
	period := periods[r.IntN(len(periods))]
	if r.IntN(3) == 0 {
		period = 1000 + r.Int64N(3_000_000-1000+1)
	}
	var burst int64
	if a == algorithm.TokenBucket || a == algorithm.LeakyBucket {
		burst = r.Int64N(15)
	}
	return luaPolicy(a, 1+r.Int64N(12), period, burst)
}

// luaNextNow moves now on: repeats, small steps (around the emission interval), steps within a
// period, long pauses, and a few steps backward.
func luaNextNow(r *rand.Rand, p *algorithm.Policy, now int64) int64 {
	period := p.PeriodMicros()
	t := period/p.Limit + 1
	switch x := r.IntN(100); {
	case x < 25:
		return now
	case x < 60:
		return now + r.Int64N(2*t+1)
	case x < 80:
		return now + r.Int64N(period+1)
	case x < 88:
		return now + period + r.Int64N(3*period+1)
	case x < 93:
		return now + 4*period + r.Int64N(50*period)
	default:
		return max(0, now-r.Int64N(period+1))
	}
}

func luaRandomCost(r *rand.Rand) int64 {
	switch x := r.IntN(10); {
	case x == 0:
		return 0
	case x < 6:
		return 1
	default:
		return 2 + r.Int64N(3)
	}
}

func luaBase(r *rand.Rand) int64 {
	if r.IntN(2) == 0 {
		return r.Int64N(1_000_000_000)
	}
	return 1_800_000_000_000_000 + r.Int64N(1_000_000_000_000) // real Unix time in µs
}

// TestLuaTraces runs randomized traces through each algorithm's single script, comparing every
// decision with the core's, and the stored state with the core's at the end of each trace. A few
// steps switch the key to another policy (another limit, period, burst or algorithm): a changed
// stamp starts the state afresh, a changed burst carries it over.
func TestLuaTraces(t *testing.T) {
	e := newLuaEnv(t)
	for _, a := range algorithm.Algorithms {
		t.Run(a.String(), func(t *testing.T) {
			t.Parallel()
			e := *e
			e.t = t
			r := rand.New(rand.NewPCG(1, uint64(a)))
			for trace := 0; trace < 300; trace++ {
				key := fmt.Sprintf("rate-limit:{lua-%v-%d}:trace", a, trace)
				policies := []algorithm.Policy{luaRandomPolicy(r, a), luaRandomPolicy(r, a), luaRandomPolicy(r, algorithm.Algorithms[r.IntN(5)])}
				policies[1].Burst = policies[0].Burst // usually the same stamp ...
				if r.IntN(2) == 0 {
					policies[1] = policies[0]
					if a == algorithm.TokenBucket || a == algorithm.LeakyBucket {
						policies[1].Burst = r.Int64N(15) // ... or only the burst changed
					}
				}
				p := &policies[0]
				var s algorithm.State
				var history strings.Builder
				now := luaBase(r)
				for i, n := 0, 30+r.IntN(40); i < n; i++ {
					if r.IntN(25) == 0 {
						p = &policies[r.IntN(len(policies))]
					}
					now = luaNextNow(r, p, now)
					e.step(key, p, &s, now, luaRandomCost(r), &history)
				}
				e.checkState(key, &s, &history)
			}
		})
	}
}

// luaTrace runs steps (now, cost) on a fresh key under p, comparing each with the core; it
// returns the replies and the Go state.
func (e *luaEnv) luaTrace(key string, p algorithm.Policy, steps [][2]int64) ([][]int64, *algorithm.State) {
	e.t.Helper()
	var s algorithm.State
	var history strings.Builder
	var out [][]int64
	for _, st := range steps {
		got, ok := e.step(key, &p, &s, st[0], st[1], &history)
		if !ok {
			e.t.Fatalf("%s: cost %d refused by CheckCost", key, st[1])
		}
		out = append(out, got)
	}
	e.checkState(key, &s, &history)
	return out, &s
}

func TestLuaGoldenFractionalEmission(t *testing.T) {
	e := newLuaEnv(t)
	t0 := int64(1_800_000_000_000_123)
	// Token bucket 3 per 1s: T = 333333⅓ µs. Three at once, then the fourth waits ceil(T).
	got, s := e.luaTrace("rate-limit:{frac}:tb", luaPolicy(algorithm.TokenBucket, 3, 1_000_000, 0),
		[][2]int64{{t0, 1}, {t0, 1}, {t0, 1}, {t0, 1}, {t0 + 333_333, 1}, {t0 + 333_334, 1}, {t0 + 333_334, 0}})
	wants := [][]int64{
		{1, 3, 2, 0, 333_334, 0},
		{1, 3, 1, 0, 666_667, 0},
		{1, 3, 0, 0, 1_000_000, 0},
		{0, 3, 0, 333_334, 1_000_000, 0},
		{0, 3, 0, 1, 666_667, 0},
		{1, 3, 0, 0, 1_000_000, 0},
		{1, 3, 0, 0, 1_000_000, 0},
	}
	for i := range wants {
		if !slices.Equal(got[i], wants[i]) {
			t.Errorf("token bucket step %d: %v, want %v", i, got[i], wants[i])
		}
	}
	if s.TAT != t0+1_333_333 || s.Frac != 1 {
		t.Errorf("tat %d + %d/3, want %d + 1/3", s.TAT, s.Frac, t0+1_333_333)
	}
	// Many steps at about the rate: the fraction must never drift.
	r := rand.New(rand.NewPCG(2, 2))
	for _, p := range []algorithm.Policy{
		luaPolicy(algorithm.TokenBucket, 3, 1_000_000, 0),
		luaPolicy(algorithm.LeakyBucket, 3, 1_000_000, 2),
		luaPolicy(algorithm.TokenBucket, 7, 1_000_001, 5),
		luaPolicy(algorithm.LeakyBucket, 12, 999_999, 0),
	} {
		var steps [][2]int64
		now := t0
		for i := 0; i < 2000; i++ {
			now += p.PeriodMicros()/p.Limit - 2 + r.Int64N(5)
			steps = append(steps, [2]int64{now, 1})
		}
		e.luaTrace(fmt.Sprintf("rate-limit:{frac}:%v-%d", p.Algorithm, p.Limit), p, steps)
	}
}

// TestLuaGoldenLargeNumbers: policies at the bounds of exactness, real Unix times, and a clock
// that jumps far backward (the buckets' wait limit·(tat - now) then passes 2^53).
func TestLuaGoldenLargeNumbers(t *testing.T) {
	e := newLuaEnv(t)
	t0 := int64(1_800_000_000_000_000)
	const max = algorithm.MaxLimit
	for _, a := range []algorithm.Algorithm{algorithm.FixedWindow, algorithm.SlidingLog} {
		// limit 2^53: count + cost would pass 2^53.
		got, _ := e.luaTrace(fmt.Sprintf("rate-limit:{big}:%v", a), luaPolicy(a, max, 60_000_000, 0),
			[][2]int64{{t0, max - 1}, {t0 + 1, 1}, {t0 + 2, 1}, {t0 + 3, 0}, {t0 + 60_000_000, max}, {t0 + 60_000_001, max}})
		if got[0][2] != 1 || got[1][2] != 0 || got[2][0] != 0 {
			t.Errorf("%v at 2^53: %v", a, got)
		}
	}
	r := rand.New(rand.NewPCG(3, 3))
	day := int64(24 * time.Hour / time.Microsecond)
	for _, p := range []algorithm.Policy{
		luaPolicy(algorithm.SlidingWindow, 26_000, day, 0), // (limit+1)·period ≤ 2^51: the store's bound
		luaPolicy(algorithm.SlidingWindow, 30_000, day, 0), // beyond it: the script is still exact below 2^53
		luaPolicy(algorithm.SlidingWindow, 1<<20-1, 1<<31, 0),
		luaPolicy(algorithm.TokenBucket, 26_000, day, 0),
		luaPolicy(algorithm.TokenBucket, 1<<20-1, 1<<31, 1<<20-1),
		luaPolicy(algorithm.TokenBucket, 1, 1<<31, 1<<20-1),
		luaPolicy(algorithm.LeakyBucket, 26_000, day, 25_999),
		luaPolicy(algorithm.LeakyBucket, 1, 1<<31, 1<<20-2),
	} {
		var steps [][2]int64
		now := t0 + r.Int64N(day)
		capacity := p.Capacity()
		if p.Algorithm == algorithm.LeakyBucket {
			capacity = p.Burst
		}
		for i := 0; i < 300; i++ {
			switch r.IntN(4) {
			case 0:
			case 1:
				now += r.Int64N(p.PeriodMicros() / p.Limit * 50)
			default:
				now += r.Int64N(p.PeriodMicros() / 4)
			}
			cost := r.Int64N(capacity/5 + 1)
			if r.IntN(3) == 0 {
				cost = r.Int64N(4)
			}
			steps = append(steps, [2]int64{now, cost})
		}
		e.luaTrace(fmt.Sprintf("rate-limit:{big}:%v-%d-%d", p.Algorithm, p.Limit, p.Burst), p, steps)
	}
	// A long sliding log: its list is read in chunks.
	for _, p := range []algorithm.Policy{luaPolicy(algorithm.SlidingLog, 500, 1_000_000, 0), luaPolicy(algorithm.SlidingLog, 130, 100_000, 0)} {
		var steps [][2]int64
		now := t0
		for i := 0; i < 1500; i++ {
			now += r.Int64N(2 * p.PeriodMicros() / p.Limit)
			if r.IntN(50) == 0 {
				now -= r.Int64N(p.PeriodMicros() / 3)
			}
			steps = append(steps, [2]int64{now, r.Int64N(4)})
		}
		e.luaTrace(fmt.Sprintf("rate-limit:{big}:log-%d", p.Limit), p, steps)
	}
	// Far backward: from real time to 1970.
	for _, p := range []algorithm.Policy{
		luaPolicy(algorithm.TokenBucket, 5, 1_000_000, 10),
		luaPolicy(algorithm.TokenBucket, 1000, 1000, 0),
		luaPolicy(algorithm.LeakyBucket, 7, 3_000_000, 3),
		luaPolicy(algorithm.FixedWindow, 5, 1_000_000, 0),
		luaPolicy(algorithm.SlidingWindow, 5, 1_000_000, 0),
		luaPolicy(algorithm.SlidingLog, 5, 1_000_000, 0),
	} {
		e.luaTrace(fmt.Sprintf("rate-limit:{back}:%v-%d", p.Algorithm, p.Limit), p,
			[][2]int64{{t0, 1}, {t0, 2}, {1_000_000_000, 0}, {1_000_000_000, 1}, {0, 1}, {t0 + 1, 1}, {t0 + 10_000_000, 1}})
	}
}

func luaClone(s algorithm.State) algorithm.State {
	s.Log = slices.Clone(s.Log)
	return s
}

// TestLuaMultiScript: several limits of one client in one call, all or nothing.
func TestLuaMultiScript(t *testing.T) {
	e := newLuaEnv(t)
	t0 := int64(1_800_000_000_000_000)
	keys := []string{"rate-limit:{client-1}:a", "rate-limit:{client-1}:b"}
	ps := []algorithm.Policy{luaPolicy(algorithm.FixedWindow, 5, 1_000_000, 0), luaPolicy(algorithm.TokenBucket, 2, 1_000_000, 0)}
	multi := func(now int64, costs ...int64) []int64 {
		t.Helper()
		got, err := e.runMulti(keys, ps, costs, i64(now), luaSlack)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	// All pass: both consumed.
	if got := multi(t0, 1, 1); !slices.Equal(got, []int64{1, 5, 4, 0, 1_000_000, 0, 1, 2, 1, 0, 500_000, 0}) {
		t.Fatalf("both pass: %v", got)
	}
	if got := multi(t0, 1, 1); !slices.Equal(got, []int64{1, 5, 3, 0, 1_000_000, 0, 1, 2, 0, 0, 1_000_000, 0}) {
		t.Fatalf("both pass again: %v", got)
	}
	// The bucket refuses: the window is not consumed either (its decision says what it would be).
	if got := multi(t0, 2, 1); !slices.Equal(got, []int64{1, 5, 1, 0, 1_000_000, 0, 0, 2, 0, 500_000, 1_000_000, 0}) {
		t.Fatalf("one refuses: %v", got)
	}
	if got, _ := e.run(keys[0], &ps[0], 0, i64(t0), luaSlack); !slices.Equal(got, []int64{1, 5, 3, 0, 1_000_000, 0}) {
		t.Fatalf("the window after a refused multi: %v, want remaining 3", got)
	}
	// A peek in a multi writes nothing either.
	if got := multi(t0+500_000, 0, 0); got[0] != 1 || got[6] != 1 {
		t.Fatalf("peek: %v", got)
	}

	// Randomized: three limits of random algorithms per client, against the core applying the
	// approvals only when all pass.
	r := rand.New(rand.NewPCG(4, 4))
	for client := 0; client < 60; client++ {
		n := 1 + r.IntN(4)
		keys := make([]string, n)
		ps := make([]algorithm.Policy, n)
		states := make([]algorithm.State, n)
		for i := range ps {
			keys[i] = fmt.Sprintf("rate-limit:{multi-%d}:%d", client, i)
			ps[i] = luaRandomPolicy(r, algorithm.Algorithms[r.IntN(5)])
		}
		var history strings.Builder
		now := luaBase(r)
		for step := 0; step < 40; step++ {
			now = luaNextNow(r, &ps[r.IntN(n)], now)
			costs := make([]int64, n)
			var want []int64
			next := make([]algorithm.State, n)
			all := true
			for i := range ps {
				costs[i] = min(luaRandomCost(r), ps[i].Capacity())
				if ps[i].Algorithm != algorithm.TokenBucket && ps[i].Algorithm != algorithm.LeakyBucket {
					costs[i] = min(costs[i], ps[i].Limit)
				}
				next[i] = luaClone(states[i])
				var d algorithm.Decision
				if err := algorithm.DecideInto(&ps[i], &next[i], now, costs[i], &d); err != nil {
					t.Fatal(err)
				}
				want = append(want, luaWant(&d)...)
				all = all && d.Allowed
			}
			if all {
				states = next
			}
			fmt.Fprintf(&history, "  now %d costs %v: %v\n", now, costs, want)
			got, err := e.runMulti(keys, ps, costs, i64(now), luaSlack)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, want) {
				t.Fatalf("client %d: multi replied %v, Go %v\nhistory:\n%s", client, got, want, &history)
			}
		}
		for i := range keys {
			e.checkState(keys[i], &states[i], &history)
		}
	}
}

// TestLuaTTL: an approval sets the TTL to the reset plus the slack (rounded up to ms), on the
// state's one key (the hash, or the sliding log's list); a refusal or a peek leaves it alone; a
// peek of a never-seen key creates nothing.
func TestLuaTTL(t *testing.T) {
	e := newLuaEnv(t)
	ctx := context.Background()
	serverMillis := func() int64 {
		ts, err := e.c.Do(ctx, e.c.B().Time().Build()).AsStrSlice()
		if err != nil {
			t.Fatal(err)
		}
		sec, _ := strconv.ParseInt(ts[0], 10, 64)
		us, _ := strconv.ParseInt(ts[1], 10, 64)
		return sec*1000 + us/1000
	}
	expireAt := func(key string) int64 {
		at, err := e.c.Do(ctx, e.c.B().Pexpiretime().Key(key).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		return at
	}
	t0 := int64(1_800_000_000_000_000)
	const slack = 1_234_567 // µs
	for _, a := range algorithm.Algorithms {
		key := "rate-limit:{ttl}:" + a.String()
		p := luaPolicy(a, 2, 10_000_000, 0)
		if a == algorithm.LeakyBucket {
			p.Burst = 1 // room for the second request below
		}
		// A peek on a never-seen key creates no key.
		if got, err := e.run(key, &p, 0, i64(t0), slack); err != nil || got[0] != 1 {
			t.Fatalf("%v: peek: %v %v", a, got, err)
		}
		if n, _ := e.c.Do(ctx, e.c.B().Exists().Key(key, key+":log").Build()).AsInt64(); n != 0 {
			t.Fatalf("%v: a peek created %d keys", a, n)
		}
		before := serverMillis()
		got, err := e.run(key, &p, 1, i64(t0+3_000_001), slack)
		after := serverMillis()
		if err != nil || got[0] != 1 {
			t.Fatalf("%v: approval: %v %v", a, got, err)
		}
		ms := (got[4] + slack + 999) / 1000
		keys := []string{key}
		if a == algorithm.SlidingLog {
			keys = []string{key + ":log"}
		}
		if n, _ := e.c.Do(ctx, e.c.B().Exists().Key(key, key+":log").Build()).AsInt64(); n != 1 {
			t.Fatalf("%v: an approval left %d keys, want the state's one", a, n)
		}
		for _, k := range keys {
			at := expireAt(k)
			if at < before+ms || at > after+ms {
				t.Errorf("%v: %s expires at %d, want %d ms (reset %dµs + slack) after the call, in [%d, %d]", a, k, at, ms, got[4], before+ms, after+ms)
			}
			if pttl, _ := e.c.Do(ctx, e.c.B().Pttl().Key(k).Build()).AsInt64(); pttl <= 0 || pttl > ms {
				t.Errorf("%v: %s PTTL %d, want ≈ %d", a, k, pttl, ms)
			}
		}
		// Exhaust, then a refusal and a peek leave the expiry alone.
		if got, _ := e.run(key, &p, 1, i64(t0+3_000_001), slack); got[0] != 1 {
			t.Fatalf("%v: second approval: %v", a, got)
		}
		var was []int64
		for _, k := range keys {
			was = append(was, expireAt(k))
		}
		if got, _ := e.run(key, &p, 1, i64(t0+3_000_002), slack+10_000_000); got[0] != 0 {
			t.Fatalf("%v: refusal: %v", a, got)
		}
		if _, err := e.run(key, &p, 0, i64(t0+3_000_003), slack+10_000_000); err != nil {
			t.Fatalf("%v: peek: %v", a, err)
		}
		for i, k := range keys {
			if at := expireAt(k); at != was[i] {
				t.Errorf("%v: a refusal or a peek moved the expiry of %s from %d to %d", a, k, was[i], at)
			}
		}
	}
	// The TTL is at least 1 ms even for a reset below 1 ms and no slack; and a key expires with
	// its state: after the TTL, it is gone.
	p := luaPolicy(algorithm.FixedWindow, 3, 1000, 0)
	key := "rate-limit:{ttl}:short"
	if got, err := e.run(key, &p, 1, i64(t0+999), 0); err != nil || got[0] != 1 || got[4] != 1 {
		t.Fatalf("short: %v %v", got, err)
	}
	time.Sleep(20 * time.Millisecond)
	if n, _ := e.c.Do(ctx, e.c.B().Exists().Key(key).Build()).AsInt64(); n != 0 {
		t.Errorf("short: the key outlived its TTL")
	}
}

// TestLuaRenew: a state written under another algorithm, limit or period is never seen, and
// nothing of it survives the first approval under the new one; a changed burst carries over.
func TestLuaRenew(t *testing.T) {
	e := newLuaEnv(t)
	t0 := int64(1_800_000_000_000_000)
	key := "rate-limit:{renew}:p"
	var s algorithm.State
	var history strings.Builder
	step := func(p algorithm.Policy, now, cost int64) []int64 {
		t.Helper()
		got, ok := e.step(key, &p, &s, now, cost, &history)
		if !ok {
			t.Fatalf("cost %d refused by CheckCost", cost)
		}
		e.checkState(key, &s, &history)
		return got
	}
	log := luaPolicy(algorithm.SlidingLog, 3, 1_000_000, 0)
	step(log, t0, 1)
	step(log, t0+1, 2)
	if got := step(log, t0+2, 1); got[0] != 0 {
		t.Fatalf("sliding log full: %v", got)
	}
	// Another limit: a fresh state; a peek or a refusal does not renew it yet.
	log4 := luaPolicy(algorithm.SlidingLog, 4, 1_000_000, 0)
	if got := step(log4, t0+3, 0); got[2] != 4 {
		t.Fatalf("peek under a new limit: %v, want remaining 4", got)
	}
	step(log4, t0+4, 1) // renews: the old log is gone
	// Another algorithm: the log list and the count go.
	sw := luaPolicy(algorithm.SlidingWindow, 4, 1_000_000, 0)
	step(sw, t0+5, 2)
	if n, _ := e.c.Do(context.Background(), e.c.B().Exists().Key(key+":log").Build()).AsInt64(); n != 0 {
		t.Fatal("the sliding log's list survived a renewal")
	}
	tb := luaPolicy(algorithm.TokenBucket, 4, 1_000_000, 0)
	step(tb, t0+6, 3)
	step(luaPolicy(algorithm.TokenBucket, 4, 1_000_000, 10), t0+7, 1) // only the burst: carried over
	step(luaPolicy(algorithm.TokenBucket, 4, 2_000_000, 10), t0+8, 1) // the period: fresh
	step(luaPolicy(algorithm.LeakyBucket, 4, 2_000_000, 10), t0+9, 1)
	step(luaPolicy(algorithm.FixedWindow, 4, 2_000_000, 0), t0+10, 1)
	step(log, t0+11, 1)
}

// TestLuaOldSlidingLogLayout: a sliding log written by an earlier sluice, its count and stamp
// in the hash and its entries alone in the list, reads as never seen (under its own policy as
// under any other); a peek or a refusal leaves it alone, and the first approval replaces both
// keys with the one list. The hash algorithms never take the old hash for their own state.
func TestLuaOldSlidingLogLayout(t *testing.T) {
	e := newLuaEnv(t)
	ctx := context.Background()
	t0 := int64(1_800_000_000_000_000)
	p := luaPolicy(algorithm.SlidingLog, 3, 1_000_000, 0)
	old := func(key string) {
		t.Helper()
		for _, cmd := range [][]string{
			{"HSET", key, "alg", "2", "limit", "3", "period", "1000000", "count", "3"},
			{"RPUSH", key + ":log", i64(t0) + ":1", i64(t0+1) + ":2"},
		} {
			if err := e.c.Do(ctx, e.c.B().Arbitrary(cmd...).Build()).Error(); err != nil {
				t.Fatal(err)
			}
		}
	}
	var history strings.Builder
	key := "rate-limit:{old}:log"
	old(key)
	var s algorithm.State
	if got, _ := e.step(key, &p, &s, t0+2, 0, &history); got[2] != 3 || got[4] != 0 {
		t.Fatalf("a peek on the old layout: %v, want a fresh state", got)
	}
	if n, _ := e.c.Do(ctx, e.c.B().Exists().Key(key, key+":log").Build()).AsInt64(); n != 2 {
		t.Fatalf("a peek changed the old layout's keys: %d left", n)
	}
	e.step(key, &p, &s, t0+3, 2, &history)
	e.step(key, &p, &s, t0+4, 1, &history)
	if got, _ := e.step(key, &p, &s, t0+5, 1, &history); got[0] != 0 {
		t.Fatalf("full: %v", got)
	}
	e.checkState(key, &s, &history) // the hash is gone, the list is the new state
	// A header without entries, which no decision writes, is not a state either (a count that no
	// entry would ever expire): never seen, and replaced by the first approval.
	key = "rate-limit:{old}:header-only"
	if err := e.c.Do(ctx, e.c.B().Arbitrary("RPUSH", key+":log", "2:3:1000000:3").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	s = algorithm.State{}
	if got, _ := e.step(key, &p, &s, t0, 0, &history); got[2] != 3 || got[4] != 0 {
		t.Fatalf("a peek on a header without entries: %v, want a fresh state", got)
	}
	e.step(key, &p, &s, t0, 1, &history)
	e.checkState(key, &s, &history)
	for _, a := range []algorithm.Algorithm{algorithm.FixedWindow, algorithm.SlidingWindow, algorithm.TokenBucket, algorithm.LeakyBucket} {
		key := "rate-limit:{old}:" + a.String()
		old(key)
		q := luaPolicy(a, 3, 1_000_000, 0)
		var s algorithm.State
		if got, _ := e.step(key, &q, &s, t0+2, 1, &history); got[0] != 1 {
			t.Fatalf("%v on an old sliding log's keys: %v", a, got)
		}
		e.checkState(key, &s, &history)
	}
}

// TestLuaRedisTime: now "" decides at Redis's TIME.
func TestLuaRedisTime(t *testing.T) {
	e := newLuaEnv(t)
	ctx := context.Background()
	serverMicros := func() int64 {
		ts, err := e.c.Do(ctx, e.c.B().Time().Build()).AsStrSlice()
		if err != nil {
			t.Fatal(err)
		}
		sec, _ := strconv.ParseInt(ts[0], 10, 64)
		us, _ := strconv.ParseInt(ts[1], 10, 64)
		return sec*1_000_000 + us
	}
	field := func(key, f string) int64 {
		v, err := e.c.Do(ctx, e.c.B().Hget().Key(key).Field(f).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	tb := luaPolicy(algorithm.TokenBucket, 1, 1_000_000, 0)
	before := serverMicros()
	got, err := e.run("rate-limit:{time}:tb", &tb, 1, "", 0)
	after := serverMicros()
	if err != nil || !slices.Equal(got, []int64{1, 1, 0, 0, 1_000_000, 0}) {
		t.Fatalf("token bucket at TIME: %v %v", got, err)
	}
	if now := field("rate-limit:{time}:tb", "tat") - 1_000_000; now < before || now > after {
		t.Errorf("decided at %d, not within the server's TIME [%d, %d]", now, before, after)
	}
	fw := luaPolicy(algorithm.FixedWindow, 5, 1000, 0)
	before = serverMicros()
	got, err = e.run("rate-limit:{time}:fw", &fw, 1, "", 0)
	after = serverMicros()
	if err != nil || got[0] != 1 || got[2] != 4 || got[4] <= 0 || got[4] > 1000 {
		t.Fatalf("fixed window at TIME: %v %v", got, err)
	}
	if w := field("rate-limit:{time}:fw", "w"); w < before/1000 || w > after/1000 {
		t.Errorf("window %d, not within the server's TIME [%d, %d] ms", w, before/1000, after/1000)
	}
	// The multi script too.
	before = serverMicros()
	got, err = e.runMulti([]string{"rate-limit:{time}:m"}, []algorithm.Policy{tb}, []int64{1}, "", 0)
	after = serverMicros()
	if err != nil || !slices.Equal(got, []int64{1, 1, 0, 0, 1_000_000, 0}) {
		t.Fatalf("multi at TIME: %v %v", got, err)
	}
	if now := field("rate-limit:{time}:m", "tat") - 1_000_000; now < before || now > after {
		t.Errorf("multi decided at %d, not within the server's TIME [%d, %d]", now, before, after)
	}
}

// TestLuaScriptContract: the scripts refuse what they were not built for.
func TestLuaScriptContract(t *testing.T) {
	e := newLuaEnv(t)
	ctx := context.Background()
	fw := luaPolicy(algorithm.FixedWindow, 5, 1000, 0)
	err := e.single[algorithm.TokenBucket].Exec(ctx, e.c, []string{"k", "k:log"}, append(luaArgs(&fw, 1), "1", "0")).Error()
	if err == nil || !strings.Contains(err.Error(), "does not decide algorithm 1") {
		t.Errorf("token-bucket script asked for fixed-window: %v", err)
	}
	err = e.multi.Exec(ctx, e.c, []string{"k", "k:log"}, append([]string{"2", "1", "0"}, luaMultiArgs(&fw, 1)...)).Error()
	if err == nil || !strings.Contains(err.Error(), "2n keys") {
		t.Errorf("multi script with a wrong count: %v", err)
	}
}

// TestLuaScriptHelpers checks common.lua's exact division against Go's, over the range the
// scripts use (|a| < 2^53), with quotients just below and at integers.
func TestLuaScriptHelpers(t *testing.T) {
	e := newLuaEnv(t)
	script := rueidis.NewLuaScript(luaFile("lua/common.lua") + `
local a, b = tonumber(ARGV[1]), tonumber(ARGV[2])
local q, r = idivmod(a, b)
return {q, r, idiv(a, b), idivceil(a, b)}`)
	r := rand.New(rand.NewPCG(5, 5))
	for i := 0; i < 3000; i++ {
		b := 1 + r.Int64N(1<<uint(1+r.IntN(52)))
		a := r.Int64N(1<<53 - b)
		switch r.IntN(4) {
		case 0:
			a -= a % b // a multiple
		case 1:
			a = a - a%b - 1 // just below one
		}
		if r.IntN(2) == 0 {
			a = -a
		}
		q, m := a/b, a%b
		if m < 0 {
			q, m = q-1, m+b
		}
		c := q
		if m != 0 {
			c++
		}
		got, err := script.Exec(context.Background(), e.c, nil, []string{i64(a), i64(b)}).AsIntSlice()
		if err != nil {
			t.Fatal(err)
		}
		if want := []int64{q, m, q, c}; !slices.Equal(got, want) {
			t.Fatalf("idivmod(%d, %d): %v, want %v", a, b, got, want)
		}
	}
}
