package algorithm

// slidingWindow: the sliding-window counter. With prev and cur the costs approved in windows
// w-1 and w = floor(now/period), and e = now - w·period the time into window w, the previous
// window is weighted by the part of it still inside the rolling period:
//
//	approve iff prev·(period - e) + (cur + cost)·period ≤ limit·period
//
// in exact integers (128-bit products), which is prev·(1 - e/period) + cur + cost ≤ limit.
func slidingWindow(p *Policy, s *State, now, cost int64, d *Decision) error {
	period, limit := p.PeriodMicros(), p.Limit
	at := now // the instant decided at; later than now only if the clock ran backward
	var w, prev, cur int64
	if s.current(p, period) && now < (s.Window+1)*period {
		// In the recorded window, or before it if the clock ran backward: then decide at its start.
		w, prev, cur = s.Window, s.Prev, s.Count
		at = max(now, w*period)
	} else {
		w = floorDiv(now, period)
		if s.current(p, period) && s.Window == w-1 {
			prev = s.Count
		}
	}
	e := at - w*period
	allowed := mul(prev, period-e).add(mul(cur+cost, period)).lessEq(mul(limit, period))
	var retry, reset int64
	if allowed {
		if cost > 0 {
			cur += cost
			s.renew(p, period)
			s.Window, s.Count, s.Prev = w, cur, prev
		}
	} else if cur+cost <= limit {
		// Approved later in this window, once prev·(period - e') ≤ (limit - cur - cost)·period.
		x, _ := mul(limit-cur-cost, period).divmod(prev)
		retry = w*period + period - x - now
	} else {
		// Not in this window; in the next one prev' = cur, cur' = 0, and the request is approved at
		// e'' = period - floor((limit - cost)·period / cur) into it (cur > 0 here since cost ≤ limit).
		x, _ := mul(limit-cost, period).divmod(cur)
		retry = (w+1)*period + period - x - now
	}
	// Remaining = limit - cur - ceil(prev·(period - e)/period), never below 0.
	remaining := limit - cur
	if prev > 0 {
		remaining -= s.divCeilP(mul(prev, period-e), period)
	}
	switch {
	case cur > 0:
		reset = (w+2)*period - now
	case prev > 0:
		reset = (w+1)*period - now
	}
	d.set(allowed, limit, max(0, remaining), retry, reset, 0)
	return nil
}
