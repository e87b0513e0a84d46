// Package storetest is the conformance suite every sluice.Store must pass: the same golden and
// fuzzed traces, run on a virtual clock, must give decision for decision what the pure core
// (package algorithm) gives. The memory store runs it; so does the Redis store, on real Redis.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"math/big"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
)

// NewStore returns a fresh, empty store that reads its time from clock.
type NewStore func(t *testing.T, clock sluice.Clock) sluice.Store

// Step is one request of a trace: at µs since the epoch (which is a window boundary).
type Step struct {
	At   int64
	Key  string
	Cost int64
}

// Trace is a policy and requests on it, in time order.
type Trace struct {
	Name   string
	Policy sluice.Policy
	Steps  []Step
}

// Run runs the whole conformance suite on stores made by newStore.
func Run(t *testing.T, newStore NewStore) { Suite{New: newStore}.Run(t) }

// Suite is the conformance suite for one kind of store.
type Suite struct {
	New NewStore
	// CachedRefusals: the store may answer a refusal from a cache of an earlier one (the Redis
	// store's negative cache). Such an answer is exact but for Remaining, which is the earlier
	// refusal's and so may be lower than the truth (quota refilled since); the suite then
	// requires, of a decision marked Cached, Remaining ≤ the core's instead of equal.
	CachedRefusals bool
	// SplitAcrossKeys: DecideAll with limits under several keys is not one atomic step (a Redis
	// Cluster, when the keys lie in several slots; see sluice.Store.DecideAll), so a call that
	// concurrent calls race with may be refused having consumed on some of its keys. The suite
	// then requires, of concurrent calls, at most the approvals an atomic store gives instead
	// of exactly as many.
	SplitAcrossKeys bool
}

// Run runs the whole conformance suite.
func (s Suite) Run(t *testing.T) {
	newStore := s.New
	t.Run("golden", func(t *testing.T) {
		for _, tr := range GoldenTraces() {
			t.Run(tr.Name, func(t *testing.T) { s.Replay(t, tr) })
		}
	})
	t.Run("fuzzed", func(t *testing.T) {
		for i, tr := range FuzzedTraces(1, 60, 120) {
			t.Run(fmt.Sprintf("%d-%v", i, tr.Policy.Algorithm), func(t *testing.T) { s.Replay(t, tr) })
		}
	})
	t.Run("fuzzed-large", func(t *testing.T) {
		for i, tr := range FuzzedLargeTraces(2, 16, 80) {
			t.Run(fmt.Sprintf("%d-%v", i, tr.Policy.Algorithm), func(t *testing.T) { s.Replay(t, tr) })
		}
	})
	t.Run("policies-share-nothing", func(t *testing.T) { policiesShareNothing(t, newStore) })
	t.Run("concurrent-exact", func(t *testing.T) { ConcurrentExact(t, newStore, 32, 3) })
	t.Run("decide-all", func(t *testing.T) { decideAll(t, newStore) })
	t.Run("decide-all-concurrent", func(t *testing.T) { ConcurrentDecideAll(t, newStore, 16, 3) })
	t.Run("decide-all-keys", func(t *testing.T) { decideAllKeys(t, newStore) })
	t.Run("decide-all-keys-fuzzed", func(t *testing.T) {
		for _, tr := range FuzzedMultiTraces(3, 40, 60) {
			t.Run(tr.Name, func(t *testing.T) { s.ReplayMulti(t, tr) })
		}
	})
	t.Run("decide-all-keys-concurrent", func(t *testing.T) { ConcurrentDecideAllKeys(t, newStore, 16, 3, s.SplitAcrossKeys) })
	t.Run("dry-run", func(t *testing.T) { dryRun(t, newStore) })
	t.Run("max-delay", func(t *testing.T) { maxDelay(t, newStore) })
	t.Run("policy-change", func(t *testing.T) { s.policyChange(t) })
	t.Run("settle", func(t *testing.T) { s.settle(t) })
	t.Run("concurrency", func(t *testing.T) { Concurrency(t, newStore) })
}

