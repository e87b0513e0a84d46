-- The clients registry's write (registry.go): compare the record's revision, then write or
-- delete it, give it the registry's next version, note the change and append the audit entry,
-- in one step.
--
-- KEYS[1] records (hash: field -> "<rev> <json>"), KEYS[2] changes (sorted set: field, scored by
-- the version that last wrote it), KEYS[3] version (hash: v, the last version given; epoch, named
-- by the write that began the registry), KEYS[4] audit (stream)
-- ARGV[1] field, ARGV[2] the revision expected (-1: any; 0: none, i.e. create), ARGV[3] the record's
-- JSON ("" deletes), ARGV[4] the audit entry's JSON, ARGV[5] the audit stream's length kept,
-- ARGV[6] an epoch for a registry that begins with this write
-- Reply: {version, previous revision} written; {-1, current revision} if it was not the one
-- expected (nothing written); {-2, 0} for a delete of nothing.
local cur = redis.call('HGET', KEYS[1], ARGV[1])
local rev = 0
if cur then
  rev = tonumber(string.match(cur, '^(%d+) ')) or 0
end
local want = tonumber(ARGV[2])
if want >= 0 and want ~= rev then
  return {-1, rev}
end
if ARGV[3] == '' and not cur then
  return {-2, 0}
end
local v = redis.call('HINCRBY', KEYS[3], 'v', 1)
if v == 1 then
  redis.call('HSET', KEYS[3], 'epoch', ARGV[6])
end
if ARGV[3] == '' then
  redis.call('HDEL', KEYS[1], ARGV[1])
else
  redis.call('HSET', KEYS[1], ARGV[1], v .. ' ' .. ARGV[3])
end
redis.call('ZADD', KEYS[2], v, ARGV[1])
redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[5], '*', 'v', v, 'e', ARGV[4])
return {v, rev}
