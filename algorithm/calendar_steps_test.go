package algorithm

import (
	"testing"
	"time"
	_ "time/tzdata" // the zones, also where there is no /usr/share/zoneinfo
)

// Step tables of calendar policies at explicit instants across real calendar edges. runSteps'
// clock is µs since the Unix epoch, so a row's instant is a local time in the policy's zone,
// converted by local; every refusal's RetryAfter is checked exact by runSteps as well.

const (
	hour = time.Hour
	day  = 24 * time.Hour
)

// local is the instant of the local time s ("2006-01-02 15:04:05.999999") in loc, as runSteps'
// time.Duration since the epoch. Times that happen twice (a clock going back) are written as
// an unambiguous instant plus a duration instead.
func local(t *testing.T, loc *time.Location, s string) time.Duration {
	t.Helper()
	v, err := time.ParseInLocation("2006-01-02 15:04:05.999999", s, loc)
	if err != nil {
		t.Fatal(err)
	}
	return time.Duration(v.UnixMicro()) * µsec
}

func TestCalendarFixedWindow(t *testing.T) {
	berlin := load(t, "Europe/Berlin")
	at := func(s string) time.Duration { return local(t, berlin, s) }
	t.Run("Berlin's 23-hour day, 2026-03-29", func(t *testing.T) {
		runSteps(t, Policy{Algorithm: FixedWindow, Limit: 3, Calendar: Day, Location: berlin}, []step{
			{at: at("2026-03-28 23:59:59.999999"), cost: 1, n: 3, allowed: true, remaining: left(0), reset: after(µsec)},
			{at: at("2026-03-28 23:59:59.999999"), cost: 1, retry: µsec},
			{at: at("2026-03-29 00:00:00"), cost: 0, allowed: true, remaining: left(3), reset: after(0)},
			{at: at("2026-03-29 00:00:00"), cost: 1, n: 3, allowed: true, remaining: left(0), reset: after(23 * hour)},
			{at: at("2026-03-29 00:00:00"), cost: 1, retry: 23 * hour},
			// 01:59:59 is followed by 03:00: from 03:00 to midnight is 21 hours, not 22.
			{at: at("2026-03-29 01:59:59"), cost: 1, retry: 21*hour + sec},
			{at: at("2026-03-29 03:00:00"), cost: 1, retry: 21 * hour, reset: after(21 * hour)},
			{at: at("2026-03-29 23:59:59.999999"), cost: 1, retry: µsec},
			{at: at("2026-03-30 00:00:00"), cost: 2, allowed: true, remaining: left(1), reset: after(24 * hour)},
		})
	})
	t.Run("Berlin's 25-hour day, 2026-10-25", func(t *testing.T) {
		runSteps(t, Policy{Algorithm: FixedWindow, Limit: 2, Calendar: Day, Location: berlin}, []step{
			{at: at("2026-10-25 00:00:00"), cost: 2, allowed: true, remaining: left(0), reset: after(25 * hour)},
			{at: at("2026-10-25 00:00:00") + 150*time.Minute, cost: 1, retry: 22*hour + 30*time.Minute}, // the first 02:30 (CEST)
			{at: at("2026-10-25 00:00:00") + 210*time.Minute, cost: 1, retry: 21*hour + 30*time.Minute}, // the second (CET)
			{at: at("2026-10-25 23:00:00"), cost: 1, retry: hour},
			{at: at("2026-10-26 00:00:00"), cost: 1, allowed: true, remaining: left(1), reset: after(24 * hour)},
		})
	})
	t.Run("leap day: February 2028 has 29 days", func(t *testing.T) {
		runSteps(t, Policy{Algorithm: FixedWindow, Limit: 1, Calendar: Month}, []step{
			{at: local(t, time.UTC, "2028-02-01 00:00:00"), cost: 1, allowed: true, reset: after(29 * day)},
			{at: local(t, time.UTC, "2028-02-28 12:00:00"), cost: 1, retry: day + 12*hour},
			{at: local(t, time.UTC, "2028-02-29 23:59:59.999999"), cost: 1, retry: µsec},
			{at: local(t, time.UTC, "2028-03-01 00:00:00"), cost: 1, allowed: true, reset: after(31 * day)},
		})
		runSteps(t, Policy{Algorithm: FixedWindow, Limit: 1, Calendar: Day}, []step{
			{at: local(t, time.UTC, "2028-02-29 00:00:00"), cost: 1, allowed: true, reset: after(day)},
			{at: local(t, time.UTC, "2028-02-29 18:00:00"), cost: 1, retry: 6 * hour},
			{at: local(t, time.UTC, "2028-03-01 00:00:00"), cost: 1, allowed: true},
		})
	})
	t.Run("the end of December: month and year end together", func(t *testing.T) {
		for _, cal := range []Calendar{Month, Year} {
			runSteps(t, Policy{Algorithm: FixedWindow, Limit: 5, Calendar: cal, Location: berlin}, []step{
				{at: at("2026-12-31 23:59:59"), cost: 5, allowed: true, remaining: left(0), reset: after(sec)},
				{at: at("2026-12-31 23:59:59.999999"), cost: 1, retry: µsec},
				{at: at("2027-01-01 00:00:00"), cost: 0, allowed: true, remaining: left(5), reset: after(0)},
				{at: at("2027-01-01 00:00:00"), cost: 5, allowed: true, remaining: left(0)},
			})
		}
	})
	t.Run("ISO week 53: 2026-12-28 to 2027-01-04, across the new year", func(t *testing.T) {
		runSteps(t, Policy{Algorithm: FixedWindow, Limit: 2, Calendar: Week, Location: berlin}, []step{
			{at: at("2026-12-27 23:59:59"), cost: 2, allowed: true, reset: after(sec)}, // week 52 ends
			{at: at("2026-12-28 00:00:00"), cost: 2, allowed: true, reset: after(7 * day)},
			{at: at("2027-01-01 00:00:00"), cost: 1, retry: 3 * day, remaining: left(0), reset: after(3 * day)},
			{at: at("2027-01-03 23:59:59.999999"), cost: 1, retry: µsec},
			{at: at("2027-01-04 00:00:00"), cost: 1, allowed: true, remaining: left(1), reset: after(7 * day)},
		})
	})
	t.Run("clock backward stays in the recorded window", func(t *testing.T) {
		runSteps(t, Policy{Algorithm: FixedWindow, Limit: 1, Calendar: Day, Location: berlin}, []step{
			{at: at("2026-03-29 12:00:00"), cost: 1, allowed: true},
			{at: at("2026-03-28 23:00:00"), cost: 1, retry: 24 * hour}, // the day before had nothing, yet refused
			{at: at("2026-03-30 00:00:00"), cost: 1, allowed: true},
		})
	})
}

