package scenario

import (
	"fmt"
	"math/bits"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/sim"
)

// The keys of calendar windows and settled costs, named as `sluice simulate`'s flags
// (--calendar, --time-zone, --start); actual is the trace column the page's requests get.
const (
	KeyCalendar = "calendar"  // none, day, week, month or year
	KeyTimeZone = "time-zone" // an IANA zone; with a calendar only; default UTC
	KeyStart    = "start"     // RFC 3339: the instant the virtual clock's 0 stands for
	KeyActual   = "actual"    // each request's real cost: "7", or a range "1-20" drawn from the scenario's random stream (Scenario.Draw)
)

// DefaultStart is the start of a calendar scenario that gives none: local midnight of this day
// in the scenario's zone, the Saturday before Europe's spring daylight-saving change, so that a
// day calendar over three days shows a 23-hour day.
var DefaultStart = struct{ Year, Month, Day int }{2026, 3, 28}

// Actual is the real cost of each request, known once it has been served: every request is
// charged its cost (1) up front and settled at its real cost right after its decision, as a
// gateway with cost_from settles model tokens. The zero Actual is none: requests cost their
// estimate. Min == Max is a fixed real cost; otherwise each request's is drawn from Min..Max
// (see Scenario.Actuals).
type Actual struct {
	Min, Max int64
	Set      bool
}

func (a Actual) String() string {
	switch {
	case !a.Set:
		return ""
	case a.Min == a.Max:
		return strconv.FormatInt(a.Min, 10)
	}
	return strconv.FormatInt(a.Min, 10) + "-" + strconv.FormatInt(a.Max, 10)
}

// parseActual reads "N" or "A-B" (0 ≤ A ≤ B ≤ 2^53); the message is "" if it is one.
func parseActual(text string) (Actual, string) {
	lo, hi, isRange := strings.Cut(text, "-")
	lo, hi = strings.TrimSpace(lo), strings.TrimSpace(hi)
	if lo == "" || isRange && hi == "" {
		return Actual{}, fmt.Sprintf("%q is not a real cost: want a whole number such as 7, or a range such as 1-20", text)
	}
	a, msg := parseCount(lo, 0)
	if msg != "" {
		return Actual{}, msg + " (want a real cost such as 7, or a range such as 1-20)"
	}
	b := a
	if isRange {
		if b, msg = parseCount(hi, 0); msg != "" {
			return Actual{}, msg + " (want a range such as 1-20)"
		}
		if b < a {
			return Actual{}, fmt.Sprintf("%d-%d is an empty range: the first number must be ≤ the second", a, b)
		}
	}
	return Actual{Min: a, Max: b, Set: true}, ""
}

// actualStream is the PCG stream of the real costs (the text "actual" as a number): with Draw,
// it fixes every draw, and it is not the jitter's, so that changing one does not move the other.
const actualStream = 0x61637475616c

// Actuals returns the real cost of each of n requests in time order (sim.Options.Actual), nil
// without Actual. With a range, the i-th is Min + floor(x_i · (Max-Min+1) / 2^64) for the i-th
// output x_i of math/rand/v2's PCG started from (Draw, 0x61637475616c).
func (sc *Scenario) Actuals(n int) []int64 {
	a := sc.Actual
	if !a.Set {
		return nil
	}
	out := make([]int64, n)
	if a.Min == a.Max {
		for i := range out {
			out[i] = a.Min
		}
		return out
	}
	span := uint64(a.Max-a.Min) + 1 // ≤ 2^53 + 1
	rng := rand.NewPCG(sc.Draw, actualStream)
	for i := range out {
		x, _ := bits.Mul64(rng.Uint64(), span)
		out[i] = a.Min + int64(x)
	}
	return out
}

// parseCalendarKeys reads calendar, time-zone and start into sc, and reports whether a calendar
// was asked for (even a misspelt one, so that Parse does not also ask for a period); the shared
// period and burst, and the per-algorithm overrides, are checked against the calendar by Parse.
func parseCalendarKeys(sc *Scenario, get func(string) (string, bool), fail func(field, format string, args ...any)) (calendar bool) {
	if text, ok := get(KeyCalendar); ok && text != "" && text != "none" {
		calendar = true
		c, err := sluice.ParseCalendar(text)
		if err != nil {
			fail(KeyCalendar, "%q: want none, day, week, month or year", text)
		}
		sc.Calendar = c
	}
	if text, ok := get(KeyTimeZone); ok && text != "" {
		switch loc, err := time.LoadLocation(text); {
		case !calendar:
			fail(KeyTimeZone, "needs a calendar: a period's windows are the same in every zone")
		case text == "Local" || err != nil:
			fail(KeyTimeZone, "%q is not a known IANA time zone (e.g. Europe/Berlin, America/New_York, UTC)", text)
		case loc != time.UTC: // UTC is the default: one address for it
			sc.Location = loc
		}
	}
	if text, ok := get(KeyStart); ok && text != "" {
		t, msg := parseStart(text)
		if msg != "" {
			fail(KeyStart, "%s", msg)
		}
		sc.Start = t
	} else if sc.Calendar != sluice.NoCalendar {
		loc := sc.Location
		if loc == nil {
			loc = time.UTC
		}
		d := DefaultStart
		// Written and read back, so that it is the very value its address gives.
		sc.Start, _ = parseStart(time.Date(d.Year, time.Month(d.Month), d.Day, 0, 0, 0, 0, loc).Format(time.RFC3339Nano))
	}
	return calendar
}

