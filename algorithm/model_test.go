package algorithm

import (
	"math/big"
	"slices"
	"time"
)

// This file holds the tests' reference models: each algorithm written again, as plainly as the
// docs/design.md#the-algorithms-exactly states it, in exact rational arithmetic
// (math/big) and with no cleverness: no GCRA, no 128-bit tricks, no clamping of the clock.
// The property and fuzz tests compare Decide with them decision by decision.
//
// The models assume time never runs backward; traces with a backward clock are checked by
// properties of the code alone (see FuzzClockBackward).

// model is one key's state under one policy, as the design describes it.
type model interface {
	// admits reports whether a request of cost at now would be approved (no state change).
	admits(now, cost int64) bool
	// admit records an approved request of cost at now.
	admit(now, cost int64)
	// remaining is how many requests of cost 1 would be approved one after another at now.
	remaining(now int64) int64
	// fullAt is the first instant ≥ now from which the key is as if never seen (full quota).
	fullAt(now int64) int64
	// delay is how long the leaky bucket would hold a request approved at now (0 for the others).
	delay(now int64) int64
}

func newModel(p *Policy) model {
	if p.Calendar != NoCalendar {
		return newCalendarModel(p)
	}
	period := p.PeriodMicros()
	switch p.Algorithm {
	case FixedWindow:
		return &fixedModel{limit: p.Limit, period: period, counts: map[int64]int64{}}
	case SlidingLog:
		return &logModel{limit: p.Limit, period: period}
	case SlidingWindow:
		return &windowModel{limit: p.Limit, period: period, counts: map[int64]int64{}}
	case TokenBucket:
		capacity := p.Burst
		if capacity == 0 {
			capacity = p.Limit
		}
		return &tokenModel{
			capacity: rat(capacity, 1),
			rate:     rat(p.Limit, period), // tokens per µs
			tokens:   rat(capacity, 1),     // starts full
		}
	case LeakyBucket:
		return &leakyModel{
			interval: rat(period, p.Limit), // T, µs per unit of cost
			room:     rat(p.Burst*period, p.Limit),
			tat:      new(big.Rat),
			seen:     false,
		}
	}
	panic("no model for " + p.Algorithm.String())
}

func rat(a, b int64) *big.Rat { return big.NewRat(a, b) }

// ceilRat returns ⌈x⌉ for x ≥ 0.
func ceilRat(x *big.Rat) int64 {
	q, r := new(big.Int).QuoRem(x.Num(), x.Denom(), new(big.Int))
	if r.Sign() > 0 {
		q.Add(q, big.NewInt(1))
	}
	return q.Int64()
}

// floorRat returns ⌊x⌋ for x ≥ 0.
func floorRat(x *big.Rat) int64 {
	return new(big.Int).Quo(x.Num(), x.Denom()).Int64()
}

// fixed-window: a count per epoch-aligned window.
type fixedModel struct {
	limit, period int64
	counts        map[int64]int64 // window index -> cost approved in it
}

func (m *fixedModel) count(now int64) int64    { return m.counts[floorDiv(now, m.period)] }
func (m *fixedModel) admits(now, c int64) bool { return m.count(now)+c <= m.limit }
func (m *fixedModel) admit(now, c int64)       { m.counts[floorDiv(now, m.period)] += c }
func (m *fixedModel) remaining(now int64) int64 {
	return m.limit - m.count(now)
}
func (m *fixedModel) fullAt(now int64) int64 {
	if m.count(now) == 0 {
		return now
	}
	return (floorDiv(now, m.period) + 1) * m.period
}
func (m *fixedModel) delay(int64) int64 { return 0 }

// sliding-log: every approved request; one at t counts while now - period < t ≤ now.
type logModel struct {
	limit, period int64
	log           []LogEntry
}

func (m *logModel) sum(now int64) int64 {
	var s int64
	for _, e := range m.log {
		if now-m.period < e.At && e.At <= now {
			s += e.Cost
		}
	}
	return s
}
func (m *logModel) admits(now, c int64) bool  { return m.sum(now)+c <= m.limit }
func (m *logModel) admit(now, c int64)        { m.log = append(m.log, LogEntry{now, c}) }
func (m *logModel) remaining(now int64) int64 { return m.limit - m.sum(now) }
func (m *logModel) delay(int64) int64         { return 0 }
func (m *logModel) fullAt(now int64) int64 {
	if m.sum(now) == 0 {
		return now
	}
	return m.log[len(m.log)-1].At + m.period // the newest entry is the last to stop counting
}

// sliding-window counter: approve iff prev·(period-e) + (cur+c)·period ≤ limit·period.
type windowModel struct {
	limit, period int64
	counts        map[int64]int64
}

