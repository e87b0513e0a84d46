-- sluice: the helpers of the scripts that decide several requests in one call (multi.lua,
-- batch.lua), assembled after the algorithm files and before the entry file; a single decision's
-- script has no need of them (and every function a script defines costs on every call).

-- nth_args holds the arguments of each request of a multi.lua or batch.lua call, parsed and
-- checked by check_all: nth_args[i] = {alg, limit, period, burst, cost, max_delay, calendar} for request
-- i, whose keys are KEYS[2i-1], KEYS[2i] and whose arguments are the stride of them from
-- ARGV[4+stride(i-1)]: alg, limit, period, burst and cost, then with a stride of 7 (multi.lua)
-- max_delay and dry_run (batch.lua's requests are Decide's: stride 5, no bound on a hold).
local nth_args = {}

-- check_all checks the arguments of all n requests (check_args) before any is decided, so that a
-- bad one fails the call with nothing written: nil, or the error reply.
local function check_all(n, stride)
  local p1, p2, p3, p4, p5, prev -- the previous request's five arguments, and its parsed ones
  for i = 1, n do
    local a = 3 + stride * (i - 1)
    local a1, a2, a3, a4, a5 = ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4], ARGV[a + 5]
    local alg, limit, period, burst, cost
    if a1 == p1 and a2 == p2 and a3 == p3 and a4 == p4 and a5 == p5 then
      -- The same as the previous request's (one policy and cost: the usual batch). Lua interns
      -- strings, so these are five pointer comparisons instead of parsing and checking again.
      alg, limit, period, burst, cost = prev[1], prev[2], prev[3], prev[4], prev[5]
    else
      if deciders[tonumber(a1)] == nil then
        return redis.error_reply('ERR sluice: unknown algorithm ' .. tostring(a1))
      end
      alg, limit, period, burst, cost = check_args(a1, a2, a3, a4, a5)
      if alg == nil then
        return limit -- the error reply
      end
      p1, p2, p3, p4, p5 = a1, a2, a3, a4, a5
    end
    local max_delay = -1
    if stride == 7 then
      -- max_delay: -1 (no bound) or the µs a leaky bucket may hold the request, below 2^53
      -- (time.Duration's most in µs is below 2^54: the store sends no more than it says).
      max_delay = tonumber(ARGV[a + 6])
      if max_delay == nil or max_delay % 1 ~= 0 or max_delay < -1 or max_delay >= 9007199254740992 or #ARGV[a + 6] > 16 then
        return redis.error_reply('ERR sluice: max_delay ' .. string.format('%q', string.sub(tostring(ARGV[a + 6]), 1, 40)) ..
          ' must be -1 or an integer number of µs in 0..2^53')
      end
      local dry = ARGV[a + 7]
      if dry ~= '0' and dry ~= '1' then
        return redis.error_reply('ERR sluice: dry_run ' .. string.format('%q', string.sub(tostring(dry), 1, 40)) .. ' must be 0 or 1')
      end
    end
    nth_args[i] = {alg, limit, period, burst, cost, max_delay, type(period) == 'table' and period.token ~= nil}
    prev = nth_args[i]
  end
  return nil
end

-- decide_nth decides request i of a multi.lua or batch.lua call, checked by check_all, at now,
-- returning what the decider returns (through decided).
local function decide_nth(i, now)
  local a = nth_args[i]
  if a[7] then -- a calendar policy (calendar.lua)
    return decided(cal_deciders[a[1]](KEYS[2 * i - 1], KEYS[2 * i], a[2], a[3], a[4], a[5], now))
  end
  return decided(deciders[a[1]](KEYS[2 * i - 1], KEYS[2 * i], a[2], a[3], a[4], a[5], now, a[6]))
end

-- decide_limits decides limits 1..n at now, as if each were alone (decide_nth): their replies
-- (six numbers each, in order), the commits of those that would consume, and whether every
-- enforced one (ARGV's dry-run flag not '1') allowed. nil and a message instead for a calendar
-- window the script cannot place: nothing is written yet.
local function decide_limits(n, now)
  local reply, commits, all = {}, {}, true
  for i = 1, n do
    local allowed, capacity, remaining, retry, reset, delay, commit = decide_nth(i, now)
    if allowed == nil then
      return nil, capacity
    end
    local r = 6 * (i - 1)
    reply[r + 1], reply[r + 2], reply[r + 3], reply[r + 4], reply[r + 5], reply[r + 6] =
      allowed, capacity, remaining, retry, reset, delay
    if allowed == 0 and ARGV[3 + 7 * i] ~= '1' then
      all = false
    end
    if commit ~= nil then
      commits[#commits + 1] = commit
    end
  end
  return reply, commits, all
end
