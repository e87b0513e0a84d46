-- sluice: one decision, atomically. Assembled as common.lua + one algorithm file + this file.
--
-- KEYS[1]  the state string, e.g. rate-limit:{customer-42}:orders-api:v2: every algorithm's state
--          but the sliding log's (common.lua, STATE)
-- KEYS[2]  the sliding log's state, one list, e.g. rate-limit:{customer-42}:orders-api:log (same
--          hash tag); always passed, used only by the sliding log, which never reads KEYS[1]. A
--          renewal deletes the other, so that each state is one key. KEYS[2] less ':log' is
--          the old format's hash, read when KEYS[1] is missing (common.lua, THE OLD FORMAT)
-- ARGV[1]  algorithm code: 1 fixed-window, 2 sliding-log, 3 sliding-window, 4 token-bucket,
--          5 leaky-bucket (algorithm.Algorithm); it must be the algorithm this script was built for
-- ARGV[2]  limit
-- ARGV[3]  period, µs
-- ARGV[4]  burst
-- ARGV[5]  cost (0 peeks)
-- ARGV[6]  now, µs; empty: Redis TIME (seconds·10^6 + µs)
-- ARGV[7]  ttl_slack, µs, added to the TTL of the keys an approval writes (empty: 0)
-- ARGV[8]  deadline, µs of Redis TIME (common.lua, DEADLINES); empty or absent: none
--
-- The caller has run algorithm.CheckCost first; the script checks its arguments again
-- (check_args, time_args in common.lua) and replies an error naming a bad one.
--
-- Reply: {allowed (0/1), capacity, remaining, retry, reset, delay, time}, integers, times in µs,
-- as algorithm.Decision.set takes them (retry 0 when allowed), one beyond 2^53 as its decimal
-- string; time is Redis TIME if the script read it (ARGV[6] empty, or a deadline), else now. Only
-- an approval of a cost > 0 writes (the state and its TTL); a refusal or a peek writes nothing.
-- After the deadline: the error 'ERR sluice: deadline passed: ...', and nothing written.
--
-- A calendar policy (fixed-window or sliding-window) is decided by the calendar single script of
-- its algorithm, which is common.lua + calendar.lua + this file deciding with cal_deciders; its
-- ARGV[3] is the calendar's windows instead of a period (calendar.lua).
local decide = deciders[tonumber(ARGV[1])]
if decide == nil then
  return redis.error_reply('ERR sluice: this script does not decide algorithm ' .. tostring(ARGV[1]))
end
local alg, limit, period, burst, cost = check_args(ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5])
if alg == nil then
  return limit -- the error reply
end
if (type(period) == 'table' and period.token ~= nil) ~= calendar_entry then -- (calendar_entry: common.lua)
  return redis.error_reply('ERR sluice: period ' .. string.format('%q', string.sub(tostring(ARGV[3]), 1, 40)) ..
    (calendar_entry and " must be a calendar's windows in this script" or ' must be µs in this script (a calendar is decided by its own)'))
end
local now, ttl_slack, time = time_args(ARGV[6], ARGV[7], has_deadline(ARGV[8]))
if now == nil then
  return ttl_slack -- the error reply
end
if past_deadline(ARGV[8], time) then
  return deadline_error(ARGV[8], time)
end
local allowed, capacity, remaining, retry, reset, delay, commit =
  decided(decide(KEYS[1], KEYS[2], limit, period, burst, cost, now))
if allowed == nil then
  return redis.error_reply(capacity) -- a calendar window the script cannot place (calendar.lua)
end
if commit ~= nil then
  commit(ttl_slack)
end
return {allowed, capacity, remaining, retry, reset, delay, reply_int(time or now)}
