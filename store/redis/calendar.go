package redis

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
)

// CALENDAR POLICIES. A fixed-window or sliding-window policy with a Calendar counts by calendar
// windows (a local day, an ISO week, a month, a year in its Location), which Redis, having no
// time zones, cannot compute. The decision must still be made on Redis's clock, like every
// other: the instance cannot know which window Redis's TIME falls in. So instead of a period the
// store passes the windows around its own clock — the boundaries that Calendar.Window gives for
// the two windows before the instance's, its own and the two after (calendarArg) — and the
// script decides in the one that holds Redis's now (lua/calendar.lua). A Redis clock up to a
// whole window away from the instance's (a day, for a daily quota) still finds its window, the
// one before it and the one after; beyond that the script answers an error, never a decision in
// a wrong window, and the store asks once more with the windows around Redis's time, which the
// error reply carries. Nothing is written by a call that errs, so asking again is safe.

// calendarAlgorithms are the algorithms that take a calendar, as Policy.Validate says.
var calendarAlgorithms = [...]algorithm.Algorithm{algorithm.FixedWindow, algorithm.SlidingWindow}

// calendarBoundaries is how many window boundaries a calendar argument carries: the starts of
// windows -2..+2 around the instance's and the end of +2.
const calendarBoundaries = 6

// maxCalendarMicros bounds the instant whose windows are passed, as the scripts bound now.
const maxCalendarMicros = 1<<60 - 1

// errCalendarRange is wrapped by the error of a calendar decision whose windows neither the
// instance's clock nor Redis's reply could place (an instant beyond 2^60 µs, 36,000 years from
// the epoch; clocks that keep moving by more than a window; a clock run back past the recorded
// window by more than a window).
var errCalendarRange = errors.New("calendar window out of range")

// calendarArg returns the period argument of calendar policy p for a decision near now (µs, the
// instance's clock): "<calendar>@<zone> b1 ... b6" (lua/calendar.lua).
func calendarArg(p *sluice.Policy, now int64) (string, error) {
	c, loc := p.Calendar, p.Location
	if now < -maxCalendarMicros || now > maxCalendarMicros {
		return "", fmt.Errorf("%w: redis store: policy %q: time %dµs is beyond the calendar windows the store decides (|now| < 2^60 µs)",
			errCalendarRange, p.Name, now)
	}
	key := calendarKey{c, loc}
	if e, ok := calendarArgs.Load(key); ok {
		if e := e.(*calendarCacheEntry); e.from <= now && now < e.to {
			return e.arg, nil
		}
	}
	var b [calendarBoundaries]int64
	b[2], b[3] = c.Window(loc, now)
	b[1], _ = c.Window(loc, b[2]-1)
	b[0], _ = c.Window(loc, b[1]-1)
	_, b[4] = c.Window(loc, b[3])
	_, b[5] = c.Window(loc, b[4])
	var s strings.Builder
	s.Grow(len(calendarToken(p)) + calendarBoundaries*18)
	s.WriteString(calendarToken(p))
	for _, x := range b {
		s.WriteByte(' ')
		s.WriteString(strconv.FormatInt(x, 10))
	}
	if calendarCached.Add(1) > maxCalendarCached {
		// Reloads load zones afresh (new *time.Location values): start over now and then
		// rather than keep every one ever seen.
		calendarArgs.Clear()
		calendarCached.Store(1)
	}
	calendarArgs.Store(key, &calendarCacheEntry{from: b[2], to: b[3], arg: s.String()})
	return s.String(), nil
}

// calendarArgs caches calendarArg's work, five lookups of Go's zone rules (10 µs): for each
// calendar and zone, the argument for the instants of one window, the last one asked for. The
// argument is a pure function of the calendar, the zone and the window, so every store shares it.
var (
	calendarArgs   sync.Map // calendarKey → *calendarCacheEntry
	calendarCached atomic.Int64
)

const maxCalendarCached = 4096

type calendarKey struct {
	calendar algorithm.Calendar
	location *time.Location
}

// calendarCacheEntry is the argument for the instants from..to (exclusive): the instance's window.
type calendarCacheEntry struct {
	from, to int64
	arg      string
}

// calendarToken names p's calendar and zone in its argument and in its state's stamp:
// "day@Europe/Berlin". Characters other than letters, digits and /_+- in the zone's name (a
// custom zone's) are written as '_'; nil Location is UTC.
func calendarToken(p *sluice.Policy) string {
	zone := "UTC"
	if p.Location != nil {
		zone = p.Location.String()
	}
	return p.Calendar.String() + "@" + strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '/', r == '_', r == '+', r == '-':
			return r
		}
		return '_'
	}, zone)
}

// periodArg returns p's period argument for a decision near the instance's time now (µs): its
// period in µs, or for a calendar policy its windows.
func periodArg(p *sluice.Policy, now int64) (string, error) {
	if p.Calendar == algorithm.NoCalendar {
		return strconv.FormatInt(p.PeriodMicros(), 10), nil
	}
	return calendarArg(p, now)
}

// instanceNow is the instance's time (µs) around which calendar windows are passed: the store's
// Clock if it has one (it is then also the scripts' now), else the system clock.
func (s *Store) instanceNow() int64 {
	if s.instanceClock != nil {
		return s.instanceClock().UnixMicro()
	}
	if s.clock != nil {
		return s.clock.Now().UnixMicro()
	}
	return time.Now().UnixMicro()
}

// calendarReply is the prefix of the scripts' error reply for a calendar window they cannot
// place, followed by Redis's time: 'ERR sluice: calendar: time <µs> ...'.
const calendarReply = "sluice: calendar: time "

// calendarMiss returns the Redis time of an error reply saying that the calendar windows passed
// do not hold it.
func calendarMiss(err error) (int64, bool) { return replyTime(err, calendarReply) }
