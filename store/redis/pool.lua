-- The region's pool of one global policy (pool.go): its instances, sharing this regional Redis,
-- elect one refresher (KEYS[1], the lock: its id, with a TTL it renews), add their demand into
-- KEYS[2] (hash: admitted, refused, used, until µs of this Redis's clock), and read the grant the
-- refresher publishes, KEYS[3] ("version allotment learning expires_µs epoch", expiring with its
-- lease). KEYS[4] is the shrinks in flight: "from from_expires_µs until_µs" for each, the larger
-- allotment an instance may still enforce, until every instance had the time to read the smaller
-- one (until; the key expires with the last); take answers the largest as "from from_expires_µs".
--
-- ARGV[1] the mode:
--   push id admitted refused used used_for_µs keep_ms  -> 1
--   lead id ttl_ms                                      -> {1|0, the lock's pttl}
--   take id keep_ms                                     -> {0} not the holder, or {1, admitted,
--        refused, used, used_for_µs, grant|false, grant's pttl, shrink|false, span_µs}; the counts
--        reset, the take's time kept (for keep_ms) so that the next take's span is known (0: not)
--   publish id value px_ms from from_expires_µs shrink_ms -> the version, or 0: not the holder
--   read                                                -> {grant|false, pttl}
--   release id                                          -> 1 if id held the lock (now free), else 0
local mode = ARGV[1]
local function nowus()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
-- shrinks are the shrinks in flight at now: {from, from_expires, until} each (KEYS[4] holds
-- "from from_expires until" for each; a key of one "from from_expires", as written before, is
-- one shrink until the key's own TTL).
local function shrinks(now)
  local out = {}
  local s = redis.call('GET', KEYS[4])
  if not s then
    return out
  end
  local f, e = string.match(s, '^(%d+) (%d+)$')
  if f then
    return {{tonumber(f), tonumber(e), now + math.max(0, redis.call('PTTL', KEYS[4])) * 1000}}
  end
  for f3, e3, u in string.gmatch(s, '(%d+) (%d+) (%d+)') do
    if tonumber(u) > now then
      out[#out + 1] = {tonumber(f3), tonumber(e3), tonumber(u)}
    end
  end
  return out
end
-- largest is the shrink in flight from the largest allotment, as "from from_expires", or false.
local function largest(es)
  local best = nil
  for _, e in ipairs(es) do
    if best == nil or e[1] > best[1] or (e[1] == best[1] and e[2] > best[2]) then
      best = e
    end
  end
  return best and string.format('%d %d', best[1], best[2]) or false
end
local function holder(id)
  return redis.call('GET', KEYS[1]) == id
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
  local d = redis.call('HMGET', KEYS[2], 'admitted', 'refused', 'used', 'until', 'taken')
  redis.call('DEL', KEYS[2])
  -- When this take was, so that the next one (this refresher's or a new one's) knows the span
  -- its counts came in.
  redis.call('HSET', KEYS[2], 'taken', string.format('%d', now))
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
  local used, usedFor = 0, 0
  local ut = tonumber(d[4] or '0') or 0
  if ut > now then
    used, usedFor = tonumber(d[3] or '0') or 0, ut - now
  end
  local taken, span = tonumber(d[5] or '0') or 0, 0
  if taken > 0 and taken < now then
    span = now - taken
  end
  return {1, tonumber(d[1] or '0') or 0, tonumber(d[2] or '0') or 0, used, usedFor,
    redis.call('GET', KEYS[3]), redis.call('PTTL', KEYS[3]), largest(shrinks(now)), span}
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
    -- Each shrink in flight keeps its own time: a later one (a smaller allotment) does not
    -- extend an earlier, larger one's, which would then be held as long as shrinks follow each
    -- other within a window (a region's demand moving down in steps, or by its noise).
    local now = nowus()
    local es = shrinks(now)
    es[#es + 1] = {from, fromExp, now + tonumber(ARGV[7]) * 1000}
    local parts, last = {}, now
    for i, e in ipairs(es) do
      parts[i] = string.format('%d %d %d', e[1], e[2], e[3])
      last = math.max(last, e[3])
    end
    redis.call('SET', KEYS[4], table.concat(parts, ' '), 'PX', math.ceil((last - now) / 1000))
  end
  return version
elseif mode == 'read' then
  return {redis.call('GET', KEYS[3]), redis.call('PTTL', KEYS[3])}
end
return redis.error_reply('pool: unknown mode ' .. tostring(mode))
