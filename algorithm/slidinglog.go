package algorithm

// slidingLog: the exact rolling window. An approved request at t counts while now - period < t;
// approve iff the counted cost plus this cost ≤ limit.
func slidingLog(p *Policy, s *State, now, cost int64) (Decision, error) {
	period, limit := p.PeriodMicros(), p.Limit
	if cost > limit {
		return never(p, cost, "exceeds the limit "+itoa(limit))
	}
	var log []LogEntry
	var sum int64
	if s.Alg == SlidingLog {
		log, sum = s.Log, s.Count
	}
	// Skip the expired prefix; sum becomes the cost that still counts.
	start := 0
	for start < len(log) && log[start].At <= now-period {
		sum -= log[start].Cost
		start++
	}
	d := Decision{Limit: limit}
	if sum+cost <= limit {
		d.Allowed = true
		if cost > 0 {
			at := now
			if n := len(log); n > 0 && log[n-1].At > now {
				at = log[n-1].At // the clock ran backward: keep the log sorted, conservatively
			}
			// Drop the expired prefix in place, reusing the slice's memory.
			kept := copy(s.Log, log[start:])
			s.Log = append(s.Log[:kept], LogEntry{At: at, Cost: cost})
			sum += cost
			s.Alg, s.Count = SlidingLog, sum
			log, start = s.Log, 0
		}
	} else {
		// Wait for the oldest entries to expire until this cost fits; entry e stops counting at
		// e.At + period.
		left := sum
		for _, e := range log[start:] {
			left -= e.Cost
			if left+cost <= limit {
				d.RetryAfter = micros(e.At + period - now)
				break
			}
		}
	}
	d.Remaining = limit - sum
	if sum > 0 {
		d.ResetAfter = micros(log[len(log)-1].At + period - now)
	}
	return d, nil
}