func TestCalendarSlidingWindow(t *testing.T) {
	berlin := load(t, "Europe/Berlin")
	at := func(s string) time.Duration { return local(t, berlin, s) }
	t.Run("into Berlin's 25-hour day, weighted by its own length", func(t *testing.T) {
		runSteps(t, Policy{Algorithm: SlidingWindow, Limit: 10, Calendar: Day, Location: berlin}, []step{
			// 10 on the 24th; they weigh on the 25th, which lasts 25 hours, until it ends.
			{at: at("2026-10-24 12:00:00"), cost: 10, allowed: true, remaining: left(0), reset: after(12*hour + 25*hour)},
			// In the next window prev = 10 weighs 10·(25h - e)/25h: a cost of 1 fits once
			// 10·(25h - e) ≤ 9·25h, e = 2.5h: the first 02:30 (CEST) — 2.4h into a 24-hour day.
			{at: at("2026-10-24 12:00:00"), cost: 1, retry: 12*hour + 150*time.Minute},
			{at: at("2026-10-25 00:00:00"), cost: 0, allowed: true, remaining: left(0), reset: after(25 * hour)},
			{at: at("2026-10-25 00:00:00") + 150*time.Minute - µsec, cost: 1, retry: µsec},
			// 12.5h into the day (11:30 CET, the clocks having gone back an hour): half the weight.
			{at: at("2026-10-25 11:30:00"), cost: 0, allowed: true, remaining: left(5), reset: after(12*hour + 30*time.Minute)},
			{at: at("2026-10-25 11:30:00"), cost: 5, allowed: true, remaining: left(0), reset: after(12*hour + 30*time.Minute + 24*hour)},
			// 5 + 1 ≤ 10 in this window once 10·(25h - e) ≤ 4·25h: e = 15h, at 14:00 CET.
			{at: at("2026-10-25 11:30:00"), cost: 1, retry: 150 * time.Minute},
			{at: at("2026-10-25 14:00:00"), cost: 1, allowed: true, remaining: left(0)},
			// The 26th lasts 24h, prev = 6: a cost of 5 fits once 6·(24h - e) ≤ 5·24h, e = 4h.
			{at: at("2026-10-25 14:00:00"), cost: 5, retry: 10*hour + 4*hour},
			{at: at("2026-10-26 04:00:00"), cost: 5, allowed: true, remaining: left(0)},
		})
	})
	t.Run("out of Berlin's 23-hour day", func(t *testing.T) {
		runSteps(t, Policy{Algorithm: SlidingWindow, Limit: 23, Calendar: Day, Location: berlin}, []step{
			{at: at("2026-03-28 23:00:00"), cost: 23, allowed: true, reset: after(hour + 23*hour)},
			// On the 29th (23h) a cost of 1 fits once 23·(23h - e) ≤ 22·23h: e = 1h, 01:00.
			{at: at("2026-03-29 00:00:00"), cost: 1, retry: hour},
			{at: at("2026-03-29 03:00:00"), cost: 0, allowed: true, remaining: left(2), reset: after(21 * hour)}, // e = 2h: 23·21/23 = 21
			{at: at("2026-03-29 03:00:00"), cost: 2, allowed: true, remaining: left(0), reset: after(21*hour + 24*hour)},
		})
	})
	t.Run("leap day: March weighs February by March's 31 days", func(t *testing.T) {
		utc := func(s string) time.Duration { return local(t, time.UTC, s) }
		runSteps(t, Policy{Algorithm: SlidingWindow, Limit: 31, Calendar: Month}, []step{
			{at: utc("2028-02-29 12:00:00"), cost: 31, allowed: true, remaining: left(0), reset: after(12*hour + 31*day)},
			{at: utc("2028-03-01 00:00:00"), cost: 0, allowed: true, remaining: left(0)},
			{at: utc("2028-03-02 00:00:00"), cost: 0, allowed: true, remaining: left(1)}, // 31 - ceil(31·30/31)
			{at: utc("2028-03-02 00:00:00"), cost: 2, retry: day},
			{at: utc("2028-03-03 00:00:00"), cost: 2, allowed: true, remaining: left(0)},
		})
	})
	t.Run("ISO week 53 and the year after it", func(t *testing.T) {
		runSteps(t, Policy{Algorithm: SlidingWindow, Limit: 7, Calendar: Week, Location: berlin}, []step{
			{at: at("2026-12-28 00:00:00"), cost: 7, allowed: true, remaining: left(0), reset: after(14 * day)},
			// Not in week 53; in week 1 of 2027 once 7·(7d - e) ≤ 6·7d: e = 1 day.
			{at: at("2027-01-01 00:00:00"), cost: 1, retry: 3*day + day},
			{at: at("2027-01-04 23:59:59.999999"), cost: 1, retry: µsec},
			{at: at("2027-01-05 00:00:00"), cost: 1, allowed: true, remaining: left(0)},
		})
	})
	t.Run("end of December in a year calendar", func(t *testing.T) {
		runSteps(t, Policy{Algorithm: SlidingWindow, Limit: 365, Calendar: Year, Location: berlin}, []step{
			{at: at("2026-12-31 23:59:59"), cost: 365, allowed: true, reset: after(sec + 365*day)},
			{at: at("2027-01-01 00:00:00"), cost: 0, allowed: true, remaining: left(0)},
			{at: at("2027-01-02 00:00:00"), cost: 0, allowed: true, remaining: left(1)},
		})
	})
}

