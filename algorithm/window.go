package algorithm

// WindowOf returns the window of a window algorithm (fixed-window, sliding-window) under p that
// holds instant t (µs): the id State.Window records for it, and its start and end (exclusive), in
// µs. The window before it is WindowOf(start - 1).
//
// For a fixed period the id is the window's index, floor(t/period); for a calendar policy it is
// the window's start, and the windows have the calendar's lengths in p.Location (instants beyond
// ±2^62 µs are taken as ±2^62).
//
// Every piece of code that needs the window of an instant (a decision, a settlement, a store that
// passes boundaries to Redis) asks here, so that fixed periods and calendar windows agree.
func (p *Policy) WindowOf(t int64) (id, start, end int64) {
	if p.Calendar != NoCalendar {
		start, end = calendarWindow(p, t)
		return start, start, end
	}
	period := p.PeriodMicros()
	id = floorDiv(t, period)
	return id, id * period, (id + 1) * period
}
