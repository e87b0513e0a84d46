package algorithm

import (
	"errors"
	"fmt"
	"math/big"
	"math/rand/v2"
	"testing"
	"time"
)

// The reference models of calendar policies: counts per window keyed by the window's start as
// Calendar.Window gives it (itself checked against a bisection model in calendar_test.go), and
// the design's rules written plainly, in math/big, with no recorded boundaries, tags or clamps.

func newCalendarModel(p *Policy) model {
	w := func(t int64) (int64, int64) { return p.Calendar.Window(p.Location, t) }
	switch p.Algorithm {
	case FixedWindow:
		return &calFixedModel{limit: p.Limit, window: w, counts: map[int64]int64{}}
	case SlidingWindow:
		return &calSlidingModel{limit: p.Limit, window: w, counts: map[int64]int64{}}
	}
	panic("no calendar model for " + p.Algorithm.String())
}

type calFixedModel struct {
	limit  int64
	window func(int64) (start, end int64)
	counts map[int64]int64 // window start -> cost approved in it
}

func (m *calFixedModel) count(now int64) int64 { s, _ := m.window(now); return m.counts[s] }
func (m *calFixedModel) admits(now, c int64) bool {
	return m.count(now)+c <= m.limit
}
func (m *calFixedModel) admit(now, c int64)        { s, _ := m.window(now); m.counts[s] += c }
func (m *calFixedModel) remaining(now int64) int64 { return m.limit - m.count(now) }
func (m *calFixedModel) delay(int64) int64         { return 0 }
func (m *calFixedModel) fullAt(now int64) int64 {
	if _, e := m.window(now); m.count(now) > 0 {
		return e
	}
	return now
}

// calSlidingModel: approve iff prev·(L - e) + (cur + c)·L ≤ limit·L, L the current window's length.
type calSlidingModel struct {
	limit  int64
	window func(int64) (start, end int64)
	counts map[int64]int64
}

func (m *calSlidingModel) fits(now, extra int64) bool {
	s, e := m.window(now)
	ps, _ := m.window(s - 1)
	prev, cur, n, el := m.counts[ps], m.counts[s], e-s, now-s
	lhs := new(big.Int).Mul(big.NewInt(prev), big.NewInt(n-el))
	lhs.Add(lhs, new(big.Int).Mul(big.NewInt(cur+extra), big.NewInt(n)))
	return lhs.Cmp(new(big.Int).Mul(big.NewInt(m.limit), big.NewInt(n))) <= 0
}
func (m *calSlidingModel) admits(now, c int64) bool { return m.fits(now, c) }
func (m *calSlidingModel) admit(now, c int64)       { s, _ := m.window(now); m.counts[s] += c }
func (m *calSlidingModel) delay(int64) int64        { return 0 }
func (m *calSlidingModel) remaining(now int64) int64 {
	var k int64
	for k < m.limit && m.fits(now, k+1) {
		k++
	}
	return k
}
func (m *calSlidingModel) fullAt(now int64) int64 {
	s, e := m.window(now)
	ps, _ := m.window(s - 1)
	switch {
	case m.counts[s] > 0:
		_, e2 := m.window(e)
		return e2
	case m.counts[ps] > 0:
		return e
	}
	return now
}

// calendarZones have every kind of change: an hour at 02:00 (Berlin, New York), midnight
// skipped (Santiago), half an hour (Lord Howe), none (UTC, Kolkata).
var calendarZones = []string{"UTC", "Europe/Berlin", "America/New_York", "America/Santiago", "Australia/Lord_Howe", "Asia/Kolkata"}

// calendarOrigins are the edges the traces start near (UTC instants; a day either side of each
// zone's local one): Berlin's 23- and 25-hour days, a leap day, the end of December, ISO week 53.
var calendarOrigins = []string{"2026-03-28T20:00:00Z", "2026-10-24T20:00:00Z", "2028-02-28T12:00:00Z",
	"2026-12-31T12:00:00Z", "2027-01-03T12:00:00Z", "2026-09-05T12:00:00Z", "2026-04-04T12:00:00Z"}

// calendarPolicy derives a valid calendar policy from fuzzed numbers.
func calendarPolicy(t testing.TB, alg, cal, zone, limit uint8) Policy {
	loc, err := time.LoadLocation(calendarZones[int(zone)%len(calendarZones)])
	if err != nil {
		t.Fatal(err)
	}
	a := FixedWindow
	if alg%2 == 1 {
		a = SlidingWindow
	}
	return Policy{Algorithm: a, Limit: 1 + int64(limit)%20, Calendar: Day + Calendar(cal%4), Location: loc}
}

// calendarTrace reads requests of 3 bytes each from data, as fuzzTrace does: two for the gap
// (its top two bits pick raw µs up to 16ms, minutes up to 11 days, a share of the current
// window up to 4 of them, or a landing on, or 1µs either side of, the next boundary), one for
// the cost.
func calendarTrace(p *Policy, origin int64, data []byte) []request {
	var reqs []request
	now := origin
	for ; len(data) >= 3 && len(reqs) < 64; data = data[3:] {
		g := int64(data[0])<<8 | int64(data[1])
		n := g & 0x3fff
		_, start, end := p.WindowOf(now)
		switch g >> 14 {
		case 0:
			now += n
		case 1:
			now += n * 60_000_000
		case 2:
			now += n * (end - start) / 0x1000
		case 3:
			now = end + n%3 - 1
		}
		c := int64(data[2])
		var cost int64
		switch {
		case c < 0x80:
			cost = 1
		case c < 0xc0:
			cost = c % 4
		case c < 0xf0:
			cost = 1 + c%p.Limit
		case c < 0xfe:
			cost = p.Limit + c%4
		default:
			cost = -1
		}
		reqs = append(reqs, request{now, cost})
	}
	return reqs
}

