-- sluice: several limits of one request, all or nothing, atomically. Assembled as common.lua + all
-- five algorithm files + nth.lua + this file. On a Redis Cluster every key must lie in one slot:
-- those of one client do (its hash tag); the store splits the limits of other keys by slot.
--
-- KEYS     for each limit i = 1..n: its state string KEYS[2i-1] and its sliding log's list KEYS[2i]
--          (as KEYS[1], KEYS[2] of single.lua); the limits' keys must be distinct
-- ARGV[1]  n, the number of limits
-- ARGV[2]  now, µs; empty: Redis TIME
-- ARGV[3]  ttl_slack, µs (empty: 0)
-- ARGV[4+7(i-1) .. 10+7(i-1)]  limit i's alg, limit, period (µs, or a calendar's windows:
--          calendar.lua), burst, cost (as single.lua's ARGV[1..5]), max_delay (µs a leaky bucket may hold the request; -1: no bound) and
--          dry_run (1: the limit counts but never refuses the request; else 0)
-- ARGV[4+7n]  optional (then the deadline follows it): 'check', to decide every limit and write
--          nothing even if all allow — the first phase of a DecideAll whose limits lie in several
--          slots of a Redis Cluster (redis.go, acrossSlots)
-- ARGV[#ARGV]  (after the limits' arguments) the call's deadline, µs of Redis TIME (common.lua,
--          DEADLINES); empty: none
--
-- Each limit is decided as if alone, all at the same now. If every enforced one (dry_run 0) is
-- allowed and the call is not a check, every approval is written, the dry-run limits' included; if any enforced one is
-- refused, nothing is written at all (so the decisions of the allowed ones describe a
-- consumption that did not happen). A dry-run limit's refusal refuses nothing. Every limit's
-- arguments are checked first (check_all): one out of range fails the call with an error reply
-- naming it, and nothing is written. A calendar limit whose window the script cannot place
-- (calendar.lua) fails the call with its error reply, nothing written. After the deadline: the error
-- 'ERR sluice: deadline passed: ...', and nothing written.
--
-- Reply: 6·n + 1 integers, limit i's {allowed, capacity, remaining, retry, reset, delay} (as
-- single.lua's reply) at 6(i-1)+1 .. 6i, then time (as single.lua's).
local n = tonumber(ARGV[1])
if n == nil or #KEYS ~= 2 * n or (#ARGV ~= 4 + 7 * n and #ARGV ~= 5 + 7 * n) then
  return redis.error_reply('ERR sluice: multi script wants 2n keys and 4+7n arguments (5+7n to check)')
end
local check_only = #ARGV == 5 + 7 * n
if check_only and ARGV[4 + 7 * n] ~= 'check' then
  return redis.error_reply('ERR sluice: multi script: mode ' .. string.format('%q', string.sub(tostring(ARGV[4 + 7 * n]), 1, 40)) ..
    ' must be check (or absent)')
end
local deadline = ARGV[#ARGV]
local now, ttl_slack, time = time_args(ARGV[2], ARGV[3], has_deadline(deadline))
if now == nil then
  return ttl_slack -- the error reply
end
if past_deadline(deadline, time) then
  return deadline_error(deadline, time)
end
local err = check_all(n, 7)
if err ~= nil then
  return err
end
local reply, commits, all = decide_limits(n, now)
if reply == nil then
  return redis.error_reply(commits) -- a calendar window the script cannot place: nothing written yet
end
if all and not check_only then
  for _, commit in ipairs(commits) do
    commit(ttl_slack)
  end
end
reply[6 * n + 1] = reply_int(time or now)
return reply
