package algorithm

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

func TestValidateRejects(t *testing.T) {
	const huge = MaxLimit + 1
	for _, c := range []struct {
		name  string
		p     Policy
		field string // the message must name it
		// trusted: Decide documents that p must be valid and, to stay cheap, re-checks only what
		// would make it divide by zero or loop (limit, period, burst range, algorithm). For the
		// rest it is only required not to panic.
		trusted bool
	}{
		{"limit 0", Policy{Algorithm: FixedWindow, Limit: 0, Period: sec}, "limit 0", false},
		{"negative limit", Policy{Algorithm: TokenBucket, Limit: -5, Period: sec}, "limit -5", false},
		{"limit over 2^53", Policy{Algorithm: SlidingWindow, Limit: huge, Period: sec}, "limit", false},
		{"limit max int64", Policy{Algorithm: SlidingLog, Limit: math.MaxInt64, Period: sec}, "limit", false},
		{"period 0", Policy{Algorithm: FixedWindow, Limit: 1, Period: 0}, "period", false},
		{"negative period", Policy{Algorithm: LeakyBucket, Limit: 1, Period: -sec}, "period", false},
		{"period under 1ms", Policy{Algorithm: TokenBucket, Limit: 1, Period: ms - µsec}, "period", false},
		{"period of 1ns", Policy{Algorithm: SlidingLog, Limit: 1, Period: 1}, "period", false},
		{"period not whole µs", Policy{Algorithm: SlidingWindow, Limit: 1, Period: ms + 500}, "microseconds", true},
		{"period max int64 ns", Policy{Algorithm: FixedWindow, Limit: 1, Period: math.MaxInt64}, "microseconds", true},
		{"negative burst", Policy{Algorithm: TokenBucket, Limit: 1, Period: sec, Burst: -5}, "burst -5", false},
		{"negative burst, leaky", Policy{Algorithm: LeakyBucket, Limit: 1, Period: sec, Burst: -1}, "burst -1", false},
		{"burst over 2^53", Policy{Algorithm: TokenBucket, Limit: 1, Period: ms, Burst: huge}, "burst", false},
		{"burst on fixed-window", Policy{Algorithm: FixedWindow, Limit: 1, Period: sec, Burst: 5}, "burst 5", true},
		{"burst on sliding-log", Policy{Algorithm: SlidingLog, Limit: 1, Period: sec, Burst: 1}, "burst 1", true},
		{"burst on sliding-window", Policy{Algorithm: SlidingWindow, Limit: 1, Period: sec, Burst: 2}, "burst 2", true},
		{"no algorithm", Policy{Limit: 1, Period: sec}, "algorithm", false},
		{"algorithm 99", Policy{Algorithm: 99, Limit: 1, Period: sec}, "algorithm 99", false},
		{"algorithm 7", Policy{Algorithm: 7, Limit: 1, Period: sec}, "algorithm 7", false},
		// A bucket that takes centuries to refill (drain) is beyond any clock.
		{"token bucket refilling for centuries", Policy{Algorithm: TokenBucket, Limit: 1, Period: time.Hour, Burst: 1 << 40}, "burst", true},
		{"leaky bucket draining for centuries", Policy{Algorithm: LeakyBucket, Limit: 1, Period: time.Hour, Burst: 1 << 40}, "burst", true},
		{"token bucket of default capacity, centuries", Policy{Algorithm: TokenBucket, Limit: 1, Period: math.MaxInt64 / 1000 * 1000}, "period", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, name := range []string{"", "gold"} {
				p := c.p
				p.Name = name
				err := p.Validate()
				if !errors.Is(err, ErrInvalidPolicy) {
					t.Fatalf("%+v: Validate() = %v, want an error wrapping ErrInvalidPolicy", p, err)
				}
				if !strings.Contains(err.Error(), c.field) {
					t.Errorf("%+v: %q does not name %q", p, err, c.field)
				}
				if name != "" && !strings.Contains(err.Error(), `policy "gold"`) {
					t.Errorf("%+v: %q does not name the policy", p, err)
				}
				// Decide must never panic under it, and refuse to decide unless it is documented
				// to trust Validate there.
				for _, cost := range []int64{0, 1, 2} {
					s := new(State)
					d, err := Decide(&p, s, 1_000_000, cost)
					if c.trusted {
						continue
					}
					if !errors.Is(err, ErrInvalidPolicy) || d.Allowed {
						t.Errorf("%+v: Decide(cost %d) = %+v, %v; want refused with ErrInvalidPolicy", p, cost, d, err)
					}
					if s.Alg != 0 {
						t.Errorf("%+v: Decide under an invalid policy wrote the state %+v", p, s)
					}
				}
			}
		})
	}
}

