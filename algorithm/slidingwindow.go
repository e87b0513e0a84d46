package algorithm

// slidingWindow: the sliding-window counter. With prev and cur the costs approved in windows
// w-1 and w = floor(now/period), and e = now - w·period the time into window w, the previous
// window is weighted by the part of it still inside the rolling period:
//
//	approve iff prev·(period - e) + (cur + cost)·period ≤ limit·period
//
// in exact integers (128-bit products), which is prev·(1 - e/period) + cur + cost ≤ limit.
func slidingWindow(p *Policy, s *State, now, cost int64) (Decision, error) {
	period, limit := p.PeriodMicros(), p.Limit
	if cost > limit {
		return never(p, cost, "exceeds the limit "+itoa(limit))
	}
	w := floorDiv(now, period)
	at := now // the instant decided at; later than now only if the clock ran backward
	var prev, cur int64
	if s.Alg == SlidingWindow {
		switch {
		case s.Window > w: // clock ran backward: decide at the start of the recorded window
			w, at = s.Window, s.Window*period
			prev, cur = s.Prev, s.Count
		case s.Window == w:
			prev, cur = s.Prev, s.Count
		case s.Window == w-1:
			prev = s.Count
		}
	}
	e := at - w*period
	capacity := mul(limit, period)
	d := Decision{Limit: limit}
	if mul(prev, period-e).add(mul(cur+cost, period)).lessEq(capacity) {
		d.Allowed = true
		if cost > 0 {
			cur += cost
			*s = State{Alg: SlidingWindow, Window: w, Count: cur, Prev: prev}
		}
	} else if cur+cost <= limit {
		// Approved later in this window, once prev·(period - e') ≤ (limit - cur - cost)·period.
		x, _ := mul(limit-cur-cost, period).divmod(prev)
		d.RetryAfter = micros(w*period + period - x - now)
	} else {
		// Not in this window; in the next one prev' = cur, cur' = 0, and the request is approved at
		// e'' = period - floor((limit - cost)·period / cur) into it (cur > 0 here since cost ≤ limit).
		x, _ := mul(limit-cost, period).divmod(cur)
		d.RetryAfter = micros((w+1)*period + period - x - now)
	}
	// Remaining = limit - cur - ceil(prev·(period - e)/period), never below 0.
	used := cur + mul(prev, period-e).divCeil(period)
	d.Remaining = max(0, limit-used)
	switch {
	case cur > 0:
		d.ResetAfter = micros((w+2)*period - now)
	case prev > 0:
		d.ResetAfter = micros((w+1)*period - now)
	}
	return d, nil
}
