-- sluice: the limits of one request when some are concurrency limits (slots in flight, under a
-- lease), all or nothing, atomically. Assembled as common.lua + all five algorithm files + nth.lua +
-- this file (as multi.lua is). On a Redis Cluster every key must lie in one slot.
--
-- A concurrency limit's state is one sorted set, e.g. rate-limit:{customer-42}:api-conc:slots,
-- of the slots held: a lease of cost c holds c members, its ID (16 hex digits) and then ID/2 ..
-- ID/c, each scored by the lease's expiry in µs (of Redis TIME, unless now is passed). Every call
-- first drops the members expired at now (ZREMRANGEBYSCORE), so the set's size is the slots in
-- flight; its TTL is the last expiry's (plus ttl_slack), so an idle client leaves nothing.
--
-- KEYS     the rate limits' keys as multi.lua's (2n: state string and sliding log of each),
--          then each concurrency limit's sorted set (m)
-- ARGV[1]  n, the number of rate limits
-- ARGV[2]  now, µs; empty: Redis TIME
-- ARGV[3]  ttl_slack, µs (empty: 0)
-- ARGV[4 .. 3+7n]  the rate limits' arguments, as multi.lua's
-- ARGV[4+7n]  m, the number of concurrency limits
-- ARGV[5+7n+5(j-1) .. 9+7n+5(j-1)]  concurrency limit j's limit, lease (µs), cost (slots),
--          dry_run (0/1) and lease ID (1..16 hex digits)
-- ARGV[5+7n+5m]  optional (then the deadline follows it): 'check', to decide and write nothing
--          but the pruning of expired slots (acrossSlots' first phase, redis.go)
-- ARGV[#ARGV]  the call's deadline, µs of Redis TIME (common.lua, DEADLINES); empty: none
--
-- Every limit is decided at the same now. A concurrency limit allows iff the slots in flight
-- plus its cost are at most its limit; a refusal's retry is a hint: the time until enough slots
-- would expire, at most 1s (algorithm.RetryHint; a slot frees whenever a request ends). If every
-- enforced limit allows and the call is not a check, every approval is written; else nothing is.
--
-- Reply: 6(n+m)+1 integers: the rate limits' six (as multi.lua's), then each concurrency
-- limit's {allowed, limit, remaining, retry, reset, 0}, then time.
local n = tonumber(ARGV[1])
if n == nil or n < 0 or n % 1 ~= 0 or #ARGV < 6 + 7 * n then
  return redis.error_reply('ERR sluice: conc script wants n, now, ttl_slack, 7n rate arguments, m, 5m concurrency arguments, a deadline')
end
local m = tonumber(ARGV[4 + 7 * n])
if m == nil or m < 1 or m % 1 ~= 0 or #KEYS ~= 2 * n + m or (#ARGV ~= 5 + 7 * n + 5 * m and #ARGV ~= 6 + 7 * n + 5 * m) then
  return redis.error_reply('ERR sluice: conc script wants 2n+m keys and 5+7n+5m arguments (6+7n+5m to check)')
end
local check_only = #ARGV == 6 + 7 * n + 5 * m
if check_only and ARGV[5 + 7 * n + 5 * m] ~= 'check' then
  return redis.error_reply('ERR sluice: conc script: mode ' .. string.format('%q', string.sub(tostring(ARGV[5 + 7 * n + 5 * m]), 1, 40)) ..
    ' must be check (or absent)')
end
local deadline = ARGV[#ARGV]
local now, ttl_slack, time = time_args(ARGV[2], ARGV[3], has_deadline(deadline))
if now == nil then
  return ttl_slack -- the error reply
end
if type(now) ~= 'number' or type(ttl_slack) ~= 'number' then
  return redis.error_reply('ERR sluice: conc script: now and ttl_slack must be below 2^53 µs')
end
if past_deadline(deadline, time) then
  return deadline_error(deadline, time)
end
local err = check_all(n, 7)
if err ~= nil then
  return err
end
-- The concurrency limits' arguments, checked before anything is decided or written.
local conc = {}
for j = 1, m do
  local a = 4 + 7 * n + 5 * (j - 1)
  local limit, lease, cost, dry, id = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), ARGV[a + 4], ARGV[a + 5]
  local bad
  if limit == nil or limit % 1 ~= 0 or limit < 1 or limit > 65536 then -- algorithm.MaxConcurrency
    bad = 'limit'
  elseif lease == nil or lease % 1 ~= 0 or lease < 1000 or lease >= 9007199254740992 then
    bad = 'lease'
  elseif cost == nil or cost % 1 ~= 0 or cost < 0 or cost > limit then
    bad = 'cost'
  elseif dry ~= '0' and dry ~= '1' then
    bad = 'dry_run'
  elseif type(id) ~= 'string' or #id < 1 or #id > 16 or string.find(id, '^%x+$') == nil then
    bad = 'lease ID'
  end
  if bad ~= nil then
    local at = ({limit = 1, lease = 2, cost = 3, dry_run = 4})[bad] or 5
    return redis.error_reply('ERR sluice: concurrency limit ' .. j .. ': bad ' .. bad .. ' ' ..
      string.format('%q', string.sub(tostring(ARGV[a + at]), 1, 40)))
  end
  conc[j] = {KEYS[2 * n + j], limit, lease, cost, dry == '1', id}
end

local reply, commits, all = decide_limits(n, now)
if reply == nil then
  return redis.error_reply(commits) -- a calendar window the script cannot place: nothing written yet
end

local hint = 1000000 -- algorithm.RetryHint, µs
local take = {}
for j = 1, m do
  local key, limit, lease, cost, dry, id = unpack(conc[j])
  redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%d', now)) -- expired: expires ≤ now
  local held = redis.call('ZCARD', key)
  local allowed = held + cost <= limit
  local retry, remaining, last = 0, limit - held, 0
  local top = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if #top == 2 then
    last = tonumber(top[2])
  end
  if allowed then
    if cost > 0 then
      remaining = remaining - cost
      last = math.max(last, now + lease)
      take[#take + 1] = j
    end
  else
    -- The slots to free: the (held + cost - limit)-th earliest expiry.
    local need = held + cost - limit
    local nth = redis.call('ZRANGE', key, need - 1, need - 1, 'WITHSCORES')
    retry = hint
    if #nth == 2 then
      retry = math.min(hint, tonumber(nth[2]) - now)
    end
    if not dry then
      all = false
    end
  end
  local reset = 0
  if last > now then
    reset = last - now
  end
  local r = 6 * (n + j - 1)
  reply[r + 1], reply[r + 2], reply[r + 3], reply[r + 4], reply[r + 5], reply[r + 6] =
    allowed and 1 or 0, limit, math.max(0, remaining), retry, reset, 0
end

if all and not check_only then
  for _, commit in ipairs(commits) do
    commit(ttl_slack)
  end
  for _, j in ipairs(take) do
    local key, limit, lease, cost, dry, id = unpack(conc[j])
    local exp = string.format('%d', now + lease)
    local args = {exp, id}
    for k = 2, cost do
      args[#args + 1] = exp
      args[#args + 1] = id .. '/' .. k
    end
    redis.call('ZADD', key, unpack(args))
    local last = tonumber(redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')[2])
    redis.call('PEXPIRE', key, math.ceil((last - now + ttl_slack) / 1000))
  end
end
reply[6 * (n + m) + 1] = reply_int(time or now)
return reply
