package algorithm

// fixedWindow: count the cost approved in the epoch-aligned window w = floor(now/period);
// approve iff count + cost ≤ limit.
func fixedWindow(p *Policy, s *State, now, cost int64) (Decision, error) {
	period, limit := p.PeriodMicros(), p.Limit
	if cost > limit {
		return never(p, cost, "exceeds the limit "+itoa(limit))
	}
	w := floorDiv(now, period)
	var count int64
	if s.Alg == FixedWindow && s.Window >= w {
		w = s.Window // a later window than now's only if the clock ran backward: stay in it
		count = s.Count
	}
	end := (w + 1) * period // the refusal holds until this window ends
	d := Decision{Limit: limit}
	if count+cost <= limit {
		d.Allowed = true
		if cost > 0 {
			count += cost
			*s = State{Alg: FixedWindow, Window: w, Count: count}
		}
	} else {
		d.RetryAfter = micros(end - now)
	}
	d.Remaining = limit - count
	if count > 0 {
		d.ResetAfter = micros(end - now)
	}
	return d, nil
}