// decideAll: "3 a second and 5 a minute" on one key, all or nothing.
func decideAll(t *testing.T, newStore NewStore) {
	clock := sluice.NewManualClock(time.UnixMicro(0))
	store := newStore(t, clock)
	ctx := context.Background()
	perSecond := sluice.Policy{Name: "per-second", Algorithm: sluice.TokenBucket, Limit: 3, Period: time.Second}
	perMinute := sluice.Policy{Name: "per-minute", Algorithm: sluice.SlidingLog, Limit: 5, Period: time.Minute}
	limits := []sluice.Limit{{Policy: perSecond, Cost: 1}, {Policy: perMinute, Cost: 1}}
	out := make([]sluice.Decision, 2)
	for i := 0; i < 3; i++ {
		ok, err := store.DecideAll(ctx, "c", limits, out)
		if err != nil || !ok || !out[0].Allowed || !out[1].Allowed {
			t.Fatalf("request %d within both limits: %v %v %+v", i, ok, err, out)
		}
	}
	// The per-second bucket is empty: the request is refused, and the per-minute log keeps its 2 left.
	ok, err := store.DecideAll(ctx, "c", limits, out)
	if err != nil || ok || out[0].Allowed || !out[1].Allowed || out[0].RetryAfter != 333_334*time.Microsecond {
		t.Fatalf("4th request at once: %v %v %+v, want refused by per-second with RetryAfter 333.334ms", ok, err, out)
	}
	if d, _ := store.Decide(ctx, "c", perMinute, 0); d.Remaining != 2 {
		t.Fatalf("per-minute remaining after a refusal by per-second: %d, want 2 (nothing consumed)", d.Remaining)
	}
	clock.Set(time.UnixMicro(10_000_000))
	for i := 0; i < 2; i++ {
		if ok, err := store.DecideAll(ctx, "c", limits, out); err != nil || !ok {
			t.Fatalf("request %d after 10s: %v %v %+v", i, ok, err, out)
		}
	}
	// Now per-minute is spent and per-second is not: refused, and per-second keeps its tokens.
	ok, err = store.DecideAll(ctx, "c", limits, out)
	if err != nil || ok || !out[0].Allowed || out[1].Allowed {
		t.Fatalf("6th request in the minute: %v %v %+v, want refused by per-minute only", ok, err, out)
	}
	if d, _ := store.Decide(ctx, "c", perSecond, 0); d.Remaining != 1 {
		t.Fatalf("per-second remaining after a refusal by per-minute: %d, want 1", d.Remaining)
	}
	// A cost that can never fit one limit is an error, and nothing is consumed.
	_, err = store.DecideAll(ctx, "c", []sluice.Limit{{Policy: perSecond, Cost: 1}, {Policy: perMinute, Cost: 6}}, out)
	if !errors.Is(err, sluice.ErrCostExceedsLimit) {
		t.Fatalf("cost 6 on a limit of 5: %v, want ErrCostExceedsLimit", err)
	}
	if d, _ := store.Decide(ctx, "c", perSecond, 0); d.Remaining != 1 {
		t.Fatalf("per-second remaining after an impossible request: %d, want 1", d.Remaining)
	}
}

// Replay runs tr on a fresh store and on the pure core, and fails at the first decision that differs.
func Replay(t *testing.T, newStore NewStore, tr Trace) { Suite{New: newStore}.Replay(t, tr) }

// Replay runs tr on a fresh store and on the pure core, and fails at the first decision that differs.
func (s Suite) Replay(t *testing.T, tr Trace) {
	t.Helper()
	clock := sluice.NewManualClock(time.UnixMicro(0))
	store := s.New(t, clock)
	ref := map[string]*algorithm.State{}
	p := tr.Policy
	ctx := context.Background()
	for i, st := range tr.Steps {
		clock.Set(time.UnixMicro(st.At))
		want, wantErr := decideRef(ref, &p, st)
		got, gotErr := store.Decide(ctx, st.Key, p, st.Cost)
		if (wantErr == nil) != (gotErr == nil) || (wantErr != nil && !sameKind(wantErr, gotErr)) {
			t.Fatalf("%s step %d %+v: error %v, want %v", tr.Name, i, st, gotErr, wantErr)
		}
		if s.CachedRefusals && !want.Allowed && got.Cached() && got.Remaining <= want.Remaining {
			got.Remaining, got.Source = want.Remaining, sluice.FromStore
		}
		if got != want {
			t.Fatalf("%s step %d %+v (policy %+v):\n got %+v\nwant %+v", tr.Name, i, st, p, got, want)
		}
	}
}

func decideRef(ref map[string]*algorithm.State, p *sluice.Policy, st Step) (sluice.Decision, error) {
	s := ref[st.Key]
	if s == nil {
		s = &algorithm.State{}
		ref[st.Key] = s
	}
	return algorithm.Decide(p, s, st.At, st.Cost)
}

func sameKind(a, b error) bool {
	for _, target := range []error{sluice.ErrCostExceedsLimit, sluice.ErrInvalidCost} {
		if errors.Is(a, target) != errors.Is(b, target) {
			return false
		}
	}
	return true
}

const (
	ms  = int64(1000)
	sec = 1000 * ms
	min = 60 * sec
)

