package algorithm

// leakyBucket: the leaky bucket as a queue (nginx limit_req without nodelay). Requests drain at
// Limit per Period, T = period/limit apart; the queue has room for Burst requests of waiting:
//
//	approve iff max(tat, now) - now ≤ Burst·T  ⇔  wait ≤ Burst·period
//
// and an approved request is held for Delay = max(tat, now) - now (rounded up to a whole µs, so
// it is never served early), then tat moves on by cost·T.
func leakyBucket(p *Policy, s *State, now, cost int64, d *Decision) error {
	period := p.PeriodMicros()
	room := mul(p.Burst, period)
	wait := gcraWait(p, s, now)
	allowed := wait.lessEq(room)
	var retry, delay int64
	if allowed {
		if wait != (u128{}) {
			delay = gcraUntil(s, now)
		}
		if cost > 0 && !gcraAdvance(p, s, now, cost) {
			return never(p, cost, "takes longer to drain than any clock runs", d)
		}
	} else {
		retry = wait.sub(room).divCeil(p.Limit)
	}
	// Remaining: how many requests of cost 1 the queue would still take now.
	var remaining, reset int64
	after := gcraWait(p, s, now)
	if after.lessEq(room) {
		q, _ := s.divP(room.sub(after), period)
		remaining = q + 1
	}
	if after != (u128{}) {
		reset = gcraUntil(s, now)
	}
	d.set(allowed, p.Capacity(), remaining, retry, reset, delay)
	return nil
}
