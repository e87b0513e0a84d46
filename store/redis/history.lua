-- The fleet's history (history.go): one sorted set per slot of time, KEYS[i], each member an
-- instance's count ("<instance id> <name>", an id has no space) scored with its value (ZADD and
-- ZRANGE: commands the store's ACL grants already; the values are integers below 2^53, exact in a
-- score). An add sets the instance's counts, it does not add to them: an add sent again (its
-- answer lost, or retried after an outage) changes nothing. A read returns every instance's
-- counts, which the caller sums. All the keys are in the registry's slot.
--
-- ARGV[1] "add" or "read"
-- add:  KEYS[1] the slot's set; ARGV[2] its time to live, ms (set at every add); then member and
--       value pairs, ARGV[3], ARGV[4], ...
--       Reply: the number of counts set.
-- read: KEYS the slots' sets. Reply: for each, its members and values (empty if none).
if ARGV[1] == 'add' then
  local n = 0
  for i = 3, #ARGV, 2 do
    redis.call('ZADD', KEYS[1], ARGV[i + 1], ARGV[i])
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