// GoldenTraces are typical traffic and the edges of each algorithm.
func GoldenTraces() []Trace {
	var out []Trace
	add := func(name string, p sluice.Policy, steps []Step) {
		p.Name = name
		out = append(out, Trace{Name: name, Policy: p, Steps: steps})
	}
	burst := func(at int64, n int, key string, cost int64) []Step {
		s := make([]Step, n)
		for i := range s {
			s[i] = Step{At: at, Key: key, Cost: cost}
		}
		return s
	}
	every := func(start, step int64, n int, key string) []Step {
		s := make([]Step, n)
		for i := range s {
			s[i] = Step{At: start + int64(i)*step, Key: key, Cost: 1}
		}
		return s
	}
	cat := func(parts ...[]Step) []Step {
		var s []Step
		for _, p := range parts {
			s = append(s, p...)
		}
		return s
	}
	perMinute := func(a sluice.Algorithm) sluice.Policy {
		return sluice.Policy{Algorithm: a, Limit: 100, Period: time.Minute}
	}
	// The minute boundary: 100 at 59 s and 100 at 60 s, then a retry at the first admissible µs.
	boundary := cat(burst(59*sec, 100, "c", 1), burst(60*sec, 100, "c", 1), []Step{{At: 119*sec - 1, Key: "c", Cost: 1}, {At: 119 * sec, Key: "c", Cost: 1}})
	for _, a := range []sluice.Algorithm{sluice.FixedWindow, sluice.SlidingLog, sluice.SlidingWindow} {
		add("minute-boundary-"+a.String(), perMinute(a), boundary)
	}
	// Sliding window: 80 in the previous minute, 20 in this one, 15 s in.
	add("sliding-window-estimate", perMinute(sluice.SlidingWindow),
		cat(burst(10*sec, 80, "c", 1), burst(min+sec, 20, "c", 1), burst(min+15*sec, 25, "c", 1), []Step{{At: min + 30*sec, Key: "c", Cost: 1}}))
	// A bucket of 20 refilling 5/s: 20 at once, then 5 a second, then an idle hour.
	tb := sluice.Policy{Algorithm: sluice.TokenBucket, Limit: 5, Period: time.Second, Burst: 20}
	add("token-bucket-20-at-5-per-s", tb, cat(burst(0, 22, "c", 1), every(sec, 100*ms, 30, "c"), burst(3600*sec, 22, "c", 1)))
	// A report costing 5, and a cost that can never fit.
	for _, a := range algorithm.Algorithms {
		p := sluice.Policy{Algorithm: a, Limit: 10, Period: time.Second}
		if a == sluice.TokenBucket || a == sluice.LeakyBucket {
			p.Burst = 12
		}
		add("cost-5-"+a.String(), p, cat(burst(0, 3, "c", 5), []Step{{At: 100 * ms, Key: "c", Cost: 0}, {At: 200 * ms, Key: "c", Cost: 13}, {At: 300 * ms, Key: "c", Cost: 5}, {At: 1500 * ms, Key: "c", Cost: 5}}))
	}
	// Steady, a burst, steady: 5/s for 10 s, 40 in one second, 5/s for 10 s.
	bursty := cat(every(0, 200*ms, 50, "c"), every(10*sec, 25*ms, 40, "c"), every(11*sec, 200*ms, 50, "c"))
	for _, a := range algorithm.Algorithms {
		p := sluice.Policy{Algorithm: a, Limit: 5, Period: time.Second}
		if a == sluice.TokenBucket || a == sluice.LeakyBucket {
			p.Burst = 40
		}
		add("steady-burst-"+a.String(), p, bursty)
	}
	// Emission intervals that are not whole µs (3 per second), over a long steady stream.
	for _, a := range []sluice.Algorithm{sluice.TokenBucket, sluice.LeakyBucket} {
		add("fractional-interval-"+a.String(), sluice.Policy{Algorithm: a, Limit: 3, Period: time.Second, Burst: 2}, every(0, 97*ms, 400, "c"))
	}
	// Several clients on one policy are independent.
	two := cat(burst(0, 6, "a", 1), burst(0, 6, "b", 1), burst(500*ms, 3, "a", 1))
	for _, a := range algorithm.Algorithms {
		add("two-clients-"+a.String(), sluice.Policy{Algorithm: a, Limit: 5, Period: time.Second}, two)
	}
	// Contracts whose limit × period is far beyond 2^53 µs, on a real date (20,000 days after
	// the epoch). 100,000 a day: 60,000 today, then tomorrow at 6:00 the 60,000 weigh 45,000, so
	// 55,000 more fit; then one more every 1.44 s (a day / 60,000) as they weigh less.
	t0, day := 20_000*24*60*min, 24*60*min
	add("sliding-window-100000-a-day", sluice.Policy{Algorithm: sluice.SlidingWindow, Limit: 100_000, Period: 24 * time.Hour},
		cat([]Step{{At: t0, Key: "c", Cost: 60_000}, {At: t0 + day + day/4, Key: "c", Cost: 55_000}}, every(t0+day+day/4, 720*ms, 8, "c")))
	// A million a month (30 days), all at once, then half a month later half of it.
	month := 30 * day
	add("token-bucket-1000000-a-month", sluice.Policy{Algorithm: sluice.TokenBucket, Limit: 1_000_000, Period: 30 * 24 * time.Hour, Burst: 1_000_000},
		cat([]Step{{At: t0, Key: "c", Cost: 1_000_000}, {At: t0, Key: "c", Cost: 1}, {At: t0 + month/2, Key: "c", Cost: 500_001},
			{At: t0 + month/2, Key: "c", Cost: 500_000}}, every(t0+month/2, 1_296*ms, 4, "c")))
	// 700,000 an hour (5142.857… µs apart): a queue of one hour, and one of a million hours.
	for _, burst := range []int64{699_999, 1_000_000_000_000} {
		add(fmt.Sprintf("leaky-bucket-700000-an-hour-burst-%d", burst), sluice.Policy{Algorithm: sluice.LeakyBucket, Limit: 700_000, Period: time.Hour, Burst: burst},
			cat([]Step{{At: t0, Key: "c", Cost: 700_000}, {At: t0, Key: "c", Cost: burst}, {At: t0, Key: "c", Cost: 1}}, every(t0+1, 5_143, 6, "c")))
	}
	// The extremes: limit 2^53, a period of 292 years (time.Duration's most), the largest burst
	// Validate takes (a refill time just below 2^53 µs), costs of all of it, and a clock 36,000
	// years after the epoch, or before it.
	for _, a := range algorithm.Algorithms {
		p := LargestPolicy(a)
		all := MaxCost(&p)
		far := int64(1<<60 - 1)
		add("extreme-"+a.String(), p, []Step{{At: t0, Key: "c", Cost: all}, {At: t0, Key: "c", Cost: 1}, {At: t0 + 1, Key: "c", Cost: all / 2},
			{At: far - p.PeriodMicros(), Key: "c", Cost: all}, {At: far, Key: "c", Cost: 1}, {At: far, Key: "c", Cost: all}})
		add("extreme-before-the-epoch-"+a.String(), p, []Step{{At: -far, Key: "c", Cost: 0}, {At: -far, Key: "c", Cost: all / 3},
			{At: -far + 1, Key: "c", Cost: all}, {At: -far + 1, Key: "c", Cost: 1}, {At: t0, Key: "c", Cost: 1}})
	}
	return out
}

