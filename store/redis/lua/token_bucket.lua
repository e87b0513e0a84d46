-- decide_token_bucket mirrors algorithm/tokenbucket.go line for line (the state's fields tat, frac are
-- State.TAT, State.Frac; the GCRA helpers are in common.lua). Precondition: check_args passed
-- (0 ≤ cost ≤ capacity), so limit, capacity and cost are numbers; the waits (u128 in Go) and
-- times are ints.

-- tokenBucket: capacity C = Burst (or Limit), refilled Limit per Period continuously, full at
-- first sight. As GCRA: the tokens at now are C - wait/period (wait as in gcra.go), so
--
--	approve iff tokens ≥ cost  ⇔  wait ≤ (C - cost)·period
local function decide_token_bucket(key, logkey, limit, period, burst, cost, now)
  local capacity = limit -- p.Capacity()
  if burst > 0 then
    capacity = burst
  end
  local current, s_tat, s_frac, _, s_limit = read_state(key, logkey, TOKEN_BUCKET, limit, period, 'tat', 'frac')
  local converted = false -- s.adopt(p, now): a state of another limit, its use under this one
  if current and s_limit ~= limit then
    s_tat, s_frac, converted = gcra_convert(s_limit, limit, s_tat, s_frac, now)
  end
  local wait = gcra_wait(limit, current, s_tat, s_frac, now)
  local room = mul(capacity - cost, period) -- (C - cost)·period
  local allowed = le(wait, room)
  local retry = 0
  local commit = nil
  if allowed then
    if cost > 0 then
      s_tat, s_frac = gcra_advance(limit, period, current, s_tat, s_frac, now, cost)
      current = true -- s.renew(p, period) and the new s.TAT, s.Frac, written by commit
      local reset_ = gcra_until(s_tat, s_frac, now) -- the reset below: after > 0 now
      commit = function(ttl_slack)
        write_state(key, logkey, reset_, ttl_slack, TOKEN_BUCKET, limit, period, s_tat, s_frac)
      end
    end
  else
    -- Approved at the first µs t where wait - limit·(t - now) ≤ (C - cost)·period.
    retry = divceil(sub(wait, room), limit)
  end
  if converted and commit == nil then -- a refusal or a peek writes the converted state
    commit = gcra_commit(key, logkey, TOKEN_BUCKET, limit, period, s_tat, s_frac, now)
  end
  local remaining, reset = capacity, 0
  local after = gcra_wait(limit, current, s_tat, s_frac, now)
  if after ~= 0 then
    remaining = sub(capacity, divceil(after, period)) -- max(0, ...): below 0 only if the clock ran backward
    if lt(remaining, 0) then
      remaining = 0
    end
    reset = gcra_until(s_tat, s_frac, now)
  end
  return allowed and 1 or 0, capacity, remaining, retry, reset, 0, commit
end

deciders[TOKEN_BUCKET] = decide_token_bucket
