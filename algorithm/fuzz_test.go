package algorithm

import (
	"errors"
	"reflect"
	"testing"
	"time"
)

// Fuzz targets. Each derives a small policy (limit 1..20, period 1ms..2s in whole µs, burst
// 0..30 for the buckets) and a trace of up to 64 requests from its input, runs the trace, and
// checks it with the property checks of property_test.go. Their f.Add entries run as ordinary
// tests; `go test -fuzz=FuzzDecide ./algorithm/` explores further.

// fuzzPolicy derives a valid policy from four fuzzed numbers.
func fuzzPolicy(alg, limit, burst uint8, period uint32) Policy {
	p := Policy{
		Algorithm: Algorithms[int(alg)%len(Algorithms)],
		Limit:     1 + int64(limit)%20,
		Period:    time.Duration(1000+int64(period)%1_999_001) * time.Microsecond,
	}
	if p.Algorithm == TokenBucket || p.Algorithm == LeakyBucket {
		p.Burst = int64(burst) % 31
	}
	return p
}

// fuzzTrace reads requests of 3 bytes each from data: two for the gap before the request, one
// for its cost. The gap's top two bits pick its scale: raw µs (up to 16ms), a fraction of the
// period, up to 4 periods, or (with backward) a step back of up to 4 periods. The alg byte's top
// bits pick where the clock starts: at 0, at a Unix time, before the epoch, or near ±2^62.
func fuzzTrace(p *Policy, alg uint8, data []byte, backward bool) []request {
	period, capacity := p.PeriodMicros(), p.Capacity()
	var now int64
	switch alg >> 6 {
	case 1:
		now = 1_700_000_000_123_456
	case 2:
		now = -3*period - 12_345
	case 3:
		now = 1<<62 - 1_000_003*period
		if alg&1 != 0 {
			now = -now
		}
	}
	var reqs []request
	for ; len(data) >= 3 && len(reqs) < 64; data = data[3:] {
		g := int64(data[0])<<8 | int64(data[1])
		n := g & 0x3fff
		switch g >> 14 {
		case 0:
			now += n
		case 1:
			now += n * period / 0x4000
		case 2:
			now += n * period / 0x1000
		case 3:
			if backward {
				now -= n * period / 0x1000
			} else {
				now = (floorDiv(now, period)+1)*period + n%3 - 1 // next to a window boundary
			}
		}
		c := int64(data[2])
		var cost int64
		switch {
		case c < 0x80:
			cost = 1
		case c < 0xc0:
			cost = c % 4 // 0..3, with peeks
		case c < 0xf0:
			cost = 1 + c%capacity
		case c < 0xfe:
			cost = capacity + c%4 // at and just over the capacity: errors but for the leaky bucket
		default:
			cost = -1
		}
		reqs = append(reqs, request{now, cost})
	}
	return reqs
}

// addCorpus gives every target the same starting corpus: each algorithm, a few typical policies, and
// traces of bursts, steady streams, window edges and costs.
func addCorpus(f *testing.F) {
	burst := func(n int, gap uint16, cost byte) []byte {
		var b []byte
		for range n {
			b = append(b, byte(gap>>8), byte(gap), cost)
		}
		return b
	}
	join := func(parts ...[]byte) []byte {
		var b []byte
		for _, p := range parts {
			b = append(b, p...)
		}
		return b
	}
	steadyBurst := join(burst(12, 0x4000|0x4000/5, 1), burst(20, 0x4000|0x4000/40, 1), burst(12, 0x4000|0x4000/5, 1))
	mixed := join(burst(5, 0, 1), burst(3, 0x4100, 0xc3), burst(4, 0xc001, 0xf1), burst(3, 0x8800, 0x81), burst(2, 0x0001, 0xff), burst(6, 0x0100, 0xe0))
	edges := join(burst(3, 0xc000, 1), burst(3, 0xc001, 1), burst(3, 0xc002, 1), burst(4, 0x0000, 0xf0))
	for alg := range uint8(5) {
		f.Add(alg, uint8(4), uint8(4), uint32(999_000), steadyBurst)  // 5 per 1s, burst 5
		f.Add(alg, uint8(2), uint8(10), uint32(999_000), mixed)       // 3 per 1s: T not whole µs
		f.Add(alg|0x40, uint8(19), uint8(30), uint32(0), edges)       // 20 per 1ms, at a Unix time
		f.Add(alg|0x80, uint8(0), uint8(0), uint32(1_999_000), mixed) // 1 per 2s, before the epoch
		f.Add(alg|0xc0, uint8(6), uint8(3), uint32(1), join(mixed, edges))
		f.Add(alg|0xc1, uint8(9), uint8(19), uint32(123_457), join(edges, steadyBurst))
	}
}

func FuzzDecide(f *testing.F) {
	addCorpus(f)
	f.Fuzz(func(t *testing.T, alg, limit, burst uint8, period uint32, trace []byte) {
		p := fuzzPolicy(alg, limit, burst, period)
		checkAll(t, &p, replay(&p, fuzzTrace(&p, alg, trace, false)))
	})
}

func FuzzRetryAfter(f *testing.F) {
	addCorpus(f)
	f.Fuzz(func(t *testing.T, alg, limit, burst uint8, period uint32, trace []byte) {
		p := fuzzPolicy(alg, limit, burst, period)
		recs := replay(&p, fuzzTrace(&p, alg, trace, false))
		checkDecisionShape(t, &p, recs)
		checkRefusalsKeepState(t, &p, recs)
		checkRetryAfterExact(t, &p, recs)
		checkRefusalsCacheable(t, &p, recs)
	})
}