// LargestPolicy is a's policy at the core's bounds: limit 2^53, the longest period a
// time.Duration holds (292 years), and for a bucket the largest burst Policy.Validate takes
// (capacity × period / limit just below 2^53 µs).
func LargestPolicy(a sluice.Algorithm) sluice.Policy {
	p := sluice.Policy{Algorithm: a, Limit: algorithm.MaxLimit, Period: time.Duration(1<<63-1) / time.Microsecond * time.Microsecond}
	if a == sluice.TokenBucket || a == sluice.LeakyBucket {
		// capacity·period < 2^53·limit = 2^106
		c := new(big.Int).Lsh(big.NewInt(1), 106)
		c.Sub(c, big.NewInt(1)).Div(c, big.NewInt(p.PeriodMicros()))
		p.Burst = c.Int64()
		if a == sluice.LeakyBucket {
			p.Burst-- // capacity is burst + 1
		}
	}
	if err := p.Validate(); err != nil {
		panic(err) // a bug in this function
	}
	return p
}

// MaxCost is the largest cost CheckCost lets through under p: the limit of a window algorithm,
// a token bucket's capacity, or the largest leaky-bucket cost that drains in under 2^62 µs (at
// most MaxInt64).
func MaxCost(p *sluice.Policy) int64 {
	switch p.Algorithm {
	case sluice.TokenBucket:
		return p.Capacity()
	case sluice.LeakyBucket:
		c := new(big.Int).Lsh(big.NewInt(p.Limit), 62) // cost·period < 2^62·limit
		c.Sub(c, big.NewInt(1)).Div(c, big.NewInt(p.PeriodMicros()))
		if !c.IsInt64() {
			return 1<<63 - 1
		}
		return c.Int64()
	}
	return p.Limit
}

// FuzzedTraces returns n random traces per algorithm, of up to steps requests on three keys,
// drawn from random stream number stream: small limits and periods so that every branch
// (refusals, window roll-overs, queue room, idle keys) is reached often.
func FuzzedTraces(stream uint64, n, steps int) []Trace {
	r := rand.New(rand.NewPCG(stream, stream^0x5eed))
	var out []Trace
	for _, a := range algorithm.Algorithms {
		for i := 0; i < n; i++ {
			p := sluice.Policy{Name: fmt.Sprintf("fuzz-%d", i), Algorithm: a,
				Limit: 1 + r.Int64N(12), Period: time.Duration(1+r.Int64N(3000)) * time.Millisecond}
			if a == sluice.TokenBucket || a == sluice.LeakyBucket {
				p.Burst = r.Int64N(15)
			}
			period := int64(p.Period / time.Microsecond)
			at := r.Int64N(3 * period)
			tr := Trace{Name: p.Name, Policy: p}
			for j := r.IntN(steps) + 1; j > 0; j-- {
				switch r.IntN(6) {
				case 0: // a long pause
					at += r.Int64N(3 * period)
				case 1, 2: // same instant
				default:
					at += r.Int64N(period/4 + 1)
				}
				tr.Steps = append(tr.Steps, Step{At: at, Key: fmt.Sprint("k", r.IntN(3)), Cost: r.Int64N(4)})
			}
			out = append(out, tr)
		}
	}
	return out
}

