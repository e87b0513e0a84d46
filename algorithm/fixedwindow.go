package algorithm

// The transitions below assume CheckCost passed.

// fixedWindow: count the cost approved in the epoch-aligned window w = floor(now/period);
// approve iff count + cost ≤ limit.
func fixedWindow(p *Policy, s *State, now, cost int64, d *Decision) error {
	period, limit := p.PeriodMicros(), p.Limit
	var w, count int64
	if s.current(p, period) && now < (s.Window+1)*period {
		// Still in the recorded window (or, if the clock ran backward, before it: stay in it).
		// Checked by a multiplication, which costs less than the division below.
		w, count = s.Window, s.Count
	} else {
		w = floorDiv(now, period)
	}
	end := (w + 1) * period // a refusal holds, and the count lasts, until this window ends
	allowed := count+cost <= limit
	var retry, reset int64
	if allowed {
		if cost > 0 {
			count += cost
			s.renew(p, period)
			s.Window, s.Count = w, count
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
