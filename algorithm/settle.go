package algorithm

import "fmt"

// SETTLEMENT. A request whose real cost is known only after its response (the model tokens an
// upstream reports, a login that failed) is charged an estimate up front, reserved, by a
// Decide at the instant at; Settle then corrects the key's state at now, when the real cost,
// actual, is known. delta = actual - reserved:
//
//   - delta > 0: the extra is charged at now, always, even beyond the limit: the balance goes below
//     zero (a window's count above its limit, a bucket's tat beyond now + capacity·T), so the
//     client's next requests wait until it is paid off, and their RetryAfter stays exact.
//   - delta < 0: -delta is refunded, but never more than the charge still counts: a window gives
//     back only while at's window is still counted (fixed window: the current one; sliding
//     window: the current one or the previous, weighted; sliding log: the entry at at, while it
//     has not expired); a bucket gives back only the part of the charge still ahead of now,
//     counted from at — a charge of r units at at is r·T of the bucket's time from at — and never
//     below now, so a bucket that has refilled meanwhile gets nothing extra.
//
// So a reservation never gives back more than it took, whatever happened between at and now,
// and settling actual == reserved changes nothing. With no other traffic between them, a charge
// and its settlement leave the key as a charge of actual at at would (for the buckets: if the
// bucket was full at at, or the settlement comes within actual·T of it; otherwise the refund
// errs by at most now - at of the bucket's time towards the limiter, since the charge's place in
// a queue ahead of at is not known).
//
// Counts saturate at MaxLimit (already at or above any limit: a window so charged refuses until
// it ends either way), so that every number stays exact in a double (the Redis scripts).

// Settle settles, at now (µs), a charge of reserved units made at instant at (µs, the Decide's
// now: Decision.At) on the key whose state is *s, with the real cost actual, under the validated
// policy p. It reports whether *s changed. reserved and actual must be in 0..MaxLimit.
//
// Like Decide it is pure, exact and allocates nothing (the sliding log aside, which may append an
// entry for an extra charge).
func Settle(p *Policy, s *State, at, now, reserved, actual int64) (bool, error) {
	if err := CheckSettle(p, reserved, actual); err != nil {
		return false, err
	}
	delta := actual - reserved
	if delta == 0 {
		return false, nil
	}
	if delta > 0 {
		changed, ok := charge(p, s, now, delta)
		if !ok {
			return false, fmt.Errorf("%w: an extra charge of %d would delay the key beyond any clock", ErrCostExceedsLimit, delta)
		}
		return changed, nil
	}
	if p.Calendar != NoCalendar {
		if !s.current(p, calendarTag(p)) {
			return false, nil // the charge was forgotten (idle, or a policy of another algorithm or period since)
		}
		return refundCalendar(p, s, at, now, -delta), nil
	}
	if !s.current(p, p.PeriodMicros()) {
		return false, nil // the charge was forgotten (idle, or a policy of another algorithm or period since)
	}
	return refund(p, s, at, now, reserved, -delta), nil
}

// CheckSettle reports what Settle would refuse, changing nothing: an invalid policy, a
// concurrency one (its slots are given back by Release, not settled: a settlement of one would
// change nothing), or reserved or actual outside 0..MaxLimit.
func CheckSettle(p *Policy, reserved, actual int64) error {
	var d Decision
	if err := CheckCost(p, 0, &d); err != nil {
		return err // an invalid policy
	}
	if p.Algorithm == Concurrency {
		return fmt.Errorf("%w: concurrency limits requests in flight, not units: it has no charge to settle (its slots are given back by Release)", ErrInvalidPolicy)
	}
	if reserved < 0 || reserved > MaxLimit {
		return fmt.Errorf("%w: reserved %d must be in 0..2^53", ErrInvalidCost, reserved)
	}
	if actual < 0 || actual > MaxLimit {
		return fmt.Errorf("%w: actual cost %d must be in 0..2^53", ErrInvalidCost, actual)
	}
	return nil
}

