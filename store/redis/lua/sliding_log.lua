-- decide_sliding_log mirrors algorithm/slidinglog.go line for line. State.Count is the hash field
-- count; State.Log is the list logkey of "at:cost" strings, oldest first. Precondition: check_args
-- passed (0 ≤ cost ≤ limit), so limit, sum and the costs are numbers; times are ints.

-- log_reader returns entry(i): the at, cost of log entry i (0-based), read LRANGE_CHUNK at a time,
-- so that a decision reads only the entries it looks at (as the Go loops do).
local LRANGE_CHUNK = 64
local function log_reader(logkey)
  local chunk, base = {}, -1
  return function(i)
    if base < 0 or i < base or i >= base + #chunk then
      chunk, base = redis.call('LRANGE', logkey, fmt(i), fmt(i + LRANGE_CHUNK - 1)), i
    end
    local at, c = string.match(chunk[i - base + 1], '^(%-?%d+):(%d+)$')
    return parse_int(at, true), tonumber(c)
  end
end

-- slidingLog: the exact rolling window. An approved request at t counts while now - period < t;
-- approve iff the counted cost plus this cost ≤ limit.
local function decide_sliding_log(key, logkey, limit, period, burst, cost, now)
  local current, s_count = read_state(key, SLIDING_LOG, limit, period, 'count')
  local n, sum = 0, 0 -- n = len(log)
  if current then
    n, sum = redis.call('LLEN', logkey), s_count
  end
  local entry = log_reader(logkey)
  -- Skip the expired prefix; sum becomes the cost that still counts.
  local start = 0
  while start < n do
    local at, c = entry(start)
    if lt(sub(now, period), at) then
      break
    end
    sum = sum - c
    start = start + 1
  end
  local allowed = cost <= limit - sum -- sum + cost ≤ limit, without a sum that could pass 2^53
  local retry, reset = 0, 0
  local last = nil -- log[len(log)-1].At
  if n > 0 then
    last = entry(n - 1)
  end
  local commit = nil
  if allowed then
    if cost > 0 then
      local at = now
      if n > 0 and lt(now, last) then
        at = last -- the clock ran backward: keep the log sorted, conservatively
      end
      -- Drop the expired prefix (LTRIM) and append (RPUSH), in commit.
      local trim = start
      sum = sum + cost
      commit = function(ttl_slack) -- s.renew(p, period); s.Count, s.Log = sum, log
        write_state(key, logkey, not current, SLIDING_LOG, limit, period, 'count', sum)
        if trim > 0 then
          redis.call('LTRIM', logkey, fmt(trim), '-1')
        end
        redis.call('RPUSH', logkey, fmt(at) .. ':' .. fmt(cost))
        expire(key, reset, ttl_slack)
        expire(logkey, reset, ttl_slack)
      end
      start, last = 0, at
    end
  else
    -- Wait for the oldest entries to expire until this cost fits; entry e stops counting at
    -- e.At + period.
    local left = sum
    for i = start, n - 1 do
      local at, c = entry(i)
      left = left - c
      if cost <= limit - left then
        retry = sub(add(at, period), now)
        break
      end
    end
  end
  if sum > 0 then
    reset = sub(add(last, period), now)
  end
  return allowed and 1 or 0, limit, limit - sum, retry, reset, 0, commit
end

deciders[SLIDING_LOG] = decide_sliding_log
