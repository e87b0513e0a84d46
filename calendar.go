package sluice

import "github.com/sluicehq/sluice/algorithm"

// Calendar names the calendar a fixed-window or sliding-window policy counts by instead of a
// period (Policy.Calendar, in Policy.Location): windows from local midnight to midnight, Monday
// to Monday (ISO weeks), the 1st to the 1st, 1 January to 1 January, through daylight-saving
// changes. See algorithm.Calendar.
type Calendar = algorithm.Calendar

// The calendars.
const (
	NoCalendar = algorithm.NoCalendar
	Day        = algorithm.Day
	Week       = algorithm.Week
	Month      = algorithm.Month
	Year       = algorithm.Year
)

// ParseCalendar returns the calendar named s ("day", "week", "month", "year").
func ParseCalendar(s string) (Calendar, error) { return algorithm.ParseCalendar(s) }
