-- The ledger of a global policy (ledger.go; docs/design.md, "Limits across regions: the ledger"):
-- one call is one region's refresh, in one atomic step, or a read of the whole ledger. It runs
-- after common.lua (its exact mul and divmod: the proportional share's x·S/X, up to 2^94).
--
-- KEYS[1] regions: hash, region -> "want allot used until expires admitted refused at pending"
--         (integers, µs of the ledger's clock for until, expires and at): the region's last report
--         and grant; pending is the allotment it enforced when it sent that report, which it keeps
--         enforcing until the grant reaches it: counted until its next refresh says it has)
-- KEYS[2] meta: hash, since (µs: when this ledger state began) and epoch (a random name given by
--         the call that began it). No meta: the state is new (a flush, a failover to a replica that
--         lacked it, a ledger never used): learning mode until since + the lease + the hold.
-- KEYS[3] (optional) the group's key, for ledgers made in a group (the quota service's buckets of
--         one rule): µs since when the group is known; a new state's since is the group's.
--
-- ARGV[1] "refresh" or "read"
-- ARGV[2] now, µs; "" for Redis TIME (tests pass a virtual clock's)
-- ARGV[3] lease, µs (also the learning mode's length)
-- ARGV[4] the limit L (1..2^47)
-- ARGV[5] N, the regions expected (1..64): the floor is reserved for the N - live not live
-- ARGV[6] the floor F (0..L/N)
-- ARGV[7] "fair" or "proportional"
-- ARGV[8] the most clients the ledger holds (64; up to 1024 with a limit of at most 2^43, and
--         want, holds and used clamped to the limit by the caller: the sums stay exact)
-- ARGV[9] slack, µs, added to the keys' TTL (a virtual clock does not move Redis's own)
-- ARGV[10] an epoch for a state this call begins
-- ARGV[11] hold, µs: how long after its lease ends a region's allotment still counts in full (a
--          window's use made under the lease, not yet reported, cannot be given back before)
-- refresh only:
-- ARGV[12] region; ARGV[13] want (units per period); ARGV[14] used (the part of its holding the
-- region cannot give back now); ARGV[15] until (µs, ledger clock: used counts while now < until);
-- ARGV[16] admitted, ARGV[17] refused (its last interval, for the stats); ARGV[18] holds (the
-- allotment it enforces now); ARGV[19] the expiry of the lease it holds (µs; 0: none)
--
-- Reply (refresh): {allot, expires, learning 0/1, now, since, epoch, share, free}: the free is
-- what others leave it; what it holds from now is max(allot, pending, used)
-- Reply (read): {now, since, epoch, {region, record, ...}} (ARGV[1..11])
-- An error reply "ERR ledger: too many clients" when a new client would be one more than ARGV[8].

local now, err = time_args(ARGV[2], nil, false) -- (common.lua: Redis TIME for "")
if now == nil then
  return err
end
local lease, L, N, F = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local alg, maxRegions, slack, hold = ARGV[7], tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[11])

local meta = redis.call('HMGET', KEYS[2], 'since', 'epoch')
local since, epoch = tonumber(meta[1]), meta[2]

if ARGV[1] == 'read' then
  return {string.format('%.0f', now), since and string.format('%.0f', since) or '', epoch or '',
    redis.call('HGETALL', KEYS[1])}
end

if not since or not epoch then
  since, epoch = now, ARGV[10]
  if KEYS[3] then
    -- A ledger of a group: its new state is as old as the group's (the group key, in the same
    -- slot, says since when every lease of the group's ledgers is known to one of them). A
    -- ledger never used before then learns nothing; a flush takes the group key too.
    local g = tonumber(redis.call('GET', KEYS[3]))
    if not g then
      g = now
      redis.call('SET', KEYS[3], string.format('%.0f', g))
    end
    since = math.min(g, now)
  end
  redis.call('HSET', KEYS[2], 'since', string.format('%.0f', since), 'epoch', epoch)
end
local learning = now < since + lease + hold -- every lease it does not know of, and its hold, ended

