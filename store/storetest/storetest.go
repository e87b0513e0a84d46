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
		if s.CachedRefusals && !want.Allowed && got.Cached && got.Remaining <= want.Remaining {
			got.Remaining, got.Cached = want.Remaining, false
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

// GoldenTraces are the seeds' scenarios and the edges of each algorithm.
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
	// The Ukrainian scenario: 5/s for 10 s, 40 in one second, 5/s for 10 s.
	ukr := cat(every(0, 200*ms, 50, "c"), every(10*sec, 25*ms, 40, "c"), every(11*sec, 200*ms, 50, "c"))
	for _, a := range algorithm.Algorithms {
		p := sluice.Policy{Algorithm: a, Limit: 5, Period: time.Second}
		if a == sluice.TokenBucket || a == sluice.LeakyBucket {
			p.Burst = 40
		}
		add("ukrainian-"+a.String(), p, ukr)
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
// drawn from seed: small limits and periods so that every branch (refusals, window roll-overs,
// queue room, idle keys) is reached often.
func FuzzedTraces(seed uint64, n, steps int) []Trace {
	r := rand.New(rand.NewPCG(seed, seed^0x5eed))
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
// accepts, of up to steps requests on two keys, drawn from seed: limits and bursts up to 2^53,
// periods from 1 ms to 292 years, costs up to all that CheckCost lets through, and times from
// 36,000 years before the epoch to 36,000 years after it (|now| < 2^60 µs), moving on by small
// steps, periods, long pauses and jumps far ahead. (Time never runs back in a trace: a store may
// drop a key once it is idle at the latest time it has seen, as FuzzedTraces allows.)
func FuzzedLargeTraces(seed uint64, n, steps int) []Trace {
	r := rand.New(rand.NewPCG(seed, seed^0x1a59e))
	least := func(a, b int64) int64 { // (min is this package's minute)
		if a < b {
			return a
		}
		return b
	}
	count := func() int64 {
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
