-- sluice: helpers shared by every script (see scripts.go for how the scripts are assembled).
--
-- Every file is one part of a single Lua chunk: common.lua, then one or all five algorithm files,
-- then single.lua or multi.lua. Redis forbids global variables in scripts, so every name is a
-- local of that chunk, and each algorithm file registers its decide function in `deciders`.
--
-- EXACTNESS. Lua numbers are doubles: integers are exact only below 2^53, and every value the
-- scripts compute is an integer (µs, costs, counts, fractions of 1/limit µs). The Go side
-- (Store.CheckPolicy, Store.check) only sends inputs that keep every intermediate below 2^53:
--
--   now ≤ 2^52 µs (143 years after the epoch);
--   period ≤ 2^43 µs (a time.Duration); limit ≤ 2^53; cost ≤ limit for the windows and the log,
--     cost ≤ capacity for the token bucket (CheckCost);
--   sliding-window, token-bucket, leaky-bucket: (max(limit, capacity) + 1) · period ≤ 2^51,
--     so every product below of a count (prev, cur, cost, limit, capacity, burst) and a time
--     within one period is ≤ 2^51, and limit < 2^41 (period ≥ 1000 µs);
--   leaky-bucket: cost · period ≤ 2^51.
--
-- Where package algorithm compares or divides 128-bit products (u128), the Lua either relies on
-- those bounds (noted at each place) or reorders the formula so that no term can leave them:
-- count + cost ≤ limit is tested as cost ≤ limit - count (limit may be 2^53 for the fixed window
-- and the sliding log, whose sums the bounds above do not cover), and the buckets keep the wait
-- limit·(tat - now) + frac as the pair (tat - now, frac), because tat - now is unbounded when
-- the clock ran backward (see gcra_wait).
--
-- WRITING NUMBERS. Lua 5.1 turns a number into a string with "%.14g", which would round a
-- 16-digit µs timestamp; and Redis turns a number argument of redis.call into a string its own
-- way. So every number written to Redis goes through fmt ('%d': a 64-bit integer).

local FIXED_WINDOW, SLIDING_LOG, SLIDING_WINDOW, TOKEN_BUCKET, LEAKY_BUCKET = 1, 2, 3, 4, 5 -- algorithm.Algorithm

-- deciders[alg] = decide_<algorithm>(key, logkey, limit, period, burst, cost, now), returning
-- allowed (0/1), capacity, remaining, retry, reset, delay (integer µs, as Decision.set takes them;
-- retry 0 when allowed) and commit: nil if an approval would change nothing, else a function
-- commit(ttl_slack) that writes the approval (so that multi.lua can decide every limit first).
local deciders = {}

local function fmt(x)
  return string.format('%d', x)
end

-- idivmod returns floor(a/b) and a - b·floor(a/b), exactly, for b > 0 and |a| + b < 2^53.
-- The double quotient a/b is correctly rounded, so its floor is at most one off the exact one;
-- the remainder (exact: both terms are integers below 2^53) tells which way. (For |a| < 2^53 the
-- rounding error, below |a|/b·2^-53 < 1/b, cannot reach an integer, so the corrections never
-- run; they are kept so that the result never depends on that argument.)
local function idivmod(a, b)
  local q = math.floor(a / b)
  local r = a - q * b
  while r < 0 do
    q, r = q - 1, r + b
  end
  while r >= b do
    q, r = q + 1, r - b
  end
  return q, r
end

