package sim

import (
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
)

// Steady traffic at the limit, a burst of 40 in a second, steady again.
const burstPattern = "5/s for 10s; 40 in 1s; 5/s for 10s"

func burstTraffic(t *testing.T) []Request {
	t.Helper()
	reqs, err := ParseTraffic(burstPattern)
	if err != nil {
		t.Fatal(err)
	}
	if len(reqs) != 140 {
		t.Fatalf("%d requests, want 140", len(reqs))
	}
	return reqs
}

// Requests 0-49 are the first steady part (at i·200ms), 50-89 the burst (at 10s + i·25ms),
// 90-139 the second steady part (at 11s + i·200ms).
const burstStart, burstEnd = 50, 90

func refusedIndexes(rows []Row) []int {
	var idx []int
	for i, r := range rows {
		if !r.Allowed {
			idx = append(idx, i)
		}
	}
	return idx
}

func span(from, to int, except ...int) []int {
	var idx []int
	for i := from; i < to; i++ {
		if !slices.Contains(except, i) {
			idx = append(idx, i)
		}
	}
	return idx
}

func TestCompareSteadyBurstSteady(t *testing.T) {
	results, err := Compare(5, time.Second, 40, burstTraffic(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(results) != len(algorithm.Algorithms) {
		t.Fatalf("%d results, want %d", len(results), len(algorithm.Algorithms))
	}

	// Sliding window: at exactly the limit's rate, the previous window's 4 or 5 requests still
	// weigh in: in window 1 (prev 5) the request at e=0 is refused (5·1 + 1 > 5), in later ones
	// (prev 4) the one at e=200ms (4·0.8 + 2 > 5). In the burst second (prev 4, cur c), a request
	// at e passes iff 4·(1s-e) + (c+1)·1s ≤ 5s, i.e. c ≤ e/250ms: at e = 0, 250, 500, 750ms.
	var slidingWindowRefused []int
	slidingWindowRefused = append(slidingWindowRefused, 5)
	for w := 2; w < 10; w++ {
		slidingWindowRefused = append(slidingWindowRefused, 5*w+1)
	}
	slidingWindowRefused = append(slidingWindowRefused, span(burstStart, burstEnd, 50, 60, 70, 80)...)
	for w := 11; w < 21; w++ {
		slidingWindowRefused = append(slidingWindowRefused, burstEnd+5*(w-11)+1)
	}

	for _, tc := range []struct {
		alg     sluice.Algorithm
		burst   int64
		sum     Summary
		refused []int
	}{
		// The burst second offers 40 to a window that starts empty at 10s: 5 pass.
		{sluice.FixedWindow, 0, Summary{Offered: 140, Allowed: 105, Refused: 35, OfferedCost: 140, AllowedCost: 105},
			span(burstStart, burstEnd, 50, 51, 52, 53, 54)},
		// Any 1s holds the 4 steady requests before 10s, so the burst's first passes; then one
		// passes each time a steady request leaves the window: at 10.2, 10.4, 10.6, 10.8s.
		{sluice.SlidingLog, 0, Summary{Offered: 140, Allowed: 105, Refused: 35, OfferedCost: 140, AllowedCost: 105},
			span(burstStart, burstEnd, 50, 58, 66, 74, 82)},
		{sluice.SlidingWindow, 0, Summary{Offered: 140, Allowed: 85, Refused: 55, OfferedCost: 140, AllowedCost: 85},
			slidingWindowRefused},
		// A full bucket of 40 absorbs the burst (the i-th of it finds 40 - i·(1 - 25/200) tokens).
		{sluice.TokenBucket, 40, Summary{Offered: 140, Allowed: 140, OfferedCost: 140, AllowedCost: 140}, nil},
		// The queue absorbs the burst: its i-th waits i·(200-25)ms, up to 6.825s; the steady
		// requests after it each wait 40·200ms - 1s = 7s.
		{sluice.LeakyBucket, 40, Summary{Offered: 140, Allowed: 140, Delayed: 89, OfferedCost: 140, AllowedCost: 140,
			MaxDelayMicros: 7 * sec, TotalDelayMicros: 175*ms*(39*40/2) + 50*7*sec}, nil},
	} {
		r := results[slices.Index(algorithm.Algorithms, tc.alg)]
		t.Run(tc.alg.String(), func(t *testing.T) {
			want := sluice.Policy{Algorithm: tc.alg, Limit: 5, Period: time.Second, Burst: tc.burst}
			if r.Policy != want {
				t.Errorf("policy %+v, want %+v", r.Policy, want)
			}
			if r.Summary != tc.sum {
				t.Errorf("summary\n got %+v\nwant %+v", r.Summary, tc.sum)
			}
			if got := refusedIndexes(r.Rows); !slices.Equal(got, tc.refused) {
				t.Errorf("refused requests %v, want %v", got, tc.refused)
			}
			if len(r.Rows) != 140 {
				t.Fatalf("%d rows", len(r.Rows))
			}
			for i, row := range r.Rows {
				if row.Allowed && row.RetryAfterMicros != 0 || !row.Allowed && row.RetryAfterMicros <= 0 {
					t.Errorf("row %d: allowed %v with retry after %d µs", i, row.Allowed, row.RetryAfterMicros)
				}
			}
		})
	}

	leaky := results[4]
	if got := leaky.Summary.MaxDelayMicros; got < 6500*ms || got > 7500*ms {
		t.Errorf("leaky bucket: max delay %d µs, want about 7s", got)
	}
	for i, row := range leaky.Rows {
		want := int64(0)
		switch {
		case i >= burstEnd:
			want = 7 * sec
		case i >= burstStart:
			want = int64(i-burstStart) * 175 * ms
		}
		if row.DelayMicros != want {
			t.Errorf("leaky bucket: request %d at %d µs delayed %d µs, want %d", i, row.TMicros, row.DelayMicros, want)
		}
	}

	// Exact retries in the burst second.
	for _, tc := range []struct {
		alg   sluice.Algorithm
		row   int
		retry int64
	}{
		{sluice.FixedWindow, 55, 875 * ms},   // at 10.125s: the window ends at 11s
		{sluice.SlidingLog, 51, 175 * ms},    // at 10.025s: the entry at 9.2s leaves at 10.2s
		{sluice.SlidingWindow, 51, 225 * ms}, // at 10.025s: 4·(1s-e) + 2·1s ≤ 5s from e = 250ms
	} {
		row := results[slices.Index(algorithm.Algorithms, tc.alg)].Rows[tc.row]
		if row.Allowed || row.RetryAfterMicros != tc.retry {
			t.Errorf("%v: request %d at %d µs: allowed %v, retry %d µs; want refused, retry %d µs",
				tc.alg, tc.row, row.TMicros, row.Allowed, row.RetryAfterMicros, tc.retry)
		}
	}
}

func TestRunSteps(t *testing.T) {
	type step struct {
		at    int64 // µs
		key   string
		cost  int64
		row   Row // only the decision fields
		never bool
	}
	ok := func(remaining, delay int64) Row { return Row{Allowed: true, Remaining: remaining, DelayMicros: delay} }
	no := func(remaining, retry int64) Row { return Row{Remaining: remaining, RetryAfterMicros: retry} }
	for _, tc := range []struct {
		name   string
		policy sluice.Policy
		steps  []step
	}{
		{"fixed-window", sluice.Policy{Algorithm: sluice.FixedWindow, Limit: 2, Period: time.Second}, []step{
			{0, "a", 1, ok(1, 0), false},
			{0, "a", 1, ok(0, 0), false},
			{500 * ms, "a", 1, no(0, 500*ms), false},
			{500 * ms, "b", 1, ok(1, 0), false}, // another key, its own quota
			{600 * ms, "a", 0, ok(0, 0), false}, // a peek
			{700 * ms, "a", 3, no(0, NeverMicros), true},
			{sec, "a", 2, ok(0, 0), false},
		}},
		{"leaky-bucket", sluice.Policy{Algorithm: sluice.LeakyBucket, Limit: 1, Period: time.Second, Burst: 1}, []step{
			{0, "a", 1, ok(1, 0), false},
			{0, "a", 1, ok(0, sec), false},
			{0, "a", 1, no(0, sec), false},
			{sec, "a", 1, ok(0, sec), false},
		}},
		{"token-bucket", sluice.Policy{Algorithm: sluice.TokenBucket, Limit: 2, Period: time.Second, Burst: 3}, []step{
			{0, "a", 3, ok(0, 0), false},
			{100 * ms, "a", 1, no(0, 400*ms), false},
			{500 * ms, "a", 4, no(0, NeverMicros), true}, // the core reports no Remaining with a cost that never fits
			{500 * ms, "a", 1, ok(0, 0), false},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var reqs []Request
			for _, s := range tc.steps {
				reqs = append(reqs, Request{TMicros: s.at, Key: s.key, Cost: s.cost})
			}
			res, err := Run(tc.policy, reqs)
			if err != nil {
				t.Fatal(err)
			}
			var never int64
			for i, s := range tc.steps {
				want := s.row
				want.Request = reqs[i]
				if res.Rows[i] != want {
					t.Errorf("step %d (t=%d µs, %s, cost %d):\n got %+v\nwant %+v", i, s.at, s.key, s.cost, res.Rows[i], want)
				}
				if res.Rows[i].Never() != s.never {
					t.Errorf("step %d: Never() = %v", i, !s.never)
				}
				if s.never {
					never++
				}
			}
			if res.Summary.Never != never || res.Summary.Offered != int64(len(reqs)) {
				t.Errorf("summary %+v: want never %d, offered %d", res.Summary, never, len(reqs))
			}
		})
	}
}

func TestRunIsFreshEachTime(t *testing.T) {
	p := sluice.Policy{Algorithm: sluice.SlidingLog, Limit: 5, Period: time.Second}
	a, err := Run(p, burstTraffic(t))
	if err != nil {
		t.Fatal(err)
	}
	b, err := Run(p, burstTraffic(t))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a, b) {
		t.Error("two runs of the same policy and traffic differ")
	}
}

func TestRunErrors(t *testing.T) {
	p := sluice.Policy{Algorithm: sluice.FixedWindow, Limit: 5, Period: time.Second}
	for _, tc := range []struct {
		name   string
		policy sluice.Policy
		reqs   []Request
		want   string
	}{
		{"invalid policy", sluice.Policy{Algorithm: sluice.FixedWindow, Period: time.Second}, []Request{{0, "k", 1}}, "limit 0 must be > 0"},
		{"burst on a window", sluice.Policy{Algorithm: sluice.FixedWindow, Limit: 5, Period: time.Second, Burst: 3}, nil, "burst 3"},
		{"out of order", p, []Request{{5, "k", 1}, {4, "k", 1}}, "request 2: time 0.004 ms is before the previous request's 0.005 ms"},
		{"negative time", p, []Request{{-1, "k", 1}}, "request 1: time -1 µs"},
		{"negative cost", p, []Request{{0, "k", 1}, {0, "k", -1}}, "request 2: cost -1 must be ≥ 0"},
	} {
		_, err := Run(tc.policy, tc.reqs)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one containing %q", tc.name, err, tc.want)
		}
	}
	if _, err := Run(sluice.Policy{Algorithm: sluice.FixedWindow, Period: time.Second}, nil); !errors.Is(err, sluice.ErrInvalidPolicy) {
		t.Errorf("invalid policy: error %v does not wrap ErrInvalidPolicy", err)
	}
}

