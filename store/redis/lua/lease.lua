-- sluice: releases or renews leases of one concurrency limit (conc.lua says how its sorted set
-- holds them). Assembled as common.lua + this file.
--
-- KEYS[1]  the limit's sorted set
-- ARGV[1]  'release' or 'renew'
-- ARGV[2]  now, µs; empty: Redis TIME
-- ARGV[3]  ttl_slack, µs (empty: 0)
-- ARGV[4]  the lease time, µs (renew: the leases' new expiry is now plus it)
-- ARGV[5 ..]  lease IDs (1..16 hex digits)
--
-- Expired slots are dropped first, so an expired lease is never renewed (its slots may have been
-- taken since). release: every member of each lease is removed. renew: every member of each
-- lease still held is rescored to now + lease, and the set's TTL follows its last expiry.
-- Reply: {the leases found held, time}.
local op = ARGV[1]
if (op ~= 'release' and op ~= 'renew') or #ARGV < 5 or #KEYS ~= 1 then
  return redis.error_reply('ERR sluice: lease script wants one key and release|renew, now, ttl_slack, lease, IDs')
end
local now, ttl_slack, time = time_args(ARGV[2], ARGV[3], false)
if now == nil then
  return ttl_slack -- the error reply
end
local lease = tonumber(ARGV[4])
if type(now) ~= 'number' or type(ttl_slack) ~= 'number' or lease == nil or lease % 1 ~= 0 or lease < 1000 or lease >= 9007199254740992 then
  return redis.error_reply('ERR sluice: lease script: now, ttl_slack and lease must be integers below 2^53 µs, the lease ≥ 1ms')
end
for i = 5, #ARGV do
  if #ARGV[i] < 1 or #ARGV[i] > 16 or string.find(ARGV[i], '^%x+$') == nil then
    return redis.error_reply('ERR sluice: lease script: bad lease ID ' .. string.format('%q', string.sub(ARGV[i], 1, 40)))
  end
end
local key = KEYS[1]
redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%d', now))
local found = 0
local exp = string.format('%d', now + lease)
for i = 5, #ARGV do
  local id = ARGV[i]
  local member, k = id, 1
  if op == 'release' then
    while redis.call('ZREM', key, member) == 1 do
      if k == 1 then
        found = found + 1
      end
      k = k + 1
      member = id .. '/' .. k
    end
  else
    while redis.call('ZSCORE', key, member) do
      if k == 1 then
        found = found + 1
      end
      redis.call('ZADD', key, 'XX', exp, member)
      k = k + 1
      member = id .. '/' .. k
    end
  end
end
if op == 'renew' and found > 0 then
  local last = tonumber(redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')[2])
  redis.call('PEXPIRE', key, math.ceil((last - now + ttl_slack) / 1000))
end
return {found, reply_int(time or now)}
