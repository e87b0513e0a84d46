-- sluice: the helpers of the scripts that decide several requests in one call (multi.lua,
-- batch.lua), assembled after the algorithm files and before the entry file; a single decision's
-- script has no need of them (and every function a script defines costs on every call).

-- nth_args holds the arguments of each request of a multi.lua or batch.lua call, parsed and
-- checked by check_all: nth_args[i] = {alg, limit, period, burst, cost} for request i, whose
-- keys are KEYS[2i-1], KEYS[2i] and whose alg, limit, period, burst and cost are
-- ARGV[4+5(i-1) .. 8+5(i-1)].
local nth_args = {}

-- check_all checks the arguments of all n requests (check_args) before any is decided, so that a
-- bad one fails the call with nothing written: nil, or the error reply.
local function check_all(n)
  for i = 1, n do
    local a = 3 + 5 * (i - 1)
    if deciders[tonumber(ARGV[a + 1])] == nil then
      return redis.error_reply('ERR sluice: unknown algorithm ' .. tostring(ARGV[a + 1]))
    end
    local alg, limit, period, burst, cost = check_args(ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4], ARGV[a + 5])
    if alg == nil then
      return limit -- the error reply
    end
    nth_args[i] = {alg, limit, period, burst, cost}
  end
  return nil
end

-- decide_nth decides request i of a multi.lua or batch.lua call, checked by check_all, at now,
-- returning what the decider returns (through decided).
local function decide_nth(i, now)
  local a = nth_args[i]
  return decided(deciders[a[1]](KEYS[2 * i - 1], KEYS[2 * i], a[2], a[3], a[4], a[5], now))
end
