package sim

import (
	"testing"
	"time"
	_ "time/tzdata" // the zones, also where there is no /usr/share/zoneinfo

	"github.com/sluicehq/sluice"
)

func berlin(t *testing.T) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

// A simulation's clock starts at Options.Start: a daily quota in Berlin started at 23:00 the day
// before the 23-hour day refills at local midnight, an hour in, and then lasts 23 hours.
func TestOptionsStartCalendarRun(t *testing.T) {
	loc := berlin(t)
	start := time.Date(2026, 3, 28, 23, 0, 0, 0, loc)
	p := sluice.Policy{Algorithm: sluice.FixedWindow, Limit: 2, Calendar: sluice.Day, Location: loc}
	h := int64(time.Hour / time.Microsecond)
	reqs := []Request{{0, "k", 2}, {0, "k", 1}, {h - 1, "k", 1}, {h, "k", 2}, {h, "k", 1}, {24 * h, "k", 1}}
	res, err := Options{Start: start}.Run(p, reqs)
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		allowed bool
		retry   int64
	}{{true, 0}, {false, h}, {false, 1}, {true, 0}, {false, 23 * h}, {true, 0}}
	for i, w := range want {
		if r := res.Rows[i]; r.Allowed != w.allowed || r.RetryAfterMicros != w.retry {
			t.Errorf("row %d: %+v, want allowed %v retry %d", i, r, w.allowed, w.retry)
		}
	}
	// Without a start the clock's 0 is 1970-01-01 01:00 in Berlin: the day ends 23 hours in.
	res, err = Run(p, reqs[:2])
	if err != nil {
		t.Fatal(err)
	}
	if r := res.Rows[1]; r.Allowed || r.RetryAfterMicros != 23*h {
		t.Errorf("from Unix time 0: %+v, want refused for 23h", r)
	}

	o := Options{Start: start}
	if got := o.Instant(&p, h).Format(time.RFC3339); got != "2026-03-29T00:00:00+01:00" {
		t.Errorf("Instant(1h) = %s", got)
	}
	if got := o.Instant(&p, 4*h).Format(time.RFC3339); got != "2026-03-29T04:00:00+02:00" {
		t.Errorf("Instant(4h) = %s (the clocks went forward at 02:00)", got)
	}
	if s, e, ok := o.Window(&p, 0); !ok || s != -23*h || e != h {
		t.Errorf("Window(0) = %d, %d, %v; want the 28th, from -23h to 1h", s, e, ok)
	}
	if s, e, _ := o.Window(&p, h); s != h || e != 24*h {
		t.Errorf("Window(1h) = %d, %d; want the 23-hour 29th, from 1h to 24h", s, e)
	}
	if _, _, ok := o.Window(&sluice.Policy{Algorithm: sluice.FixedWindow, Limit: 1, Period: time.Second}, 0); ok {
		t.Error("Window of a period policy is ok")
	}
}

// Sessions and fleets start there too, and Peek reads the clock from there.
func TestOptionsStartSessionAndFleet(t *testing.T) {
	loc := berlin(t)
	start := time.Date(2026, 10, 24, 12, 0, 0, 0, loc)
	p := sluice.Policy{Algorithm: sluice.SlidingWindow, Limit: 10, Calendar: sluice.Day, Location: loc}
	h := int64(time.Hour / time.Microsecond)
	s, err := Options{Start: start}.NewSession(p, 1)
	if err != nil {
		t.Fatal(err)
	}
	if r, err := s.Decide(Request{0, "k", 10}); err != nil || !r.Allowed {
		t.Fatalf("%+v, %v", r, err)
	}
	// 12.5 hours into the 25-hour 25th (23:30 local), half of the 10 still weighs.
	d, err := s.Peek(24*h+30*h/60, "k")
	if err != nil || d.Remaining != 5 {
		t.Fatalf("peek: %+v, %v; want 5 remaining", d, err)
	}
	// Two instances take budgets of 5 each: the whole day's 10. Spent on the 24th; at local
	// midnight they expire, and the 10 counted weigh in full on the 25th: refused.
	f := Fleet{Instances: 2, Budget: sluice.LocalBudget{Size: 5, MaxAge: 48 * time.Hour}}
	res, err := Options{Start: start, Fleet: &f}.Run(p, []Request{{0, "k", 1}, {0, "k", 1}, {12*h - 1, "k", 1}, {12 * h, "k", 1}})
	if err != nil {
		t.Fatal(err)
	}
	if r := res.Rows; !r[0].Allowed || !r[1].Allowed || !r[2].Allowed || r[3].Allowed || r[3].RetryAfterMicros != 25*h/10 {
		t.Fatalf("fleet: %+v; want 3 allowed, then refused for 2.5h", r)
	}
}

// Compare under a calendar runs the two algorithms that have one.
func TestCompareCalendar(t *testing.T) {
	loc := berlin(t)
	ps := CalendarPolicies(3, sluice.Week, loc)
	if len(ps) != 2 || ps[0].Algorithm != sluice.FixedWindow || ps[1].Algorithm != sluice.SlidingWindow {
		t.Fatalf("CalendarPolicies = %+v", ps)
	}
	// ISO week 53: Monday 2026-12-28 to Monday 2027-01-04.
	start := time.Date(2026, 12, 31, 0, 0, 0, 0, loc)
	day := int64(24 * time.Hour / time.Microsecond)
	res, err := Options{Start: start}.Compare(ps, []Request{{0, "k", 3}, {4 * day, "k", 1}, {4 * day, "k", 2}})
	if err != nil {
		t.Fatal(err)
	}
	// Fixed: a new week on the 4th (4 days in) takes 3. Sliding: at the week's start the 3 of
	// week 53 weigh in full: the second request waits until 3·(7d - e) + 7d ≤ 3·7d, e = 7d/3.
	if r := res[0].Rows; !r[1].Allowed || !r[2].Allowed {
		t.Errorf("fixed-window: %+v", r)
	}
	if r := res[1].Rows; r[1].Allowed || r[1].RetryAfterMicros != 7*day/3 {
		t.Errorf("sliding-window: %+v, want refused until a third into week 1 (%d µs)", r[1], 7*day/3)
	}
	bad := ps
	bad[0].Period = time.Second
	if _, err := (Options{}).Compare(bad, []Request{{0, "k", 1}}); err == nil {
		t.Error("Compare ran an invalid policy")
	}
}
