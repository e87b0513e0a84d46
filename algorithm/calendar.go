package algorithm

import (
	"fmt"
	"time"
)

// Calendar names a calendar period that a window algorithm can count by instead of a fixed
// Period: "10,000 a day", "1 million a month". The zero value is no calendar.
//
// Calendar windows start at local midnight in the policy's Location: a day at 00:00, an ISO week
// on Monday at 00:00, a month on its 1st, a year on 1 January. They follow the zone's rules, so a
// day across a daylight-saving change lasts 23 or 25 hours, and months 28 to 31 days. In the rare
// zones whose clocks skip midnight itself (America/Santiago's spring change), the day starts at
// the first instant that is on it, the change; where midnight happens twice, at the first.
type Calendar uint8

const (
	NoCalendar Calendar = iota
	Day                 // "day": from local midnight to the next
	Week                // "week": ISO weeks, from Monday 00:00 to the next Monday
	Month               // "month": from the 1st at 00:00 to the next month's
	Year                // "year": from 1 January 00:00 to the next
)

var calendarNames = [...]string{"", "day", "week", "month", "year"}

func (c Calendar) String() string {
	if int(c) < len(calendarNames) {
		return calendarNames[c]
	}
	return fmt.Sprintf("Calendar(%d)", uint8(c))
}

// ParseCalendar returns the calendar named s ("day", "week", "month", "year").
func ParseCalendar(s string) (Calendar, error) {
	for c := Day; c <= Year; c++ {
		if s == c.String() {
			return c, nil
		}
	}
	return NoCalendar, fmt.Errorf("unknown calendar %q (want one of day, week, month, year)", s)
}

// MarshalText and UnmarshalText let configuration formats spell a Calendar by name; no calendar
// is the empty string, so that a Policy without one encodes (JSON, say) and decodes back.
func (c Calendar) MarshalText() ([]byte, error) {
	if int(c) >= len(calendarNames) {
		return nil, fmt.Errorf("invalid calendar %d", uint8(c))
	}
	return []byte(c.String()), nil
}

func (c *Calendar) UnmarshalText(b []byte) error {
	if len(b) == 0 {
		*c = NoCalendar
		return nil
	}
	v, err := ParseCalendar(string(b))
	if err != nil {
		return err
	}
	*c = v
	return nil
}

// Window returns the calendar window of c that holds instant t (µs since the Unix epoch) in loc
// (nil: UTC): its start and its end (exclusive), in µs. start ≤ t < end. c must be a calendar.
//
// It is pure: the same zone data give the same windows on every instance; Redis, which has no
// time zones, is handed the boundaries this computes (see the Redis store).
func (c Calendar) Window(loc *time.Location, t int64) (start, end int64) {
	if loc == nil {
		loc = time.UTC
	}
	lt := time.UnixMicro(t).In(loc)
	y, m, d := lt.Date()
	var from, to [3]int // (year, month, day) of the first day of this window and of the next
	switch c {
	case Day:
		from, to = [3]int{y, int(m), d}, [3]int{y, int(m), d + 1}
	case Week:
		wd := (int(lt.Weekday()) + 6) % 7 // days since Monday
		from, to = [3]int{y, int(m), d - wd}, [3]int{y, int(m), d - wd + 7}
	case Month:
		from, to = [3]int{y, int(m), 1}, [3]int{y, int(m) + 1, 1}
	case Year:
		from, to = [3]int{y, 1, 1}, [3]int{y + 1, 1, 1}
	default:
		panic(fmt.Sprintf("algorithm: Calendar.Window of %v", c))
	}
	start, end = dayStart(loc, from), dayStart(loc, to)
	// Between a day's first instant and t there can be no other (the local date never goes
	// backward), so these hold; the guard keeps a broken zone file from looping a caller.
	if !(start <= t && t < end) {
		panic(fmt.Sprintf("algorithm: calendar window [%d, %d) does not hold %d in %v", start, end, t, loc))
	}
	return start, end
}

// dayStart returns the first instant (µs) whose local date in loc is on or after ymd (which may be
// denormalised: day 32 is the next month's 1st).
func dayStart(loc *time.Location, ymd [3]int) int64 {
	c := time.Date(ymd[0], time.Month(ymd[1]), ymd[2], 0, 0, 0, 0, loc)
	want := civil(time.Date(ymd[0], time.Month(ymd[1]), ymd[2], 12, 0, 0, 0, time.UTC))
	switch {
	case civil(c) < want:
		// Local midnight does not exist (the clocks jump from 23:59:59 to 01:00), and Date
		// resolved it to an instant of the day before: the day starts at the change.
		_, next := c.ZoneBounds()
		c = next
	default:
		// Midnight may exist twice (the clocks go back across it): the day starts at the
		// earlier one, in the zone before the change, if Date picked the later.
		if zs, _ := c.ZoneBounds(); !zs.IsZero() && zs.After(c.Add(-25*time.Hour)) {
			before := zs.Add(-time.Nanosecond)
			_, off := before.Zone()
			e := time.Date(ymd[0], time.Month(ymd[1]), ymd[2], 0, 0, 0, 0, time.FixedZone("", off))
			if e.Before(zs) && civil(e.In(loc)) >= want {
				c = e
			}
		}
	}
	return c.UnixMicro()
}

// civil orders local dates: y·10000 + m·100 + d.
func civil(t time.Time) int {
	y, m, d := t.Date()
	return y*10000 + int(m)*100 + d
}
