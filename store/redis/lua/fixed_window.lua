-- decide_fixed_window mirrors algorithm/fixedwindow.go line for line (the state's fields w, count are
-- State.Window, State.Count). Precondition: check_args passed (0 ≤ cost ≤ limit), so limit,
-- count and cost are numbers, and so is w (|now| < 2^60, period ≥ 1000); times are ints.

-- fixedWindow: count the cost approved in the epoch-aligned window w = floor(now/period);
-- approve iff count + cost ≤ limit.
local function decide_fixed_window(key, logkey, limit, period, burst, cost, now)
  local current, s_window, s_count = read_state(key, logkey, FIXED_WINDOW, limit, period, 'w', 'count')
  local w, count = 0, 0
  if current and lt(now, mul(s_window + 1, period)) then
    -- Still in the recorded window (or, if the clock ran backward, before it: stay in it).
    w, count = s_window, s_count
  else
    w = divmod(now, period)
  end
  local end_ = mul(w + 1, period) -- a refusal holds, and the count lasts, until this window ends
  local allowed = cost <= limit - count -- count + cost ≤ limit, without a sum that could pass 2^53
  local retry, reset = 0, 0
  local commit = nil
  if allowed then
    if cost > 0 then
      count = count + cost -- ≤ limit
      commit = function(ttl_slack) -- s.renew(p, period); s.Window, s.Count = w, count
        write_state(key, logkey, reset, ttl_slack, FIXED_WINDOW, limit, period, w, count)
      end
    end
  else
    retry = sub(end_, now)
  end
  if count > 0 then
    reset = sub(end_, now)
  end
  return allowed and 1 or 0, limit, math.max(0, limit - count), retry, reset, 0, commit -- (count > limit after a settlement)
end

deciders[FIXED_WINDOW] = decide_fixed_window
