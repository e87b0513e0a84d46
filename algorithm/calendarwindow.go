package algorithm

// Calendar windows: fixed-window and sliding-window counting by the calendar (Policy.Calendar),
// whose windows have lengths of their own (a day of 23, 24 or 25 hours, a month of 28 to 31 days).
// The transitions below assume CheckCost passed; they are the ones of fixedwindow.go and
// slidingwindow.go with the window [start, end) taken from the calendar instead of from
// floor(now/period).
//
// Their state (see State) records, besides the counts, the current window's start (Window) and
// end (TAT), and for the sliding window the end of the window after it (Frac), so that a decision
// inside a recorded window does no zone arithmetic at all: a new window's boundaries are looked up
// once, when its first request is approved. State.Period holds calendarTag, a negative number
// that no period can be, naming the calendar and the zone: a state written under another
// calendar or zone, or with no calendar, reads as never seen.

// calendarEdge bounds the instants handed to the zone arithmetic: beyond ±2^62 µs (146,000 years)
// decisions are not exact anyway (see Decide), and near the ends of int64 the calendar's dates
// overflow. Clamping keeps such a request from panicking.
const calendarEdge = 1 << 62

func clampCalendar(t int64) int64 { return min(max(t, -calendarEdge), calendarEdge) }

// calendarWindow is p's calendar window holding t.
func calendarWindow(p *Policy, t int64) (start, end int64) {
	return p.Calendar.Window(p.Location, clampCalendar(t))
}

// calendarTag is what State.Period holds for a calendar policy: the top bit set (negative, so
// never a period), the calendar in the low 3 bits, and an FNV-1a hash of the zone's name in the
// rest. The name, not the *time.Location, so that every instance (and a reload that loads the
// zone again) agrees.
func calendarTag(p *Policy) int64 {
	name := "UTC"
	if p.Location != nil {
		name = p.Location.String()
	}
	h := uint64(14695981039346656037)
	for i := 0; i < len(name); i++ {
		h ^= uint64(name[i])
		h *= 1099511628211
	}
	return int64(h&^7 | 1<<63 | uint64(p.Calendar&7))
}

// renewCalendar makes s a fresh calendar state of p (tag = calendarTag(p)), unless it already is
// one (of any limit: its counts are kept, and it takes p's limit).
func (s *State) renewCalendar(p *Policy, tag int64) {
	if !s.current(p, tag) {
		*s = State{Alg: p.Algorithm, Limit: p.Limit, Period: tag}
	}
	s.Limit = p.Limit
}

// calendarFixed: count the cost approved in the calendar window [start, end) holding now;
// approve iff count + cost ≤ limit. A refusal holds, and the count lasts, until end, the next
// local boundary.
func calendarFixed(p *Policy, s *State, now, cost int64, d *Decision) error {
	tag, limit := calendarTag(p), p.Limit
	var start, end, count int64
	if s.current(p, tag) && now < s.TAT {
		// In the recorded window, or before it if the clock ran backward: stay in it.
		start, end, count = s.Window, s.TAT, s.Count
	} else {
		start, end = calendarWindow(p, now)
	}
	allowed := count+cost <= limit
	var retry, reset int64
	if allowed {
		if cost > 0 {
			count += cost
			s.renewCalendar(p, tag)
			s.Window, s.TAT, s.Count = start, end, count
		}
	} else {
		retry = end - now
	}
	if count > 0 {
		reset = end - now
	}
	d.set(allowed, limit, max(0, limit-count), retry, reset, 0) // (count > limit after a settlement charged beyond it)
	return nil
}

// calendarSliding: the sliding-window counter over calendar windows. With cur the cost approved
// in the window [start, end) holding now, prev that of the window before it (the one holding
// start-1, which may be longer or shorter), L = end - start the CURRENT window's length and
// e = now - start, the previous window is weighted by the share of the current one still to run:
//
//	approve iff prev·(L - e) + (cur + cost)·L ≤ limit·L
//
// (prev·(1 - e/L) + cur + cost ≤ limit), exact in 128-bit integers. A refusal's RetryAfter may
// point into the next window, of another length L2: there prev' = cur, cur' = 0.
func calendarSliding(p *Policy, s *State, now, cost int64, d *Decision) error {
	tag, limit := calendarTag(p), p.Limit
	at := now // the instant decided at; later than now only if the clock ran backward
	var start, end, next, prev, cur int64
	inRecorded := s.current(p, tag) && now < s.TAT
	if inRecorded {
		// In the recorded window, or before it if the clock ran backward: then decide at its start.
		start, end, next, prev, cur = s.Window, s.TAT, s.Frac, s.Prev, s.Count
		at = max(now, start)
	} else {
		start, end = calendarWindow(p, now)
		if s.current(p, tag) && s.TAT == start {
			prev = s.Count // the recorded window is the one just before (windows are contiguous)
		}
	}
	n := end - start
	e := at - start
	allowed := mul(prev, n-e).add(mul(cur+cost, n)).lessEq(mul(limit, n))
	var retry, reset int64
	if allowed {
		if cost > 0 {
			if !inRecorded {
				_, next = calendarWindow(p, end)
			}
			cur += cost
			s.renewCalendar(p, tag)
			s.Window, s.TAT, s.Frac, s.Count, s.Prev = start, end, next, cur, prev
		}
	} else if cur+cost <= limit {
		// Approved later in this window, once prev·(L - e') ≤ (limit - cur - cost)·L.
		x, _ := mul(limit-cur-cost, n).divmod(prev)
		retry = end - x - now
	} else {
		// Not in this window (so cur > 0: the state is recorded in it and next is known); in the
		// next one, of length L2, the request is approved at e'' = L2 - floor((limit - cost)·L2 / cur).
		n2 := next - end
		x, _ := mul(limit-cost, n2).divmod(cur)
		retry = next - x - now
	}
	// Remaining = limit - cur - ceil(prev·(L - e)/L), never below 0.
	remaining := limit - cur
	if prev > 0 {
		remaining -= mul(prev, n-e).divCeil(n)
	}
	switch {
	case cur > 0:
		reset = next - now
	case prev > 0:
		reset = end - now
	}
	d.set(allowed, limit, max(0, remaining), retry, reset, 0)
	return nil
}

// CalendarIn names a calendar policy's windows as a person writes them: "day in Europe/Berlin",
// "month in UTC" (weeks are ISO weeks, from Monday); "" for a policy with a period. Descriptions
// of a policy (answers, metrics, the CLI) say "per" it where they would say the period.
func (p *Policy) CalendarIn() string {
	if p.Calendar == NoCalendar {
		return ""
	}
	zone := "UTC"
	if p.Location != nil {
		zone = p.Location.String()
	}
	return p.Calendar.String() + " in " + zone
}
