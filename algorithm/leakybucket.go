package algorithm

// leakyBucket: the leaky bucket as a queue (nginx limit_req without nodelay). Requests drain at
// Limit per Period, T = period/limit apart; the queue has room for Burst requests of waiting:
//
//	approve iff max(tat, now) - now ≤ Burst·T  ⇔  wait ≤ Burst·period
//
// and an approved request is held for Delay = max(tat, now) - now (rounded up to a whole µs, so
// it is never served early), then tat moves on by cost·T.
func leakyBucket(p *Policy, s *State, now, cost int64) (Decision, error) {
	period := p.PeriodMicros()
	if !fits(p, cost) {
		return never(p, cost, "takes longer to drain than any clock runs")
	}
	room := mul(p.Burst, period)
	wait := gcraWait(p, s, LeakyBucket, now)
	d := Decision{Limit: p.Capacity()}
	if wait.lessEq(room) {
		d.Allowed = true
		d.Delay = micros(wait.divCeil(p.Limit))
		if cost > 0 {
			if !gcraAdvance(p, s, LeakyBucket, now, cost) {
				return never(p, cost, "takes longer to drain than any clock runs")
			}
			wait = wait.add(mul(cost, period))
		}
	} else {
		d.RetryAfter = micros(wait.sub(room).divCeil(p.Limit))
	}
	// Remaining: how many requests of cost 1 the queue would still take now.
	if wait.lessEq(room) {
		q, _ := room.sub(wait).divmod(period)
		d.Remaining = q + 1
	}
	d.ResetAfter = micros(wait.divCeil(p.Limit))
	return d, nil
}
