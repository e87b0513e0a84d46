package redis

import (
	"context"
	"fmt"
	"math/big"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/store/storetest"
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
	single map[algorithm.Algorithm]luaRunner
	multi  luaRunner
	batch  luaRunner
}

// luaRunner runs one of the store's programs: the library's function (FCALL, what the store
// calls on Redis ≥ 7), or in luaScriptsEnv the script itself (EVALSHA).
type luaRunner interface {
	Exec(ctx context.Context, c rueidis.Client, keys, args []string) rueidis.RedisResult
}

type fnRunner struct{ p *program }

func (f fnRunner) Exec(ctx context.Context, c rueidis.Client, keys, args []string) rueidis.RedisResult {
	return fcall(ctx, c, f.p, keys, args)
}

func newLuaEnv(t testing.TB) *luaEnv {
	t.Helper()
	srv := redistest.Start(t)
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	e := &luaEnv{t: t, srv: srv, c: c, single: map[algorithm.Algorithm]luaRunner{}}
	prog := func(p *program) luaRunner {
		if luaScripts {
			return p.lua
		}
		return fnRunner{p}
	}
	for _, a := range algorithm.Algorithms {
		e.single[a] = prog(newProgram(singleScript(a), "single_"+strconv.Itoa(int(a))))
	}
	e.multi, e.batch = prog(newProgram(multiScript(), "multi")), prog(newProgram(batchScript(), "batch"))
	return e
}

// luaScripts runs the Lua tests on the scripts (EVALSHA) instead of the library's functions:
// SLUICE_LUA_SCRIPTS=1 go test -run Lua. (Both are assembled from the same files; the store
// calls the scripts only on a server that refuses Functions, which TestConformanceScripts and
// TestFunctionsRefusedByACL cover through the store.)
var luaScripts = os.Getenv("SLUICE_LUA_SCRIPTS") == "1"

func luaPolicy(a algorithm.Algorithm, limit, periodMicros, burst int64) algorithm.Policy {
	return algorithm.Policy{Algorithm: a, Limit: limit, Period: time.Duration(periodMicros) * time.Microsecond, Burst: burst}
}

func i64(n int64) string { return strconv.FormatInt(n, 10) }

// luaArgs is a policy's ARGV (alg, limit, period, burst) followed by cost.
func luaArgs(p *algorithm.Policy, cost int64) []string {
	return []string{strconv.Itoa(int(p.Algorithm)), i64(p.Limit), i64(p.PeriodMicros()), i64(p.Burst), i64(cost)}
}

// luaKeys are a state's keys as the store passes them (KEYS[1], KEYS[2]): for the store's key
// k, the state string k:v2 and the sliding log's list k:log (k itself is the old format's hash).
func luaKeys(key string) []string { return []string{key + ":v2", key + ":log"} }

