-- The region's pool of one global policy (pool.go): its instances, sharing this regional Redis,
-- elect one refresher (KEYS[1], the lock: its id, with a TTL it renews), add their demand into
-- KEYS[2] (hash: admitted, refused, used, until µs of this Redis's clock), and read the grant the
-- refresher publishes, KEYS[3] ("version allotment learning expires_µs epoch", expiring with its
-- lease). KEYS[4] is a shrink in flight: "from from_expires_µs", the larger allotment an instance
-- may still enforce, until every instance had the time to read the smaller one (its TTL).
--
-- ARGV[1] the mode:
--   push id admitted refused used used_for_µs keep_ms  -> 1
--   lead id ttl_ms                                      -> {1|0, the lock's pttl}
--   take id                                             -> {0} not the holder, or {1, admitted,
--        refused, used, used_for_µs, grant|false, grant's pttl, shrink|false}; the counts reset
--   publish id value px_ms from from_expires_µs shrink_ms -> the version, or 0: not the holder
--   read                                                -> {grant|false, pttl}
--   release id                                          -> 1 if id held the lock (now free), else 0
local mode = ARGV[1]
local function holder(id)
  return redis.call('GET', KEYS[1]) == id
end
local function nowus()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
if mode == 'push' then
  local now = nowus()
  redis.call('HINCRBY', KEYS[2], 'admitted', ARGV[3])
  redis.call('HINCRBY', KEYS[2], 'refused', ARGV[4])
  local used, usedFor = tonumber(ARGV[5]), tonumber(ARGV[6])
  if used > 0 and usedFor > 0 then
    local old = redis.call('HMGET', KEYS[2], 'used', 'until')
    local ou, ot = tonumber(old[1] or '0') or 0, tonumber(old[2] or '0') or 0
    local u = now + usedFor
    if ot > now then
      used, u = math.max(used, ou), math.max(u, ot)
    end
    redis.call('HSET', KEYS[2], 'used', string.format('%d', used), 'until', string.format('%d', u))
  end
  redis.call('PEXPIRE', KEYS[2], ARGV[7])
  return 1
elseif mode == 'lead' then
  local cur = redis.call('GET', KEYS[1])
  if cur == false or cur == ARGV[2] then
    redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
    return {1, tonumber(ARGV[3])}
  end
  return {0, redis.call('PTTL', KEYS[1])}
elseif mode == 'release' then
  if holder(ARGV[2]) then
    redis.call('DEL', KEYS[1])
    return 1
  end
  return 0
elseif mode == 'take' then
  if not holder(ARGV[2]) then
    return {0}
  end
  local now = nowus()
  local d = redis.call('HMGET', KEYS[2], 'admitted', 'refused', 'used', 'until')
  redis.call('DEL', KEYS[2])
  local used, usedFor = 0, 0
  local ut = tonumber(d[4] or '0') or 0
  if ut > now then
    used, usedFor = tonumber(d[3] or '0') or 0, ut - now
  end
  return {1, tonumber(d[1] or '0') or 0, tonumber(d[2] or '0') or 0, used, usedFor,
    redis.call('GET', KEYS[3]), redis.call('PTTL', KEYS[3]), redis.call('GET', KEYS[4])}
elseif mode == 'publish' then
  if not holder(ARGV[2]) then
    return 0
  end
  local version = 1
  local old = redis.call('GET', KEYS[3])
  if old then
    version = (tonumber(string.match(old, '^(%d+)')) or 0) + 1
  end
  redis.call('SET', KEYS[3], version .. ' ' .. ARGV[3], 'PX', ARGV[4])
  local from, fromExp = tonumber(ARGV[5]), tonumber(ARGV[6])
  if from > 0 then
    local s = redis.call('GET', KEYS[4])
    if s then
      local f, e = string.match(s, '^(%d+) (%d+)$')
      from, fromExp = math.max(from, tonumber(f)), math.max(fromExp, tonumber(e))
    end
    redis.call('SET', KEYS[4], string.format('%d %d', from, fromExp), 'PX', ARGV[7])
  end
  return version
elseif mode == 'read' then
  return {redis.call('GET', KEYS[3]), redis.call('PTTL', KEYS[3])}
end
return redis.error_reply('pool: unknown mode ' .. tostring(mode))
