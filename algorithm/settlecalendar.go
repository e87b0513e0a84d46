package algorithm

// Settlement of calendar policies (fixed-window and sliding-window counting by the calendar, see
// calendarwindow.go), by the rule of settle.go. Their state records the window's start (Window)
// and end (TAT), and for the sliding window the end of the window after it (Frac), not a window
// index under a period: the period's transitions would divide by a period they do not have.

// settleCalendar settles delta = actual - reserved (≠ 0) of a charge made at at, at now, and
// reports whether *s changed. An extra charge never fails: counts saturate at MaxLimit.
func settleCalendar(p *Policy, s *State, at, now, delta int64) bool {
	tag := calendarTag(p)
	current := s.current(p, tag)
	if delta > 0 {
		chargeCalendar(p, s, tag, current, now, delta)
		return true
	}
	if !current {
		return false // the charge was forgotten (idle, or a policy of other numbers since)
	}
	return refundCalendar(p, s, at, now, -delta)
}

// chargeCalendar adds cost to the count of the calendar window holding now (or of the recorded
// one, if the clock ran backward before its end), beyond the limit if need be.
func chargeCalendar(p *Policy, s *State, tag int64, current bool, now, cost int64) {
	if current && now < s.TAT {
		s.Count = addSat(s.Count, cost)
		return
	}
	start, end := calendarWindow(p, now)
	var prev, next int64
	if p.Algorithm == SlidingWindow {
		if current && s.TAT == start {
			prev = s.Count // the recorded window is the one just before now's
		}
		_, next = calendarWindow(p, end)
	}
	s.renewCalendar(p, tag)
	s.Window, s.TAT, s.Frac, s.Count, s.Prev = start, end, next, addSat(0, cost), prev
}

// refundCalendar gives back up to cost units of a charge made at at, while at's window still
// counts: the fixed window's current one; the sliding window's current one or the previous
// (weighted), never more than that window's count.
func refundCalendar(p *Policy, s *State, at, now, cost int64) bool {
	inRecorded := s.Window <= at && at < s.TAT
	take := func(n *int64) bool {
		if *n == 0 {
			return false
		}
		*n -= min(cost, *n)
		return true
	}
	switch {
	case now < s.TAT && inRecorded:
		// at's window is still the current one (now before its end).
		return take(&s.Count)
	case p.Algorithm != SlidingWindow:
		return false // the fixed window: at's window has ended, its count no longer counts
	case now < s.TAT:
		// at's may be the window before the recorded one: its count is Prev.
		if prevStart, _ := calendarWindow(p, s.Window-1); prevStart <= at && at < s.Window {
			return take(&s.Prev)
		}
	case now < s.Frac && inRecorded:
		// The recorded window has ended and is now's previous one, still weighted.
		return take(&s.Count)
	}
	return false
}
