-- decide_leaky_bucket mirrors algorithm/leakybucket.go line for line (the hash fields tat, frac are
-- State.TAT, State.Frac; the GCRA helpers are in common.lua). Precondition: CheckCost passed,
-- policy valid, (max(limit, burst + 1) + 1)·period ≤ 2^51 and cost·period ≤ 2^51 (common.lua).

-- leakyBucket: the leaky bucket as a queue (nginx limit_req without nodelay). Requests drain at
-- Limit per Period, T = period/limit apart; the queue has room for Burst requests of waiting:
--
--	approve iff max(tat, now) - now ≤ Burst·T  ⇔  wait ≤ Burst·period
--
-- and an approved request is held for Delay = max(tat, now) - now (rounded up to a whole µs, so
-- it is never served early), then tat moves on by cost·T.
--
-- A caller that holds a request for at most max_delay µs (≥ 0; nil or negative: no bound) also
-- needs Delay ≤ max_delay ⇔ wait ≤ limit·max_delay: room = min(burst·period, limit·max_delay).
local function decide_leaky_bucket(key, logkey, limit, period, burst, cost, now, max_delay)
  local room = burst * period
  if max_delay ~= nil and max_delay >= 0 and limit * max_delay < room then
    room = limit * max_delay
  end
  local current, s_tat, s_frac = read_state(key, LEAKY_BUCKET, limit, period, 'tat', 'frac')
  local wait_d, wait_f = gcra_wait(current, s_tat, s_frac, now)
  local allowed = gcra_le(limit, wait_d, wait_f, room)
  local retry, delay = 0, 0
  local commit = nil
  if allowed then
    if wait_d > 0 or wait_f > 0 then
      delay = gcra_until(s_tat, s_frac, now)
    end
    if cost > 0 then
      local renew = not current
      s_tat, s_frac = gcra_advance(limit, period, current, s_tat, s_frac, now, cost)
      current = true -- s.renew(p, period) and the new s.TAT, s.Frac, written by commit
      local reset_ = gcra_until(s_tat, s_frac, now) -- the reset below: after > 0 now
      commit = function(ttl_slack)
        write_state(key, logkey, renew, LEAKY_BUCKET, limit, period, 'tat', s_tat, 'frac', s_frac)
        expire(key, reset_, ttl_slack)
      end
    end
  else
    retry = gcra_excess_ceil(limit, wait_d, wait_f, room)
  end
  -- Remaining: how many requests of cost 1 the queue would still take now.
  local remaining, reset = 0, 0
  local after_d, after_f = gcra_wait(current, s_tat, s_frac, now)
  if gcra_le(limit, after_d, after_f, room) then
    remaining = idiv(room - (limit * after_d + after_f), period) + 1 -- after ≤ room ≤ 2^51
  end
  if after_d > 0 or after_f > 0 then
    reset = gcra_until(s_tat, s_frac, now)
  end
  return allowed and 1 or 0, burst + 1, remaining, retry, reset, delay, commit
end

deciders[LEAKY_BUCKET] = decide_leaky_bucket
