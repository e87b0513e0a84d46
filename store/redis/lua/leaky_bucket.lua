-- decide_leaky_bucket mirrors algorithm/leakybucket.go line for line (the state's fields tat, frac are
-- State.TAT, State.Frac; the GCRA helpers are in common.lua). Precondition: check_args passed, so
-- limit and burst are numbers; the cost, the waits (u128 in Go), times and the capacity
-- burst + 1 are ints.

-- leakyBucket: the leaky bucket as a queue (nginx limit_req without nodelay). Requests drain at
-- Limit per Period, T = period/limit apart; the queue has room for Burst requests of waiting:
--
--	approve iff max(tat, now) - now ≤ Burst·T  ⇔  wait ≤ Burst·period
--
-- and an approved request is held for Delay = max(tat, now) - now (rounded up to a whole µs, so
-- it is never served early), then tat moves on by cost·T.
--
-- A caller that holds a request for at most max_delay µs (≥ 0; nil or -1: no bound) also needs
-- Delay ≤ max_delay ⇔ wait ≤ limit·max_delay: room = min(burst·period, limit·max_delay).
local function decide_leaky_bucket(key, logkey, limit, period, burst, cost, now, max_delay)
  local room = mul(burst, period)
  if max_delay ~= nil and max_delay >= 0 then
    local hold = mul(limit, max_delay)
    if lt(hold, room) then
      room = hold
    end
  end
  local current, s_tat, s_frac, _, s_limit = read_state(key, logkey, LEAKY_BUCKET, limit, period, 'tat', 'frac')
  local converted = false -- s.adopt(p, now): a state of another limit, its use under this one
  if current and s_limit ~= limit then
    s_tat, s_frac, converted = gcra_convert(s_limit, limit, s_tat, s_frac, now)
  end
  local wait = gcra_wait(limit, current, s_tat, s_frac, now)
  local allowed = le(wait, room)
  local retry, delay = 0, 0
  local commit = nil
  if allowed then
    if wait ~= 0 then
      delay = gcra_until(s_tat, s_frac, now)
    end
    if cost ~= 0 then -- cost > 0
      s_tat, s_frac = gcra_advance(limit, period, current, s_tat, s_frac, now, cost)
      current = true -- s.renew(p, period) and the new s.TAT, s.Frac, written by commit
      local reset_ = gcra_until(s_tat, s_frac, now) -- the reset below: after > 0 now
      commit = function(ttl_slack)
        write_state(key, logkey, reset_, ttl_slack, LEAKY_BUCKET, limit, period, s_tat, s_frac)
      end
    end
  else
    retry = divceil(sub(wait, room), limit)
  end
  if converted and commit == nil then -- a refusal or a peek writes the converted state
    commit = gcra_commit(key, logkey, LEAKY_BUCKET, limit, period, s_tat, s_frac, now)
  end
  -- Remaining: how many requests of cost 1 the queue would still take now.
  local remaining, reset = 0, 0
  local after = gcra_wait(limit, current, s_tat, s_frac, now)
  if le(after, room) then
    remaining = add(divmod(sub(room, after), period), 1)
  end
  if after ~= 0 then
    reset = gcra_until(s_tat, s_frac, now)
  end
  return allowed and 1 or 0, add(burst, 1), remaining, retry, reset, delay, commit
end

deciders[LEAKY_BUCKET] = decide_leaky_bucket
