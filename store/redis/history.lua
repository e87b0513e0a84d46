-- The fleet's history (history.go): one sorted set per slot of time, KEYS[i], each member a
-- count's name scored with its value, which every instance adds its own to (ZSCORE and ZADD: the
-- commands the store's ACL grants already; the sums are integers below 2^53, exact in a score).
-- All the keys are in the registry's slot.
--
-- ARGV[1] "add" or "read"
-- add:  KEYS[1] the slot's set; ARGV[2] its time to live, ms (set at every add); then name and
--       increment pairs, ARGV[3], ARGV[4], ...
--       Reply: the number of counts added to.
-- read: KEYS the slots' sets. Reply: for each, its names and values (empty if none).
if ARGV[1] == 'add' then
  local n = 0
  for i = 3, #ARGV, 2 do
    local v = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[i]) or '0') + tonumber(ARGV[i + 1])
    redis.call('ZADD', KEYS[1], string.format('%.0f', v), ARGV[i])
    n = n + 1
  end
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return n
end
local out = {}
for i = 1, #KEYS do
  out[i] = redis.call('ZRANGE', KEYS[i], 0, -1, 'WITHSCORES')
end
return out
