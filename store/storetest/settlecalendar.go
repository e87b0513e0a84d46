package storetest

import (
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
)

// CalendarSettleTraces returns fuzzed traces of calendar policies for the settlement suite
// (ReplaySettle): fixed and sliding windows over Europe/Berlin days across its 23-hour
// 2026-03-29 and its 25-hour 2026-10-25, a month (February to April 2026, across the clock change
// in March), ISO week 53 of 2026 into week 1 of 2027, and a year across the leap day of 2028;
// small limits, and limits of 2^53 with costs that saturate the counts. The clock moves by
// anything from a microsecond to two windows, often to within a millisecond of a window's edge,
// and now and then back by up to a minute (the clock ran backward, within its window).
func CalendarSettleTraces(stream uint64, steps int) []Trace {
	r := rand.New(rand.NewPCG(stream, stream^0xca1e))
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		panic("storetest: the time zone Europe/Berlin: " + err.Error()) // the zone data are part of the test
	}
	type span struct {
		name     string
		calendar algorithm.Calendar
		loc      *time.Location
		from     time.Time
	}
	spans := []span{
		{"day-spring", algorithm.Day, berlin, time.Date(2026, 3, 27, 18, 0, 0, 0, berlin)},
		{"day-autumn", algorithm.Day, berlin, time.Date(2026, 10, 23, 18, 0, 0, 0, berlin)},
		{"month", algorithm.Month, berlin, time.Date(2026, 2, 10, 0, 0, 0, 0, berlin)},
		{"week-53", algorithm.Week, berlin, time.Date(2026, 12, 21, 12, 0, 0, 0, berlin)},
		{"year-leap", algorithm.Year, nil, time.Date(2027, 12, 30, 0, 0, 0, 0, time.UTC)},
	}
	var out []Trace
	for _, sp := range spans {
		for _, a := range []algorithm.Algorithm{sluice.FixedWindow, sluice.SlidingWindow} {
			for _, large := range []bool{false, true} {
				limit := 1 + r.Int64N(12)
				if large {
					limit = algorithm.MaxLimit
				}
				p := sluice.Policy{Name: fmt.Sprintf("cal-%s-%v", sp.name, a), Algorithm: a, Limit: limit, Calendar: sp.calendar, Location: sp.loc}
				tr := Trace{Name: fmt.Sprintf("%s, limit %d", p.Name, limit), Policy: p}
				at := sp.from.UnixMicro()
				hi := at // the latest instant yet
				for range steps {
					at = calendarStep(r, &p, at, hi)
					hi = max(hi, at)
					cost := r.Int64N(limit/2 + 2)
					if large {
						cost = []int64{1, limit / 3, limit / 2, limit, r.Int64N(limit) + 1}[r.IntN(5)]
					}
					if cost > limit { // (min is this package's minute)
						cost = limit
					}
					tr.Steps = append(tr.Steps, Step{At: at, Key: []string{"a", "b"}[r.IntN(2)], Cost: cost})
				}
				out = append(out, tr)
			}
		}
	}
	return out
}

// calendarStep moves at on: within its window, to a millisecond either side of its end, a window
// or two on, or back by up to a minute — but not out of the window holding hi, the latest
// instant yet: a store may forget a state whose reset the clock has passed (a sweep, a TTL),
// which the core, handed the state, does not.
func calendarStep(r *rand.Rand, p *sluice.Policy, at, hi int64) int64 {
	start, end := p.Calendar.Window(p.Location, at)
	switch k := r.IntN(10); {
	case k < 3:
		return end + r.Int64N(2*ms+1) - ms
	case k < 4:
		return max(at, start+r.Int64N(ms))
	case k < 5:
		floor, _ := p.Calendar.Window(p.Location, hi)
		return max(floor, at-r.Int64N(min+1)) // (min: a minute, in µs)
	case k < 8:
		return at + r.Int64N(max(1, (end-at)/3+1))
	default:
		return at + r.Int64N(2*(end-start)+1)
	}
}