// A state written under another calendar, another zone or no calendar reads as never seen, and
// a calendar state is never read by a policy with a period; under another limit it keeps its count.
func TestCalendarStateOfAnotherPolicy(t *testing.T) {
	berlin, ny := load(t, "Europe/Berlin"), load(t, "America/New_York")
	now := us(local(t, berlin, "2026-06-10 12:00:00"))
	for _, alg := range []Algorithm{FixedWindow, SlidingWindow} {
		base := Policy{Algorithm: alg, Limit: 4, Calendar: Day, Location: berlin}
		s := new(State)
		if d, err := Decide(&base, s, now, 4); err != nil || !d.Allowed {
			t.Fatalf("%v: %+v, %v", alg, d, err)
		}
		others := []Policy{
			{Algorithm: alg, Limit: 4, Calendar: Week, Location: berlin},
			{Algorithm: alg, Limit: 4, Calendar: Day, Location: ny},
			{Algorithm: alg, Limit: 4, Calendar: Day},
			{Algorithm: alg, Limit: 4, Period: day},
		}
		for _, o := range others {
			if d, err := Decide(&o, clone(s), now, 0); err != nil || d.Remaining != o.Limit || d.ResetAfter != 0 {
				t.Errorf("%v: a state of %v in Berlin read under %+v: %+v, %v; want never seen", alg, base.Calendar, o, d, err)
			}
		}
		if d, _ := Decide(&base, clone(s), now, 0); d.Remaining != 0 {
			t.Errorf("%v: the same policy again: %+v", alg, d)
		}
		raised := base
		raised.Limit = 5
		if d, err := Decide(&raised, clone(s), now, 1); err != nil || !d.Allowed || d.Remaining != 0 {
			t.Errorf("%v: 4 used, the limit raised to 5: %+v, %v; want exactly one more", alg, d, err)
		}
		// The same zone loaded again is the same zone.
		again := base
		again.Location = load(t, "Europe/Berlin")
		if d, _ := Decide(&again, clone(s), now, 0); d.Remaining != 0 {
			t.Errorf("%v: Berlin loaded again: %+v", alg, d)
		}
	}
	// A period state is not a calendar state.
	p := Policy{Algorithm: FixedWindow, Limit: 4, Period: day}
	s := new(State)
	Decide(&p, s, now, 4)
	c := Policy{Algorithm: FixedWindow, Limit: 4, Calendar: Day}
	if d, _ := Decide(&c, s, now, 0); d.Remaining != 4 {
		t.Errorf("a period state read as a calendar one: %+v", d)
	}
}

// WindowOf names calendar windows by their start.
func TestWindowOfCalendar(t *testing.T) {
	berlin := load(t, "Europe/Berlin")
	p := Policy{Algorithm: SlidingWindow, Limit: 1, Calendar: Day, Location: berlin}
	t0 := us(local(t, berlin, "2026-03-29 12:00:00"))
	id, start, end := p.WindowOf(t0)
	if id != start || start != us(local(t, berlin, "2026-03-29 00:00:00")) || end-start != us(23*hour) {
		t.Errorf("WindowOf = %d, [%d, %d)", id, start, end)
	}
	if pid, _, pend := p.WindowOf(start - 1); pend != start || pid != us(local(t, berlin, "2026-03-28 00:00:00")) {
		t.Errorf("the window before: %d ending %d", pid, pend)
	}
	// Far beyond any clock it does not panic.
	for _, x := range []int64{-1 << 63, 1<<63 - 1} {
		p.WindowOf(x)
		Decide(&p, new(State), x, 1)
	}
}
