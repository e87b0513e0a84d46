-- sluice: several independent decisions in one call, each atomic and in order. Assembled as
-- common.lua + all five algorithm files + nth.lua + this file. The store sends it to decide the
-- requests that are waiting at once with one script call instead of one each (fewer script
-- dispatches and one TIME for all): on a single server any of them, on a cluster those of one
-- hash slot.
--
-- KEYS     for each decision i = 1..n: its state string KEYS[2i-1] and its sliding log's list KEYS[2i]
-- ARGV[1]  n
-- ARGV[2]  now, µs; empty: Redis TIME
-- ARGV[3]  ttl_slack, µs (empty: 0)
-- ARGV[4+5(i-1) .. 8+5(i-1)]  decision i's alg, limit, period (µs), burst, cost (single.lua's ARGV[1..5])
-- ARGV[#ARGV-n+i]  (the last n arguments, after the decisions') decision i's deadline, µs of Redis
--          TIME (common.lua, DEADLINES); empty: none. Each decision has its own: the requests of
--          a batch come from different callers.
--
-- Decision i is exactly single.lua's, made after decisions 1..i-1 were written: the same as n
-- single calls at the same instant, in this order (several may be on one key). Every decision's
-- arguments are checked first (check_all): one out of range fails the call with an error reply
-- naming it, and nothing is written. A decision whose deadline has passed is not made: it writes
-- nothing, and its reply is {-1, 0, 0, 0, 0, 0}; one of a calendar policy whose window the script
-- cannot place (Redis's clock is outside the windows passed: calendar.lua) is not made either,
-- and its reply is {-2, 0, 0, 0, 0, 0}.
--
-- Reply: 6·n + 1 integers, decision i's {allowed, capacity, remaining, retry, reset, delay} at
-- 6(i-1)+1 .. 6i, then time (as single.lua's); one beyond 2^53 as its decimal string.
local n = tonumber(ARGV[1])
if n == nil or #KEYS ~= 2 * n or #ARGV ~= 3 + 6 * n then
  return redis.error_reply('ERR sluice: batch script wants 2n keys and 3+6n arguments')
end
local deadlines = #ARGV - n
local with_time = false
for i = 1, n do
  with_time = with_time or has_deadline(ARGV[deadlines + i])
end
local now, ttl_slack, time = time_args(ARGV[2], ARGV[3], with_time)
if now == nil then
  return ttl_slack -- the error reply
end
local err = check_all(n, 5)
if err ~= nil then
  return err
end
local reply = {}
for i = 1, n do
  local r = 6 * (i - 1)
  if past_deadline(ARGV[deadlines + i], time) then
    reply[r + 1], reply[r + 2], reply[r + 3], reply[r + 4], reply[r + 5], reply[r + 6] = -1, 0, 0, 0, 0, 0
  else
    local allowed, capacity, remaining, retry, reset, delay, commit = decide_nth(i, now)
    if allowed == nil then -- a calendar window the script cannot place (calendar.lua): not made
      allowed, capacity, remaining, retry, reset, delay = -2, 0, 0, 0, 0, 0
    end
    if commit ~= nil then
      commit(ttl_slack)
    end
    reply[r + 1], reply[r + 2], reply[r + 3], reply[r + 4], reply[r + 5], reply[r + 6] =
      allowed, capacity, remaining, retry, reset, delay
  end
end
reply[6 * n + 1] = reply_int(time or now)
return reply
