-- decide_sliding_window mirrors algorithm/slidingwindow.go line for line (the hash fields w, count,
-- prev are State.Window, State.Count, State.Prev). Precondition: check_args passed (0 ≤ cost ≤
-- limit), so limit, cur, prev and cost are numbers, and so is w (|now| < 2^60, period ≥ 1000);
-- times and the products (u128 in Go) are ints.

-- slidingWindow: the sliding-window counter. With prev and cur the costs approved in windows
-- w-1 and w = floor(now/period), and e = now - w·period the time into window w, the previous
-- window is weighted by the part of it still inside the rolling period:
--
--	approve iff prev·(period - e) + (cur + cost)·period ≤ limit·period
--
-- in exact integers, which is prev·(1 - e/period) + cur + cost ≤ limit.
local function decide_sliding_window(key, logkey, limit, period, burst, cost, now)
  local current, s_window, s_count, s_prev = read_state(key, SLIDING_WINDOW, limit, period, 'w', 'count', 'prev')
  local at = now -- the instant decided at; later than now only if the clock ran backward
  local w, prev, cur = 0, 0, 0
  if current and lt(now, mul(s_window + 1, period)) then
    -- In the recorded window, or before it if the clock ran backward: then decide at its start.
    w, prev, cur = s_window, s_prev, s_count
    local start = mul(w, period)
    if lt(now, start) then
      at = start -- max(now, w·period)
    end
  else
    w = divmod(now, period)
    if current and s_window == w - 1 then
      prev = s_count
    end
  end
  local e = sub(at, mul(w, period))
  local allowed = le(add(mul(prev, sub(period, e)), mul(add(cur, cost), period)), mul(limit, period))
  local retry, reset = 0, 0
  local commit = nil
  if allowed then
    if cost > 0 then
      cur = cur + cost -- ≤ limit, as allowed
      commit = function(ttl_slack) -- s.renew(p, period); s.Window, s.Count, s.Prev = w, cur, prev
        write_state(key, logkey, not current, SLIDING_WINDOW, limit, period, 'w', w, 'count', cur, 'prev', prev)
        expire(key, reset, ttl_slack)
      end
    end
  elseif cost <= limit - cur then -- cur + cost ≤ limit, without a sum that could pass 2^53
    -- Approved later in this window, once prev·(period - e') ≤ (limit - cur - cost)·period.
    local x = divmod(mul(limit - cur - cost, period), prev)
    retry = sub(sub(add(mul(w, period), period), x), now)
  else
    -- Not in this window; in the next one prev' = cur, cur' = 0, and the request is approved at
    -- e'' = period - floor((limit - cost)·period / cur) into it (cur > 0 here since cost ≤ limit).
    local x = divmod(mul(limit - cost, period), cur)
    retry = sub(sub(add(mul(w + 1, period), period), x), now)
  end
  -- Remaining = limit - cur - ceil(prev·(period - e)/period), never below 0 (the quotient is at
  -- most prev: a number).
  local remaining = limit - cur
  if prev > 0 then
    remaining = remaining - divceil(mul(prev, sub(period, e)), period)
  end
  if cur > 0 then
    reset = sub(mul(w + 2, period), now)
  elseif prev > 0 then
    reset = sub(mul(w + 1, period), now)
  end
  return allowed and 1 or 0, limit, math.max(0, remaining), retry, reset, 0, commit
end

deciders[SLIDING_WINDOW] = decide_sliding_window