// FuzzedLargeTraces returns n random traces per algorithm over the whole range the core
// accepts, of up to steps requests on two keys, drawn from random stream number stream: limits
// and bursts up to 2^53, periods from 1 ms to 292 years, costs up to all that CheckCost lets through, and times from
// 36,000 years before the epoch to 36,000 years after it (|now| < 2^60 µs), moving on by small
// steps, periods, long pauses and jumps far ahead. (Time never runs back in a trace: a store may
// drop a key once it is idle at the latest time it has seen, as FuzzedTraces allows.)
func FuzzedLargeTraces(stream uint64, n, steps int) []Trace {
	r := rand.New(rand.NewPCG(stream, stream^0x1a59e))
	least := func(a, b int64) int64 { // (min is this package's minute)
		if a < b {
			return a
		}
		return b
	}
	count := func() int64 { return RandomCount(r) }
	const maxPeriod = int64(1<<63-1) / int64(time.Microsecond)
	const far = int64(1<<60 - 1)
	period := func() int64 {
		switch r.IntN(6) {
		case 0:
			return 1000 + r.Int64N(3_000_000)
		case 1:
			return 24 * 60 * min * (1 + r.Int64N(400)) // days
		case 2:
			return 1<<53 - 1 + r.Int64N(3)
		case 3:
			return maxPeriod - r.Int64N(2)
		}
		return 1000 + r.Int64N(maxPeriod-999)
	}
	var out []Trace
	for _, a := range algorithm.Algorithms {
		for i := 0; i < n; i++ {
			var p sluice.Policy
			for {
				p = sluice.Policy{Name: fmt.Sprintf("fuzz-large-%d", i), Algorithm: a, Limit: count(), Period: time.Duration(period()) * time.Microsecond}
				if a == sluice.TokenBucket || a == sluice.LeakyBucket {
					p.Burst = count() >> r.IntN(54)
				}
				if p.Validate() == nil {
					break
				}
			}
			pm, most := p.PeriodMicros(), MaxCost(&p)
			var at int64
			switch r.IntN(4) {
			case 0:
				at = r.Int64N(3 * pm)
			case 1:
				at = 1_800_000_000_000_000 + r.Int64N(1_000_000_000_000)
			case 2:
				at = far - r.Int64N(1<<50)
			default:
				at = -r.Int64N(far)
			}
			tr := Trace{Name: p.Name, Policy: p}
			for j := r.IntN(steps) + 1; j > 0; j-- {
				switch r.IntN(10) {
				case 0: // a pause of up to 50 periods
					at += r.Int64N(50*pm + 1)
				case 1: // far ahead
					at += r.Int64N(far - max(at, 0) + 1)
				case 2, 3, 4: // same instant
				default: // about the emission interval, or within a period
					at += r.Int64N(least(pm, 4*(pm/p.Limit+1)) + 1)
				}
				at = least(at, far)
				var cost int64
				switch r.IntN(8) {
				case 0:
					cost = 0
				case 1, 2, 3:
					cost = least(1, most)
				case 4:
					cost = most - least(most, r.Int64N(3))
				case 5:
					cost = most / (2 + r.Int64N(10))
				default:
					cost = r.Int64N(most) + 1
				}
				tr.Steps = append(tr.Steps, Step{At: at, Key: fmt.Sprint("k", r.IntN(2)), Cost: cost})
			}
			out = append(out, tr)
		}
	}
	return out
}

// policiesShareNothing: one key under two policies of one store keeps two states.
func policiesShareNothing(t *testing.T, newStore NewStore) {
	clock := sluice.NewManualClock(time.UnixMicro(0))
	store := newStore(t, clock)
	ctx := context.Background()
	perSecond := sluice.Policy{Name: "per-second", Algorithm: sluice.FixedWindow, Limit: 2, Period: time.Second}
	perDay := sluice.Policy{Name: "per-day", Algorithm: sluice.FixedWindow, Limit: 3, Period: 24 * time.Hour}
	for i := 0; i < 2; i++ {
		if d, err := store.Decide(ctx, "c", perSecond, 1); err != nil || !d.Allowed {
			t.Fatalf("per-second request %d: %+v %v", i, d, err)
		}
	}
	d, err := store.Decide(ctx, "c", perDay, 1)
	if err != nil || !d.Allowed || d.Remaining != 2 {
		t.Fatalf("per-day after two per-second requests: %+v %v, want allowed with 2 remaining", d, err)
	}
}