func TestSimulateStopsOnEmitError(t *testing.T) {
	stop := errors.New("stop")
	n := 0
	sum, err := Simulate(sluice.Policy{Algorithm: sluice.TokenBucket, Limit: 5, Period: time.Second}, burstTraffic(t), func(Row) error {
		if n++; n == 3 {
			return stop
		}
		return nil
	})
	if err != stop || n != 3 || sum.Offered != 3 {
		t.Errorf("got %v after %d rows (summary %+v), want the emit error after 3", err, n, sum)
	}
}

func TestCompare(t *testing.T) {
	ps := ComparePolicies(5, time.Minute, 7)
	var algs []sluice.Algorithm
	for _, p := range ps {
		algs = append(algs, p.Algorithm)
		wantBurst := int64(0)
		if p.Algorithm == sluice.TokenBucket || p.Algorithm == sluice.LeakyBucket {
			wantBurst = 7
		}
		if p.Limit != 5 || p.Period != time.Minute || p.Burst != wantBurst {
			t.Errorf("%v: policy %+v, want limit 5, period 1m, burst %d", p.Algorithm, p, wantBurst)
		}
	}
	if !slices.Equal(algs, algorithm.Algorithms) {
		t.Errorf("algorithms %v, want %v", algs, algorithm.Algorithms)
	}
	if _, err := Compare(0, time.Second, 0, burstTraffic(t)); err == nil || !strings.Contains(err.Error(), "fixed-window") || !strings.Contains(err.Error(), "limit 0") {
		t.Errorf("Compare with limit 0: error %v, want one naming the algorithm and the limit", err)
	}
}
