package algorithm

// leakyBucket: the leaky bucket as a queue (nginx limit_req without nodelay). Requests drain at
// Limit per Period, T = period/limit apart; the queue has room for Burst requests of waiting:
//
//	approve iff max(tat, now) - now ≤ Burst·T  ⇔  wait ≤ Burst·period
//
// and an approved request is held for Delay = max(tat, now) - now (rounded up to a whole µs, so
// it is never served early), then tat moves on by cost·T.
//
// A caller that holds a request for at most maxDelay µs (≥ 0; negative: no bound) also needs
// Delay ≤ maxDelay, that is ceil(tat - now) ≤ maxDelay ⇔ wait ≤ limit·maxDelay (maxDelay is a
// whole number of µs): the same test with room = min(Burst·period, limit·maxDelay). So a request
// held too long is refused like one the queue has no room for, changing nothing, and its
// RetryAfter is exact: ceil(wait/limit) - maxDelay, when its hold would be maxDelay.
func leakyBucket(p *Policy, s *State, now, cost, maxDelay int64, d *Decision) error {
	s.adopt(p, now) // a state of another limit: its use, under this one
	period := p.PeriodMicros()
	room := mul(p.Burst, period)
	if maxDelay >= 0 {
		if hold := mul(p.Limit, maxDelay); hold.less(room) {
			room = hold
		}
	}
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
