package envoyconf

import (
	"strconv"
	"strings"
	"time"
)

// Unit is the time unit of a limit. Its values are the numbers of Envoy's
// RateLimitResponse.RateLimit.Unit (and of envoy.type.v3.RateLimitUnit, which a request's own
// limit uses), so that a server converts between them with a cast.
type Unit int32

// The units. WEEK is numbered after YEAR, as in Envoy's enumeration.
const (
	UnknownUnit Unit = 0
	Second      Unit = 1
	Minute      Unit = 2
	Hour        Unit = 3
	Day         Unit = 4
	Month       Unit = 5
	Year        Unit = 6
	Week        Unit = 7
)

var unitNames = [...]string{"unknown", "second", "minute", "hour", "day", "month", "year", "week"}

// unitList is how error messages list the units, shortest first.
const unitList = "second, minute, hour, day, week, month or year"

// String returns the unit as a configuration file spells it ("second").
func (u Unit) String() string {
	if u >= 0 && int(u) < len(unitNames) {
		return unitNames[u]
	}
	return "Unit(" + strconv.Itoa(int(u)) + ")"
}

// Valid reports whether u is one of Second ... Week.
func (u Unit) Valid() bool { return u >= Second && u <= Week }

// Duration is the unit's length, the divider the windows are aligned to: a minute is 60 s, a day
// 86,400 s, a week 7 days, a month 30 days and a year 365 days (calendar months and years are not
// used: every window is floor(now / length), counted from the Unix epoch). 0 for an invalid unit.
func (u Unit) Duration() time.Duration {
	const day = 24 * time.Hour
	switch u {
	case Second:
		return time.Second
	case Minute:
		return time.Minute
	case Hour:
		return time.Hour
	case Day:
		return day
	case Week:
		return 7 * day
	case Month:
		return 30 * day
	case Year:
		return 365 * day
	}
	return 0
}

// parseUnit reads a unit as the reference service does: the name upper-cased (Go's
// strings.ToUpper, so "Second" and "SECOND" are second too) and looked up among Envoy's enum
// names; "unknown" is a name there but not a unit.
func parseUnit(s string) (Unit, bool) {
	up := strings.ToUpper(s)
	for u := Second; u <= Week; u++ {
		if up == strings.ToUpper(unitNames[u]) {
			return u, true
		}
	}
	return UnknownUnit, false
}
