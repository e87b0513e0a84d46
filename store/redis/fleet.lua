-- The instance registry (fleet.go): one sorted set, KEYS[1], of the gateway instances that
-- heartbeat on this Redis, each member an instance's id scored with when it was last heard from
-- (µs of Redis's clock). One call is one heartbeat: it drops the members not heard from for a
-- TTL, adds or refreshes this instance (or removes it: leave), keeps the set's own key for a TTL
-- beyond the last heartbeat (so a fleet that is gone leaves nothing), and answers what is live.
--
-- ARGV[1] the instance's id
-- ARGV[2] the TTL, µs: a member last heard from TTL ago or longer is gone
-- ARGV[3] now, µs; "" for Redis TIME (tests pass a virtual clock's)
-- ARGV[4] "beat" or "leave"
-- ARGV[5] how many live members to list, the most recently heard from first
-- ARGV[6] slack, µs, added to the key's TTL (a virtual clock does not move Redis's own)
--
-- Reply: {now µs, live count, {id, last heard from µs, ...}} (the count is of every live
-- member; the list holds at most ARGV[5] of them).
local now
if ARGV[3] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[3])
end
local ttl = tonumber(ARGV[2])
-- (Scores are µs of the epoch, below 2^53: exact doubles. '%.0f' writes them whole.)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%.0f', now - ttl))
if ARGV[4] == 'leave' then
  redis.call('ZREM', KEYS[1], ARGV[1])
else
  redis.call('ZADD', KEYS[1], string.format('%.0f', now), ARGV[1])
end
local n = redis.call('ZCARD', KEYS[1])
if n > 0 then
  redis.call('PEXPIRE', KEYS[1], math.ceil((ttl + tonumber(ARGV[6])) / 1000))
end
local listed = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[5]) - 1, 'REV', 'WITHSCORES')
return {string.format('%.0f', now), n, listed}
