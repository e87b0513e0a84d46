-- decide_sliding_log mirrors algorithm/slidinglog.go line for line. Precondition: check_args
-- passed (0 ≤ cost ≤ limit), so limit, sum and the costs are numbers; times are ints.
--
-- ONE KEY. The whole state is the list logkey: its first element is the header
-- "alg:limit:period:count" (the stamp, and State.Count), the rest State.Log as "at:cost" strings,
-- oldest first. Losing the key (an eviction, a DEL) then loses the whole state, which is as if
-- never seen: the client gets its quota back, and is never left with a count whose entries, gone,
-- can no longer expire. The key of every other algorithm's state is not read; a renewal deletes
-- it, with whatever state another algorithm, or an earlier version of sluice, left there (and the
-- old format's hash beside it: common.lua, THE OLD FORMAT).
-- (Before this layout the count lived in the hash and only the entries in this list: such a list
-- starts with an entry, not a header, so it reads as never seen and the first approval replaces
-- it; while instances of both versions share a Redis, each sees the other's sliding logs as never
-- seen, which errs towards admitting.)

-- log_reader returns elem(i): element i (0-based; 0 is the header) of the list logkey, or nil past
-- its end, read LRANGE_CHUNK at a time, so that a decision reads only the entries it looks at (as
-- the Go loops do).
local LRANGE_CHUNK = 64
local function log_reader(logkey)
  local chunk, base = {}, -1
  return function(i)
    if base < 0 or i < base or i >= base + #chunk then
      chunk, base = redis.call('LRANGE', logkey, fmt(i), fmt(i + LRANGE_CHUNK - 1)), i
    end
    return chunk[i - base + 1]
  end
end

-- log_entry returns the at, cost of log entry i (0-based): list element i + 1.
local function log_entry(elem, i)
  local at, c = string.match(elem(i + 1), '^(%-?%d+):(%d+)$')
  return parse_int(at, true), tonumber(c)
end

-- log_header is the list's first element for a sliding log of limit, period whose entries cost count.
local function log_header(limit, period, count)
  return fmt(SLIDING_LOG) .. ':' .. fmt(limit) .. ':' .. fmt(period) .. ':' .. fmt(count)
end

-- slidingLog: the exact rolling window. An approved request at t counts while now - period < t;
-- approve iff the counted cost plus this cost ≤ limit.
local function decide_sliding_log(key, logkey, limit, period, burst, cost, now)
  local elem = log_reader(logkey)
  -- State.current: the header's algorithm and period are the policy's (a missing key has none).
  local current, s_count = false, 0
  local h = elem(0)
  if h ~= nil then
    local alg, l, p, count = string.match(h, '^(%d+):(%d+):(%d+):(%d+)$')
    local stamp = parse_int(p, true) -- (as read_state's: an int beyond 2^53 only if W is built)
    current = tonumber(alg) == SLIDING_LOG and l ~= nil and -- of any limit: the log is the use, kept
      (stamp == period or (W ~= nil and stamp ~= nil and W.cmp(stamp, period) == 0))
    s_count = tonumber(count)
  end
  local n, sum = 0, 0 -- n = len(log)
  if current then
    n, sum = redis.call('LLEN', logkey) - 1, s_count
    if n < 1 then
      -- A header without entries, which no decision writes (an approval leaves its own entry):
      -- not a state (as a lost key, never seen) rather than a count nothing would expire.
      current, n, sum = false, 0, 0
    end
  end
  -- Skip the expired prefix; sum becomes the cost that still counts.
  local start = 0
  while start < n do
    local at, c = log_entry(elem, start)
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
    last = log_entry(elem, n - 1)
  end
  local commit = nil
  if allowed then
    if cost > 0 then
      local at = now
      if n > 0 and lt(now, last) then
        at = last -- the clock ran backward: keep the log sorted, conservatively
      end
      local trim = start
      sum = sum + cost
      commit = function(ttl_slack) -- s.renew(p, period); s.Count, s.Log = sum, log
        local e = fmt(at) .. ':' .. fmt(cost)
        if not current then
          redis.call('DEL', key, old_key(key, logkey), logkey)
          redis.call('RPUSH', logkey, log_header(limit, period, sum), e)
        else
          -- Drop the expired prefix: LTRIM keeps its last entry in the header's place, which
          -- LSET then overwrites (O(expired), as the prefix the decision skipped).
          if trim > 0 then
            redis.call('LTRIM', logkey, fmt(trim), '-1')
          end
          redis.call('LSET', logkey, '0', log_header(limit, period, sum))
          redis.call('RPUSH', logkey, e)
        end
        expire(logkey, reset, ttl_slack)
      end
      start, last = 0, at
    end
  else
    -- Wait for the oldest entries to expire until this cost fits; entry e stops counting at
    -- e.At + period.
    local left = sum
    for i = start, n - 1 do
      local at, c = log_entry(elem, i)
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
  return allowed and 1 or 0, limit, math.max(0, limit - sum), retry, reset, 0, commit -- (sum > limit after a settlement)
end

deciders[SLIDING_LOG] = decide_sliding_log