// ConcurrentExact hammers one key from many goroutines at one frozen instant, rounds times, for
// every algorithm, and requires exactly the capacity to be approved: no lost update, no double
// spend. The clock stands still so that the exact count is known.
func ConcurrentExact(t *testing.T, newStore NewStore, goroutines, rounds int) {
	clock := sluice.NewManualClock(time.UnixMicro(1_000_000_000))
	store := newStore(t, clock)
	const limit = 100
	for _, a := range algorithm.Algorithms {
		p := sluice.Policy{Name: "concurrent-" + a.String(), Algorithm: a, Limit: limit, Period: time.Hour}
		want := int64(limit)
		if a == sluice.LeakyBucket {
			p.Burst = limit - 1 // one served now, 99 queued
		}
		for round := 0; round < rounds; round++ {
			key := fmt.Sprintf("hot-%d", round)
			var approved atomic.Int64
			var wg sync.WaitGroup
			start := make(chan struct{})
			for g := 0; g < goroutines; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					for i := 0; i < 2*limit/goroutines+2; i++ {
						d, err := store.Decide(context.Background(), key, p, 1)
						if err != nil {
							t.Error(err)
							return
						}
						if d.Allowed {
							approved.Add(1)
						}
					}
				}()
			}
			close(start)
			wg.Wait()
			if got := approved.Load(); got != want {
				t.Fatalf("%v round %d: %d goroutines approved %d, want exactly %d", a, round, goroutines, got, want)
			}
		}
	}
}

// ConcurrentDecideAll hammers DecideAll on a few keys of one store from many goroutines at one
// frozen instant, for every algorithm paired with a looser fixed window: exactly the tighter
// limit is approved on each key, and the looser one has consumed exactly as much (all or nothing
// under concurrency: no approval lost, none written half).
func ConcurrentDecideAll(t *testing.T, newStore NewStore, goroutines, rounds int) {
	clock := sluice.NewManualClock(time.UnixMicro(1_000_000_000))
	store := newStore(t, clock)
	ctx := context.Background()
	const limit, keys = 30, 4
	for _, a := range algorithm.Algorithms {
		tight := sluice.Policy{Name: "tight-" + a.String(), Algorithm: a, Limit: limit, Period: time.Hour}
		if a == sluice.LeakyBucket {
			tight.Burst = limit - 1
		}
		loose := sluice.Policy{Name: "loose-" + a.String(), Algorithm: sluice.FixedWindow, Limit: 10 * limit, Period: time.Hour}
		limits := []sluice.Limit{{Policy: loose, Cost: 1}, {Policy: tight, Cost: 1}}
		for round := 0; round < rounds; round++ {
			var approved [keys]atomic.Int64
			var wg sync.WaitGroup
			start := make(chan struct{})
			for g := 0; g < goroutines; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					out := make([]sluice.Decision, 2)
					<-start
					for i := 0; i < 3*limit*keys/goroutines+2; i++ {
						k := (g + i) % keys
						ok, err := store.DecideAll(ctx, fmt.Sprintf("all-%d-%d", round, k), limits, out)
						if err != nil {
							t.Error(err)
							return
						}
						if ok {
							approved[k].Add(1)
						}
					}
				}()
			}
			close(start)
			wg.Wait()
			for k := range keys {
				key := fmt.Sprintf("all-%d-%d", round, k)
				if got := approved[k].Load(); got != limit {
					t.Fatalf("%v round %d key %d: %d approved, want exactly %d", a, round, k, got, limit)
				}
				if d, err := store.Decide(ctx, key, loose, 0); err != nil || d.Remaining != 9*limit {
					t.Fatalf("%v round %d key %d: the loose limit has %d left (%v), want %d: it consumed without the tight one",
						a, round, k, d.Remaining, err, 9*limit)
				}
			}
		}
	}
}

// dryRun: a dry-run limit is decided in the same call as the enforced ones; it never refuses, it
// consumes when the request passes, and it consumes nothing when an enforced limit refuses.
func dryRun(t *testing.T, newStore NewStore) {
	clock := sluice.NewManualClock(time.UnixMicro(0))
	store := newStore(t, clock)
	ctx := context.Background()
	enforced := sluice.Policy{Name: "enforced", Algorithm: sluice.FixedWindow, Limit: 2, Period: time.Minute}
	trial := sluice.Policy{Name: "trial", Algorithm: sluice.SlidingLog, Limit: 1, Period: time.Minute}
	limits := []sluice.Limit{{Policy: enforced, Cost: 1}, {Policy: trial, Cost: 1, DryRun: true}}
	out := make([]sluice.Decision, 2)
	want := []struct {
		ok, enforced, trial bool
	}{
		{true, true, true},   // both allow: both consume
		{true, true, false},  // the dry-run limit would refuse: the request passes, enforced consumes
		{false, false, true}, // enforced refuses: the dry-run limit (whose verdict is moot) consumes nothing
	}
	trialStore := []sluice.Limit{{Policy: trial, Cost: 1, DryRun: true}}
	for i, w := range want {
		if i == 2 {
			clock.Set(time.UnixMicro(61 * sec)) // trial's log is empty again; enforced's window has 0
			for j := 0; j < 2; j++ {
				if ok, err := store.DecideAll(ctx, "e", []sluice.Limit{{Policy: enforced, Cost: 1}}, out[:1]); err != nil || !ok {
					t.Fatalf("filling enforced: %v %v", ok, err)
				}
			}
		}
		ok, err := store.DecideAll(ctx, "e", limits, out)
		if err != nil || ok != w.ok || out[0].Allowed != w.enforced || out[1].Allowed != w.trial {
			t.Fatalf("request %d: %v %v %+v, want ok %v, enforced %v, dry-run %v", i, ok, err, out, w.ok, w.enforced, w.trial)
		}
	}
	if d, _ := store.Decide(ctx, "e", trial, 0); d.Remaining != 1 {
		t.Fatalf("dry-run limit: %d left after a request an enforced limit refused, want 1 (nothing consumed)", d.Remaining)
	}
	// A dry-run limit alone never refuses, and counts.
	if ok, err := store.DecideAll(ctx, "alone", trialStore, out[:1]); err != nil || !ok || !out[0].Allowed {
		t.Fatalf("dry-run alone, first: %v %v %+v", ok, err, out[0])
	}
	if ok, err := store.DecideAll(ctx, "alone", trialStore, out[:1]); err != nil || !ok || out[0].Allowed {
		t.Fatalf("dry-run alone, second: %v %v %+v, want ok (never refuses) with the limit's refusal", ok, err, out[0])
	}
}

