-- sluice: one decision, atomically. Assembled as common.lua + one algorithm file + this file.
--
-- KEYS[1]  the state hash, e.g. rate-limit:{customer-42}:orders-api: every algorithm's state but
--          the sliding log's
-- KEYS[2]  the sliding log's state, one list, KEYS[1] .. ':log' (same hash tag); always passed,
--          used only by the sliding log, which never reads KEYS[1]. A renewal deletes both keys,
--          so that each state is one key
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
-- The caller has run algorithm.CheckCost and the store's bounds (common.lua) first.
--
-- Reply: {allowed (0/1), capacity, remaining, retry, reset, delay, time}, integers, times in µs,
-- as algorithm.Decision.set takes them (retry 0 when allowed); time is Redis TIME if the script
-- read it (ARGV[6] empty, or a deadline), else now. Only an approval of a cost > 0 writes (the
-- state and its TTL); a refusal or a peek writes nothing. After the deadline: the error
-- 'ERR sluice: deadline passed: ...', and nothing written.
local decide = deciders[tonumber(ARGV[1])]
if decide == nil then
  return redis.error_reply('ERR sluice: this script does not decide algorithm ' .. tostring(ARGV[1]))
end
local now, time = now_arg(ARGV[6], has_deadline(ARGV[8]))
if past_deadline(ARGV[8], time) then
  return deadline_error(ARGV[8], time)
end
local allowed, capacity, remaining, retry, reset, delay, commit =
  decide(KEYS[1], KEYS[2], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), now)
if commit ~= nil then
  commit(tonumber(ARGV[7]) or 0)
end
return {allowed, capacity, remaining, retry, reset, delay, time or now}