func FuzzAdmissionBounds(f *testing.F) {
	addCorpus(f)
	f.Fuzz(func(t *testing.T, alg, limit, burst uint8, period uint32, trace []byte) {
		p := fuzzPolicy(alg, limit, burst, period)
		recs := replay(&p, fuzzTrace(&p, alg, trace, false))
		checkAdmissionBounds(t, &p, recs)
		checkLeakySpacing(t, &p, recs)
	})
}

func FuzzResetAfter(f *testing.F) {
	addCorpus(f)
	f.Fuzz(func(t *testing.T, alg, limit, burst uint8, period uint32, trace []byte) {
		p := fuzzPolicy(alg, limit, burst, period)
		recs := replay(&p, fuzzTrace(&p, alg, trace, false))
		checkResetAfter(t, &p, recs)
		checkRemainingExact(t, &p, recs)
	})
}

// FuzzClockBackward runs traces whose clock may step back: see checkClockBackward.
func FuzzClockBackward(f *testing.F) {
	addCorpus(f)
	f.Fuzz(func(t *testing.T, alg, limit, burst uint8, period uint32, trace []byte) {
		p := fuzzPolicy(alg, limit, burst, period)
		checkClockBackward(t, &p, replay(&p, fuzzTrace(&p, alg, trace, true)))
	})
}

// FuzzPolicy: any policy and any request, valid or not: Validate and Decide never panic;
// Validate's errors wrap ErrInvalidPolicy; under a valid policy Decide errs only on a negative
// cost or one that can never fit, and then with RetryAfter Never.
func FuzzPolicy(f *testing.F) {
	f.Add(uint8(4), int64(5), int64(1_000_000_000), int64(20), int64(0), int64(1), int64(3))
	f.Add(uint8(0), int64(0), int64(0), int64(0), int64(0), int64(0), int64(0))
	f.Add(uint8(1), int64(-1), int64(999_999), int64(-1), int64(-1), int64(-1), int64(1))
	f.Add(uint8(5), int64(1<<53), int64(1<<62), int64(1<<53), int64(1<<62), int64(1<<53), int64(-5))
	f.Add(uint8(3), int64(1), int64(1_000_500), int64(3), int64(-1<<62), int64(2), int64(1<<40))
	f.Add(uint8(2), int64(3), int64(1<<63-1), int64(0), int64(1<<63-1), int64(1<<63-1), int64(-1<<63))
	f.Add(uint8(99), int64(3), int64(1_000_000), int64(0), int64(5), int64(1), int64(1))
	f.Fuzz(func(t *testing.T, alg uint8, limit, period, burst, now, cost, dt int64) {
		p := Policy{Algorithm: Algorithm(alg), Limit: limit, Period: time.Duration(period), Burst: burst}
		verr := p.Validate()
		if verr != nil && !errors.Is(verr, ErrInvalidPolicy) {
			t.Fatalf("%+v: Validate() = %v, not wrapping ErrInvalidPolicy", p, verr)
		}
		s := new(State)
		d1, err1 := Decide(&p, s, now, cost)
		if (err1 != nil || !d1.Allowed || cost == 0) && !reflect.DeepEqual(s, new(State)) {
			t.Fatalf("%+v: cost %d at %d: %+v, %v wrote the state %+v", p, cost, now, d1, err1, s)
		}
		d2, err2 := Decide(&p, s, now+dt, 1) // on whatever state the first left
		if verr != nil {
			return // only "no panic" (see TestValidateRejects for what Decide catches)
		}
		for _, c := range []struct {
			cost int64
			d    Decision
			err  error
		}{{cost, d1, err1}, {1, d2, err2}} {
			switch {
			case c.err == nil:
				if c.d.Limit != p.Capacity() || c.d.Remaining < 0 {
					t.Fatalf("%+v: cost %d: %+v", p, c.cost, c.d)
				}
			case errors.Is(c.err, ErrInvalidCost):
				if c.cost >= 0 {
					t.Fatalf("%+v: cost %d: %v", p, c.cost, c.err)
				}
			case errors.Is(c.err, ErrCostExceedsLimit):
				if c.d.Allowed || c.d.RetryAfter != Never {
					t.Fatalf("%+v: cost %d: %+v with %v", p, c.cost, c.d, c.err)
				}
				if c.cost <= p.Capacity() && p.Algorithm != LeakyBucket && withinClock(now, p) {
					t.Fatalf("%+v: cost %d ≤ capacity at %d: %v", p, c.cost, now, c.err)
				}
			case errors.Is(c.err, ErrNoLease):
				// A concurrency policy takes slots only under a lease (Acquire), never by Decide.
				if p.Algorithm != Concurrency || c.cost <= 0 || c.d.Allowed {
					t.Fatalf("%+v: cost %d: %+v with %v", p, c.cost, c.d, c.err)
				}
			default:
				t.Fatalf("%+v: cost %d: unexpected error %v", p, c.cost, c.err)
			}
		}
	})
}

// withinClock reports whether now leaves room for the policy's longest wait before int64 µs
// run out (a token bucket may not be able to record a request at the very end of time).
func withinClock(now int64, p Policy) bool {
	return now > -(1<<62) && now < 1<<62
}
