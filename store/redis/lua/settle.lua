-- sluice: one settlement, atomically: algorithm/settle.go line for line, on Redis's clock. Assembled
-- as common.lua + all five algorithm files + calendar.lua (its eq too) + nth.lua + this file (the
-- deciders give the state's reset after it, for its TTL).
--
-- KEYS[1], KEYS[2]  the state string and the sliding log's list, as single.lua's
-- KEYS[3]  optional: the record of the settlement's id (a key of the same hash slot); absent: no id
-- ARGV[1..4]  alg, limit, period (µs), burst, as single.lua's
-- ARGV[5]  at, µs: the instant of the decision that charged (Decision.At, on the clock that
--          decided it: Redis TIME, or the store's test clock); empty: now
-- ARGV[6]  reserved, ARGV[7] actual: integers in 0..2^53
-- ARGV[8]  now, µs; empty: Redis TIME
-- ARGV[9]  ttl_slack, µs (empty: 0)
-- ARGV[10] deadline, µs of Redis TIME (common.lua, DEADLINES); empty: none
-- ARGV[11] a calendar policy's: at's calendar window "<start> <end>" (µs), which the store
--          computes exactly (Calendar.Window is pure); empty with ARGV[5] empty (at = now: its
--          window is now's among those passed)
-- ARGV[12] optional: a channel on which a settlement that gave quota back (actual < reserved)
--          and changed the state publishes KEYS[1], for every instance's negative cache
--          (negcache.go); empty or absent: nothing published
-- ARGV[13] with KEYS[3]: how long the id's record is kept, ms (a positive integer)
--
-- SETTLED ONCE. With KEYS[3], the settlement is made once for its id: a call that finds KEYS[3]
-- (an earlier attempt of the same settlement ran, its reply lost or late) changes nothing and
-- replies {0, time}; otherwise, once the settlement is made (changed or not: a retry must not
-- find another state to settle), KEYS[3] is written with its TTL in the same script, so the
-- record and the change are one atomic step (and one replicated effect). A call after its
-- deadline, or that fails its checks, writes neither.
--
-- A calendar policy (fixed-window or sliding-window) passes its windows around the instance's
-- clock as its period (ARGV[3], calendar.lua), and the script settles in the window of those
-- that holds now, as its decisions do; a now outside them is calendar.lua's error reply, with
-- nothing written, and the store asks again around the time it names.
--
-- Reply: {changed (0/1), time} (time as single.lua's). A bad argument: an error reply naming it,
-- and nothing written; after the deadline, the deadline error, and nothing written.

local MAX_COUNT = 9007199254740992 -- algorithm.MaxLimit: counts saturate there

-- window_of is (*Policy).WindowOf: the id, start and end of the window that holds t.
local function window_of(t, period)
  local id = divmod(t, period)
  return id, mul(id, period), mul(add(id, 1), period)
end

-- add_sat is addSat: a + b for counts (numbers ≤ 2^53), at most 2^53.
local function add_sat(a, b)
  if b > MAX_COUNT - a then
    return math.max(a, MAX_COUNT)
  end
  return a + b
end

local function settle_fixed_window(key, logkey, limit, period, at, now, reserved, delta)
  local current, w, count = read_state(key, logkey, FIXED_WINDOW, limit, period, 'w', 'count')
  if delta > 0 then
    local id = window_of(now, period)
    if not (current and le(id, w)) then -- still in the recorded window (or before it)
      w, count = id, 0
    end
    count = add_sat(count, delta)
  else
    if not current then
      return false
    end
    local id_at = window_of(at, period)
    local id_now = window_of(now, period)
    if not eq(id_at, w) or lt(w, id_now) or count == 0 then
      return false -- at's window has ended: its count no longer counts
    end
    count = count - math.min(-delta, count)
  end
  write_state(key, logkey, 0, 0, FIXED_WINDOW, limit, period, w, count) -- (the TTL: after, from a peek)
  return true
end

local function settle_sliding_window(key, logkey, limit, period, at, now, reserved, delta)
  local current, w, cur, prev = read_state(key, logkey, SLIDING_WINDOW, limit, period, 'w', 'count', 'prev')
  if delta > 0 then
    local id, start = window_of(now, period)
    if current and le(id, w) then
      cur = add_sat(cur, delta)
    else
      local prev_id = window_of(sub(start, 1), period)
      local p = 0
      if current and eq(w, prev_id) then
        p = cur
      end
      w, cur, prev = id, add_sat(0, delta), p
    end
  else
    if not current then
      return false
    end
    local id_at, _, end_at = window_of(at, period)
    local id_now, start_now = window_of(now, period)
    local after_at = window_of(end_at, period) -- the window after at's
    if le(id_now, w) and eq(id_at, w) then -- at's window is still the current one
      if cur == 0 then
        return false
      end
      cur = cur - math.min(-delta, cur)
    elseif le(id_now, w) and eq(after_at, w) then -- at's is the previous window, still weighted
      if prev == 0 then
        return false
      end
      prev = prev - math.min(-delta, prev)
    else
      -- The state's window may be the one before now's: its count is now's previous one.
      local prev_now = window_of(sub(start_now, 1), period)
      if not eq(w, prev_now) or not eq(id_at, w) or cur == 0 then
        return false
      end
      cur = cur - math.min(-delta, cur)
    end
  end
  write_state(key, logkey, 0, 0, SLIDING_WINDOW, limit, period, w, cur, prev)
  return true
end

-- CALENDAR WINDOWS (calendar.lua): the state records its window's start w; its end E is the
-- boundary after w. With k the window among those passed that holds now (cal.b[k] ≤ now <
-- cal.b[k+1]), now < E iff now is before w (the clock ran backward) or cal.b[k] is w; the
-- recorded window is the one just before now's iff w is cal.b[k-1]. at's window is [at_s, at_e).

-- settle_fixed_calendar is algorithm.Settle of a calendar fixed window: an extra charge counts in
-- the recorded window while now < E, else in now's; a refund only while at's window is the
-- recorded one and now < E.
local function settle_fixed_calendar(key, logkey, limit, cal, k, now, at_s, delta)
  local h = cal_stamp(FIXED_WINDOW, limit, cal.token)
  local current, w, count = cal_read(key, logkey, h, 2)
  local in_recorded = current and (lt(now, w) or eq(w, cal.b[k])) -- now < E
  if delta > 0 then
    if not in_recorded then
      w, count = cal.b[k], 0
    end
    count = add_sat(count, delta)
  else
    if not in_recorded or not eq(at_s, w) or count == 0 then
      return false -- at's window has ended (or is not the recorded one): its count no longer counts
    end
    count = count - math.min(-delta, count)
  end
  cal_write(key, logkey, 0, 0, h, w, count) -- (the TTL: after, from a peek)
  return true
end

-- settle_sliding_calendar is algorithm.Settle of a calendar sliding window: an extra charge counts
-- in the recorded window while now < E, else in now's, with prev the recorded count if that
-- window is the one just before now's; a refund gives back from the current count (at's window
-- recorded, now < E), from prev (at's window just before the recorded one, now < E), or from the
-- recorded count while now is in the window after it (it is now's previous count).
local function settle_sliding_calendar(key, logkey, limit, cal, k, now, at_s, at_e, delta)
  local h = cal_stamp(SLIDING_WINDOW, limit, cal.token)
  local current, w, cur, prev = cal_read(key, logkey, h, 3)
  local in_recorded = current and (lt(now, w) or eq(w, cal.b[k])) -- now < E
  local before_now = current and not in_recorded and eq(w, cal.b[k - 1]) -- (k ≥ 2 here: the peek checked)
  if delta > 0 then
    if not in_recorded then
      local p = 0
      if before_now then
        p = cur -- contiguous: the recorded count is now's window's previous
      end
      w, cur, prev = cal.b[k], 0, p
    end
    cur = add_sat(cur, delta)
  elseif in_recorded and eq(at_s, w) then -- at's window is still the current one
    if cur == 0 then
      return false
    end
    cur = cur - math.min(-delta, cur)
  elseif in_recorded and eq(at_e, w) then -- at's is the previous window, still weighted
    if prev == 0 then
      return false
    end
    prev = prev - math.min(-delta, prev)
  elseif before_now and eq(at_s, w) then -- at's window is now's previous one
    if cur == 0 then
      return false
    end
    cur = cur - math.min(-delta, cur)
  else
    return false
  end
  cal_write(key, logkey, 0, 0, h, w, cur, prev)
  return true
end

-- settle_calendar settles a calendar policy's charge: first a peek (the decision's own checks:
-- Redis's now among the windows passed, the recorded window and its neighbours known), so that a
-- window the script cannot place is an error before anything is written, then the settlement.
-- at_arg is ARGV[11]. Returns changed, or nil and the error reply.
-- at_given: ARGV[5] was not empty.
local function settle_calendar(key, logkey, alg, limit, cal, at, at_given, now, at_arg, delta)
  local at_s, at_e
  if at_given then
    local a, b = string.match(at_arg or '', '^(%-?%d+) (%-?%d+)$')
    if a ~= nil and #a <= 20 and #b <= 20 then
      at_s, at_e = parse_int(a), parse_int(b)
    end
    local function beyond(v) -- an int from 2^62 on (or down from -2^62): no window's boundary
      return W ~= nil and type(v) == 'table' and W.mag_cmp(v, W.TWO62) >= 0
    end
    if at_s == nil or at_e == nil or beyond(at_s) or beyond(at_e) or lt(at, at_s) or not lt(at, at_e) then
      return nil, redis.error_reply('ERR sluice: at\'s window ' .. string.format('%q', string.sub(tostring(at_arg), 1, 60)) ..
        ' must be two integers (µs), start ≤ at < end')
    end
  end
  local ok, msg = cal_deciders[alg](key, logkey, limit, cal, 0, 0, now)
  if ok == nil then
    return nil, redis.error_reply(msg)
  end
  local k = cal_window(cal, now) -- (not nil: the peek placed now)
  if not at_given then
    at_s, at_e = cal.b[k], cal.b[k + 1] -- at is now
  end
  if alg == FIXED_WINDOW then
    return settle_fixed_calendar(key, logkey, limit, cal, k, now, at_s, delta)
  end
  return settle_sliding_calendar(key, logkey, limit, cal, k, now, at_s, at_e, delta)
end

-- settle_gcra: charge (gcraAdvance, refusing a tat from 2^62 on) or gcraRefund.
local function settle_gcra(key, logkey, alg, limit, period, at, now, reserved, delta)
  local current, tat, frac, _, s_limit = read_state(key, logkey, alg, limit, period, 'tat', 'frac')
  local converted = false -- s.adopt(p, now)
  if current and s_limit ~= limit then
    tat, frac, converted = gcra_convert(s_limit, limit, tat, frac, now)
  end
  if delta > 0 then
    tat, frac = gcra_advance(limit, period, current, tat, frac, now, delta)
    if W ~= nil and W.cmp(tat, W.TWO62) >= 0 then
      return nil, redis.error_reply('ERR sluice: actual ' .. ARGV[7] .. ': an extra charge of ' .. fmt(delta) ..
        ' would delay the key beyond any clock')
    end
  else
    local wait = gcra_wait(limit, current, tat, frac, now) -- limit·(tat - now), 0 if tat ≤ now
    if wait == 0 then
      return false -- (not converted either: gcra_convert leaves such a state alone)
    end
    local back = mul(-delta, period)
    -- What is left of the charge: reserved·period - limit·(now - at), if positive.
    local left = mul(reserved, period)
    if lt(at, now) then
      local elapsed = mul(limit, sub(now, at))
      if not lt(elapsed, left) then
        if converted then
          write_state(key, logkey, 0, 0, alg, limit, period, tat, frac)
        end
        return converted
      end
      left = sub(left, elapsed)
    end
    if lt(left, back) then
      back = left
    end
    if lt(wait, back) then
      back = wait
    end
    local q, r = divmod(back, limit) -- r < limit: a number
    tat, frac = sub(tat, q), frac - r
    if frac < 0 then
      tat, frac = sub(tat, 1), frac + limit
    end
  end
  write_state(key, logkey, 0, 0, alg, limit, period, tat, frac)
  return true
end

local function settle_sliding_log(key, logkey, limit, period, at, now, reserved, delta)
  local all = redis.call('LRANGE', logkey, '0', '-1')
  local current, sum = false, 0
  if all[1] ~= nil then
    local alg, l, p, count = string.match(all[1], '^(%d+):(%d+):(%d+):(%d+)$')
    local stamp = parse_int(p, true)
    current = tonumber(alg) == SLIDING_LOG and l ~= nil and -- of any limit: the log is the use, kept
      (stamp == period or (W ~= nil and stamp ~= nil and W.cmp(stamp, period) == 0)) and #all > 1
    sum = tonumber(count)
  end
  local n = 0
  if current then
    n = #all - 1
  else
    sum = 0
  end
  local function entry(e) -- entry e (1-based): list element e
    local a, c = string.match(all[e + 1], '^(%-?%d+):(%d+)$')
    return parse_int(a, true), tonumber(c)
  end
  if delta > 0 then
    local start = 0
    while start < n do
      local a, c = entry(start + 1)
      if lt(sub(now, period), a) then
        break
      end
      sum = sum - c
      start = start + 1
    end
    local cost = math.min(delta, math.max(0, MAX_COUNT - sum))
    if cost == 0 then
      return false
    end
    local t = now
    if n > 0 then
      local last = entry(n)
      if lt(now, last) then
        t = last -- keep the log sorted (see slidingLog)
      end
    end
    sum = sum + cost
    local e = fmt(t) .. ':' .. fmt(cost)
    if not current then
      redis.call('DEL', key, old_key(key, logkey), logkey)
      redis.call('RPUSH', logkey, log_header(limit, period, sum), e)
    else
      if start > 0 then
        redis.call('LTRIM', logkey, fmt(start), '-1')
      end
      redis.call('LSET', logkey, '0', log_header(limit, period, sum))
      redis.call('RPUSH', logkey, e)
    end
    return true
  end
  if not current or not lt(sub(now, period), at) then
    return false -- nothing held, or the charge's entry has expired
  end
  -- The entry of the charge: the last ones at at, reduced from the newest.
  local left, costs, first = -delta, {}, nil
  for e = n, 1, -1 do
    local a, c = entry(e)
    if left == 0 or lt(a, at) then
      break
    end
    if eq(a, at) then
      local take = math.min(left, c)
      costs[e], left, sum, first = c - take, left - take, sum - take, e
    end
  end
  if first == nil then
    return false
  end
  -- Rewrite the list from the first entry changed: its head kept, then the rest with their new
  -- costs, those down to 0 dropped (a zero-cost entry would only hold the key's reset open).
  local rest = {}
  for e = first, n do
    local c = costs[e]
    if c == nil then
      rest[#rest + 1] = all[e + 1]
    elseif c > 0 then
      rest[#rest + 1] = fmt(entry(e)) .. ':' .. fmt(c)
    end
  end
  if first == 1 and #rest == 0 then
    redis.call('DEL', logkey) -- no entry left: as if never seen
    return true
  end
  redis.call('LTRIM', logkey, '0', fmt(first - 1))
  redis.call('LSET', logkey, '0', log_header(limit, period, sum))
  if #rest > 0 then
    redis.call('RPUSH', logkey, unpack(rest))
  end
  return true
end

local alg, limit, period, burst = check_args(ARGV[1], ARGV[2], ARGV[3], ARGV[4], '0')
if alg == nil then
  return limit -- the error reply
end
local amounts = {}
for i, name in ipairs({'reserved', 'actual'}) do
  local v = parse_int(ARGV[5 + i])
  if v == nil or type(v) == 'table' or v < 0 or v > MAX_COUNT then
    return redis.error_reply('ERR sluice: ' .. name .. ' ' .. string.format('%q', string.sub(tostring(ARGV[5 + i]), 1, 40)) ..
      ' must be an integer in 0..2^53')
  end
  amounts[i] = v
end
local reserved, actual = amounts[1], amounts[2]
local now, ttl_slack, time = time_args(ARGV[8], ARGV[9], has_deadline(ARGV[10]))
if now == nil then
  return ttl_slack -- the error reply
end
if past_deadline(ARGV[10], time) then
  return deadline_error(ARGV[10], time)
end
local once = KEYS[3] ~= nil
if once then
  local ms = ARGV[13]
  if ms == nil or not string.match(ms, '^[1-9]%d?%d?%d?%d?%d?%d?%d?%d?%d?%d?%d?$') then
    return redis.error_reply('ERR sluice: the id\'s TTL ' .. string.format('%q', string.sub(tostring(ms), 1, 40)) ..
      ' must be a positive integer of ms below 10^12')
  end
  if redis.call('EXISTS', KEYS[3]) == 1 then
    return {0, reply_int(time or now)} -- made already, by an earlier attempt
  end
end
local at = now
if ARGV[5] ~= nil and ARGV[5] ~= '' then
  at = parse_int(ARGV[5])
  if at == nil or (W ~= nil and type(at) == 'table' and W.mag_cmp(at, W.TWO60) >= 0) then
    return redis.error_reply('ERR sluice: at ' .. string.format('%q', string.sub(tostring(ARGV[5]), 1, 40)) ..
      ' must be an integer number of µs, |at| < 2^60')
  end
end
local delta = actual - reserved -- (both ≤ 2^53: exact)
local cal = type(period) == 'table' and period.token ~= nil -- a calendar policy: period is its windows
local changed, err = false, nil
if delta ~= 0 then
  if cal then
    changed, err = settle_calendar(KEYS[1], KEYS[2], alg, limit, period, at, ARGV[5] ~= nil and ARGV[5] ~= '', now, ARGV[11], delta)
  elseif alg == FIXED_WINDOW then
    changed = settle_fixed_window(KEYS[1], KEYS[2], limit, period, at, now, reserved, delta)
  elseif alg == SLIDING_WINDOW then
    changed = settle_sliding_window(KEYS[1], KEYS[2], limit, period, at, now, reserved, delta)
  elseif alg == SLIDING_LOG then
    changed = settle_sliding_log(KEYS[1], KEYS[2], limit, period, at, now, reserved, delta)
  else
    changed, err = settle_gcra(KEYS[1], KEYS[2], alg, limit, period, at, now, reserved, delta)
  end
end
if err ~= nil then
  return err
end
if once then
  redis.call('SET', KEYS[3], '1', 'PX', ARGV[13])
end
if changed then
  -- The state's TTL: its ResetAfter now, as a peek tells (a peek writes nothing).
  local decide = deciders[alg]
  if cal then
    decide = cal_deciders[alg] -- (it places now as the peek before the settlement did)
  end
  local _, _, _, _, reset = decide(KEYS[1], KEYS[2], limit, period, burst, 0, now)
  local k = KEYS[1]
  if alg == SLIDING_LOG then
    k = KEYS[2]
  end
  if redis.call('EXISTS', k) == 1 then
    expire(k, reset, ttl_slack)
  end
  if delta < 0 and ARGV[12] ~= nil and ARGV[12] ~= '' then
    redis.call('PUBLISH', ARGV[12], KEYS[1]) -- (the state key: the client's key as the keys hold it, hashed or not)
  end
end
return {changed and 1 or 0, reply_int(time or now)}