// parseStart reads an RFC 3339 time of whole µs; the message is "" if it is one.
func parseStart(text string) (time.Time, string) {
	t, err := time.Parse(time.RFC3339Nano, text)
	switch {
	case err != nil:
		return time.Time{}, fmt.Sprintf("%q is not an RFC 3339 time (want e.g. 2026-03-28T00:00:00+01:00)", text)
	case t.Nanosecond()%1000 != 0:
		return time.Time{}, fmt.Sprintf("%s must be a whole number of microseconds", text)
	}
	return t, ""
}

// formatStart writes a start as Encode and the commands do.
func formatStart(t time.Time) string { return t.Format(time.RFC3339Nano) }

// calendarPolicies returns the policies of a calendar scenario: fixed-window and sliding-window
// (sim.CalendarPolicies), with their own limits.
func (sc *Scenario) calendarPolicies() []sluice.Policy {
	ps := sim.CalendarPolicies(sc.Limit, sc.Calendar, sc.Location)
	for i := range ps {
		if o := sc.Own[algorithmIndex(ps[i].Algorithm)]; o.Limit != 0 {
			ps[i].Limit = o.Limit
		}
	}
	return ps
}

func algorithmIndex(a sluice.Algorithm) int {
	for i, b := range algorithm.Algorithms {
		if a == b {
			return i
		}
	}
	return -1
}

// hasCalendar reports whether a runs under a calendar: fixed-window and sliding-window do.
func hasCalendar(a sluice.Algorithm) bool {
	for _, b := range sim.CalendarAlgorithms {
		if a == b {
			return true
		}
	}
	return false
}

// Options are the sim.Options of the scenario's runs (Start, the fleet; the real costs are per run).
func (sc *Scenario) Options() sim.Options {
	return sim.Options{Start: sc.Start, Fleet: sc.fleet(), Changes: sc.Changes}
}

// Window is one calendar window on the timeline, in virtual µs: [StartMicros, EndMicros).
type Window struct {
	StartMicros, EndMicros int64
	Label                  string // its local start and length: "Sun 2026-03-29, 23h"
	Short                  string // its name where there is little room: "Sun 29", "W53", "Feb", "2027"
}

// MaxWindows bounds the windows a Result lists (a day calendar over years would be too many
// markers to draw); beyond it, Windows is empty.
const MaxWindows = 400

// windows lists the calendar windows that begin before end (µs), the first the one holding 0.
func windows(sc *Scenario, p sluice.Policy, end int64) []Window {
	if p.Calendar == sluice.NoCalendar {
		return nil
	}
	o := sc.Options()
	var ws []Window
	for t := int64(0); t < end; {
		s, e, _ := o.Window(&p, t)
		if len(ws) == MaxWindows {
			return nil
		}
		local := o.Instant(&p, s)
		ws = append(ws, Window{StartMicros: s, EndMicros: e,
			Label: windowLabel(p.Calendar, local) + ", " + sim.FormatDuration(e-s), Short: windowShort(p.Calendar, local)})
		t = e
	}
	return ws
}

// windowLabel names the calendar window starting at local time t: Sun 2026-03-29, the week of
// 2026-12-28 (ISO week 53), 2028-02, 2027.
func windowLabel(c sluice.Calendar, t time.Time) string {
	return sim.WindowName(c, t, "Mon 2006-01-02")
}

// windowShort is windowLabel in a few characters.
func windowShort(c sluice.Calendar, t time.Time) string {
	switch c {
	case sluice.Week:
		_, wk := t.ISOWeek()
		return fmt.Sprintf("W%d", wk)
	case sluice.Month:
		return t.Format("Jan")
	case sluice.Year:
		return t.Format("2006")
	}
	return t.Format("Mon 2")
}

// describeCalendar says in words what a calendar policy does, for the page's cards.
func describeCalendar(p sluice.Policy) string {
	zone := p.Location.String() // nil is UTC, and says so
	var window string
	switch p.Calendar {
	case sluice.Day:
		window = "day, from local midnight to the next (23 or 25 hours when the clocks change)"
	case sluice.Week:
		window = "ISO week, from Monday 00:00 to the next Monday"
	case sluice.Month:
		window = "month, from the 1st at 00:00 to the next month's"
	case sluice.Year:
		window = "year, from 1 January 00:00 to the next"
	}
	if p.Algorithm == sluice.SlidingWindow {
		return fmt.Sprintf("At most %d per %s in %s, counting the previous %s's requests in proportion to how much of it is still within the last %s's length: each %s.",
			p.Limit, p.Calendar, zone, p.Calendar, p.Calendar, window)
	}
	return fmt.Sprintf("At most %d in each calendar %s in %s.", p.Limit, window, zone)
}

// Instant writes virtual time tMicros as a person reads it, in the calendar's zone (else the
// start's offset): "Sun 2026-03-29 03:00:00 +02:00"; "" for a scenario that runs from Unix time 0
// without a calendar, whose times are the clock's.
func (sc *Scenario) Instant(tMicros int64) string {
	if sc.Start.IsZero() && sc.Calendar == sluice.NoCalendar {
		return ""
	}
	p := sluice.Policy{Calendar: sc.Calendar, Location: sc.Location}
	return sc.Options().Instant(&p, tMicros).Format("Mon 2006-01-02 15:04:05 -07:00")
}