// charge adds cost to the key's state at now, beyond the limit if need be (counts saturating at
// MaxLimit), and reports whether it changed; ok false, changing nothing, only if a bucket's tat
// would reach 2^62 µs.
func charge(p *Policy, s *State, now, cost int64) (changed, ok bool) {
	if p.Calendar != NoCalendar {
		chargeCalendar(p, s, now, cost)
		return true, true
	}
	period := p.PeriodMicros()
	current := s.current(p, period)
	switch p.Algorithm {
	case FixedWindow:
		id, _, _ := p.WindowOf(now)
		count := int64(0)
		if current && id <= s.Window { // still in the recorded window (or before it: the clock ran backward)
			id, count = s.Window, s.Count
		}
		s.renew(p, period)
		s.Window, s.Count = id, addSat(count, cost)
	case SlidingWindow:
		id, start, _ := p.WindowOf(now)
		var cur, prev int64
		if current && id <= s.Window {
			id, cur, prev = s.Window, s.Count, s.Prev
		} else if prevID, _, _ := p.WindowOf(start - 1); current && s.Window == prevID {
			prev = s.Count
		}
		s.renew(p, period)
		s.Window, s.Count, s.Prev = id, addSat(cur, cost), prev
	case SlidingLog:
		var log []LogEntry
		var sum int64
		if current {
			log, sum = s.Log, s.Count
		}
		start := 0
		for start < len(log) && log[start].At <= now-period {
			sum -= log[start].Cost
			start++
		}
		cost = min(cost, max(0, MaxLimit-sum))
		if cost == 0 {
			return false, true // saturated
		}
		at := now
		if n := len(log); n > 0 && log[n-1].At > now {
			at = log[n-1].At // keep the log sorted (see slidingLog)
		}
		log = append(log[start:], LogEntry{At: at, Cost: cost})
		s.renew(p, period)
		s.Count, s.Log = sum+cost, log
	case TokenBucket, LeakyBucket:
		// A tat from 2^62 on is beyond any clock (as a cost's drain time, CheckCost).
		c := *s
		c.adopt(p, now)
		if !gcraAdvance(p, &c, now, cost) || c.TAT >= 1<<62 {
			return false, false
		}
		*s = c
	}
	return true, true
}

// refund gives back up to cost units of a charge of reserved made at at, on a current state, as
// the comment above says.
func refund(p *Policy, s *State, at, now, reserved, cost int64) bool {
	switch p.Algorithm {
	case FixedWindow:
		idAt, _, _ := p.WindowOf(at)
		idNow, _, _ := p.WindowOf(now)
		if idAt != s.Window || idNow > s.Window || s.Count == 0 {
			return false // at's window has ended: its count no longer counts
		}
		s.Count -= min(cost, s.Count)
	case SlidingWindow:
		idAt, _, endAt := p.WindowOf(at)
		idNow, startNow, _ := p.WindowOf(now)
		afterAt, _, _ := p.WindowOf(endAt) // the window after at's
		switch {
		case idNow <= s.Window && idAt == s.Window: // at's window is still the current one
			if s.Count == 0 {
				return false
			}
			s.Count -= min(cost, s.Count)
		case idNow <= s.Window && afterAt == s.Window: // at's is the previous window, still weighted
			if s.Prev == 0 {
				return false
			}
			s.Prev -= min(cost, s.Prev)
		default:
			// The state's window may be the one before now's: its count is now's previous one.
			prevNow, _, _ := p.WindowOf(startNow - 1)
			if s.Window != prevNow || idAt != s.Window || s.Count == 0 {
				return false
			}
			s.Count -= min(cost, s.Count)
		}
	case SlidingLog:
		// The entry of the charge: the last ones at at (several requests may share a µs), while
		// they count (now - period < at).
		if at <= now-p.PeriodMicros() {
			return false
		}
		log := s.Log
		left := cost
		for i := len(log) - 1; i >= 0 && left > 0 && log[i].At >= at; i-- {
			if log[i].At != at {
				continue
			}
			take := min(left, log[i].Cost)
			log[i].Cost -= take
			left -= take
			s.Count -= take
			if log[i].Cost == 0 {
				// Drop it, in place: a zero-cost entry would only hold the key's reset open.
				copy(log[i:], log[i+1:])
				log[len(log)-1] = LogEntry{}
				log = log[:len(log)-1]
			}
		}
		s.Log = log
		return left != cost
	case TokenBucket, LeakyBucket:
		adopted := s.adopt(p, now)
		return gcraRefund(p, s, at, now, reserved, cost) || adopted
	}
	return true
}

