package algorithm

import (
	"errors"
	"math/big"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"
)

// Settlements (settle.go): step tables at explicit instants, the properties the design promises
// (a refund never gives more than was charged; settling the reserved cost changes nothing; a
// charge and its settlement are a charge of the real cost), and a fuzzed trace of requests and
// settlements against the reference models, extended here with the settlement rule.

// TestSettleSteps: reservations settled per algorithm, at explicit instants. A request step
// checks its decision; a settlement step checks the Remaining a peek then reports.
func TestSettleSteps(t *testing.T) {
	sec := int64(time.Second / time.Microsecond)
	type step struct {
		now, cost         int64 // a request, or with settle a settlement at now
		settle            bool
		at, reserved, act int64 // the settlement's reservation and real cost
		allowed           bool  // a request's decision
		remaining         int64 // a request's, or a peek's after a settlement
		retry             int64 // a refusal's, µs
	}
	req := func(now, cost int64, allowed bool, remaining, retry int64) step {
		return step{now: now, cost: cost, allowed: allowed, remaining: remaining, retry: retry}
	}
	settle := func(now, at, reserved, act, remaining int64) step {
		return step{now: now, settle: true, at: at, reserved: reserved, act: act, remaining: remaining}
	}
	fixed := Policy{Algorithm: FixedWindow, Limit: 10, Period: time.Second}
	log := Policy{Algorithm: SlidingLog, Limit: 10, Period: time.Second}
	window := Policy{Algorithm: SlidingWindow, Limit: 10, Period: time.Second}
	token := Policy{Algorithm: TokenBucket, Limit: 10, Period: time.Second} // T = 100ms
	leaky := Policy{Algorithm: LeakyBucket, Limit: 10, Period: time.Second, Burst: 20}
	cases := []struct {
		name  string
		p     Policy
		steps []step
	}{
		{"fixed window: a larger real cost goes beyond the limit, refused until the window ends", fixed, []step{
			req(0, 4, true, 6, 0),
			settle(100_000, 0, 4, 13, 0), // count 13 > 10
			req(200_000, 1, false, 0, sec-200_000),
			req(sec, 1, true, 9, 0), // the debt ends with its window
		}},
		{"fixed window: a smaller real cost refunds in the same window, nothing after it", fixed, []step{
			req(0, 8, true, 2, 0),
			settle(500_000, 0, 8, 3, 7),
			req(900_000, 5, true, 2, 0),
			settle(sec+1, 900_000, 5, 0, 10), // the window rolled: nothing to refund
			req(sec+2, 10, true, 0, 0),
		}},
		{"sliding log: a refund reduces the entry at at, the extra is an entry at now", log, []step{
			req(0, 6, true, 4, 0),
			req(100_000, 2, true, 2, 0),
			settle(200_000, 0, 6, 1, 7),
			settle(300_000, 100_000, 2, 12, 0),             // 1 + 2 + 10 = 13
			req(400_000, 1, false, 0, 300_000+sec-400_000), // until the entry of 10 at 300ms expires
			settle(sec+1, 0, 6, 0, 0),                      // expired: nothing
		}},
		{"sliding window: a refund of the previous window lowers its weight, an extra delays exactly", window, []step{
			req(900_000, 10, true, 0, 0),
			settle(sec+500_000, 900_000, 10, 4, 8), // prev 4, weighted ½: 2
			req(sec+500_000, 8, true, 0, 0),
			settle(sec+500_001, sec+500_000, 8, 9, 0),  // cur 9 + 2 > 10
			req(sec+600_000, 1, false, 0, sec-600_000), // at the window's end: 9 + 1 ≤ 10
		}},
		{"token bucket: an extra delays the next request exactly; a refund gives back what is left of the charge", token, []step{
			req(0, 5, true, 5, 0),
			settle(0, 0, 5, 18, 0), // 10 - 18 = -8 tokens
			req(0, 1, false, 0, 900_000),
			req(900_000, 1, true, 0, 0),
			req(5*sec, 4, true, 6, 0),
			settle(5*sec+50_000, 5*sec, 4, 1, 9), // tat back 300ms to 5.1s: 9.5 tokens
			settle(20*sec, 5*sec, 4, 0, 10),      // refilled: nothing extra
		}},
		{"leaky bucket: an extra charge lengthens the queue", leaky, []step{
			req(0, 1, true, 20, 0),
			settle(0, 0, 1, 31, 0), // 3.1s of queue > 2s of room
			req(0, 1, false, 0, 1_100_000),
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var s State
			for i, st := range c.steps {
				if st.settle {
					if _, err := Settle(&c.p, &s, st.at, st.now, st.reserved, st.act); err != nil {
						t.Fatalf("step %d: %v", i, err)
					}
					if d, _ := Decide(&c.p, clone(&s), st.now, 0); d.Remaining != st.remaining {
						t.Fatalf("step %d %+v: remaining %d after the settlement, want %d", i, st, d.Remaining, st.remaining)
					}
					continue
				}
				d, err := Decide(&c.p, &s, st.now, st.cost)
				if err != nil || d.Allowed != st.allowed || d.Remaining != st.remaining || d.RetryAfter != micros(st.retry) {
					t.Fatalf("step %d %+v: got %+v, %v", i, st, d, err)
				}
			}
		})
	}
}