func calendarOrigin(t testing.TB, i uint8) int64 {
	o, err := time.Parse(time.RFC3339, calendarOrigins[int(i)%len(calendarOrigins)])
	if err != nil {
		t.Fatal(err)
	}
	return o.UnixMicro()
}

// FuzzCalendar runs calendar policies on traces across calendar edges through every check of a
// forward clock, the model's decisions among them.
func FuzzCalendar(f *testing.F) {
	edges := []byte{0xc0, 0, 1, 0xc0, 1, 1, 0xc0, 2, 0xe5, 0x80, 0x10, 1, 0xc0, 0, 0xf1, 0, 0, 0x81}
	steady := []byte{}
	for range 20 {
		steady = append(steady, 0x41, 0x00, 1) // 256 minutes apart
	}
	for i := range uint8(14) {
		f.Add(i, i/2, i, i*3, uint8(4), edges)
		f.Add(i+1, i, i+2, i, uint8(9), append(append([]byte{}, steady...), edges...))
	}
	f.Fuzz(func(t *testing.T, alg, cal, zone, origin, limit uint8, trace []byte) {
		p := calendarPolicy(t, alg, cal, zone, limit)
		checkAll(t, &p, replay(&p, calendarTrace(&p, calendarOrigin(t, origin), trace)))
	})
}

// TestCalendarProperties: random traces of every calendar in every zone, from every edge, through
// every check, against the model; and with a clock that steps back now and then.
func TestCalendarProperties(t *testing.T) {
	traces := 6
	if testing.Short() {
		traces = 2
	}
	for alg := range uint8(2) {
		for cal := range uint8(4) {
			for zone := range uint8(len(calendarZones)) {
				p := calendarPolicy(t, alg, cal, zone, 2+3*cal+zone)
				t.Run(fmt.Sprintf("%v/%d per %v in %v", p.Algorithm, p.Limit, p.Calendar, p.Location), func(t *testing.T) {
					rng := rand.New(rand.NewPCG(uint64(alg)<<16|uint64(cal)<<8|uint64(zone), 13))
					for i := range traces * len(calendarOrigins) {
						data := make([]byte, 3*60)
						for j := range data {
							data[j] = byte(rng.UintN(256))
						}
						reqs := calendarTrace(&p, calendarOrigin(t, uint8(i)), data)
						checkAll(t, &p, replay(&p, reqs))
						for j := range reqs { // step back by up to two days, now and then
							if j > 0 && rng.IntN(6) == 0 {
								back := rng.Int64N(2*86_400_000_000 + 1)
								for k := j; k < len(reqs); k++ {
									reqs[k].now -= back
								}
							}
						}
						checkClockBackward(t, &p, replay(&p, reqs))
					}
				})
			}
		}
	}
}

// FuzzCalendarPolicy: any calendar policy, valid or not, and any request: Validate and Decide
// never panic; Validate's errors wrap ErrInvalidPolicy; under a valid policy Decide errs only on a
// negative cost or one above the limit; WindowOf holds its instant within ±2^62 µs.
func FuzzCalendarPolicy(f *testing.F) {
	f.Add(uint8(1), uint8(1), uint8(1), int64(10), int64(0), int64(0), int64(1_700_000_000_000_000), int64(1), int64(3_600_000_000))
	f.Add(uint8(3), uint8(4), uint8(2), int64(1<<53), int64(1), int64(0), int64(-1<<63), int64(-1), int64(1<<63-1))
	f.Add(uint8(4), uint8(9), uint8(0), int64(0), int64(1000), int64(5), int64(1<<63-1), int64(1<<53), int64(-1))
	f.Add(uint8(1), uint8(0), uint8(5), int64(3), int64(0), int64(0), int64(1<<62), int64(3), int64(1))
	f.Fuzz(func(t *testing.T, alg, cal, zone uint8, limit, period, burst, now, cost, dt int64) {
		loc, err := time.LoadLocation(calendarZones[int(zone)%len(calendarZones)])
		if err != nil {
			t.Fatal(err)
		}
		p := Policy{Algorithm: Algorithm(alg), Limit: limit, Period: time.Duration(period), Burst: burst, Calendar: Calendar(cal), Location: loc}
		verr := p.Validate()
		if verr != nil && !errors.Is(verr, ErrInvalidPolicy) {
			t.Fatalf("%+v: Validate() = %v", p, verr)
		}
		s := new(State)
		d1, err1 := Decide(&p, s, now, cost)
		d2, err2 := Decide(&p, s, now+dt, 1)
		if verr != nil {
			return
		}
		if p.Calendar == NoCalendar {
			return // FuzzPolicy's
		}
		for _, c := range []struct {
			cost int64
			d    Decision
			err  error
		}{{cost, d1, err1}, {1, d2, err2}} {
			switch {
			case c.err == nil:
				if c.d.Limit != p.Limit || c.d.Remaining < 0 || c.d.Remaining > p.Limit {
					t.Fatalf("%+v: cost %d: %+v", p, c.cost, c.d)
				}
			case errors.Is(c.err, ErrInvalidCost) && c.cost < 0, errors.Is(c.err, ErrCostExceedsLimit) && c.cost > p.Limit:
			default:
				t.Fatalf("%+v: cost %d: unexpected error %v", p, c.cost, c.err)
			}
		}
		if -calendarEdge <= now && now <= calendarEdge {
			if _, start, end := p.WindowOf(now); !(start <= now && now < end) {
				t.Fatalf("%+v: WindowOf(%d) = [%d, %d)", p, now, start, end)
			}
		}
	})
}