-- idiv is floor(a/b) (algorithm.floorDiv, u128.divmod's quotient).
local function idiv(a, b)
  local q = idivmod(a, b)
  return q
end

-- idivceil is ceil(a/b) (u128.divCeil, State.divCeilP), also for negative a.
local function idivceil(a, b)
  local q, r = idivmod(a, b)
  if r ~= 0 then
    q = q + 1
  end
  return q
end

-- now_arg returns now in µs — the argument, or Redis TIME if it is empty — and Redis TIME in µs
-- if it was read, else nil. It is read once, when arg is empty or with_time is true (a deadline
-- is to be checked: deadlines are always on Redis's clock, whatever decides now).
local function now_arg(arg, with_time)
  local time = nil
  if arg == nil or arg == '' or with_time then
    local t = redis.call('TIME')
    time = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  if arg == nil or arg == '' then
    return time, time
  end
  return tonumber(arg), time
end

-- DEADLINES. A deadline argument is the µs of Redis TIME after which the caller no longer waits
-- for the reply: it has been told that the store is unavailable, so the call must use no quota.
-- A call that runs later (it waited on the socket of a Redis that hung) decides nothing and
-- writes nothing. Empty: no deadline. The store computes it from its own clock and a
-- conservative estimate of Redis's (redis.go).

-- has_deadline reports whether d is a deadline argument (not empty).
local function has_deadline(d)
  return d ~= nil and d ~= ''
end

-- past_deadline reports whether the deadline d has passed at time (Redis TIME, µs).
local function past_deadline(d, time)
  return has_deadline(d) and time > tonumber(d)
end

-- deadline_error is the reply of a call that came after its deadline d: an error, which the store
-- tells apart by its prefix, carrying time so that the store learns Redis's clock from it.
local function deadline_error(d, time)
  return redis.error_reply('ERR sluice: deadline passed: time ' .. fmt(time) .. ' deadline ' .. d)
end

-- read_state reads the state hash key (every algorithm's state but the sliding log's, which is
-- the list logkey alone: sliding_log.lua): current (State.current: the hash's stamp alg, limit,
-- period equals the policy's), then the values of the given fields, 0 if missing. A state
-- that is not current is never seen: all its fields read 0, as in a fresh algorithm.State.
local function read_state(key, alg, limit, period, ...)
  local v = redis.call('HMGET', key, 'alg', 'limit', 'period', ...)
  local current = tonumber(v[1]) == alg and tonumber(v[2]) == limit and tonumber(v[3]) == period
  local n = select('#', ...)
  local out = {}
  for i = 1, n do
    out[i] = current and tonumber(v[3 + i]) or 0
  end
  return current, unpack(out, 1, n)
end

-- write_state writes fields (name, number, name, number, ...) of the state hash key. If renew
-- (the state was not current: State.renew), it first deletes the hash and the log list (where the
-- sliding log keeps its whole state: sliding_log.lua), so that nothing of the old state leaks
-- into the new one, and stamps the new one.
local function write_state(key, logkey, renew, alg, limit, period, ...)
  local args = {}
  if renew then
    redis.call('DEL', key, logkey)
    args = {'alg', fmt(alg), 'limit', fmt(limit), 'period', fmt(period)}
  end
  local fields = {...}
  for i = 1, #fields, 2 do
    args[#args + 1] = fields[i]
    args[#args + 1] = fmt(fields[i + 1])
  end
  redis.call('HSET', key, unpack(args))
end

-- expire sets key's TTL to reset + ttl_slack µs, rounded up to whole ms and at least 1 ms (0 would
-- delete it). reset is the approval's ResetAfter: from then on the state is as if never seen,
-- so Redis deleting it then changes no decision.
local function expire(key, reset, ttl_slack)
  local ms = idivceil(reset + ttl_slack, 1000)
  if ms < 1 then
    ms = 1
  end
  redis.call('PEXPIRE', key, fmt(ms))
end

-- GCRA, shared by the token and the leaky bucket (algorithm/gcra.go): the theoretical arrival
-- time tat = TAT + Frac/limit µs, 0 ≤ Frac < limit; the hash fields tat and frac.
--
-- gcra.go's wait = limit·max(tat - now, 0) is a u128. Here it is the pair (d, f) with
-- wait = limit·d + f: d = TAT - now may be as large as now itself when the clock ran backward,
-- so the product is formed only where the bounds keep it below 2^53 (gcra_le said so first).

-- gcra_wait is gcraWait: (d, f) for the state (current, tat, frac) at now; (0, 0) means zero.
local function gcra_wait(current, tat, frac, now)
  if not current or tat < now or (tat == now and frac == 0) then
    return 0, 0
  end
  return tat - now, frac
end

-- gcra_le reports limit·d + f ≤ x, for 0 ≤ x < 2^53: f ≤ x and d ≤ floor((x - f)/limit).
local function gcra_le(limit, d, f, x)
  if f > x then
    return false
  end
  return d <= idiv(x - f, limit)
end

-- gcra_excess_ceil is ceil((limit·d + f - x)/limit) = d + ceil((f - x)/limit) (u128.sub, divCeil),
-- for a wait above x.
local function gcra_excess_ceil(limit, d, f, x)
  return d + idivceil(f - x, limit)
end

-- gcra_advance is gcraAdvance: it returns tat, frac = max(tat, now) + cost·period/limit for the
-- state (current, tat, frac). Go's check that the result fits a clock is never needed here: it
-- runs on an approval, so limit·(max(tat, now) - now) ≤ capacity·period or burst·period < 2^51,
-- and q ≤ cost·period/limit ≤ 2^51: the result is below now + 2^52 ≤ 2^53.
local function gcra_advance(limit, period, current, s_tat, s_frac, now, cost)
  local tat, frac = now, 0
  if current and (s_tat > now or (s_tat == now and s_frac > 0)) then
    tat, frac = s_tat, s_frac
  end
  local q, r = idivmod(cost * period, limit) -- (Go uses the cached period/limit when cost is 1: the same)
  tat, frac = tat + q, frac + r
  if frac >= limit then
    tat, frac = tat + 1, frac - limit
  end
  return tat, frac
end

-- gcra_until is gcraUntil: ceil(tat - now) µs for a tat after now.
local function gcra_until(tat, frac, now)
  if frac > 0 then
    return tat - now + 1
  end
  return tat - now
end

-- decide_nth decides request i of a multi.lua or batch.lua call, whose requests take stride
-- arguments each — its keys KEYS[2i-1], KEYS[2i], its alg, limit, period, burst and cost
-- ARGV[4+stride(i-1) .. 8+stride(i-1)], and with a stride of 7 its max_delay after them — at now,
-- returning what the decider returns; or nil and an error reply for an unknown algorithm.
local function decide_nth(i, now, stride)
  local a = 3 + stride * (i - 1)
  local decide = deciders[tonumber(ARGV[a + 1])]
  if decide == nil then
    return nil, redis.error_reply('ERR sluice: unknown algorithm ' .. tostring(ARGV[a + 1]))
  end
  local max_delay = -1
  if stride >= 6 then
    max_delay = tonumber(ARGV[a + 6])
  end
  return decide(KEYS[2 * i - 1], KEYS[2 * i], tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4]),
    tonumber(ARGV[a + 5]), now, max_delay)
end