// run runs the single script of p's algorithm on key's keys (luaKeys), without a deadline; now ""
// means Redis TIME. It returns the decision's six numbers, having checked the seventh, the
// script's time: now, when given.
func (e *luaEnv) run(key string, p *algorithm.Policy, cost int64, now string, slack int64) ([]int64, error) {
	args := append(luaArgs(p, cost), now, i64(slack))
	got, err := e.single[p.Algorithm].Exec(context.Background(), e.c, luaKeys(key), args).AsIntSlice()
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
		ks = append(ks, luaKeys(keys[i])...)
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
	if algorithm.CheckCost(p, cost, &d) != nil || p.Validate() != nil {
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
	if !luaMatch(got, want) {
		e.t.Fatalf("%s: script replied %v, Go decided %v {allowed capacity remaining retry reset delay}\nhistory:\n%s", key, got, want, history)
	}
	return got, true
}

// luaMatch reports whether the script's reply got is the decision want (luaWant). They must be
// equal, but for a time the Decision saturated (at time.Duration's most, 292 years), which the
// script replies exactly: then got must be at least that.
func luaMatch(got, want []int64) bool {
	if len(got) != len(want) {
		return false
	}
	const saturated = int64(1<<63-1) / int64(time.Microsecond)
	for i := range got {
		if got[i] != want[i] && !(i >= 3 && want[i] == saturated && got[i] > saturated) {
			return false
		}
	}
	return true
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

// checkState fails unless the state stored under key is s: a string at key:v2 ("alg limit period"
// and the algorithm's fields, in decimal), or for the sliding log a list at key:log (a header
// "alg:limit:period:count", then its entries), and nothing else.
func (e *luaEnv) checkState(key string, s *algorithm.State, history fmt.Stringer) {
	e.t.Helper()
	ctx := context.Background()
	str, err := e.c.Do(ctx, e.c.B().Get().Key(key+":v2").Build()).ToString()
	if rueidis.IsRedisNil(err) {
		str, err = "", nil
	}
	if err != nil {
		e.t.Fatal(err)
	}
	list, err := e.c.Do(ctx, e.c.B().Lrange().Key(key+":log").Start(0).Stop(-1).Build()).AsStrSlice()
	if err != nil {
		e.t.Fatal(err)
	}
	want := ""
	var wantList []string
	if s.Alg != 0 {
		stamp := strconv.Itoa(int(s.Alg)) + " " + i64(s.Limit) + " " + i64(s.Period) + " "
		switch s.Alg {
		case algorithm.FixedWindow:
			want = stamp + i64(s.Window) + " " + i64(s.Count)
		case algorithm.SlidingWindow:
			want = stamp + i64(s.Window) + " " + i64(s.Count) + " " + i64(s.Prev)
		case algorithm.SlidingLog:
			wantList = []string{strconv.Itoa(int(s.Alg)) + ":" + i64(s.Limit) + ":" + i64(s.Period) + ":" + i64(s.Count)}
			for _, le := range s.Log {
				wantList = append(wantList, i64(le.At)+":"+i64(le.Cost))
			}
		case algorithm.TokenBucket, algorithm.LeakyBucket:
			want = stamp + i64(s.TAT) + " " + i64(s.Frac)
		}
	}
	if str != want || !slices.Equal(list, wantList) {
		e.t.Fatalf("%s: stored %q %q, Go state %q %q\nhistory:\n%s", key, str, list, want, wantList, history)
	}
}

// Bounds of the full range the core accepts (Policy.Validate, CheckCost) and the scripts' now.
const (
	luaMaxPeriod = int64(1<<63-1) / int64(time.Microsecond) // µs: time.Duration's most, 292 years
	luaNowMax    = 1<<60 - 1                                // µs: |now| < 2^60 (common.lua)
	luaDay       = int64(24 * time.Hour / time.Microsecond)
)

// luaRandomPolicy returns a policy of a: two in three small (limit 1..12, period 1ms..3s, burst
// 0..14 for the buckets), the rest anywhere in the range Policy.Validate accepts: limits and bursts
// up to 2^53, periods up to 292 years (a bucket whose refill time Validate refuses is drawn again).
func luaRandomPolicy(r *rand.Rand, a algorithm.Algorithm) algorithm.Policy {
	bucket := a == algorithm.TokenBucket || a == algorithm.LeakyBucket
	if r.IntN(3) != 0 {
		periods := []int64{1000, 1001, 7919, 100_000, 333_333, 1_000_000, 3_000_000}
		period := periods[r.IntN(len(periods))]
		if r.IntN(3) == 0 {
			period = 1000 + r.Int64N(3_000_000-1000+1)
		}
		var burst int64
		if bucket {
			burst = r.Int64N(15)
		}
		return luaPolicy(a, 1+r.Int64N(12), period, burst)
	}
	for {
		p := luaPolicy(a, storetest.RandomCount(r), luaRandomPeriod(r), 0)
		if bucket && r.IntN(4) != 0 {
			p.Burst = storetest.RandomCount(r)
			if r.IntN(3) == 0 { // at Validate's bound: capacity·period/limit just below 2^53 µs
				c := new(big.Int).Lsh(big.NewInt(p.Limit), 53)
				c.Sub(c, big.NewInt(1)).Div(c, big.NewInt(p.PeriodMicros()))
				if c.IsInt64() && c.Int64() <= algorithm.MaxLimit {
					p.Burst = max(c.Int64()-r.Int64N(3), 0)
					if a == algorithm.LeakyBucket {
						p.Burst = max(p.Burst-1, 0)
					}
				}
			}
		}
		if p.Validate() == nil {
			return p
		}
	}
}

// luaRandomPeriod is a period in µs: seconds, a day, a 30-day month, a year, about 2^53, the
// most a time.Duration holds, or anything in between.
func luaRandomPeriod(r *rand.Rand) int64 {
	switch r.IntN(7) {
	case 0:
		return 1000 + r.Int64N(3_000_000)
	case 1:
		return luaDay
	case 2:
		return 30 * luaDay
	case 3:
		return 365 * luaDay
	case 4:
		return 1<<53 - 1 + r.Int64N(3)
	case 5:
		return luaMaxPeriod - r.Int64N(2)
	default:
		return 1000 + r.Int64N(luaMaxPeriod-999)
	}
}

// luaNextNow moves now on: repeats, small steps (around the emission interval), steps within a
// period, long pauses, a few steps backward, and a few jumps anywhere in |now| < 2^60 (far back
// or far ahead), never leaving that range.
func luaNextNow(r *rand.Rand, p *algorithm.Policy, now int64) int64 {
	period := p.PeriodMicros()
	t := period/p.Limit + 1
	var next int64
	switch x := r.IntN(100); {
	case x < 25:
		return now
	case x < 60:
		next = now + r.Int64N(2*t+1)
	case x < 80:
		next = now + r.Int64N(period+1)
	case x < 88:
		next = now + period + r.Int64N(3*period+1)
	case x < 93:
		next = now + 4*period + r.Int64N(50*period)
	case x < 98:
		next = now - r.Int64N(period+1)
	default:
		next = r.Int64N(2*luaNowMax+1) - luaNowMax
	}
	return min(max(next, -luaNowMax), luaNowMax)
}

// luaRandomCost is a cost for p: mostly 1, some 0 and small ones, and some up to the most that
// CheckCost lets through (near it, half of it, or anything below).
func luaRandomCost(r *rand.Rand, p *algorithm.Policy) int64 {
	switch x := r.IntN(20); {
	case x < 2:
		return 0
	case x < 11:
		return 1
	case x < 15:
		return min(2+r.Int64N(3), storetest.MaxCost(p))
	case x < 17:
		return max(0, storetest.MaxCost(p)-r.Int64N(3))
	case x < 18:
		return storetest.MaxCost(p) / 2
	default:
		return r.Int64N(storetest.MaxCost(p)) + 1
	}
}

// luaBase is a trace's first now: near the epoch, a real Unix time, just around 2^53 µs (where
// now stops being a Lua number), far ahead near 2^60, or before the epoch.
func luaBase(r *rand.Rand) int64 {
	switch r.IntN(8) {
	case 0, 1, 2:
		return r.Int64N(1_000_000_000)
	case 3, 4:
		return 1_800_000_000_000_000 + r.Int64N(1_000_000_000_000) // real Unix time in µs
	case 5:
		return 1<<53 - 1_000_000 + r.Int64N(2_000_000)
	case 6:
		return luaNowMax - r.Int64N(1<<50)
	default:
		return -r.Int64N(luaNowMax)
	}
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
					e.step(key, p, &s, now, luaRandomCost(r, p), &history)
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

// TestLuaGoldenLargeNumbers: policies whose products pass 2^53 (the contracts the store used to
// refuse, worked out by hand), the extremes of the core's range (limit 2^53, a period of 292
// years, replies and states beyond 2^53), real Unix times, and a clock that jumps far backward
// (the buckets' wait limit·(tat - now) then passes 2^53).
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
		luaPolicy(algorithm.SlidingWindow, 26_000, day, 0), // (limit+1)·period ≤ 2^51: the store's old bound
		luaPolicy(algorithm.SlidingWindow, 30_000, day, 0), // beyond it: products past 2^53
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
	// The contracts, by hand. 100,000 a day: 60,000 today; tomorrow at 6:00 they weigh 45,000, so
	// 55,000 fit; then one more each 1.44 s (a day / 60,000) as their weight falls.
	golden := func(name string, p algorithm.Policy, steps [][2]int64, wants [][]int64) {
		t.Helper()
		got, _ := e.luaTrace("rate-limit:{golden}:"+name, p, steps)
		for i := range wants {
			if !slices.Equal(got[i], wants[i]) {
				t.Errorf("%s step %d: %v, want %v", name, i, got[i], wants[i])
			}
		}
	}
	td := 20_000 * day // a day boundary (2024-10-04)
	at6 := td + day + day/4
	golden("100000-a-day", luaPolicy(algorithm.SlidingWindow, 100_000, day, 0),
		[][2]int64{{td, 60_000}, {at6, 55_000}, {at6, 1}, {at6 + 1_439_999, 1}, {at6 + 1_440_000, 1}},
		[][]int64{
			{1, 100_000, 40_000, 0, 2 * day, 0},
			{1, 100_000, 0, 0, 151_200_000_000, 0},
			{0, 100_000, 0, 1_440_000, 151_200_000_000, 0},
			{0, 100_000, 0, 1, 151_198_560_001, 0},
			{1, 100_000, 0, 0, 151_198_560_000, 0},
		})
	// A million a month (30 days), burst a million: all of it at once, then one token each 2.592 s.
	month := 30 * day
	golden("1000000-a-month", luaPolicy(algorithm.TokenBucket, 1_000_000, month, 1_000_000),
		[][2]int64{{td, 1_000_000}, {td, 1}, {td + month/2, 500_001}, {td + month/2, 500_000}, {td + month/2 + 2_591_999, 1}, {td + month/2 + 2_592_000, 1}},
		[][]int64{
			{1, 1_000_000, 0, 0, month, 0},
			{0, 1_000_000, 0, 2_592_000, month, 0},
			{0, 1_000_000, 500_000, 2_592_000, month / 2, 0},
			{1, 1_000_000, 0, 0, month, 0},
			{0, 1_000_000, 0, 1, month - 2_591_999, 0},
			{1, 1_000_000, 0, 0, month, 0},
		})
	// 700,000 an hour (5142.857… µs apart), a queue of an hour: full at once; the next fits after
	// 5143 µs and is held for the rest of the hour.
	hour := int64(time.Hour / time.Microsecond)
	golden("700000-an-hour", luaPolicy(algorithm.LeakyBucket, 700_000, hour, 699_999),
		[][2]int64{{td, 700_000}, {td, 1}, {td + 5143, 1}},
		[][]int64{
			{1, 700_000, 0, 0, hour, 0},
			{0, 700_000, 0, 5143, hour, 0},
			{1, 700_000, 0, 0, hour, hour - 5143},
		})
	// ... and a queue of a million hours (burst × period = 3.6·10^21): 10^12 take 5142857142857142
	// µs and 600,000/700,000 of one, so room is left for exactly one more.
	golden("700000-an-hour-deep", luaPolicy(algorithm.LeakyBucket, 700_000, hour, 1_000_000_000_000),
		[][2]int64{{td, 1_000_000_000_000}, {td, 1}, {td, 1}},
		[][]int64{
			{1, 1_000_000_000_001, 1, 0, 5_142_857_142_857_143, 0},
			{1, 1_000_000_000_001, 0, 0, 5_142_857_142_862_286, 5_142_857_142_857_143},
			{0, 1_000_000_000_001, 0, 5143, 5_142_857_142_862_286, 0},
		})
	// The extremes: limit 2^53 and a period of 292 years, whose second window ends past 2^53 µs
	// (the script replies it as a string).
	golden("largest-fixed-window", luaPolicy(algorithm.FixedWindow, max, luaMaxPeriod, 0),
		[][2]int64{{t0, max}, {t0, 0}, {luaMaxPeriod, 1}, {2*luaMaxPeriod - 1, max}},
		[][]int64{
			{1, max, 0, 0, luaMaxPeriod - t0, 0},
			{1, max, 0, 0, luaMaxPeriod - t0, 0},
			{1, max, max - 1, 0, luaMaxPeriod, 0},
			{0, max, max - 1, 1, 1, 0},
		})
	for _, a := range algorithm.Algorithms {
		p := luaPolicy(a, max, luaMaxPeriod, 0)
		if a == algorithm.TokenBucket || a == algorithm.LeakyBucket {
			p = luaPolicy(a, max, luaMaxPeriod, 8_796_093_022_207_999) // capacity·period/limit just below 2^53 µs
		}
		most := storetest.MaxCost(&p)
		var steps [][2]int64
		for _, now := range []int64{-luaNowMax, -luaNowMax + 1, -1 << 53, 0, t0, 1<<53 - 1, 1 << 53, 1<<53 + 1, luaNowMax - luaMaxPeriod, luaNowMax} {
			steps = append(steps, [2]int64{now, most}, [2]int64{now, 1}, [2]int64{now, most / 2}, [2]int64{now, 0})
		}
		got, s := e.luaTrace("rate-limit:{largest}:"+a.String(), p, steps)
		if len(got) != len(steps) || (a == algorithm.LeakyBucket && s.TAT <= 1<<60) {
			t.Errorf("%v: %d replies, tat %d", a, len(got), s.TAT)
		}
	}
	// A leaky bucket drains a cost of 2^63 - 1 in a moment when the limit is 2^53 a millisecond,
	// and one of nearly 2^62 µs when it is 3.
	e.luaTrace("rate-limit:{largest}:drain", luaPolicy(algorithm.LeakyBucket, max, 1000, 0),
		[][2]int64{{t0, 1<<63 - 1}, {t0, 1}, {t0 + 1_023_999, 1}, {t0 + 1_024_000, 1}})
	lb := luaPolicy(algorithm.LeakyBucket, 3, 1000, 5)
	e.luaTrace("rate-limit:{largest}:long-drain", lb, [][2]int64{{t0, storetest.MaxCost(&lb)}, {t0, 1}, {luaNowMax, 1}, {luaNowMax, storetest.MaxCost(&lb)}})

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
				costs[i] = luaRandomCost(r, &ps[i]) // (CheckCost lets it through)
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
			if !luaMatch(got, want) {
				t.Fatalf("client %d: multi replied %v, Go %v\nhistory:\n%s", client, got, want, &history)
			}
		}
		for i := range keys {
			e.checkState(keys[i], &states[i], &history)
		}
	}
}

