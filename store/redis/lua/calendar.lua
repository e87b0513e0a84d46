-- sluice: calendar windows (a day, an ISO week, a month, a year in a time zone) of the fixed-window
-- and sliding-window algorithms, decided on Redis's clock. Assembled after common.lua (and the
-- algorithm files) in the scripts that decide calendar policies: the calendar single scripts
-- (common.lua, this file, single.lua deciding with cal_deciders), multi.lua, batch.lua and the
-- library. Their ARGV are the usual ones; only a calendar policy's period argument differs.
--
-- Redis has no time zones, and the script cannot know which local day Redis's TIME falls in. So
-- the store passes, instead of a period in µs, the calendar windows around its own clock, as
-- algorithm.Calendar.Window computes them (Go's zone data, the same on every instance):
--
--   "<calendar>@<zone> <b1> <b2> ... <bn>"       e.g. "day@Europe/Berlin 1774562400000000 ..."
--
-- b1 < b2 < ... < bn are consecutive window boundaries in µs: window k is [b_k, b_k+1). The store
-- passes six (calendar.go, calendarArg): the starts of the two windows before its own, of its own and
-- of the two after, and the end of the last, so that a Redis clock up to one window away from the
-- instance's still finds its window with the one before it and the one after. The script decides
-- in the window that holds Redis's now (or the test's now), never the instance's. A now outside
-- the windows passed is an error reply, 'ERR sluice: calendar: time <µs> is outside ...', and
-- nothing is written: never a decision in a wrong window.
--
-- <calendar>@<zone> is the policy's stamp in place of the period (common.lua, STATE): a state
-- written under another calendar or zone is never seen. The state's window field is the window's
-- START in µs (algorithm.State.Window of a calendar policy), not an index:
--
--   "1 1000 day@Europe/Berlin 1774735200000000 17"          fixed-window: start, count
--   "3 1000 month@UTC 1774994400000000 12 40"               sliding-window: start, count, prev
--
-- The decisions mirror algorithm/fixedwindow.go and algorithm/slidingwindow.go, with window w's
-- end the next boundary instead of (w+1)·period, and the sliding window weighted by the length of
-- the current window: approve iff prev·(len - e) + (cur + cost)·len ≤ limit·len, e = now - start.
-- Boundaries and times are ints of common.lua (a number below 2^53 µs, the years 1685 to 2255;
-- limbs beyond, for the core's whole range of |now| < 2^60), compared and subtracted as such; a
-- window's length, and a time into it, are numbers (below a year).

-- eq reports whether two ints are equal.
local function eq(a, b)
  if W == nil then
    return a == b
  end
  return W.cmp(a, b) == 0
end

-- calendar_period (declared in common.lua, for check_args) returns the period argument a as a
-- table {token = '<calendar>@<zone>', b = {b1, ..., bn}, n = n}, or nil if it is not one: at
-- least two boundaries, each an integer of at most 20 characters strictly inside ±2^62,
-- strictly increasing.
calendar_period = function(a)
  if type(a) ~= 'string' or #a > 512 then
    return nil
  end
  local token, rest = string.match(a, '^(%l+@[%w/_+%-]*) ([%d %-]+)$')
  if token == nil then
    return nil
  end
  local b, n = {}, 0
  for x in string.gmatch(rest, '%S+') do
    local v = #x <= 20 and parse_int(x) or nil
    if v == nil or (W ~= nil and type(v) == 'table' and W.mag_cmp(v, W.TWO62) >= 0) or (n > 0 and not lt(b[n], v)) then
      return nil
    end
    n = n + 1
    b[n] = v
  end
  if n < 2 then
    return nil
  end
  return {token = token, b = b, n = n}
end

-- cal_stamp is the state string's prefix for a calendar policy, with the space after it.
local function cal_stamp(alg, limit, token)
  return string.format('%d %d ', alg, limit) .. token .. ' '
end

-- cal_read reads key's state under the calendar stamp h: current, then its nfields (2 or 3)
-- numbers, 0 if not current. A state under a stamp of another algorithm, calendar or zone, a
-- sliding log's list or the old format's hash beside it is not current (no old version wrote
-- calendar states) and marks key stale, so that a write replaces it whole; one of another limit is
-- current (its counts are kept).
local function cal_read(key, logkey, h, nfields)
  local v = redis.call('GET', key)
  if v then
    local i1 = string.find(h, ' ', 1, true) -- h is "<alg> <limit> <token> " (the token has no space)
    local i2 = string.find(h, ' ', i1 + 1, true)
    local i = match_stamp(v, string.sub(h, 1, i1), string.sub(h, i2))
    if i ~= nil then
      local a, b, c
      if nfields == 3 then
        a, b, c = string.match(v, '^(%-?%d+) (%-?%d+) (%-?%d+)$', i)
      else
        a, b = string.match(v, '^(%-?%d+) (%-?%d+)$', i)
      end
      if a ~= nil then
        return true, parse_int(a, true), parse_int(b, true), c and parse_int(c, true) or 0
      end
    end
    stale[key] = true
    return false, 0, 0, 0
  end
  if redis.call('EXISTS', old_key(key, logkey), logkey) ~= 0 then
    stale[key] = true
  end
  return false, 0, 0, 0
end

-- cal_write writes key's state, h then the numbers v1, v2[, v3], with write_state's TTL.
local function cal_write(key, logkey, reset, ttl_slack, h, v1, v2, v3)
  if stale[key] then
    redis.call('DEL', logkey)
    stale[key] = nil
  end
  local ms = divceil(add(reset, ttl_slack), 1000)
  if ms == 0 then
    ms = 1
  end
  local v = h .. fmt(v1) .. ' ' .. fmt(v2)
  if v3 ~= nil then
    v = v .. ' ' .. fmt(v3)
  end
  redis.call('SET', key, v, 'PX', fmt(ms))
end

-- cal_error is the reply of a decision whose window the boundaries passed do not say: now
-- outside them, or (ahead) a state recorded in a later window than they reach.
local function cal_error(now, cal, ahead)
  local why = 'is outside the calendar windows passed'
  if ahead ~= nil then
    why = 'is before the recorded window ' .. fmt(ahead) .. ', beyond the calendar windows passed'
  end
  return 'ERR sluice: calendar: time ' .. fmt(now) .. ' ' .. why .. ' (' .. fmt(cal.b[1]) .. ' .. ' ..
    fmt(cal.b[cal.n]) .. '): Redis\'s clock and this instance\'s differ by more than a window'
end

-- cal_window returns the index k of the window that holds now (b[k] ≤ now < b[k+1]), or nil.
local function cal_window(cal, now)
  local b, n = cal.b, cal.n
  if lt(now, b[1]) or not lt(now, b[n]) then
    return nil
  end
  for k = 1, n - 1 do
    if lt(now, b[k + 1]) then
      return k
    end
  end
  return nil
end

-- cal_recorded returns the index of the recorded window start s among the boundaries, or nil.
local function cal_recorded(cal, s)
  for k = 1, cal.n do
    if eq(cal.b[k], s) then
      return k
    end
  end
  return nil
end

-- decide_fixed_calendar is decide_fixed_window (algorithm/fixedwindow.go) on calendar windows.
-- On error: nil and the error's message, nothing written.
local function decide_fixed_calendar(key, logkey, limit, cal, burst, cost, now)
  local h = cal_stamp(FIXED_WINDOW, limit, cal.token)
  local current, s_window, s_count = cal_read(key, logkey, h, 2)
  local k = cal_window(cal, now)
  if k == nil then
    return nil, cal_error(now, cal)
  end
  local count = 0
  if current and lt(now, s_window) then
    -- Before the recorded window (the clock ran backward): stay in it, if its end is known.
    local j = cal_recorded(cal, s_window)
    if j == nil or j == cal.n then
      return nil, cal_error(now, cal, s_window)
    end
    k, count = j, s_count
  elseif current and eq(s_window, cal.b[k]) then
    count = s_count -- still in the recorded window
  end
  local start, end_ = cal.b[k], cal.b[k + 1] -- a refusal holds, and the count lasts, until end_
  local allowed = cost <= limit - count
  local retry, reset = 0, 0
  local commit = nil
  if allowed then
    if cost > 0 then
      count = count + cost
      commit = function(ttl_slack)
        cal_write(key, logkey, reset, ttl_slack, h, start, count)
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

-- decide_sliding_calendar is decide_sliding_window (algorithm/slidingwindow.go) on calendar
-- windows, the previous window weighted by the current window's length len: with e = at - start,
--
--	approve iff prev·(len - e) + (cur + cost)·len ≤ limit·len
--
-- It needs the window before the one decided in (is the recorded one it?) and the one after (a
-- refusal's wait may run into it, and the count lasts until its end). On error: nil and the
-- error's message, nothing written.
local function decide_sliding_calendar(key, logkey, limit, cal, burst, cost, now)
  local h = cal_stamp(SLIDING_WINDOW, limit, cal.token)
  local current, s_window, s_count, s_prev = cal_read(key, logkey, h, 3)
  local k = cal_window(cal, now)
  if k == nil then
    return nil, cal_error(now, cal)
  end
  local at = now -- the instant decided at; later than now only if the clock ran backward
  local prev, cur = 0, 0
  local fresh = true
  if current and lt(now, s_window) then
    -- Before the recorded window (the clock ran backward): decide at its start.
    local j = cal_recorded(cal, s_window)
    if j == nil or j + 2 > cal.n then
      return nil, cal_error(now, cal, s_window)
    end
    k, prev, cur, at, fresh = j, s_prev, s_count, s_window, false
  elseif current and eq(s_window, cal.b[k]) then
    prev, cur, fresh = s_prev, s_count, false -- in the recorded window
  end
  if k < 2 or k + 2 > cal.n then
    return nil, cal_error(now, cal) -- the window before or after this one is not known
  end
  if fresh and current and eq(s_window, cal.b[k - 1]) then
    prev = s_count
  end
  local start, end_, next_end = cal.b[k], cal.b[k + 1], cal.b[k + 2]
  local len, e = sub(end_, start), sub(at, start) -- (numbers: below a year)
  local allowed = le(add(mul(prev, len - e), mul(add(cur, cost), len)), mul(limit, len))
  local retry, reset = 0, 0
  local commit = nil
  if allowed then
    if cost > 0 then
      cur = cur + cost
      commit = function(ttl_slack)
        cal_write(key, logkey, reset, ttl_slack, h, start, cur, prev)
      end
    end
  elseif cost <= limit - cur then
    -- Approved later in this window, once prev·(len - e') ≤ (limit - cur - cost)·len; x < len - e.
    local x = divmod(mul(limit - cur - cost, len), prev)
    retry = sub(sub(end_, x), now)
  else
    -- Not in this window; in the next one, of length len2, prev' = cur and cur' = 0, and the
    -- request is approved at e'' = len2 - floor((limit - cost)·len2 / cur) into it (x < len2).
    local len2 = sub(next_end, end_)
    local x = divmod(mul(limit - cost, len2), cur)
    retry = sub(sub(next_end, x), now)
  end
  local remaining = limit - cur
  if prev > 0 then
    remaining = remaining - divceil(mul(prev, len - e), len)
  end
  if cur > 0 then
    reset = sub(next_end, now)
  elseif prev > 0 then
    reset = sub(end_, now)
  end
  return allowed and 1 or 0, limit, math.max(0, remaining), retry, reset, 0, commit
end

local cal_deciders = {[FIXED_WINDOW] = decide_fixed_calendar, [SLIDING_WINDOW] = decide_sliding_calendar}
