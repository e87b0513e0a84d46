package algorithm

// slidingLog: the exact rolling window. An approved request at t counts while now - period < t;
// approve iff the counted cost plus this cost ≤ limit.
func slidingLog(p *Policy, s *State, now, cost int64, d *Decision) error {
	period, limit := p.PeriodMicros(), p.Limit
	var log []LogEntry
	var sum int64
	if s.current(p, period) {
		log, sum = s.Log, s.Count
	}
	// Skip the expired prefix; sum becomes the cost that still counts.
	start := 0
	for start < len(log) && log[start].At <= now-period {
		sum -= log[start].Cost
		start++
	}
	allowed := sum+cost <= limit
	var retry, reset int64
	if allowed {
		if cost > 0 {
			at := now
			if n := len(log); n > 0 && log[n-1].At > now {
				at = log[n-1].At // the clock ran backward: keep the log sorted, conservatively
			}
			// Drop the expired prefix by reslicing, not copying: O(1) per decision; append moves
			// the live entries to a new array when the old one's tail is used up (amortised O(1)).
			log = append(log[start:], LogEntry{At: at, Cost: cost})
			sum += cost
			s.renew(p, period)
			s.Count, s.Log = sum, log
			start = 0
		}
	} else {
		// Wait for the oldest entries to expire until this cost fits; entry e stops counting at
		// e.At + period.
		left := sum
		for _, e := range log[start:] {
			left -= e.Cost
			if left+cost <= limit {
				retry = e.At + period - now
				break
			}
		}
	}
	if sum > 0 {
		reset = log[len(log)-1].At + period - now
	}
	d.set(allowed, limit, max(0, limit-sum), retry, reset, 0) // (sum > limit after a settlement charged beyond it)
	return nil
}