func TestSettleRejectsBadInput(t *testing.T) {
	p := Policy{Algorithm: FixedWindow, Limit: 10, Period: time.Second}
	var s State
	if _, err := Decide(&p, &s, 0, 3); err != nil {
		t.Fatal(err)
	}
	before := *clone(&s)
	for _, c := range []struct{ reserved, actual int64 }{{-1, 0}, {0, -1}, {MaxLimit + 1, 0}, {3, MaxLimit + 1}} {
		if _, err := Settle(&p, &s, 0, 1, c.reserved, c.actual); !errors.Is(err, ErrInvalidCost) {
			t.Errorf("Settle(reserved %d, actual %d): %v, want ErrInvalidCost", c.reserved, c.actual, err)
		}
	}
	bad := Policy{Algorithm: FixedWindow, Limit: 0, Period: time.Second}
	if _, err := Settle(&bad, &s, 0, 1, 3, 0); !errors.Is(err, ErrInvalidPolicy) {
		t.Errorf("Settle on an invalid policy: %v", err)
	}
	if !reflect.DeepEqual(s, before) {
		t.Fatalf("bad input changed the state: %+v", s)
	}
	// A concurrency policy holds slots, not units: nothing to settle, on a key that holds some
	// or on one never seen (where a settlement must not report a state to store).
	conc := Policy{Algorithm: Concurrency, Limit: 2, Period: time.Second}
	var held State
	var d Decision
	if err := Acquire(&conc, &held, 0, 7, 1, &d); err != nil || !d.Allowed {
		t.Fatal(d, err)
	}
	heldBefore := *clone(&held)
	for _, st := range []*State{&held, {}} {
		for _, c := range []struct{ reserved, actual int64 }{{1, 2}, {2, 1}} {
			if changed, err := Settle(&conc, st, 0, 1, c.reserved, c.actual); changed || !errors.Is(err, ErrInvalidPolicy) {
				t.Errorf("Settle of concurrency (reserved %d, actual %d): changed %v, %v; want false, ErrInvalidPolicy", c.reserved, c.actual, changed, err)
			}
		}
	}
	if !reflect.DeepEqual(held, heldBefore) {
		t.Fatalf("a concurrency settlement changed the state: %+v", held)
	}
}

// settlePolicies are the properties' policies: each algorithm, T whole and not.
func settlePolicies() []Policy {
	var ps []Policy
	for _, a := range Algorithms {
		for _, lp := range []struct {
			limit  int64
			period time.Duration
			burst  int64
		}{{5, time.Second, 0}, {3, time.Second, 7}, {10, 250 * time.Millisecond, 4}} {
			p := Policy{Algorithm: a, Limit: lp.limit, Period: lp.period}
			if a == TokenBucket || a == LeakyBucket {
				p.Burst = lp.burst
			}
			ps = append(ps, p)
		}
	}
	// Calendar windows of their own lengths, across Europe/Berlin's 23-hour 2026-03-29 and
	// 25-hour 2026-10-25 (see settleScale).
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		panic(err)
	}
	for _, a := range []Algorithm{FixedWindow, SlidingWindow} {
		ps = append(ps, Policy{Algorithm: a, Limit: 5, Calendar: Day, Location: berlin},
			Policy{Algorithm: a, Limit: 7, Calendar: Week, Location: berlin},
			Policy{Algorithm: a, Limit: 4, Calendar: Month})
	}
	return ps
}