// TestLuaMultiCheck: multi.lua with 'check' after the limits' arguments decides exactly as
// without it and writes nothing, even when every limit allows (the first phase of a DecideAll
// across a cluster's slots); any other mode is an error naming it, writing nothing.
func TestLuaMultiCheck(t *testing.T) {
	e := newLuaEnv(t)
	ctx := context.Background()
	t0 := int64(1_800_000_000_000_000)
	keys := append(luaKeys("rate-limit:{check}:a"), luaKeys("rate-limit:{check}:b")...)
	fw, sl := luaPolicy(algorithm.FixedWindow, 5, 1_000_000, 0), luaPolicy(algorithm.SlidingLog, 2, 1_000_000, 0)
	call := func(mode ...string) ([]int64, error) {
		args := append(append(append([]string{"2", i64(t0), i64(luaSlack)}, luaMultiArgs(&fw, 1)...), luaMultiArgs(&sl, 1)...), mode...)
		return e.multi.Exec(ctx, e.c, keys, append(args, "")).AsIntSlice()
	}
	exists := func() int64 {
		n, err := e.c.Do(ctx, e.c.B().Exists().Key(keys...).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	want := []int64{1, 5, 4, 0, 1_000_000, 0, 1, 2, 1, 0, 1_000_000, 0, t0}
	for range 3 { // a check changes nothing, so each gives the first decision again
		if got, err := call("check"); err != nil || !slices.Equal(got, want) {
			t.Fatalf("check: %v %v, want %v", got, err, want)
		}
		if n := exists(); n != 0 {
			t.Fatalf("a check that every limit allowed wrote %d keys", n)
		}
	}
	if got, err := call(); err != nil || !slices.Equal(got, want) {
		t.Fatalf("the commit after the checks: %v %v, want %v", got, err, want)
	}
	if n := exists(); n != 2 {
		t.Fatalf("the commit wrote %d keys, want 2 (a's string, b's log)", n)
	}
	if got, err := call("check"); err != nil || got[2] != 3 || got[8] != 0 {
		t.Fatalf("check after the commit: %v %v, want 3 and 0 left", got, err)
	}
	for _, bad := range []string{"", "1", "commit", "CHECK"} {
		if _, err := call(bad); err == nil || !strings.Contains(err.Error(), "sluice: multi script: mode") {
			t.Errorf("mode %q: %v, want an error naming the mode", bad, err)
		}
	}
	if got, err := call("check"); err != nil || got[2] != 3 || got[8] != 0 {
		t.Fatalf("after the bad modes: %v %v, want 3 and 0 left (nothing written)", got, err)
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
		if n, _ := e.c.Do(ctx, e.c.B().Exists().Key(key, key+":v2", key+":log").Build()).AsInt64(); n != 0 {
			t.Fatalf("%v: a peek created %d keys", a, n)
		}
		before := serverMillis()
		got, err := e.run(key, &p, 1, i64(t0+3_000_001), slack)
		after := serverMillis()
		if err != nil || got[0] != 1 {
			t.Fatalf("%v: approval: %v %v", a, got, err)
		}
		ms := (got[4] + slack + 999) / 1000
		keys := []string{key + ":v2"}
		if a == algorithm.SlidingLog {
			keys = []string{key + ":log"}
		}
		if n, _ := e.c.Do(ctx, e.c.B().Exists().Key(key, key+":v2", key+":log").Build()).AsInt64(); n != 1 {
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
	if n, _ := e.c.Do(ctx, e.c.B().Exists().Key(key+":v2").Build()).AsInt64(); n != 0 {
		t.Errorf("short: the key outlived its TTL")
	}
}

// TestLuaRenew: a state written under another algorithm or period is never seen, and nothing of
// it survives the first approval under the new one; a changed limit or burst carries over what
// was used.
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
	// Another limit: the log is the use, kept: 3 of 4 used.
	log4 := luaPolicy(algorithm.SlidingLog, 4, 1_000_000, 0)
	if got := step(log4, t0+3, 0); got[2] != 1 {
		t.Fatalf("peek under a new limit: %v, want remaining 1", got)
	}
	if got := step(log4, t0+4, 1); got[0] != 1 || got[2] != 0 {
		t.Fatalf("the fourth under limit 4: %v, want approved, none left", got)
	}
	// Another algorithm: the log list and the count go.
	sw := luaPolicy(algorithm.SlidingWindow, 4, 1_000_000, 0)
	step(sw, t0+5, 2)
	if n, _ := e.c.Do(context.Background(), e.c.B().Exists().Key(key+":log").Build()).AsInt64(); n != 0 {
		t.Fatal("the sliding log's list survived a renewal")
	}
	tb := luaPolicy(algorithm.TokenBucket, 4, 1_000_000, 0)
	step(tb, t0+6, 3)
	step(luaPolicy(algorithm.TokenBucket, 4, 1_000_000, 10), t0+7, 1) // only the burst: carried over
	step(luaPolicy(algorithm.TokenBucket, 7, 1_000_000, 10), t0+7, 0) // the limit: converted by a peek
	step(luaPolicy(algorithm.TokenBucket, 3, 1_000_000, 10), t0+8, 1)
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
	field := func(key string) int64 { // the state string's first field after the stamp (tat, w)
		v, err := e.c.Do(ctx, e.c.B().Get().Key(key+":v2").Build()).ToString()
		if err != nil {
			t.Fatal(err)
		}
		f, err := strconv.ParseInt(strings.Fields(v)[3], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	tb := luaPolicy(algorithm.TokenBucket, 1, 1_000_000, 0)
	before := serverMicros()
	got, err := e.run("rate-limit:{time}:tb", &tb, 1, "", 0)
	after := serverMicros()
	if err != nil || !slices.Equal(got, []int64{1, 1, 0, 0, 1_000_000, 0}) {
		t.Fatalf("token bucket at TIME: %v %v", got, err)
	}
	if now := field("rate-limit:{time}:tb") - 1_000_000; now < before || now > after {
		t.Errorf("decided at %d, not within the server's TIME [%d, %d]", now, before, after)
	}
	// A minute's window: its key (which lives until the window ends) is still there to be read
	// back however slow the machine (a 1 ms one could expire between the script and HGET).
	const minute = 60_000_000
	fw := luaPolicy(algorithm.FixedWindow, 5, minute, 0)
	before = serverMicros()
	got, err = e.run("rate-limit:{time}:fw", &fw, 1, "", 0)
	after = serverMicros()
	if err != nil || got[0] != 1 || got[2] != 4 || got[4] <= 0 || got[4] > minute {
		t.Fatalf("fixed window at TIME: %v %v", got, err)
	}
	if w := field("rate-limit:{time}:fw"); w < before/minute || w > after/minute {
		t.Errorf("window %d, not within the server's TIME [%d, %d] minutes", w, before/minute, after/minute)
	}
	// The multi script too.
	before = serverMicros()
	got, err = e.runMulti([]string{"rate-limit:{time}:m"}, []algorithm.Policy{tb}, []int64{1}, "", 0)
	after = serverMicros()
	if err != nil || !slices.Equal(got, []int64{1, 1, 0, 0, 1_000_000, 0}) {
		t.Fatalf("multi at TIME: %v %v", got, err)
	}
	if now := field("rate-limit:{time}:m") - 1_000_000; now < before || now > after {
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

// TestLuaScriptArgs: every script checks its own arguments against the core's bounds (the store
// never sends others): an argument out of range is an error reply naming it, and nothing is
// written; the bounds themselves are taken.
func TestLuaScriptArgs(t *testing.T) {
	e := newLuaEnv(t)
	ctx := context.Background()
	batch := e.batch
	const now = "1800000000000000"
	// args: alg, limit, period, burst, cost, now, ttl_slack (single.lua's ARGV).
	type call struct {
		name string // the argument the error must name ("" if the call is valid)
		args []string
	}
	calls := []call{
		{"limit", []string{"4", "0", "1000000", "0", "1", now, "0"}},
		{"limit", []string{"4", "-1", "1000000", "0", "1", now, "0"}},
		{"limit", []string{"4", "1.5", "1000000", "0", "1", now, "0"}},
		{"limit", []string{"4", "ten", "1000000", "0", "1", now, "0"}},
		{"limit", []string{"4", "", "1000000", "0", "1", now, "0"}},
		{"limit", []string{"4", "9007199254740993", "1000000", "0", "1", now, "0"}},
		{"period", []string{"4", "10", "999", "0", "1", now, "0"}},
		{"period", []string{"4", "10", "1000.5", "0", "1", now, "0"}},
		{"period", []string{"4", "10", "-1000000", "0", "1", now, "0"}},
		{"period", []string{"1", "10", "9223372036854776", "0", "1", now, "0"}},
		{"period", []string{"1", "10", "1e400", "0", "1", now, "0"}},
		{"burst", []string{"4", "10", "1000000", "-1", "1", now, "0"}},
		{"burst", []string{"4", "10", "1000000", "9007199254740993", "1", now, "0"}},
		{"burst", []string{"1", "10", "1000000", "1", "1", now, "0"}},          // a window takes no burst
		{"burst", []string{"4", "1", "10000000000000", "1000", "1", now, "0"}}, // refill time 10^16 µs ≥ 2^53
		{"burst", []string{"5", "1", "9007199254740992", "0", "1", now, "0"}},  // drain time of the one served
		{"cost", []string{"4", "10", "1000000", "0", "-1", now, "0"}},
		{"cost", []string{"4", "10", "1000000", "0", "0.5", now, "0"}},
		{"cost", []string{"4", "10", "1000000", "0", "11", now, "0"}},  // beyond the capacity
		{"cost", []string{"4", "10", "1000000", "12", "13", now, "0"}}, // beyond the burst
		{"cost", []string{"1", "10", "1000000", "0", "11", now, "0"}},  // beyond the limit
		{"cost", []string{"2", "10", "1000000", "0", "9223372036854775807", now, "0"}},
		{"cost", []string{"5", "1", "1000", "0", "4611686018427388", now, "0"}},                   // drains in 2^62 µs
		{"cost", []string{"5", "9007199254740992", "1000", "0", "9223372036854775808", now, "0"}}, // beyond int64
		{"now", []string{"4", "10", "1000000", "0", "1", "yesterday", "0"}},
		{"now", []string{"4", "10", "1000000", "0", "1", "1.5", "0"}},
		{"now", []string{"4", "10", "1000000", "0", "1", "1152921504606846976", "0"}},  // 2^60
		{"now", []string{"4", "10", "1000000", "0", "1", "-1152921504606846976", "0"}}, // -2^60
		{"ttl_slack", []string{"4", "10", "1000000", "0", "1", now, "-1"}},
		{"ttl_slack", []string{"4", "10", "1000000", "0", "1", now, "soon"}},
		// The bounds themselves.
		{"", []string{"1", "9007199254740992", "9223372036854775", "0", "9007199254740992", now, "0"}},
		{"", []string{"4", "9007199254740992", "1000", "9007199254740992", "9007199254740992", "1152921504606846975", "0"}},
		{"", []string{"5", "9007199254740992", "1000", "0", "9223372036854775807", "-1152921504606846975", "0"}},
		{"", []string{"5", "1", "1000", "0", "4611686018427387", now, "0"}}, // drains just within 2^62 µs
		{"", []string{"3", "1", "1000", "0", "0", "", ""}},                  // Redis TIME, no slack
	}
	for i, c := range calls {
		alg, _ := strconv.Atoi(c.args[0])
		key := fmt.Sprintf("rate-limit:{args-%d}:p", i)
		keys := luaKeys(key)
		// The single script of the algorithm, then the multi and the batch script with a valid
		// limit first (on another key of the client) and this one second.
		other := "rate-limit:{args-" + strconv.Itoa(i) + "}:other"
		// multi.lua takes max_delay and dry_run after each limit's five and the deadline last;
		// batch.lua the decisions' deadlines last (empty: none).
		multi := append(append([]string{"2", c.args[5], c.args[6], "1", "5", "1000000", "0", "1", "-1", "0"}, c.args[:5]...), "-1", "0", "")
		two := append(append([]string{"2", c.args[5], c.args[6], "1", "5", "1000000", "0", "1"}, c.args[:5]...), "", "")
		results := map[string]error{
			"single": e.single[algorithm.Algorithm(alg)].Exec(ctx, e.c, keys, c.args).Error(),
			"multi":  e.multi.Exec(ctx, e.c, append(luaKeys(other), keys...), multi).Error(),
			"batch":  batch.Exec(ctx, e.c, append(luaKeys(other), keys...), two).Error(),
		}
		for script, err := range results {
			if c.name == "" {
				if err != nil {
					t.Errorf("%s script, %q: %v", script, c.args, err)
				}
				continue
			}
			if err == nil || !strings.Contains(err.Error(), "sluice: "+c.name+" ") {
				t.Errorf("%s script, %q: error %v, want one naming %s", script, c.args, err, c.name)
			}
		}
		if c.name != "" {
			if n, _ := e.c.Do(ctx, e.c.B().Exists().Key(append(keys, luaKeys(other)...)...).Build()).AsInt64(); n != 0 {
				t.Errorf("%q: a refused call left %d keys", c.args, n)
			}
		}
	}
}

// luaIntScript runs common.lua's int operations on its arguments: ARGV is a list of (op, a, b)
// triples, each reply one string: the result (q and r for divmod, joined by a space), or "nil"
// for an operand parse_int refuses, and "BAD" if a result breaks the representation's invariant
// (a number iff |x| ≤ 2^53; a table's limbs in 0..2^24-1, its top one non-zero). Each triple
// starts with no limb code built (W nil: numbers take the double paths); an op prefixed "w:"
// runs with it built (every path is the limbs').
const luaIntScript = `
local function ok(x)
  if type(x) == 'number' then
    return x == math.floor(x) and x <= 9007199254740992 and x >= -9007199254740992
  end
  if type(x) ~= 'table' or #x == 0 or x[#x] == 0 or type(x.neg) ~= 'boolean' or W == nil then
    return false
  end
  for i = 1, #x do
    if x[i] ~= math.floor(x[i]) or x[i] < 0 or x[i] >= 16777216 then
      return false
    end
  end
  return W.mag_cmp(x, W.limbs(9007199254740992)) > 0
end
local function show(...)
  local s = {}
  for i, x in ipairs({...}) do
    if type(x) == 'boolean' then
      s[i] = tostring(x)
    elseif not ok(x) then
      return 'BAD'
    else
      s[i] = fmt(x)
    end
  end
  return table.concat(s, ' ')
end
local reply = {}
for i = 1, #ARGV, 3 do
  W = nil -- (the tables of the triples before are not used again)
  local op = ARGV[i]
  if string.sub(op, 1, 2) == 'w:' then
    big()
    op = string.sub(op, 3)
  end
  local a, b = parse_int(ARGV[i + 1]), parse_int(ARGV[i + 2])
  local r
  if a == nil or (b == nil and op ~= 'parse') then
    r = 'nil'
  elseif op == 'parse' then
    r = show(a)
  elseif op == 'add' then
    r = show(add(a, b))
  elseif op == 'sub' then
    r = show(sub(a, b))
  elseif op == 'mul' then
    r = show(mul(a, b))
  elseif op == 'divmod' then
    r = show(divmod(a, b))
  elseif op == 'divceil' then
    r = show(divceil(a, b))
  elseif op == 'cmp' then
    r = show(lt(a, b), le(a, b), lt(b, a), le(b, a))
  end
  reply[#reply + 1] = r
end
return reply`

// luaBig draws an integer for TestLuaInts: small, near ±2^53 (the edge of the numbers), near
// a power of 2^24 (a limb boundary), up to 2^64 or up to 2^120; either sign unless positive.
func luaBig(r *rand.Rand, positive bool) *big.Int {
	x := new(big.Int)
	switch r.IntN(6) {
	case 0:
		x.SetInt64(r.Int64N(1 << 20))
	case 1:
		x.SetInt64(1<<53 - 1000 + r.Int64N(2001))
	case 2:
		x.Lsh(big.NewInt(1), uint(24*(1+r.IntN(4))))
		x.Add(x, big.NewInt(r.Int64N(5)-2))
	case 3:
		x.SetUint64(r.Uint64() >> r.IntN(64))
	default: // 65..120 bits
		x.SetUint64(r.Uint64())
		x.Lsh(x, 64)
		x.Or(x, new(big.Int).SetUint64(r.Uint64()))
		x.Rsh(x, uint(8+r.IntN(56)))
	}
	if x.Sign() == 0 && positive {
		x.SetInt64(1)
	}
	if !positive && r.IntN(2) == 0 {
		x.Neg(x)
	}
	return x
}

// TestLuaInts checks common.lua's exact integers (add, sub, mul, divmod, divceil, lt, le,
// parse_int, fmt) against math/big on a real redis-server, around every edge of their
// representation: ±2^53, the limb boundaries, and products and quotients up to 2^120.
func TestLuaInts(t *testing.T) {
	e := newLuaEnv(t)
	script := rueidis.NewLuaScript(luaFile("lua/common.lua") + luaIntScript)
	r := rand.New(rand.NewPCG(5, 5))
	var args, wants []string
	flush := func() {
		t.Helper()
		got, err := script.Exec(context.Background(), e.c, nil, args).AsStrSlice()
		if err != nil {
			t.Fatal(err)
		}
		for i := range wants {
			if got[i] != wants[i] {
				t.Fatalf("%s(%s, %s) = %s, want %s", args[3*i], args[3*i+1], args[3*i+2], got[i], wants[i])
			}
		}
		args, wants = args[:0], wants[:0]
	}
	check := func(op string, a, b *big.Int, want string) {
		for _, prefix := range []string{"", "w:"} {
			args = append(args, prefix+op, a.String(), b.String())
			wants = append(wants, want)
		}
		if len(wants) >= 500 {
			flush()
		}
	}
	for i := 0; i < 10000; i++ {
		a, b := luaBig(r, false), luaBig(r, false)
		if a.BitLen() > 120 || b.BitLen() > 120 {
			continue
		}
		check("add", a, b, new(big.Int).Add(a, b).String())
		check("sub", a, b, new(big.Int).Sub(a, b).String())
		if a.BitLen()+b.BitLen() <= 124 {
			check("mul", a, b, new(big.Int).Mul(a, b).String())
		}
		c := a.Cmp(b)
		check("cmp", a, b, fmt.Sprintf("%t %t %t %t", c < 0, c <= 0, c > 0, c >= 0))
		check("cmp", a, a, "false true false true")
		d := luaBig(r, true)
		if d.BitLen() > 64 {
			d.Rsh(d, uint(d.BitLen()-64))
		}
		if r.IntN(3) == 0 { // a quotient and a remainder just at an edge
			q := luaBig(r, false)
			if q.BitLen()+d.BitLen() > 118 {
				q.Rsh(q, uint(q.BitLen()+d.BitLen()-118))
			}
			a = new(big.Int).Mul(q, d)
			a.Add(a, big.NewInt(r.Int64N(3)-1))
		}
		q, m := new(big.Int).DivMod(a, d, new(big.Int)) // Euclidean: floor for d > 0
		check("divmod", a, d, q.String()+" "+m.String())
		if m.Sign() != 0 {
			q.Add(q, big.NewInt(1))
		}
		check("divceil", a, d, q.String())
	}
	// parse_int takes decimal integers of up to 40 characters, and nothing else; fmt spells them back.
	for _, s := range []string{"0", "-0", "7", "-7", "9007199254740991", "9007199254740992", "9007199254740993", "-9007199254740993",
		"9223372036854775807", "-9223372036854775808", "18446744073709551615", "00000000000000000012", "-1000000000000000000",
		"1329227995784915872903807060280344575", "-000000000000000000000000000000000000001"} {
		want, _ := new(big.Int).SetString(s, 10)
		args = append(args, "parse", s, "", "w:parse", s, "")
		wants = append(wants, want.String(), want.String())
	}
	// Up to 15 characters, whatever Lua reads as a whole number is one (exactly).
	for s, want := range map[string]string{"+1": "1", "1.0": "1", "1e3": "1000", "0x10": "16", " 1": "1", "1 ": "1", "-2.5e1": "-25"} {
		args = append(args, "parse", s, "", "w:parse", s, "")
		wants = append(wants, want, want)
	}
	for _, s := range []string{"", "-", "--1", "1.5", "1e-1", "nan", "inf", "-inf", "1e20", "12345678901234567890123456789012345678901",
		"١٢", "4503599627370495.5", "9007199254740993.0", "+9007199254740993", " 9007199254740993", "1800000000000000 "} {
		args = append(args, "parse", s, "", "w:parse", s, "")
		wants = append(wants, "nil", "nil")
	}
	flush()
}

// multi.lua checks the two arguments it takes beyond single.lua's: a bad max_delay or dry_run is
// an error reply naming it, and nothing is written.
func TestLuaMultiHoldArgs(t *testing.T) {
	e := newLuaEnv(t)
	ctx := context.Background()
	lb := luaPolicy(algorithm.LeakyBucket, 10, 1_000_000, 5)
	for _, c := range []struct{ name, maxDelay, dry string }{
		{"max_delay", "soon", "0"}, {"max_delay", "-2", "0"}, {"max_delay", "1.5", "0"},
		{"max_delay", "9007199254740992", "0"}, {"dry_run", "-1", "yes"}, {"dry_run", "-1", ""},
	} {
		keys := []string{"rate-limit:{hold-args}:q", "rate-limit:{hold-args}:q:log"}
		args := append(append([]string{"1", "", "0"}, luaArgs(&lb, 1)...), c.maxDelay, c.dry, "")
		err := e.multi.Exec(ctx, e.c, keys, args).Error()
		if err == nil || !strings.Contains(err.Error(), "sluice: "+c.name+" ") {
			t.Errorf("max_delay %q, dry_run %q: %v, want an error naming %s", c.maxDelay, c.dry, err, c.name)
		}
		if n, _ := e.c.Do(ctx, e.c.B().Exists().Key(keys...).Build()).AsInt64(); n != 0 {
			t.Errorf("a refused call wrote %d keys", n)
		}
	}
}

// TestLuaBatchAsSingles: a batch (batch.lua) decides and writes exactly what the same decisions
// made one by one with the single scripts do: on keys repeated within the batch, on a key whose
// algorithm changes within it (a sliding log and the string algorithms taking turns: renewals,
// the log's deletion), on keys holding the old format's hash, for random batches.
func TestLuaBatchAsSingles(t *testing.T) {
	e := newLuaEnv(t)
	ctx := context.Background()
	batch := e.batch
	r := rand.New(rand.NewPCG(12, 34))
	t0 := int64(1_800_000_000_000_000)
	policies := []algorithm.Policy{
		luaPolicy(algorithm.TokenBucket, 3, 1_000_000, 0), luaPolicy(algorithm.SlidingLog, 3, 1_000_000, 0),
		luaPolicy(algorithm.FixedWindow, 4, 1_000_000, 0), luaPolicy(algorithm.SlidingWindow, 4, 1_000_000, 0),
		luaPolicy(algorithm.LeakyBucket, 2, 1_000_000, 2),
	}
	state := func(stem string) string {
		v, _ := e.c.Do(ctx, e.c.B().Get().Key(stem+":v2").Build()).ToString()
		l, _ := e.c.Do(ctx, e.c.B().Lrange().Key(stem+":log").Start(0).Stop(-1).Build()).AsStrSlice()
		h, _ := e.c.Do(ctx, e.c.B().Hgetall().Key(stem).Build()).AsStrMap()
		return fmt.Sprintf("%q %q %v", v, l, h)
	}
	for round := range 40 {
		now := t0 + int64(round)*300_000
		n := 1 + r.IntN(12)
		stems := make([]string, n)
		ps := make([]algorithm.Policy, n)
		costs := make([]int64, n)
		for i := range n {
			stems[i] = fmt.Sprintf("k%d", r.IntN(4))
			ps[i] = policies[r.IntN(len(policies))]
			costs[i] = int64(r.IntN(3))
		}
		if round%5 == 0 { // a key of the old format, or a log, before the batch
			for _, side := range []string{"B", "S"} {
				k := "rate-limit:{" + side + "}:" + stems[0]
				if err := e.c.Do(ctx, e.c.B().Arbitrary("HSET", k, "alg", "4", "limit", "3", "period", "1000000", "tat", i64(now+2_000_000), "frac", "0").Build()).Error(); err != nil {
					t.Fatal(err)
				}
				if err := e.c.Do(ctx, e.c.B().Arbitrary("DEL", k+":v2").Build()).Error(); err != nil {
					t.Fatal(err)
				}
			}
		}
		var keys []string
		args := []string{strconv.Itoa(n), i64(now), i64(luaSlack)}
		for i := range n {
			keys = append(keys, luaKeys("rate-limit:{B}:"+stems[i])...)
			args = append(args, luaArgs(&ps[i], costs[i])...)
		}
		for range n {
			args = append(args, "")
		}
		got, err := batch.Exec(ctx, e.c, keys, args).AsIntSlice()
		if err != nil {
			t.Fatal(err)
		}
		for i := range n {
			want, err := e.run("rate-limit:{S}:"+stems[i], &ps[i], costs[i], i64(now), luaSlack)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got[6*i:6*i+6], want) {
				t.Fatalf("round %d, decision %d (%s, %v, cost %d): batch %v, single %v", round, i, stems[i], ps[i].Algorithm, costs[i], got[6*i:6*i+6], want)
			}
		}
		for k := range 4 {
			stem := fmt.Sprintf("k%d", k)
			if b, s := state("rate-limit:{B}:"+stem), state("rate-limit:{S}:"+stem); b != s {
				t.Fatalf("round %d, %s: the batch stored %s, the single calls %s", round, stem, b, s)
			}
		}
	}
}