func (m *windowModel) fits(now, extra int64) bool {
	w := floorDiv(now, m.period)
	prev, cur, e := m.counts[w-1], m.counts[w], now-w*m.period
	lhs := new(big.Int).Mul(big.NewInt(prev), big.NewInt(m.period-e))
	lhs.Add(lhs, new(big.Int).Mul(big.NewInt(cur+extra), big.NewInt(m.period)))
	rhs := new(big.Int).Mul(big.NewInt(m.limit), big.NewInt(m.period))
	return lhs.Cmp(rhs) <= 0
}
func (m *windowModel) admits(now, c int64) bool { return m.fits(now, c) }
func (m *windowModel) admit(now, c int64)       { m.counts[floorDiv(now, m.period)] += c }
func (m *windowModel) remaining(now int64) int64 {
	var k int64
	for k < m.limit && m.fits(now, k+1) {
		k++
	}
	return k
}
func (m *windowModel) fullAt(now int64) int64 {
	w := floorDiv(now, m.period)
	switch {
	case m.counts[w] > 0:
		return (w + 2) * m.period
	case m.counts[w-1] > 0:
		return (w + 1) * m.period
	}
	return now
}
func (m *windowModel) delay(int64) int64 { return 0 }

// token-bucket: tokens refilled continuously at limit/period per µs up to the capacity.
type tokenModel struct {
	capacity, rate, tokens *big.Rat
	last                   int64
	seen                   bool // until the first approval the bucket is full, whatever now is
}

func (m *tokenModel) at(now int64) *big.Rat {
	if !m.seen {
		return new(big.Rat).Set(m.capacity)
	}
	t := new(big.Rat).Mul(m.rate, rat(now-m.last, 1))
	t.Add(t, m.tokens)
	if t.Cmp(m.capacity) > 0 {
		t.Set(m.capacity)
	}
	return t
}
func (m *tokenModel) admits(now, c int64) bool { return m.at(now).Cmp(rat(c, 1)) >= 0 }
func (m *tokenModel) admit(now, c int64) {
	m.tokens = m.at(now).Sub(m.at(now), rat(c, 1))
	m.last, m.seen = now, true
}
func (m *tokenModel) remaining(now int64) int64 { return floorRat(m.at(now)) }
func (m *tokenModel) fullAt(now int64) int64 {
	missing := new(big.Rat).Sub(m.capacity, m.at(now))
	return now + ceilRat(missing.Quo(missing, m.rate))
}
func (m *tokenModel) delay(int64) int64 { return 0 }

// leaky-bucket (queue): tat is when the queue has drained; approve iff max(tat,now)-now ≤ burst·T.
type leakyModel struct {
	interval, room, tat *big.Rat
	seen                bool
}

func (m *leakyModel) wait(now int64) *big.Rat {
	w := new(big.Rat).Sub(m.tat, rat(now, 1))
	if w.Sign() < 0 || !m.seen {
		w.SetInt64(0)
	}
	return w
}
func (m *leakyModel) admits(now, c int64) bool { return m.wait(now).Cmp(m.room) <= 0 }
func (m *leakyModel) admit(now, c int64) {
	start := new(big.Rat).Add(rat(now, 1), m.wait(now))
	m.tat = start.Add(start, new(big.Rat).Mul(rat(c, 1), m.interval))
	m.seen = true
}
func (m *leakyModel) remaining(now int64) int64 {
	w := m.wait(now)
	if w.Cmp(m.room) > 0 {
		return 0
	}
	free := new(big.Rat).Sub(m.room, w)
	return floorRat(free.Quo(free, m.interval)) + 1
}
func (m *leakyModel) fullAt(now int64) int64 { return now + ceilRat(m.wait(now)) }
func (m *leakyModel) delay(now int64) int64  { return ceilRat(m.wait(now)) }

// modelCapacity is the largest cost a policy can ever approve at once (the leaky bucket takes any
// cost whose drain time fits a clock; the tests keep costs small).
func modelCapacity(p *Policy) int64 {
	if p.Algorithm == LeakyBucket {
		return 1 << 40
	}
	return p.Capacity()
}

// firstAdmitted returns the first instant ≥ now at which m admits cost, absent other traffic,
// by bisection: every model's admission only becomes easier as time passes, and at fullAt the
// key is full, so a cost that fits at all fits then.
func firstAdmitted(m model, now, cost int64) int64 {
	if m.admits(now, cost) {
		return now
	}
	lo, hi := now, m.fullAt(now) // refused at lo, admitted at hi
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		if m.admits(mid, cost) {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi
}

// us converts a duration to whole microseconds (micros, in the package, goes the other way).
func us(d time.Duration) int64 { return int64(d / time.Microsecond) }

// clone returns a deep copy of s: the sliding log's entries are copied, not shared.
func clone(s *State) *State {
	c := *s
	c.Log = slices.Clone(s.Log)
	return &c
}