// settleScale is the instant the properties start near and the time they step by: 0 and the
// period, or for a calendar policy a week before a daylight-saving change and its window's
// typical length.
func settleScale(p *Policy, rng *rand.Rand) (origin, period int64) {
	if p.Calendar == NoCalendar {
		return 0, p.PeriodMicros()
	}
	origin = time.Date(2026, 3, 22, 0, 0, 0, 0, time.UTC).UnixMicro()
	if rng.IntN(2) == 0 {
		origin = time.Date(2026, 10, 18, 0, 0, 0, 0, time.UTC).UnixMicro()
	}
	day := int64(24 * time.Hour / time.Microsecond)
	switch p.Calendar {
	case Week:
		return origin, 7 * day
	case Month:
		return origin, 30 * day
	}
	return origin, day
}

// history leaves a random state: requests of random cost at random gaps from start.
func history(p *Policy, rng *rand.Rand, start, period int64) (*State, int64) {
	s, now := new(State), start
	for range rng.IntN(12) {
		now += rng.Int64N(period / 2)
		Decide(p, s, now, 1+rng.Int64N(min(p.Capacity(), 4)))
	}
	return s, now
}

// probes reports the decisions of requests of cost 1 and of the capacity at instants from now
// on: two states with equal probes decide alike.
func probes(p *Policy, s *State, now, period int64) []Decision {
	var out []Decision
	for _, dt := range []int64{0, 1, period / 7, period / 2, period - 1, period, 3 * period / 2, 2 * period, 5 * period} {
		for _, c := range []int64{0, 1, min(p.Capacity(), 5)} {
			d, _ := Decide(p, clone(s), now+dt, c)
			out = append(out, d)
		}
	}
	return out
}

// atLeastAsStrict reports whether every probe that a approves, b approves too.
func atLeastAsStrict(a, b []Decision) bool {
	for i := range a {
		if a[i].Allowed && !b[i].Allowed {
			return false
		}
	}
	return true
}

func TestSettleProperties(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 4))
	for _, p := range settlePolicies() {
		T := new(big.Rat).SetFrac64(p.PeriodMicros(), p.Limit)
		for range 400 {
			origin, period := settleScale(&p, rng)
			s, at := history(&p, rng, origin+rng.Int64N(3*period)-period, period)
			at += rng.Int64N(period)
			reserved := 1 + rng.Int64N(min(p.Capacity(), 5))
			actual := rng.Int64N(reserved + 1)
			now := at + []int64{0, 1, rng.Int64N(period / 3), rng.Int64N(2 * period)}[rng.IntN(4)]

			// actual == reserved: nothing changes.
			same := clone(s)
			if changed, err := Settle(&p, same, at, now, reserved, reserved); err != nil || changed || !reflect.DeepEqual(same, s) {
				t.Fatalf("%v: settling the reserved cost changed %+v to %+v (%v, %v)", p, s, same, changed, err)
			}

			charged, direct := clone(s), clone(s)
			if d, _ := Decide(&p, charged, at, reserved); !d.Allowed {
				continue
			}
			fullAtCharge := gcraWait(&p, s, at) == (u128{})
			Decide(&p, direct, at, actual)
			kept := clone(charged) // the reservation, never settled
			// Other requests between the charge and the settlement, charged unconditionally in
			// both histories.
			others := rng.IntN(3)
			if rng.IntN(2) == 0 {
				others = 0
			}
			for range others {
				t0 := at + rng.Int64N(max(1, now-at+1))
				c := 1 + rng.Int64N(3)
				for _, st := range []*State{charged, direct, kept} {
					if _, err := Settle(&p, st, t0, t0, 0, c); err != nil {
						t.Fatal(err)
					}
				}
			}
			if _, err := Settle(&p, charged, at, now, reserved, actual); err != nil {
				t.Fatal(err)
			}
			got, want, upper := probes(&p, charged, now, period), probes(&p, direct, now, period), probes(&p, kept, now, period)
			// Never more than was taken: as strict as charging the real cost in the first place,
			// and never stricter than keeping the reservation.
			if !atLeastAsStrict(got, want) {
				t.Fatalf("%v: reserved %d at %d, other charges %d, settled to %d at %d: the refund gave more than was charged\n got %+v\nwant %+v",
					p, reserved, at, others, actual, now, got, want)
			}
			if !atLeastAsStrict(upper, got) {
				t.Fatalf("%v: reserved %d at %d, settled to %d at %d: stricter than keeping the reservation", p, reserved, at, actual, now)
			}
			// Nothing else happened: the same as a charge of actual at at (for a bucket, when it
			// was full at the charge or the settlement comes within actual·T of it).
			exact := others == 0
			if exact && (p.Algorithm == TokenBucket || p.Algorithm == LeakyBucket) && !fullAtCharge {
				within := new(big.Rat).Mul(T, big.NewRat(actual, 1))
				exact = big.NewRat(now-at, 1).Cmp(within) <= 0
			}
			if exact && !reflect.DeepEqual(got, want) {
				t.Fatalf("%v: reserved %d at %d, settled to %d at %d: not a charge of %d\n got %+v\nwant %+v", p, reserved, at, actual, now, actual, got, want)
			}
		}
	}
}