// maxDelay: a leaky-bucket request that would be held longer than its limit's MaxDelay is refused
// and consumes nothing. 20 requests at once on 10/s with room for 100, held at most 200ms: 3 pass
// (held 0, 100ms and 200ms), 17 are refused, and the queue is 300ms deep, not 2s. Alone and
// together with another limit (the all-or-nothing path).
func maxDelay(t *testing.T, newStore NewStore) {
	clock := sluice.NewManualClock(time.UnixMicro(0))
	store := newStore(t, clock)
	ctx := context.Background()
	queue := sluice.Policy{Name: "queue", Algorithm: sluice.LeakyBucket, Limit: 10, Period: time.Second, Burst: 100}
	other := sluice.Policy{Name: "other", Algorithm: sluice.TokenBucket, Limit: 1000, Period: time.Second}
	for _, tc := range []struct {
		key    string
		limits []sluice.Limit
	}{
		{"alone", []sluice.Limit{{Policy: queue, Cost: 1, MaxDelay: 200 * time.Millisecond}}},
		{"with-other", []sluice.Limit{{Policy: other, Cost: 1}, {Policy: queue, Cost: 1, MaxDelay: 200 * time.Millisecond}}},
	} {
		clock.Set(time.UnixMicro(0))
		out := make([]sluice.Decision, len(tc.limits))
		q := len(tc.limits) - 1
		passed := 0
		for i := 0; i < 20; i++ {
			ok, err := store.DecideAll(ctx, tc.key, tc.limits, out)
			if err != nil {
				t.Fatal(err)
			}
			if ok {
				passed++
				if want := time.Duration(i) * 100 * time.Millisecond; out[q].Delay != want {
					t.Fatalf("%s request %d: held %v, want %v", tc.key, i, out[q].Delay, want)
				}
			} else if out[q].Allowed || out[q].RetryAfter != 100*time.Millisecond {
				t.Fatalf("%s request %d: %+v, want refused with RetryAfter 100ms (when its hold is 200ms)", tc.key, i, out[q])
			}
		}
		if passed != 3 {
			t.Fatalf("%s: %d of 20 passed, want 3", tc.key, passed)
		}
		if d, _ := store.Decide(ctx, tc.key, queue, 0); d.Remaining != 98 {
			t.Fatalf("%s: the queue takes %d more, want 98: the 17 refusals consumed", tc.key, d.Remaining)
		}
		if len(tc.limits) == 2 {
			if d, _ := store.Decide(ctx, tc.key, other, 0); d.Remaining != 997 {
				t.Fatalf("%s: the other limit has %d left, want 997 (3 consumed)", tc.key, d.Remaining)
			}
		}
		clock.Set(time.UnixMicro(100 * ms))
		if ok, err := store.DecideAll(ctx, tc.key, tc.limits, out); err != nil || !ok || out[q].Delay != 200*time.Millisecond {
			t.Fatalf("%s at the RetryAfter: %v %v %+v, want passed, held 200ms", tc.key, ok, err, out[q])
		}
		// NoDelay holds nothing: the queue is busy, so the request is refused.
		no := append([]sluice.Limit(nil), tc.limits...)
		no[q].MaxDelay = sluice.NoDelay
		if ok, _ := store.DecideAll(ctx, tc.key, no, out); ok || out[q].Allowed {
			t.Fatalf("%s with NoDelay on a busy queue: %+v, want refused", tc.key, out[q])
		}
	}
}

// policyChange: a policy changed under the same name (a reload that changed its numbers) takes
// effect at once, for every algorithm and every kind of change, exactly as the core defines it:
// a state written under another algorithm, limit or period is never seen, and a changed burst
// carries over. Each trace spends the key under the first policy and repeats a refused request
// (which a store with a negative cache answers from it: with CachedRefusals, at least one
// refusal of the case must be Cached, or the case would not cover the cache), switches to the
// changed policy at that same instant, and then back and forth.
func (s Suite) policyChange(t *testing.T) {
	var cached atomic.Int64
	t.Run("cases", func(t *testing.T) {
		for _, a := range algorithm.Algorithms {
			for _, c := range policyChanges(a) {
				t.Run(a.String()+"/"+c.name, func(t *testing.T) { cached.Add(s.replayPolicyChange(t, c.from, c.to)) })
			}
		}
	})
	if s.CachedRefusals && !t.Failed() && cached.Load() == 0 {
		t.Fatal("no refusal was answered from the store's cache: the case does not cover it")
	}
}