func TestValidateAccepts(t *testing.T) {
	for _, p := range []Policy{
		{Algorithm: FixedWindow, Limit: 1, Period: ms},
		{Algorithm: SlidingLog, Limit: 100, Period: time.Minute},
		{Algorithm: SlidingWindow, Limit: 500, Period: time.Minute},
		{Algorithm: TokenBucket, Limit: 5, Period: sec, Burst: 20},
		{Algorithm: TokenBucket, Limit: 3, Period: sec}, // burst 0: capacity = limit
		{Algorithm: LeakyBucket, Limit: 5, Period: sec, Burst: 40},
		{Algorithm: LeakyBucket, Limit: 5, Period: sec}, // no queue
		{Algorithm: FixedWindow, Limit: MaxLimit, Period: 1000001 * µsec},
		{Algorithm: SlidingWindow, Limit: MaxLimit, Period: math.MaxInt64 / 1000 * 1000},
		{Algorithm: SlidingLog, Limit: 7, Period: 24 * time.Hour},
		{Algorithm: TokenBucket, Limit: MaxLimit, Period: ms, Burst: MaxLimit},
		{Algorithm: LeakyBucket, Limit: 1, Period: ms, Burst: 1 << 40}, // 35 years of queue
		{Algorithm: TokenBucket, Limit: 1, Period: time.Hour, Burst: 1 << 20},
	} {
		if err := p.Validate(); err != nil {
			t.Errorf("%+v: %v", p, err)
			continue
		}
		for _, now := range []int64{0, 1_700_000_000_000_000, -1} {
			if d, err := Decide(&p, new(State), now, 1); err != nil || !d.Allowed {
				t.Errorf("%+v: first request at %d: %+v, %v", p, now, d, err)
			}
		}
	}
}

func TestAlgorithmNames(t *testing.T) {
	for _, a := range Algorithms {
		b, err := a.MarshalText()
		if err != nil {
			t.Fatalf("%d: %v", a, err)
		}
		var back Algorithm
		if err := back.UnmarshalText(b); err != nil || back != a {
			t.Errorf("%q round-trips to %v, %v", b, back, err)
		}
		if p, err := ParseAlgorithm(a.String()); err != nil || p != a {
			t.Errorf("ParseAlgorithm(%q) = %v, %v", a.String(), p, err)
		}
	}
	for _, bad := range []Algorithm{0, 7, 99, 255} {
		if _, err := bad.MarshalText(); err == nil {
			t.Errorf("Algorithm(%d).MarshalText: no error", bad)
		}
		if !strings.Contains(bad.String(), "Algorithm(") {
			t.Errorf("Algorithm(%d).String() = %q", bad, bad.String())
		}
	}
	for _, bad := range []string{"", "token_bucket", "Token-Bucket", "gcra"} {
		var a Algorithm
		if err := a.UnmarshalText([]byte(bad)); err == nil || !strings.Contains(err.Error(), "token-bucket") {
			t.Errorf("UnmarshalText(%q) = %v, want an error listing the names", bad, err)
		}
	}
}