// THE MODELS, SETTLING. settleModel applies the settlement rule to a reference model, in its own
// terms (windows by floor(t/period), tokens and queue time as rationals), as settle.go states it.
func settleModel(m model, at, now, reserved, actual int64) {
	delta := actual - reserved
	switch m := m.(type) {
	case *fixedModel:
		w := floorDiv(now, m.period)
		if delta > 0 {
			m.counts[w] += delta
		} else if floorDiv(at, m.period) == w {
			m.counts[w] -= min(-delta, m.counts[w])
		}
	case *windowModel:
		w, wa := floorDiv(now, m.period), floorDiv(at, m.period)
		if delta > 0 {
			m.counts[w] += delta
		} else if wa == w || wa == w-1 {
			m.counts[wa] -= min(-delta, m.counts[wa])
		}
	case *logModel:
		if delta > 0 {
			m.log = append(m.log, LogEntry{now, delta})
			return
		}
		left := -delta
		for i := len(m.log) - 1; i >= 0 && left > 0; i-- {
			if e := &m.log[i]; e.At == at && now-m.period < at {
				take := min(left, e.Cost)
				e.Cost -= take
				left -= take
			}
		}
		kept := m.log[:0]
		for _, e := range m.log {
			if e.Cost > 0 {
				kept = append(kept, e)
			}
		}
		m.log = kept
	case *tokenModel:
		tokens := m.at(now)
		if delta > 0 {
			m.tokens, m.last, m.seen = tokens.Sub(tokens, rat(delta, 1)), now, true
			return
		}
		if !m.seen {
			return
		}
		give := rat(-delta, 1)
		left := new(big.Rat).Sub(rat(reserved, 1), new(big.Rat).Mul(m.rate, rat(now-at, 1)))
		room := new(big.Rat).Sub(m.capacity, tokens)
		for _, x := range []*big.Rat{left, room} {
			if x.Cmp(give) < 0 {
				give = x
			}
		}
		if give.Sign() > 0 {
			m.tokens, m.last = tokens.Add(tokens, give), now
		}
	case *leakyModel:
		if delta > 0 {
			start := new(big.Rat).Add(rat(now, 1), m.wait(now))
			m.tat, m.seen = start.Add(start, new(big.Rat).Mul(rat(delta, 1), m.interval)), true
			return
		}
		give := new(big.Rat).Mul(rat(-delta, 1), m.interval)
		left := new(big.Rat).Sub(new(big.Rat).Mul(rat(reserved, 1), m.interval), rat(now-at, 1))
		for _, x := range []*big.Rat{left, m.wait(now)} {
			if x.Cmp(give) < 0 {
				give = x
			}
		}
		if give.Sign() > 0 {
			m.tat = new(big.Rat).Sub(m.tat, give)
		}
	}
}

