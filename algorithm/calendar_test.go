package algorithm

import (
	"testing"
	"time"
)

// firstOn is the model of a day's start: the first instant (µs) whose local date in loc is on or
// after (y, m, d), found by bisection (the local date never goes backward).
func firstOn(loc *time.Location, y int, m time.Month, d int) int64 {
	want := civil(time.Date(y, m, d, 12, 0, 0, 0, time.UTC))
	lo := time.Date(y, m, d, 0, 0, 0, 0, time.UTC).Add(-36 * time.Hour).UnixMicro() // before it in every zone
	hi := time.Date(y, m, d, 0, 0, 0, 0, time.UTC).Add(36 * time.Hour).UnixMicro()  // on or after it
	for lo+1 < hi {
		mid := lo + (hi-lo)/2
		if civil(time.UnixMicro(mid).In(loc)) >= want {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi
}

func load(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

// Every day's, week's, month's and year's window from 2000 to 2035, in zones with every kind of
// change (an hour at 02:00, midnight skipped, midnight twice, half an hour, a day skipped),
// against the bisection model, probed at its first and last µs.
func TestCalendarWindowModel(t *testing.T) {
	zones := []string{"UTC", "Europe/Berlin", "America/New_York", "America/Santiago", "America/Havana",
		"Atlantic/Azores", "America/Sao_Paulo", "Australia/Lord_Howe", "Pacific/Apia", "Asia/Kolkata", "Pacific/Chatham"}
	for _, z := range zones {
		loc := load(t, z)
		for day := time.Date(2000, 1, 1, 12, 0, 0, 0, time.UTC); day.Year() < 2036; day = day.AddDate(0, 0, 1) {
			y, m, d := day.Date()
			s := firstOn(loc, y, m, d)
			if civil(time.UnixMicro(s).In(loc)) != civil(day) {
				continue // a day the zone skipped (Apia, 2011-12-30)
			}
			nd := day.AddDate(0, 0, 1)
			e := firstOn(loc, nd.Year(), nd.Month(), nd.Day())
			for _, at := range []int64{s, e - 1, s + (e-s)/2} {
				if gs, ge := Day.Window(loc, at); gs != s || ge != e {
					t.Fatalf("%s %s: Day.Window(%d) = [%d, %d), want [%d, %d)", z, day.Format("2006-01-02"), at, gs, ge, s, e)
				}
			}
			if d == 1 {
				nm := time.Date(y, m+1, 1, 12, 0, 0, 0, time.UTC)
				me := firstOn(loc, nm.Year(), nm.Month(), 1)
				if gs, ge := Month.Window(loc, s); gs != s || ge != me {
					t.Fatalf("%s %s: Month.Window = [%d, %d), want [%d, %d)", z, day.Format("2006-01"), gs, ge, s, me)
				}
				if gs, ge := Month.Window(loc, me-1); gs != s || ge != me {
					t.Fatalf("%s %s: Month.Window(end-1) = [%d, %d), want [%d, %d)", z, day.Format("2006-01"), gs, ge, s, me)
				}
				if m == 1 {
					ye := firstOn(loc, y+1, 1, 1)
					if gs, ge := Year.Window(loc, ye-1); gs != s || ge != ye {
						t.Fatalf("%s %d: Year.Window = [%d, %d), want [%d, %d)", z, y, gs, ge, s, ye)
					}
				}
			}
			if day.Weekday() == time.Monday {
				nw := day.AddDate(0, 0, 7)
				we := firstOn(loc, nw.Year(), nw.Month(), nw.Day())
				for _, at := range []int64{s, we - 1} {
					if gs, ge := Week.Window(loc, at); gs != s || ge != we {
						t.Fatalf("%s week of %s: Week.Window(%d) = [%d, %d), want [%d, %d)", z, day.Format("2006-01-02"), at, gs, ge, s, we)
					}
				}
			}
		}
	}
}

// The edges the documentation names, as a table of explicit instants.
func TestCalendarWindowEdges(t *testing.T) {
	berlin := load(t, "Europe/Berlin")
	at := func(loc *time.Location, s string) int64 {
		v, err := time.ParseInLocation("2006-01-02 15:04:05", s, loc)
		if err != nil {
			t.Fatal(err)
		}
		return v.UnixMicro()
	}
	for _, c := range []struct {
		cal        Calendar
		loc        *time.Location
		t          string
		start, end string
		hours      int64
	}{
		{Day, berlin, "2026-03-29 12:00:00", "2026-03-29 00:00:00", "2026-03-30 00:00:00", 23},
		{Day, berlin, "2026-03-28 23:59:59", "2026-03-28 00:00:00", "2026-03-29 00:00:00", 24},
		{Day, berlin, "2026-10-25 02:30:00", "2026-10-25 00:00:00", "2026-10-26 00:00:00", 25},
		{Day, time.UTC, "2028-02-29 06:00:00", "2028-02-29 00:00:00", "2028-03-01 00:00:00", 24},
		{Month, time.UTC, "2028-02-15 00:00:00", "2028-02-01 00:00:00", "2028-03-01 00:00:00", 29 * 24},
		{Month, time.UTC, "2027-02-15 00:00:00", "2027-02-01 00:00:00", "2027-03-01 00:00:00", 28 * 24},
		{Month, berlin, "2026-03-31 23:59:59", "2026-03-01 00:00:00", "2026-04-01 00:00:00", 31*24 - 1},
		{Month, berlin, "2026-12-31 23:59:59", "2026-12-01 00:00:00", "2027-01-01 00:00:00", 31 * 24},
		{Year, berlin, "2026-12-31 23:59:59", "2026-01-01 00:00:00", "2027-01-01 00:00:00", 365 * 24},
		{Year, time.UTC, "2028-07-01 00:00:00", "2028-01-01 00:00:00", "2029-01-01 00:00:00", 366 * 24},
		// ISO week 53 of 2026: Monday 28 December to Monday 4 January 2027.
		{Week, berlin, "2027-01-03 23:59:59", "2026-12-28 00:00:00", "2027-01-04 00:00:00", 7 * 24},
		{Week, berlin, "2026-12-28 00:00:00", "2026-12-28 00:00:00", "2027-01-04 00:00:00", 7 * 24},
		{Week, berlin, "2026-03-29 23:00:00", "2026-03-23 00:00:00", "2026-03-30 00:00:00", 7*24 - 1},
	} {
		s, e := c.cal.Window(c.loc, at(c.loc, c.t))
		if s != at(c.loc, c.start) || e != at(c.loc, c.end) || (e-s) != c.hours*3600e6 {
			t.Errorf("%v in %v at %s: [%s, %s) %dh, want [%s, %s) %dh", c.cal, c.loc, c.t,
				time.UnixMicro(s).In(c.loc), time.UnixMicro(e).In(c.loc), (e-s)/3600e6, c.start, c.end, c.hours)
		}
	}
	// Santiago skips midnight on 2026-09-06: the day starts at the change, 00:00 -04 = 01:00 -03.
	santiago := load(t, "America/Santiago")
	s, _ := Day.Window(santiago, at(santiago, "2026-09-06 12:00:00"))
	if got := time.UnixMicro(s).In(santiago).Format("2006-01-02 15:04 -07"); got != "2026-09-06 01:00 -03" {
		t.Errorf("Santiago 2026-09-06 starts at %s", got)
	}
}

func TestParseCalendar(t *testing.T) {
	for c := Day; c <= Year; c++ {
		if got, err := ParseCalendar(c.String()); err != nil || got != c {
			t.Errorf("ParseCalendar(%q) = %v, %v", c.String(), got, err)
		}
	}
	if _, err := ParseCalendar("fortnight"); err == nil {
		t.Error("ParseCalendar(fortnight) did not fail")
	}
	var c Calendar
	if err := c.UnmarshalText([]byte("month")); err != nil || c != Month {
		t.Errorf("UnmarshalText(month) = %v, %v", c, err)
	}
	if b, err := NoCalendar.MarshalText(); err != nil || len(b) != 0 {
		t.Errorf("NoCalendar.MarshalText = %q, %v; want \"\" (a Policy without a calendar must encode)", b, err)
	}
	if err := c.UnmarshalText(nil); err != nil || c != NoCalendar {
		t.Errorf("UnmarshalText(\"\") = %v, %v", c, err)
	}
	if _, err := Calendar(9).MarshalText(); err == nil {
		t.Error("Calendar(9).MarshalText did not fail")
	}
}