type policyChangeCase struct {
	name     string
	from, to sluice.Policy
}

// policyChanges returns the changes of a policy of a (3 a second; burst 2 for the buckets): its
// limit raised and lowered, its period longer and shorter, its burst raised and lowered (buckets),
// and its algorithm changed to each other one.
func policyChanges(a sluice.Algorithm) []policyChangeCase {
	bucket := func(b sluice.Algorithm) bool { return b == sluice.TokenBucket || b == sluice.LeakyBucket }
	policy := func(b sluice.Algorithm, limit int64, period time.Duration, burst int64) sluice.Policy {
		if !bucket(b) {
			burst = 0
		}
		return sluice.Policy{Name: "changed", Algorithm: b, Limit: limit, Period: period, Burst: burst}
	}
	from := policy(a, 3, time.Second, 2)
	out := []policyChangeCase{
		{"raise-limit", from, policy(a, 10, time.Second, 2)},
		{"lower-limit", from, policy(a, 1, time.Second, 2)},
		{"longer-period", from, policy(a, 3, time.Minute, 2)},
		{"shorter-period", from, policy(a, 3, 100*time.Millisecond, 2)},
	}
	if bucket(a) {
		out = append(out, policyChangeCase{"raise-burst", from, policy(a, 3, time.Second, 6)},
			policyChangeCase{"lower-burst", from, policy(a, 3, time.Second, 0)})
	}
	for _, b := range algorithm.Algorithms {
		if b != a {
			out = append(out, policyChangeCase{"to-" + b.String(), from, policy(b, 3, time.Second, 2)})
		}
	}
	return out
}

// replayPolicyChange decides a trace on one key of a fresh store, each request under from or to,
// and on the core (one reference state, decided under whichever policy each request names), and
// fails at the first decision that differs. It returns how many decisions were Cached.
func (s Suite) replayPolicyChange(t *testing.T, from, to sluice.Policy) int64 {
	t.Helper()
	type step struct {
		p        *sluice.Policy
		at, cost int64
	}
	var steps []step
	add := func(p *sluice.Policy, at, cost int64, n int64) {
		for ; n > 0; n-- {
			steps = append(steps, step{p, at, cost})
		}
	}
	t0 := 10 * sec
	add(&from, t0, 1, from.Capacity()+2) // spent, then refused twice
	add(&to, t0, 1, to.Capacity()+2)     // changed at that instant
	add(&to, t0+1, 0, 1)
	add(&from, t0+250*ms, 1, 2) // and back
	add(&to, t0+250*ms, 1, 2)
	add(&from, t0+700*ms, 2, 1)
	add(&to, t0+700*ms, 2, 1)
	add(&from, t0+1300*ms, 1, 2)
	add(&to, t0+1300*ms, 1, 2)
	add(&to, t0+3*sec, 1, 1)
	add(&from, t0+3*sec, 1, 1)

	clock := sluice.NewManualClock(time.UnixMicro(0))
	store := s.New(t, clock)
	ctx := context.Background()
	var ref algorithm.State
	var cached int64
	for i, st := range steps {
		clock.Set(time.UnixMicro(st.at))
		want, wantErr := algorithm.Decide(st.p, &ref, st.at, st.cost)
		got, gotErr := store.Decide(ctx, "c", *st.p, st.cost)
		if (wantErr == nil) != (gotErr == nil) || (wantErr != nil && !sameKind(wantErr, gotErr)) {
			t.Fatalf("step %d (policy %+v, at %d, cost %d): error %v, want %v", i, *st.p, st.at, st.cost, gotErr, wantErr)
		}
		if got.Cached() {
			cached++
		}
		if s.CachedRefusals && !want.Allowed && got.Cached() && got.Remaining <= want.Remaining {
			got.Remaining, got.Source = want.Remaining, sluice.FromStore
		}
		if got != want {
			t.Fatalf("step %d (policy %+v, at %d, cost %d), changed from %+v to %+v:\n got %+v\nwant %+v", i, *st.p, st.at, st.cost, from, to, got, want)
		}
	}
	return cached
}

// RandomCount is a limit or a burst drawn from r over the whole valid range: small, about a
// million, near 2^53 or 2^53 itself, a power of two, or anything in 1..2^53.
func RandomCount(r *rand.Rand) int64 {
	switch r.IntN(5) {
	case 0:
		return 1 + r.Int64N(12)
	case 1:
		return 1 + r.Int64N(2_000_000)
	case 2:
		return algorithm.MaxLimit - r.Int64N(3)
	case 3:
		return 1 << r.IntN(54)
	}
	return 1 + r.Int64N(algorithm.MaxLimit)
}