// gcraRefund moves tat back by up to cost·T: by the least of cost·T, what is left at now of the
// charge's reserved·T counted from at, and tat - now (never below now: a bucket that refilled
// gets nothing extra). In 1/limit µs, as gcraWait counts.
func gcraRefund(p *Policy, s *State, at, now, reserved, cost int64) bool {
	period := p.PeriodMicros()
	wait := gcraWait(p, s, now) // limit·(tat - now), 0 if tat ≤ now
	if wait == (u128{}) {
		return false
	}
	back := mul(cost, period)
	// What is left of the charge: reserved·period - limit·(now - at), if positive.
	left := mul(reserved, period)
	if now > at {
		elapsed := mul(p.Limit, now-at)
		if !elapsed.less(left) {
			return false
		}
		left = left.sub(elapsed)
	}
	if left.less(back) {
		back = left
	}
	if wait.less(back) {
		back = wait
	}
	q, r := back.divmod(p.Limit)
	tat, frac := s.TAT-q, s.Frac-r
	if frac < 0 {
		tat, frac = tat-1, frac+p.Limit
	}
	s.TAT, s.Frac = tat, frac
	return true
}

// chargeCalendar is charge for a calendar policy, whose state records its window's start
// (Window), end (TAT) and, for the sliding window, the next window's end (Frac; see
// calendarwindow.go): the extra counts in the recorded window while now is before its end (or
// before its start: the clock ran backward), else in now's window, the recorded one becoming
// the sliding window's previous count if it is the window just before.
func chargeCalendar(p *Policy, s *State, now, cost int64) {
	tag := calendarTag(p)
	if s.current(p, tag) && now < s.TAT {
		s.Count = addSat(s.Count, cost)
		return
	}
	start, end := calendarWindow(p, now)
	var prev int64
	if p.Algorithm == SlidingWindow && s.current(p, tag) && s.TAT == start {
		prev = s.Count
	}
	s.renewCalendar(p, tag)
	s.Window, s.TAT, s.Count, s.Prev = start, end, min(cost, MaxLimit), prev
	if p.Algorithm == SlidingWindow {
		_, s.Frac = calendarWindow(p, end)
	}
}

// refundCalendar is refund for a calendar policy's current state: a fixed window gives back only
// while at's window is the recorded one and now is still in it; a sliding window also from the
// previous count (at in the window just before the recorded one, now in the recorded one), and
// from the recorded count while now is in the next window, where it is now's previous count.
func refundCalendar(p *Policy, s *State, at, now, cost int64) bool {
	take := func(n *int64) bool {
		if *n == 0 {
			return false
		}
		*n -= min(cost, *n)
		return true
	}
	inRecorded := s.Window <= at && at < s.TAT
	switch {
	case inRecorded && now < s.TAT:
		return take(&s.Count)
	case p.Algorithm != SlidingWindow:
		return false
	case inRecorded && now < s.Frac: // now is in the next window: the recorded count is its previous one
		return take(&s.Count)
	case at < s.Window && now < s.TAT:
		if ps, _ := calendarWindow(p, s.Window-1); ps <= at {
			return take(&s.Prev) // at's is the window just before the recorded one, still weighted
		}
	}
	return false
}

// addSat is a + b for counts ≥ 0, at most MaxLimit (or a, if a is already beyond it).
func addSat(a, b int64) int64 {
	if b > MaxLimit-a {
		return max(a, MaxLimit)
	}
	return a + b
}
