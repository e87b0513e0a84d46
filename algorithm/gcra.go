package algorithm

// The token bucket and the leaky bucket share one state: the theoretical arrival time
// tat = TAT + Frac/limit µs (GCRA). Each approved unit of cost moves tat forward by the emission
// interval T = period/limit, kept as an exact fraction so that no rounding ever drifts: TAT holds
// whole µs and Frac the remainder in 1/limit µs.
//
// Both decide on the queue ahead of now, scaled by limit so that it is an integer:
// wait = limit·max(tat - now, 0), in 1/limit µs. A wait of k·period is k units of cost.

// adopt converts a bucket state written under another limit to p's limit at now, keeping the
// units in use: wait = limit·(tat - now) is the use times period, the same number under any
// limit, so the new tat is now + wait/limit' (a whole quotient and the remainder in Frac: exact,
// so converting back and forth at one instant changes nothing). The use is kept whole, even
// beyond the new capacity (a lowered burst or limit then refuses until it has drained below it,
// as a window whose count is above a lowered limit does), and the new tat is at most 2^62 - 1 µs
// after now (a queue longer than any clock). A state whose tat is not after now is full: it is
// left alone, as it would read the same under any limit. It reports whether it changed s.
func (s *State) adopt(p *Policy, now int64) bool {
	period := p.PeriodMicros()
	if !s.current(p, period) || s.Limit == p.Limit || s.TAT < now || (s.TAT == now && s.Frac == 0) {
		return false
	}
	wait := mul(s.Limit, s.TAT-now).add(small(s.Frac))
	q, r := wait.divmod(p.Limit)
	if q >= 1<<62 {
		q, r = 1<<62-1, 0
	}
	s.TAT, s.Frac = now+q, r
	s.Limit, s.cache = p.Limit, derive(p.Limit, period)
	return true
}

// gcraWait returns limit·max(tat - now, 0) for s (0 if s is not current under p).
func gcraWait(p *Policy, s *State, now int64) u128 {
	if !s.current(p, p.PeriodMicros()) || s.TAT < now || (s.TAT == now && s.Frac == 0) {
		return u128{}
	}
	return mul(p.Limit, s.TAT-now).add(small(s.Frac))
}

// gcraAdvance sets tat = max(tat, now) + cost·period/limit. It reports false, changing nothing,
// if that time is beyond any clock.
func gcraAdvance(p *Policy, s *State, now, cost int64) bool {
	period := p.PeriodMicros()
	current := s.current(p, period)
	tat, frac := now, int64(0)
	if current && (s.TAT > now || (s.TAT == now && s.Frac > 0)) {
		tat, frac = s.TAT, s.Frac
	}
	var q, r int64
	if current && cost == 1 && s.Limit == p.Limit && s.cache.emitQ|s.cache.emitR != 0 { // (a State built from its exported fields has no cache)
		q, r = s.cache.emitQ, s.cache.emitR
	} else {
		q, r = mul(cost, period).divmod(p.Limit)
	}
	if q > maxInt64-1-max(tat, 0) { // (tat may be negative on a clock before the epoch)
		return false
	}
	tat, frac = tat+q, frac+r
	if frac >= p.Limit {
		tat, frac = tat+1, frac-p.Limit
	}
	s.renew(p, period)
	s.TAT, s.Frac = tat, frac
	return true
}

// fits reports whether cost·period/limit µs is a time any clock reaches (under 2^62 µs).
func fits(p *Policy, cost int64) bool {
	if cost < 1<<9 {
		return true // period < 2^53 µs, so cost·period/limit < 2^62 without dividing
	}
	q, _ := mul(cost, p.PeriodMicros()).divmod(p.Limit)
	return q < 1<<62
}

// gcraUntil returns ceil(tat - now) in µs for a state whose tat is after now: TAT - now, plus one
// if a fraction of a µs is left. No division: that is why Frac is kept below limit.
func gcraUntil(s *State, now int64) int64 {
	if s.Frac > 0 {
		return s.TAT - now + 1
	}
	return s.TAT - now
}
