-- The instance registry (fleet.go): one sorted set, KEYS[1], of the gateway instances that
-- heartbeat on this Redis, each member an instance's id scored with when it was last heard from
-- (µs of Redis's clock). One call is one heartbeat: it drops the members not heard from for a
-- TTL, adds or refreshes this instance (or removes it: leave), keeps the set's own key for a TTL
-- beyond the last heartbeat (so a fleet that is gone leaves nothing), and answers what is live.
--
-- KEYS[2], if given, is a hash in the same slot (its hash tag is the registry's: fleet.go): each
-- live instance's report of its approvals (ARGV[7], a string fleet.go writes and reads), by id.
-- A member dropped or leaving takes its field with it, and the hash expires with the set.
--
-- KEYS[3], given with KEYS[2], in the same slot: when the registry began (µs), that is when a
-- heartbeat found it empty (none, or every member gone: a new Redis, a restart that lost it, a
-- fleet that was all gone) or found it without this key (written by an older version, or
-- evicted). From then on it is kept as long as the set, so now - began is how long this Redis has
-- kept the registry without a break: once that is a TTL, every live instance has heartbeat into
-- it, and its count is whole (fleet.go: a lower count is taken only then).
--
-- ARGV[1] the instance's id
-- ARGV[2] the TTL, µs: a member last heard from TTL ago or longer is gone
-- ARGV[3] now, µs; "" for Redis TIME (tests pass a virtual clock's)
-- ARGV[4] "beat" or "leave"
-- ARGV[5] how many live members to list, the most recently heard from first
-- ARGV[6] slack, µs, added to the key's TTL (a virtual clock does not move Redis's own)
-- ARGV[7] this instance's report ("" for none: its field is removed)
--
-- Reply: {now µs, live count, {id, last heard from µs, ...}, {report of each listed id, ...},
-- began µs} (the count is of every live member; the list holds at most ARGV[5] of them; a report
-- is false, nil in Go, for a member that sent none; began is "" without KEYS[3]).
local now
if ARGV[3] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[3])
end
local ttl = tonumber(ARGV[2])
-- (Scores are µs of the epoch, below 2^53: exact doubles. '%.0f' writes them whole.)
local gone = string.format('%.0f', now - ttl)
-- The dead members' reports go with them (HDEL in batches: unpack's stack is bounded).
local shares = KEYS[2]
if shares then
  local dead = redis.call('ZRANGE', KEYS[1], '-inf', gone, 'BYSCORE')
  for i = 1, #dead, 1000 do
    redis.call('HDEL', shares, unpack(dead, i, math.min(i + 999, #dead)))
  end
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', gone)
local since, began = KEYS[3], ''
if since then
  began = redis.call('GET', since)
  if not began or redis.call('ZCARD', KEYS[1]) == 0 then
    began = string.format('%.0f', now)
    redis.call('SET', since, began)
  end
end
if ARGV[4] == 'leave' then
  redis.call('ZREM', KEYS[1], ARGV[1])
  if shares then
    redis.call('HDEL', shares, ARGV[1])
  end
else
  redis.call('ZADD', KEYS[1], string.format('%.0f', now), ARGV[1])
  if shares and ARGV[7] ~= '' then
    redis.call('HSET', shares, ARGV[1], ARGV[7])
  elseif shares then
    redis.call('HDEL', shares, ARGV[1])
  end
end
local n = redis.call('ZCARD', KEYS[1])
if n > 0 then
  local ms = math.ceil((ttl + tonumber(ARGV[6])) / 1000)
  redis.call('PEXPIRE', KEYS[1], ms)
  if shares then
    redis.call('PEXPIRE', shares, ms)
  end
  if since then
    redis.call('PEXPIRE', since, ms)
  end
elseif shares then
  redis.call('DEL', shares)
  if since then
    redis.call('DEL', since)
  end
end
local listed = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[5]) - 1, 'REV', 'WITHSCORES')
local reports = {}
if shares and #listed > 0 then
  local listedIDs = {}
  for i = 1, #listed, 2 do
    listedIDs[#listedIDs + 1] = listed[i]
  end
  reports = redis.call('HMGET', KEYS[2], unpack(listedIDs))
end
return {string.format('%.0f', now), n, listed, reports, began}
