package sim

import (
	"fmt"
	"time"

	"github.com/sluicehq/sluice"
)

// Options are a simulation's settings beyond its policy and its requests. The zero value is the
// default: the virtual clock's 0 is Unix time 0, and one limiter decides every request.
//
//	sim.Options{Start: start}.Run(policy, reqs)
//
// Run, Simulate, Compare, NewSession and NewFleetSession are the zero Options' (and a Fleet's).
type Options struct {
	// Start is the instant the virtual clock's 0 stands for: every Request.TMicros (a trace's
	// t_ms, a pattern's times) counts from it. It matters to calendar policies, whose windows
	// begin at local midnights, not at 0. The zero Time means Unix time 0
	// (1970-01-01T00:00:00Z), which is a window boundary of every period.
	Start time.Time

	// Fleet, if not nil, deals the requests to its instances in turn, each spending local
	// budgets of the policy (see Fleet).
	Fleet *Fleet

	// Actual, if not nil, gives the requests their real costs, known once they have been served:
	// request i costs Actual[i] (0..2^53; NoActual, or i beyond the slice: not known), its Cost
	// being the estimate charged up front. An approved request with a real cost is settled with it
	// right after its decision, at the same virtual instant (sluice.Reservation.Settle: a larger
	// cost charged beyond the limit if need be, a smaller one refunded), and its Row says the
	// balance that leaves. ReadTrace reads them from a trace's actual column.
	Actual []int64

	// Durations, if not nil, give the requests' responses their lengths in µs (a streamed
	// model's answer lasts seconds): request i's lasts Durations[i] (≥ 0; i beyond the slice:
	// 0). An approved request then holds its estimate while its response runs, and is settled
	// with its real cost (Actual) when it ends, at TMicros + Durations[i] on the virtual clock —
	// before any request at that instant is decided — so that parallel responses hold their
	// estimates together. Its Row, emitted once it is settled, says what the key's running
	// responses held (Row.Streams). ReadTrace reads them from a trace's duration_ms column.
	Durations []int64

	// Changes, in time order, change the policy while the simulation runs (see Change): each
	// applies to the requests from its instant on. Not with a Fleet.
	Changes []Change
}

// origin is Start in µs since the Unix epoch.
func (o Options) origin() int64 {
	if o.Start.IsZero() {
		return 0
	}
	return o.Start.UnixMicro()
}

// Instant is the instant of virtual time tMicros (Start + tMicros), in the zone a person reads
// it in: a calendar policy's Location, else Start's own (UTC if Start is zero).
func (o Options) Instant(p *sluice.Policy, tMicros int64) time.Time {
	t := time.UnixMicro(o.origin() + tMicros)
	switch {
	case p != nil && p.Calendar != sluice.NoCalendar:
		loc := p.Location
		if loc == nil {
			loc = time.UTC
		}
		return t.In(loc)
	case o.Start.IsZero():
		return t.UTC()
	}
	return t.In(o.Start.Location())
}

// Window returns the calendar window of p that holds virtual time tMicros, as virtual times:
// [start, end), start negative if the window began before the simulation did. ok is false for a
// policy without a calendar.
func (o Options) Window(p *sluice.Policy, tMicros int64) (start, end int64, ok bool) {
	if p.Calendar == sluice.NoCalendar {
		return 0, 0, false
	}
	org := o.origin()
	_, s, e := p.WindowOf(org + tMicros)
	return s - org, e - org, true
}

// NewSession returns a session of policy under o for traffic from at most keys distinct keys
// (see NewSession and NewFleetSession).
func (o Options) NewSession(policy sluice.Policy, keys int) (*Session, error) {
	if o.Fleet != nil {
		if o.Changes != nil {
			return nil, fmt.Errorf("sim: changes apply to one instance, not to a fleet")
		}
		return newFleetSession(policy, keys, *o.Fleet, o.origin())
	}
	p := policy
	for i, c := range o.Changes {
		if i > 0 && c.TMicros < o.Changes[i-1].TMicros {
			return nil, fmt.Errorf("sim: change %s is before change %s (changes must be in time order)", c, o.Changes[i-1])
		}
		if p = c.Apply(p); p.Validate() != nil {
			return nil, fmt.Errorf("sim: change %s: %v: %w", c, p.Algorithm, p.Validate())
		}
	}
	s, err := newSession(policy, keys, o.origin())
	if err == nil {
		s.changes = o.Changes
	}
	return s, err
}

// Run is the package's Run under o.
func (o Options) Run(policy sluice.Policy, reqs []Request) (Result, error) {
	rows := make([]Row, 0, len(reqs))
	sum, err := o.Simulate(policy, reqs, func(r Row) error {
		rows = append(rows, r)
		return nil
	})
	if err != nil {
		return Result{}, err
	}
	return Result{Policy: policy, Rows: rows, Summary: sum}, nil
}

// Simulate is the package's Simulate (or, with a Fleet, SimulateFleet) under o.
func (o Options) Simulate(policy sluice.Policy, reqs []Request, emit func(Row) error) (Summary, error) {
	if o.Durations != nil {
		st, err := o.NewStreamSession(policy, len(reqs))
		if err != nil {
			return Summary{}, err
		}
		return st.simulate(reqs, emit, o.Actual, o.Durations)
	}
	s, err := o.NewSession(policy, len(reqs))
	if err != nil {
		return Summary{}, err
	}
	return s.simulate(reqs, emit, o.Actual)
}

// Compare runs reqs under each of policies in turn (ComparePolicies' or CalendarPolicies'), under
// o. It validates every policy before running any.
func (o Options) Compare(policies []sluice.Policy, reqs []Request) ([]Result, error) {
	for _, p := range policies {
		if err := p.Validate(); err != nil {
			return nil, fmt.Errorf("%v: %w", p.Algorithm, err)
		}
	}
	results := make([]Result, 0, len(policies))
	for _, p := range policies {
		r, err := o.Run(p, reqs)
		if err != nil {
			return nil, fmt.Errorf("%v: %w", p.Algorithm, err)
		}
		results = append(results, r)
	}
	return results, nil
}

// CalendarAlgorithms are the algorithms that count by the calendar, in the order of
// `sluice simulate --compare --calendar`: the other three have no calendar.
var CalendarAlgorithms = []sluice.Algorithm{sluice.FixedWindow, sluice.SlidingWindow}

// CalendarPolicies returns the policies a comparison under calendar c in loc runs: one per
// CalendarAlgorithms, each with limit.
func CalendarPolicies(limit int64, c sluice.Calendar, loc *time.Location) []sluice.Policy {
	ps := make([]sluice.Policy, 0, len(CalendarAlgorithms))
	for _, a := range CalendarAlgorithms {
		ps = append(ps, sluice.Policy{Algorithm: a, Limit: limit, Calendar: c, Location: loc})
	}
	return ps
}

// WindowName names the calendar window of c that starts at local time t, as the simulation's
// outputs (the table, the page) show it: a day by its date in dayLayout (a time layout:
// "2006-01-02", "Mon 2006-01-02"), a week by its Monday and ISO week number ("2026-12-28 (ISO
// week 53)"), a month as 2028-02, a year as 2027.
func WindowName(c sluice.Calendar, t time.Time, dayLayout string) string {
	switch c {
	case sluice.Week:
		_, wk := t.ISOWeek()
		return fmt.Sprintf("%s (ISO week %d)", t.Format("2006-01-02"), wk)
	case sluice.Month:
		return t.Format("2006-01")
	case sluice.Year:
		return t.Format("2006")
	}
	return t.Format(dayLayout)
}