// checkModelDecision compares a decision of cost at now with the model's (as checkAgainstModel),
// recording an approval in the model.
func checkModelDecision(t *testing.T, p *Policy, m model, d Decision, now, cost int64, what string) {
	t.Helper()
	want := Decision{Limit: p.Capacity(), Allowed: m.admits(now, cost), At: now}
	if want.Allowed {
		want.Delay = micros(m.delay(now))
		if cost > 0 {
			m.admit(now, cost)
		}
	} else {
		want.RetryAfter = micros(firstAdmitted(m, now, cost) - now)
	}
	want.Remaining = max(0, m.remaining(now))
	want.ResetAfter = micros(m.fullAt(now) - now)
	if d != want {
		t.Fatalf("%s: %+v\nthe model says %+v", what, d, want)
	}
}

// FuzzSettle runs a trace of requests and settlements of the approved ones (oldest first, each
// with a real cost from the trace) against the models.
func FuzzSettle(f *testing.F) {
	addCorpus(f)
	f.Fuzz(func(t *testing.T, alg, limit, burst uint8, period uint32, trace []byte) {
		p := fuzzPolicy(alg, limit, burst, period)
		pm := p.PeriodMicros()
		now := int64(0)
		if alg>>6 == 1 {
			now = 1_700_000_000_123_456
		}
		m := newModel(&p)
		s := new(State)
		type reservation struct{ at, cost int64 }
		var pending []reservation
		for step := 0; len(trace) >= 3 && step < 64; trace, step = trace[3:], step+1 {
			g := int64(trace[0])<<8 | int64(trace[1])
			switch n := g & 0x3fff; g >> 14 {
			case 0:
				now += n
			case 1:
				now += n * pm / 0x4000
			default:
				now += n * pm / 0x1000
			}
			op := trace[2]
			if op >= 0xa0 && len(pending) > 0 {
				r := pending[0]
				pending = pending[1:]
				actual := int64(op&0x1f) % (2*r.cost + 4)
				before := clone(s)
				if _, err := Settle(&p, s, r.at, now, r.cost, actual); err != nil {
					t.Fatal(err)
				}
				if actual == r.cost && !reflect.DeepEqual(before, s) {
					t.Fatalf("step %d: settling the reserved cost changed the state", step)
				}
				settleModel(m, r.at, now, r.cost, actual)
				d, _ := Decide(&p, clone(s), now, 0)
				checkModelDecision(t, &p, m, d, now, 0, "peek after a settlement")
				d, _ = Decide(&p, clone(s), now, 1)
				checkModelDecision(t, &p, newModelCopy(m), d, now, 1, "request after a settlement")
				continue
			}
			cost := 1 + int64(op)%min(p.Capacity(), 4)
			d, err := Decide(&p, s, now, cost)
			if err != nil {
				t.Fatal(err)
			}
			checkModelDecision(t, &p, m, d, now, cost, "request")
			if d.Allowed {
				pending = append(pending, reservation{now, cost})
			}
		}
	})
}

// newModelCopy returns a copy of m that a check may admit into without changing m.
func newModelCopy(m model) model {
	switch m := m.(type) {
	case *fixedModel:
		c := *m
		c.counts = map[int64]int64{}
		for k, v := range m.counts {
			c.counts[k] = v
		}
		return &c
	case *windowModel:
		c := *m
		c.counts = map[int64]int64{}
		for k, v := range m.counts {
			c.counts[k] = v
		}
		return &c
	case *logModel:
		c := *m
		c.log = append([]LogEntry(nil), m.log...)
		return &c
	case *tokenModel:
		c := *m
		c.tokens = new(big.Rat).Set(m.tokens)
		return &c
	case *leakyModel:
		c := *m
		c.tat = new(big.Rat).Set(m.tat)
		return &c
	}
	panic("unknown model")
}