-- The records: live (lease unexpired), or expired but still counted (kept as E: in full for the
-- hold after the lease, then the use it reported until that use ends), or gone (dropped: their
-- quota is given back only now, after their lease, the hold and their use ended).
local region = ARGV[12]
local flat = redis.call('HGETALL', KEYS[1])
local recs = {}
local names = {}
local E = 0
local last = 0 -- the latest lease expiry or end of a use that counts, of the records kept
for i = 1, #flat, 2 do
  local name, r = flat[i], {}
  for x in string.gmatch(flat[i + 1], '%-?%d+') do
    r[#r + 1] = tonumber(x)
  end
  local rec = {want = r[1], allot = r[2], used = r[3], ['until'] = r[4], expires = r[5],
    admitted = r[6], refused = r[7], at = r[8], pending = r[9] or 0}
  local counts = rec['until'] > now and rec.used or 0
  if rec.expires + hold > now then
    counts = math.max(counts, rec.allot, rec.pending)
  end
  if rec.expires + hold > now or counts > 0 then
    last = math.max(last, rec.expires + hold, rec['until'])
  end
  if name == region then
    recs[name] = rec -- replaced below
  elseif rec.expires > now then
    rec.hold = math.max(rec.allot, counts)
    recs[name] = rec
    names[#names + 1] = name
  elseif counts > 0 then
    E = E + counts
  else
    redis.call('HDEL', KEYS[1], name)
  end
end
if not recs[region] and redis.call('HLEN', KEYS[1]) >= maxRegions then
  return redis.error_reply('ERR ledger: too many clients (at most ' .. maxRegions .. ')')
end

local want, used, untl = tonumber(ARGV[13]), tonumber(ARGV[14]), tonumber(ARGV[15])
local usedNow = untl > now and used or 0
local pending = 0 -- what it enforces until this grant reaches it (its lease's allotment)
if tonumber(ARGV[19]) > now then
  pending = tonumber(ARGV[18])
end
names[#names + 1] = region
table.sort(names)
local n = #names
local R = F * math.max(0, N - n) -- the floor reserved for the regions not live
local others = 0
for _, name in ipairs(names) do
  if name ~= region then
    others = others + recs[name].hold
  end
end
local free = math.max(0, L - R - E - others)
local share, allot

if learning then
  -- Doorman's learning mode: no new quota; what the region reports holding (its lease's
  -- allotment, or its floor if it has no lease), capped so that the sum stays within the limit.
  local holds = F
  if tonumber(ARGV[19]) > now then
    holds = pending
  end
  share = math.max(holds, usedNow)
  free = math.max(0, L - E - others)
  allot = math.min(share, free)
else
  -- The algorithm over the live regions, sorted by name, each want raised to the floor.
  local C = math.max(0, L - R - E)
  local w, sum = {}, 0
  local me
  for i, name in ipairs(names) do
    local x = name == region and want or recs[name].want
    w[i] = math.max(x, F)
    sum = sum + w[i]
    if name == region then
      me = i
    end
  end
  local gets = {}
  if sum <= C then
    for i = 1, n do
      gets[i] = w[i]
    end
  elseif alg == 'proportional' then
    -- allot.ProportionalShare
    local equal = math.floor(C / n)
    local spare, excess = C, 0
    for i = 1, n do
      gets[i] = math.min(w[i], equal)
      spare = spare - gets[i]
      excess = excess + w[i] - gets[i]
    end
    local rests = {}
    local left = C
    for i = 1, n do
      local x = w[i] - gets[i]
      if x > 0 then
        local q, r = divmod(mul(x, spare), excess)
        gets[i] = gets[i] + q
        rests[#rests + 1] = {i = i, r = r}
      end
      left = left - gets[i]
    end
    table.sort(rests, function(a, b)
      if a.r ~= b.r then
        return a.r > b.r
      end
      return a.i < b.i
    end)
    for _, r in ipairs(rests) do
      if left == 0 then
        break
      end
      if gets[r.i] < w[r.i] then
        gets[r.i] = gets[r.i] + 1
        left = left - 1
      end
    end
  else
    -- allot.FairShare: in rounds, an equal part of what remains to each client not satisfied.
    for i = 1, n do
      w[i] = math.min(w[i], C)
      gets[i] = 0
    end
    local rem = C
    while true do
      local k = 0
      for i = 1, n do
        if gets[i] < w[i] then
          k = k + 1
        end
      end
      if k == 0 or rem == 0 then
        break
      end
      local part = math.floor(rem / k)
      if part == 0 then
        for i = 1, n do
          if rem == 0 then
            break
          end
          if gets[i] < w[i] then
            gets[i] = gets[i] + 1
            rem = rem - 1
          end
        end
        break
      end
      for i = 1, n do
        if gets[i] < w[i] then
          local g = math.min(part, w[i] - gets[i])
          gets[i] = gets[i] + g
          rem = rem - g
        end
      end
    end
  end
  share = gets[me]
  allot = math.min(share, free)
end

local expires = now + lease
redis.call('HSET', KEYS[1], region, string.format('%.0f %.0f %.0f %.0f %.0f %.0f %.0f %.0f %.0f', want, allot, used, untl,
  expires, tonumber(ARGV[16]), tonumber(ARGV[17]), now, pending))

-- Both keys live while a lease or a use that counts does, and a lease beyond (a state that
-- expired begins anew, in learning mode: safe).
last = math.max(last, expires + hold, untl)
local ms = math.ceil((last - now + lease + slack) / 1000)
redis.call('PEXPIRE', KEYS[1], ms)
redis.call('PEXPIRE', KEYS[2], ms)
if KEYS[3] and redis.call('PTTL', KEYS[3]) < ms then
  redis.call('PEXPIRE', KEYS[3], ms) -- the group lives as long as its longest state
end

return {allot, string.format('%.0f', expires), learning and 1 or 0, string.format('%.0f', now),
  string.format('%.0f', since), epoch, share, free}
