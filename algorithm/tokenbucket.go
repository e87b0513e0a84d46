package algorithm

// tokenBucket: capacity C = Burst (or Limit), refilled Limit per Period continuously, full at
// first sight. As GCRA: the tokens at now are C - wait/period (wait as in gcra.go), so
//
//	approve iff tokens ≥ cost  ⇔  wait ≤ (C - cost)·period
func tokenBucket(p *Policy, s *State, now, cost int64) (Decision, error) {
	period, capacity := p.PeriodMicros(), p.Capacity()
	if cost > capacity {
		return never(p, cost, "exceeds the bucket's capacity "+itoa(capacity))
	}
	wait := gcraWait(p, s, TokenBucket, now)
	d := Decision{Limit: capacity}
	if wait.lessEq(mul(capacity-cost, period)) {
		d.Allowed = true
		if cost > 0 {
			gcraAdvance(p, s, TokenBucket, now, cost) // cannot overflow: Validate bounds capacity·period/limit
			wait = wait.add(mul(cost, period))
		}
	} else {
		// Approved at the first µs t where wait - limit·(t - now) ≤ (C - cost)·period.
		d.RetryAfter = micros(wait.sub(mul(capacity-cost, period)).divCeil(p.Limit))
	}
	d.Remaining = capacity - wait.divCeil(period)
	d.ResetAfter = micros(wait.divCeil(p.Limit))
	return d, nil
}
