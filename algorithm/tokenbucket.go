package algorithm

// tokenBucket: capacity C = Burst (or Limit), refilled Limit per Period continuously, full at
// first sight. As GCRA: the tokens at now are C - wait/period (wait as in gcra.go), so
//
//	approve iff tokens ≥ cost  ⇔  wait ≤ (C - cost)·period
func tokenBucket(p *Policy, s *State, now, cost int64, d *Decision) error {
	s.adopt(p, now) // a state of another limit: its use, under this one
	period, capacity := p.PeriodMicros(), p.Capacity()
	wait := gcraWait(p, s, now)
	allowed := wait.lessEq(mul(capacity-cost, period))
	var retry int64
	if allowed {
		if cost > 0 && !gcraAdvance(p, s, now, cost) {
			// Only within a refill time of the end of int64 µs; Validate bounds the refill time.
			return never(p, cost, "would be approved beyond any clock", d)
		}
	} else {
		// Approved at the first µs t where wait - limit·(t - now) ≤ (C - cost)·period.
		retry = wait.sub(mul(capacity-cost, period)).divCeil(p.Limit)
	}
	remaining, reset := capacity, int64(0)
	if after := gcraWait(p, s, now); after != (u128{}) {
		remaining = max(0, capacity-s.divCeilP(after, period)) // below 0 only if the clock ran backward
		reset = gcraUntil(s, now)
	}
	d.set(allowed, capacity, remaining, retry, reset, 0)
	return nil
}
