-- sluice: helpers shared by every script (see scripts.go for how the scripts are assembled).
--
-- Every file is one part of a single Lua chunk: common.lua, then one or all five algorithm files,
-- then single.lua, or nth.lua and multi.lua or batch.lua. Redis forbids global variables in scripts, so every name is a
-- local of that chunk, and each algorithm file registers its decide function in `deciders`.
--
-- EXACTNESS. Lua numbers are doubles, exact for integers only up to 2^53; package algorithm
-- computes in int64 and forms products such as limit·period in 128 bits (u128). So the scripts
-- compute on ints (below): exact integers of any size, a plain Lua number while |x| ≤ 2^53 and a
-- table of limbs beyond. Every formula is the Go one, term for term, with add, sub, mul, divmod,
-- divceil, lt, le where Go uses u128, or int64 arithmetic that could pass 2^53; plain Lua
-- arithmetic only where both operands are numbers and the result is at most 2^53 in magnitude,
-- as noted at each place. While every value is below 2^53 (nearly every call), the ints are
-- numbers and the operations compute on doubles, checking each result.
--
-- The scripts take every policy Policy.Validate accepts and every cost CheckCost accepts, and
-- check their arguments themselves (check_args, time_args: an error reply names a bad one):
--
--   limit 1..2^53, burst 0..2^53 (0 for the window algorithms), period 1000 µs .. 2^63-1 ns
--     (9223372036854775 µs, just above 2^53), and for the buckets capacity·period/limit < 2^53 µs;
--   cost ≤ limit (the windows and the log), ≤ capacity (token bucket), or for the leaky bucket any
--     int64 whose drain time floor(cost·period/limit) is below 2^62 µs;
--   |now| < 2^60 µs (36,000 years either side of the epoch; Redis TIME is far inside).
--
-- Under these bounds no int64 of package algorithm overflows — the largest, a leaky bucket's
-- theoretical arrival time, stays below 2^62 + 2^60 + 2^53, and tat - now below 2^63 even after
-- the clock ran back from +2^60 to -2^60; the u128 products stay below 2^117 — so the ints equal
-- Go's values exactly. The one quotient Go saturates (at MaxInt64), the token bucket's
-- ceil(wait/period) after the clock ran far back, only ever enters max(0, capacity - q), which
-- is 0 either way.
--
-- WRITING NUMBERS. Lua 5.1 turns a number into a string with "%.14g", which would round a
-- 16-digit µs timestamp; and Redis turns a number argument of redis.call into a string its own
-- way. So every number written to Redis goes through fmt ('%d' for a number, exact to 2^63; the
-- digits of a table), and a reply carries an int beyond 2^53 as its decimal string (decided),
-- which the Go side parses as it parses an integer reply.

local FIXED_WINDOW, SLIDING_LOG, SLIDING_WINDOW, TOKEN_BUCKET, LEAKY_BUCKET = 1, 2, 3, 4, 5 -- algorithm.Algorithm

-- deciders[alg] = decide_<algorithm>(key, logkey, limit, period, burst, cost, now), returning
-- allowed (0/1), capacity, remaining, retry, reset, delay (ints, µs, as Decision.set takes them;
-- retry 0 when allowed) and commit: nil if an approval would change nothing, else a function
-- commit(ttl_slack) that writes the approval (so that multi.lua can decide every limit first).
local deciders = {}

-- INTS (algorithm/u128.go's role). An int is a Lua number if its magnitude is at most 2^53 —
-- then it is exact — and otherwise a table: its magnitude's base-2^24 limbs t[1..n], least
-- significant first, the top one non-zero, and t.neg, true if it is negative. So a table is never
-- equal to a number, and is larger in magnitude than every number. Tables are never changed once
-- made.
--
-- The limb code, W, is built only when a call first needs it (big()): most calls never do, and
-- every function a script defines is made again on every call. Only W makes tables, so while W
-- is nil every int is a number, and add, sub, mul, lt, le, divmod compute on doubles, keeping a
-- result only if it is provably exact — a sum or product strictly between -2^53 and 2^53 is (an
-- exact result of that size is representable, and rounding is monotonic: one of 2^53 or more
-- rounds to 2^53 or more) — and otherwise redo it on limbs, as every operation does once W is
-- built. A limb product is below 2^48 and a column of them with its carry stays below 2^53, so
-- every limb step is exact too. (The literal 9007199254740992 is 2^53.)
local W = nil

local function big()
  if W ~= nil then
    return W
  end
  local type, floor = type, math.floor
  local TWO24, TWO53 = 16777216, 9007199254740992

  -- limbs returns the limbs of |x| for an integer-valued double x (of any size: a double above
  -- 2^53 is an integer, and dividing by 2^24 or subtracting below keeps it exact).
  local function limbs(x)
    if x < 0 then
      x = -x
    end
    local t, n = {}, 0
    while x > 0 do
      local q = floor(x / TWO24)
      n = n + 1
      t[n] = x - q * TWO24
      x = q
    end
    return t
  end

  -- norm returns the int with limbs z (which it may trim) and sign neg: a number if |z| ≤ 2^53.
  local function norm(z, neg)
    local n = #z
    while n > 0 and z[n] == 0 do
      z[n] = nil
      n = n - 1
    end
    if n <= 3 then
      local h = (z[3] or 0) * TWO24 + (z[2] or 0) -- below 2^48: exact
      if h < 536870912 or (h == 536870912 and (z[1] or 0) == 0) then -- |z| = h·2^24 + z[1] ≤ 2^53 = 2^29·2^24
        local v = h * TWO24 + (z[1] or 0)
        if neg and v ~= 0 then
          return -v
        end
        return v
      end
    end
    z.neg = neg
    return z
  end

  -- split returns the limbs and the sign of an int.
  local function split(x)
    if type(x) == 'number' then
      return limbs(x), x < 0
    end
    return x, x.neg
  end

  -- mag_cmp compares the magnitudes x and y (limbs without leading zeros): -1, 0 or 1.
  local function mag_cmp(x, y)
    if #x ~= #y then
      return #x < #y and -1 or 1
    end
    for i = #x, 1, -1 do
      if x[i] ~= y[i] then
        return x[i] < y[i] and -1 or 1
      end
    end
    return 0
  end

  local function mag_add(x, y)
    local z, carry = {}, 0
    local n = #x > #y and #x or #y
    for i = 1, n do
      local s = (x[i] or 0) + (y[i] or 0) + carry
      if s >= TWO24 then
        z[i], carry = s - TWO24, 1
      else
        z[i], carry = s, 0
      end
    end
    if carry > 0 then
      z[n + 1] = carry
    end
    return z
  end

  -- mag_sub returns x - y for magnitudes x ≥ y.
  local function mag_sub(x, y)
    local z, borrow = {}, 0
    for i = 1, #x do
      local s = x[i] - (y[i] or 0) - borrow
      if s < 0 then
        z[i], borrow = s + TWO24, 1
      else
        z[i], borrow = s, 0
      end
    end
    return z
  end

  -- add returns a + b, or a - b if negate.
  local function add(a, b, negate)
    if type(a) == 'number' and type(b) == 'number' then
      local s = negate and a - b or a + b
      if s < TWO53 and s > -TWO53 then
        return s
      end
    end
    local x, xn = split(a)
    local y, yn = split(b)
    if negate then
      yn = not yn
    end
    if xn == yn then
      return norm(mag_add(x, y), xn)
    end
    local c = mag_cmp(x, y)
    if c == 0 then
      return 0
    elseif c > 0 then
      return norm(mag_sub(x, y), xn)
    end
    return norm(mag_sub(y, x), yn)
  end

  local function mul(a, b)
    if type(a) == 'number' and type(b) == 'number' then
      local p = a * b
      if p < TWO53 and p > -TWO53 then
        return p
      end
    end
    local x, xn = split(a)
    local y, yn = split(b)
    local nx, ny = #x, #y
    local z = {}
    for k = 1, nx + ny do
      z[k] = 0
    end
    for i = 1, nx do
      local xi, carry = x[i], 0
      for j = 1, ny do
        local s = z[i + j - 1] + xi * y[j] + carry -- ≤ (2^24 - 1)·2^24 + 2^24 - 1 < 2^48: carry < 2^24
        carry = floor(s / TWO24)
        z[i + j - 1] = s - carry * TWO24
      end
      z[i + ny] = carry
    end
    return norm(z, xn ~= yn)
  end

  -- cmp compares two ints: -1, 0 or 1.
  local function cmp(a, b)
    if type(a) == 'number' then
      if type(b) == 'number' then
        return a < b and -1 or (a > b and 1 or 0)
      end
      return b.neg and 1 or -1 -- |b| > 2^53 ≥ |a|
    elseif type(b) == 'number' then
      return a.neg and -1 or 1
    elseif a.neg ~= b.neg then
      return a.neg and -1 or 1
    end
    local c = mag_cmp(a, b)
    return a.neg and -c or c
  end

  -- tofloat is the double nearest an int, within a relative 2^-50 (one rounding per limb).
  local function tofloat(x)
    if type(x) == 'number' then
      return x
    end
    local f = 0
    for i = #x, 1, -1 do
      f = f * TWO24 + x[i]
    end
    if x.neg then
      return -f
    end
    return f
  end

  -- divmod returns floor(a/d) and a - d·floor(a/d) for ints a and d > 0. It refines a quotient:
  -- with e the floor of the double quotient of the remainder r and d (relative error below
  -- 2^-48), r - e·d, computed exactly, is at most |r|·2^-48 + d in magnitude, so each round
  -- divides |r|/d by 2^48 until it is below 2, and then e is 0 or ±1: a remainder below 2^120
  -- takes at most four rounds, and at most two corrections follow. Nothing saturates.
  local function divmod(a, d)
    local fd = tofloat(d)
    local q, r = 0, a
    for _ = 1, 8 do
      local e = floor(tofloat(r) / fd)
      if e == 0 then
        break
      end
      if not (e < TWO53 and e > -TWO53) then
        e = norm(limbs(e), e < 0)
      end
      q, r = add(q, e), add(r, mul(e, d), true)
    end
    while cmp(r, 0) < 0 do
      q, r = add(q, -1), add(r, d)
    end
    while cmp(r, d) >= 0 do
      q, r = add(q, 1), add(r, d, true)
    end
    return q, r
  end

  -- parse returns the int of a string of decimal digits (optionally after '-'), or nil for any
  -- other string or one of over 40 characters (twice what an int64 takes).
  local function parse(s)
    if type(s) ~= 'string' or #s > 40 or not string.find(s, '^%-?%d+$') then
      return nil
    end
    local v = tonumber(s) -- strtod: correctly rounded, so exact if strictly inside ±2^53
    if v < TWO53 and v > -TWO53 then
      return v
    end
    local neg = string.sub(s, 1, 1) == '-'
    local digits = neg and string.sub(s, 2) or s
    local x, i = 0, 1
    local n = (#digits - 1) % 7 + 1 -- the first chunk's digits; 7 each after it
    while i <= #digits do
      x = add(mul(x, ({10, 100, 1000, 10000, 100000, 1000000, 10000000})[n]), tonumber(string.sub(digits, i, i + n - 1)))
      i, n = i + n, 7
    end
    if neg then
      return add(0, x, true)
    end
    return x
  end

  local function fmt(x)
    if type(x) == 'number' then
      return string.format('%d', x)
    end
    local m, parts = {}, {}
    for i = 1, #x do
      m[i] = x[i]
    end
    while #m > 0 do -- divide by 10^7, limb by limb: each partial dividend is below 10^7·2^24 < 2^48
      local r = 0
      for i = #m, 1, -1 do
        local cur = r * TWO24 + m[i]
        local q = floor(cur / 10000000) -- exact: a non-integer quotient is ≥ 10^-7 from the next integer
        m[i], r = q, cur - q * 10000000
      end
      while #m > 0 and m[#m] == 0 do
        m[#m] = nil
      end
      parts[#parts + 1] = r
    end
    local s = x.neg and '-' or ''
    for i = #parts, 1, -1 do
      s = s .. string.format(i == #parts and '%d' or '%07d', parts[i])
    end
    return s
  end

  W = {limbs = limbs, mag_cmp = mag_cmp, add = add, mul = mul, cmp = cmp, divmod = divmod, parse = parse, fmt = fmt,
    -- the bounds of check_args and time_args beyond 2^53 (see EXACTNESS):
    PERIOD_MAX = {14898167, 12884901, 32, neg = false}, -- 9223372036854775 µs: time.Duration's most
    INT64_MAX = {16777215, 16777215, 32767, neg = false}, -- 2^63 - 1
    TWO62 = {0, 0, 16384, neg = false},
    TWO60 = {0, 0, 4096, neg = false}}
  return W
end

local function add(a, b)
  if W == nil then
    local s = a + b
    if s < 9007199254740992 and s > -9007199254740992 then
      return s
    end
  end
  return big().add(a, b)
end

local function sub(a, b)
  if W == nil then
    local s = a - b
    if s < 9007199254740992 and s > -9007199254740992 then
      return s
    end
  end
  return big().add(a, b, true)
end

local function mul(a, b)
  if W == nil then
    local p = a * b
    if p < 9007199254740992 and p > -9007199254740992 then
      return p
    end
  end
  return big().mul(a, b)
end

local function lt(a, b)
  if W == nil then
    return a < b
  end
  return W.cmp(a, b) < 0
end

local function le(a, b)
  if W == nil then
    return a <= b
  end
  return W.cmp(a, b) <= 0
end

-- divmod returns floor(a/d) and a - d·floor(a/d) for ints a and d > 0 (u128.divmod,
-- algorithm.floorDiv, State.divP). On numbers with |a| + d < 2^53: the double quotient a/d is
-- correctly rounded, so its floor is at most one off the exact one, and the remainder (exact:
-- both terms are integers below 2^53) tells which way. (The rounding error, below |a|/d·2^-53 <
-- 1/d, cannot reach an integer, so the corrections never run; they are kept so that the result
-- never depends on that argument.) Beyond that, on limbs.
local function divmod(a, d)
  if W == nil and a < 9007199254740992 - d and a > d - 9007199254740992 then
    local q = math.floor(a / d)
    local r = a - q * d
    while r < 0 do
      q, r = q - 1, r + d
    end
    while r >= d do
      q, r = q + 1, r - d
    end
    return q, r
  end
  return big().divmod(a, d)
end

-- divceil is ceil(a/d) for d > 0 (u128.divCeil, State.divCeilP).
local function divceil(a, d)
  local q, r = divmod(a, d)
  if r ~= 0 then
    q = add(q, 1)
  end
  return q
end

-- parse_int returns the int that the string s spells, or nil if it is not an integer: a string
-- of decimal digits, optionally after '-', of up to 40 characters; or a shorter one, of up to 15,
-- that Lua reads as a whole number ("1e3" is 1000; a decimal of at most 15 significant digits
-- with a fraction never reads as a whole number: its distance to one exceeds the rounding).
-- tonumber is strtod, correctly rounded: an integer strictly inside ±2^53 is read exactly, and
-- any other is read as ±2^53 or beyond.
-- written: s is a number the scripts wrote (fmt), read back from Redis (nil if missing: false),
-- which needs no checking.
local function parse_int(s, written)
  local v = tonumber(s)
  if v ~= nil and v < 9007199254740992 and v > -9007199254740992 then
    if written or (#s <= 15 and v % 1 == 0) or (#s <= 40 and string.find(s, '^%-?%d+$')) then
      return v
    end
    return nil
  elseif written and v == nil then
    return nil
  end
  return big().parse(s) -- beyond 2^53, or not a number at all
end

local function fmt(x)
  if W == nil then
    return string.format('%d', x)
  end
  return W.fmt(x)
end

-- calendar_period parses the period argument of a calendar policy (lua/calendar.lua, which sets it
-- in the scripts that decide calendar policies; nil in the others, which then refuse one).
local calendar_period = nil

-- calendar_entry is true where single.lua decides calendar policies (the calendar single scripts
-- and the library's functions of them), which then take only a calendar's windows as the period;
-- elsewhere single.lua takes only µs.
local calendar_entry = false

-- check_args parses and checks one decision's arguments, single.lua's ARGV[1..5], as
-- Policy.Validate and CheckCost would: it returns alg, limit, period, burst, cost as ints, or nil
-- and an error reply naming the first bad one. (The store checks the same before it calls a
-- script; this keeps a script from computing on what no policy allows.) alg, limit and burst
-- must be numbers (at most 2^53); a bound beyond 2^53 is compared only if W is built, as
-- otherwise every int is a number, below it.
local function check_args(a_alg, a_limit, a_period, a_burst, a_cost)
  -- parse_int's first case, inline, for what the store sends (short whole numbers); else parse_int.
  local alg, limit, period, burst, cost = tonumber(a_alg), tonumber(a_limit), tonumber(a_period), tonumber(a_burst), tonumber(a_cost)
  if not (alg and limit and period and burst and cost and #a_alg <= 15 and #a_limit <= 15 and #a_period <= 15 and
      #a_burst <= 15 and #a_cost <= 15 and alg % 1 == 0 and limit % 1 == 0 and period % 1 == 0 and burst % 1 == 0 and
      cost % 1 == 0 and period < 9007199254740992 and cost < 9007199254740992 and limit < 9007199254740992 and
      burst < 9007199254740992 and alg < 9007199254740992) then -- (the lower bounds are checked below)
    alg, limit, period, burst, cost = parse_int(a_alg), parse_int(a_limit), parse_int(a_period), parse_int(a_burst), parse_int(a_cost)
    if period == nil and calendar_period ~= nil then
      period = calendar_period(a_period) -- a table with .token, or nil
    end
  end
  local cal = type(period) == 'table' and period.token ~= nil
  if W ~= nil then -- an argument may be beyond 2^53
    if type(alg) == 'table' then
      alg = nil
    end
    if type(limit) == 'table' then
      limit = nil
    end
    if type(burst) == 'table' then
      burst = nil
    end
  end
  local bad, arg, want -- the first bad argument's name, its value and what it must be
  if alg == nil or alg < 1 or alg > 5 then
    bad, arg, want = 'algorithm', a_alg, 'must be 1..5'
  elseif limit == nil or limit < 1 then
    bad, arg, want = 'limit', a_limit, 'must be an integer in 1..2^53'
  elseif cal and alg ~= FIXED_WINDOW and alg ~= SLIDING_WINDOW then
    bad, arg, want = 'period', a_period, 'of a calendar must be of fixed-window or sliding-window'
  elseif period == nil or (not cal and (lt(period, 1000) or (W ~= nil and W.cmp(period, W.PERIOD_MAX) > 0))) then
    bad, arg, want = 'period', a_period, 'must be an integer number of µs in 1000..9223372036854775 (or a calendar\'s windows)'
  elseif burst == nil or burst < 0 then
    bad, arg, want = 'burst', a_burst, 'must be an integer in 0..2^53'
  elseif burst ~= 0 and alg ~= TOKEN_BUCKET and alg ~= LEAKY_BUCKET then
    bad, arg, want = 'burst', a_burst, 'must be 0 for a window algorithm'
  elseif cost == nil or lt(cost, 0) then
    bad, arg, want = 'cost', a_cost, 'must be an integer ≥ 0'
  else
    local capacity = limit -- Policy.Capacity
    if alg == TOKEN_BUCKET and burst > 0 then
      capacity = burst
    elseif alg == LEAKY_BUCKET then
      capacity = add(burst, 1)
    end
    local drain = 0 -- a leaky bucket's floor(cost·period/limit) µs, as algorithm.fits: below 2^62 unless a table
    if alg == LEAKY_BUCKET and not lt(cost, 512) then
      drain = divmod(mul(cost, period), limit)
    end
    if (alg == TOKEN_BUCKET or alg == LEAKY_BUCKET) and not lt(mul(capacity, period), 9007199254740992) and
        not lt(divmod(mul(capacity, period), limit), 9007199254740992) then -- the refill (drain) time, times limit
      bad, arg, want = 'burst', a_burst, '× period / limit must be below 2^53 µs'
    elseif alg == LEAKY_BUCKET then
      if W ~= nil and (W.cmp(cost, W.INT64_MAX) > 0 or W.cmp(drain, W.TWO62) >= 0) then
        bad, arg, want = 'cost', a_cost, 'takes longer to drain than any clock runs (cost × period / limit must be below 2^62 µs)'
      end
    elseif lt(capacity, cost) then
      bad, arg, want = 'cost', a_cost, 'exceeds the capacity ' .. fmt(capacity)
    end
  end
  if bad ~= nil then
    return nil, redis.error_reply('ERR sluice: ' .. bad .. ' ' .. string.format('%q', string.sub(tostring(arg), 1, 40)) .. ' ' .. want)
  end
  return alg, limit, period, burst, cost
end

-- time_args returns now and ttl_slack in µs from their arguments — now, or Redis TIME if it is
-- empty; ttl_slack, or 0 if it is empty — and Redis TIME in µs if it was read, else nil. TIME is
-- read once, when a_now is empty or with_time is true (a deadline is to be checked: deadlines are
-- always on Redis's clock, whatever decides now). Or nil and an error reply.
local function time_args(a_now, a_slack, with_time)
  local now, slack, time, bad, arg, want = 0, 0, nil, nil, nil, nil
  if a_now == nil or a_now == '' or with_time then
    local t = redis.call('TIME')
    time = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  if a_now == nil or a_now == '' then
    now = time
  else
    now = parse_int(a_now)
    if now == nil or (W ~= nil and type(now) == 'table' and W.mag_cmp(now, W.TWO60) >= 0) then
      bad, arg, want = 'now', a_now, 'must be an integer number of µs, |now| < 2^60'
    end
  end
  if bad == nil and a_slack ~= nil and a_slack ~= '' then
    slack = parse_int(a_slack)
    if slack == nil or lt(slack, 0) or lt(9007199254740992, slack) then
      bad, arg, want = 'ttl_slack', a_slack, 'must be an integer number of µs in 0..2^53'
    end
  end
  if bad ~= nil then
    return nil, redis.error_reply('ERR sluice: ' .. bad .. ' ' .. string.format('%q', string.sub(tostring(arg), 1, 40)) .. ' ' .. want)
  end
  return now, slack, time
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

-- STATE (every algorithm's but the sliding log's, which is the list logkey alone: sliding_log.lua)
-- is one string at key, written by one SET … PX and read by one GET:
--
--   "<alg> <limit> <period> <field> <field> [<field>]"     e.g. "4 1000000 1000000 1764598000123456 0"
--
-- the stamp (the algorithm, limit and period it was written under), then the algorithm's numbers
-- in decimal (fmt: exact at any size). A state whose algorithm or period is not the policy's is
-- never seen: its fields read 0, as in a fresh algorithm.State (State.current). One of another
-- limit keeps what was used (a window's counts; a bucket's use, converted: gcra_convert), and is
-- written under the policy's limit by the next write.

-- THE OLD FORMAT (before the string): a hash at the key logkey names less its ':log' (the store's
-- keys: prefix{client}:policy, beside the string at …:v2), fields alg, limit, period and the
-- algorithm's, written by HSET + PEXPIRE. Instances of the old version may still write it during a
-- rolling upgrade. A call that finds no string reads the hash instead (read_old) and, if it is
-- current, starts from its state: the hash records approvals the old instances made, so taking it
-- over is never more lenient than starting afresh. The hash is left alone (the old instances
-- still count on it, and it expires by its own TTL). The key is not among the script's KEYS: it
-- lies in the same hash slot (the same hash tag) and is read only when the string is missing.

-- stale[key] is set when a call found something under key's names other than a current string
-- (a state of another algorithm or period, the old hash, the sliding log's list): a write of key's state then
-- deletes logkey first, so that a state is one key and nothing of the old one leaks into it.
local stale = {}

-- old_key is the name of the old format's hash beside logkey: logkey less its ':log' (or key
-- itself if logkey is not so named: then there is no old hash to read).
local function old_key(key, logkey)
  if string.sub(logkey, -4) == ':log' then
    return string.sub(logkey, 1, -5)
  end
  return key
end

-- stamp is the string's prefix for the policy (alg, limit, period), with the space after it, and
-- the two parts a current state's stamp has whatever its limit: "<alg> " before the limit and
-- " <period> " after it; the last ones made are kept (a batch's requests are usually of one
-- policy: the same ints, even tables, as check_all reuses them).
local last_stamp = {}

local function stamp(alg, limit, period)
  local c = last_stamp
  if c[1] == alg and c[2] == limit and c[3] == period then
    return c[4], c[5], c[6]
  end
  local a, p
  if W == nil then
    a, p = string.format('%d', alg), string.format('%d', period)
  else
    a, p = W.fmt(alg), W.fmt(period)
  end
  local h = a .. ' ' .. fmt(limit) .. ' ' .. p .. ' '
  last_stamp = {alg, limit, period, h, a .. ' ', ' ' .. p .. ' '}
  return h, a .. ' ', ' ' .. p .. ' '
end

-- match_stamp reads the stamp of the state string v: if its algorithm and period are the head's
-- and tail's (stamp's two parts), the index of its first field and the limit it was written under
-- (a number: no policy's limit is above 2^53); else nil.
local function match_stamp(v, head, tail)
  if string.sub(v, 1, #head) ~= head then
    return nil
  end
  local e = string.find(v, ' ', #head + 1, true)
  if e == nil or string.sub(v, e, e + #tail - 1) ~= tail then
    return nil
  end
  local l = string.sub(v, #head + 1, e - 1)
  if #l == 0 or #l > 16 or not string.find(l, '^%d+$') then
    return nil
  end
  return e + #tail, tonumber(l)
end

-- read_old reads the old format's hash old for the policy: current, then the given fields' values
-- (0 if not current; at most three), then the limit it was written under.
local function read_old(old, alg, limit, period, ...)
  local v = redis.call('HMGET', old, 'alg', 'limit', 'period', ...)
  local s = parse_int(v[3], true) -- (numbers compare by ==; an int beyond 2^53 only if W is built)
  local l = tonumber(v[2])
  if not (tonumber(v[1]) == alg and l ~= nil and l >= 1 and l <= 9007199254740992 and l % 1 == 0 and
      (s == period or (W ~= nil and s ~= nil and W.cmp(s, period) == 0))) then
    return false, 0, 0, 0, limit
  end
  local vals = {}
  for i = 1, 3 do
    vals[i] = i <= select('#', ...) and parse_int(v[3 + i], true) or 0
  end
  return true, vals[1], vals[2], vals[3], l
end

-- read_state reads the state of key (the string above; else the old hash beside logkey): current,
-- then the values of its n fields (their names are the old hash's fields), 0 if not current, then
-- the limit it was written under (the policy's if not current).
local function read_state(key, logkey, alg, limit, period, ...)
  local v = redis.call('GET', key)
  if v then
    local _, head, tail = stamp(alg, limit, period)
    local i, l = match_stamp(v, head, tail)
    if i ~= nil then
      local a, b, c
      if select('#', ...) == 3 then
        a, b, c = string.match(v, '^(%-?%d+) (%-?%d+) (%-?%d+)$', i)
      else
        a, b = string.match(v, '^(%-?%d+) (%-?%d+)$', i)
      end
      if a ~= nil then
        return true, parse_int(a, true), parse_int(b, true), c and parse_int(c, true), l
      end
    end
    stale[key] = true -- another algorithm's or period's state (or not one of ours)
    return false, 0, 0, 0, limit
  end
  -- No string: usually nothing at all (one EXISTS tells); else a log or the old format's hash.
  local old = old_key(key, logkey)
  if redis.call('EXISTS', old, logkey) == 0 then
    return false, 0, 0, 0, limit
  end
  stale[key] = true
  if old == key then
    return false, 0, 0, 0, limit
  end
  return read_old(old, alg, limit, period, ...)
end

-- write_state writes key's state (the policy's stamp and the fields v1, v2[, v3]) with its TTL:
-- reset + ttl_slack µs, rounded up to whole ms and at least 1 ms (0 would delete it). reset is the
-- approval's ResetAfter: from then on the state is as if never seen, so Redis deleting it then
-- changes no decision.
local function write_state(key, logkey, reset, ttl_slack, alg, limit, period, v1, v2, v3)
  if stale[key] then
    redis.call('DEL', logkey)
    stale[key] = nil
  end
  local ms = divceil(add(reset, ttl_slack), 1000)
  if ms == 0 then -- (reset and ttl_slack are ≥ 0)
    ms = 1
  end
  local v
  if W == nil then
    if v3 == nil then
      v = string.format('%d %d %d %d %d', alg, limit, period, v1, v2)
    else
      v = string.format('%d %d %d %d %d %d', alg, limit, period, v1, v2, v3)
    end
    redis.call('SET', key, v, 'PX', string.format('%d', ms))
    return
  end
  v = (stamp(alg, limit, period)) .. W.fmt(v1) .. ' ' .. W.fmt(v2)
  if v3 ~= nil then
    v = v .. ' ' .. W.fmt(v3)
  end
  redis.call('SET', key, v, 'PX', W.fmt(ms))
end

-- expire sets key's TTL as write_state does (the sliding log's list: sliding_log.lua).
local function expire(key, reset, ttl_slack)
  local ms = divceil(add(reset, ttl_slack), 1000)
  if ms == 0 then -- (reset and ttl_slack are ≥ 0)
    ms = 1
  end
  redis.call('PEXPIRE', key, fmt(ms))
end

-- GCRA, shared by the token and the leaky bucket (algorithm/gcra.go): the theoretical arrival
-- time tat = TAT + Frac/limit µs, 0 ≤ Frac < limit; the hash fields tat and frac. tat is an int
-- (beyond 2^53 for a far now or a long drain), frac a number (below limit).

-- gcra_wait is gcraWait: limit·max(tat - now, 0) for the state (current, tat, frac) at now.
local function gcra_wait(limit, current, tat, frac, now)
  if not current or lt(tat, now) or (frac == 0 and le(tat, now)) then -- (le: tat == now, as not lt)
    return 0
  end
  if W == nil then -- on numbers, at once: every step is ≥ 0, so a result below 2^53 means each was, exactly
    local wait = limit * (tat - now) + frac
    if wait < 9007199254740992 then
      return wait
    end
  end
  return add(mul(limit, sub(tat, now)), frac)
end

-- gcra_advance is gcraAdvance: it returns tat, frac = max(tat, now) + cost·period/limit for the
-- state (current, tat, frac). Go's check that the result fits a clock never fails here: it runs
-- on an approval, so max(tat, now) - now ≤ capacity·period/limit or burst·period/limit < 2^53,
-- q = floor(cost·period/limit) < 2^62 (check_args), and |now| < 2^60: the result is below 2^63 - 1.
local function gcra_advance(limit, period, current, s_tat, s_frac, now, cost)
  local tat, frac = now, 0
  if current and (lt(now, s_tat) or (s_frac > 0 and le(now, s_tat))) then -- (le: s_tat == now, as not lt)
    tat, frac = s_tat, s_frac
  end
  local q, r = divmod(mul(cost, period), limit) -- (Go uses the cached period/limit when cost is 1: the same)
  tat = add(tat, q)
  if r >= limit - frac then -- frac + r ≥ limit, without a sum that could pass 2^53 (frac, r < limit)
    tat, frac = add(tat, 1), r - (limit - frac)
  else
    frac = frac + r
  end
  return tat, frac
end

-- gcra_convert is State.adopt: the state (tat, frac) written under the limit s_limit, converted to
-- limit at now with the same units in use, wait = s_limit·(tat - now) + frac: tat = now +
-- floor(wait/limit), frac the remainder, at most 2^62 - 1 µs after now. A tat not after now is
-- returned as it is (a full bucket reads the same under any limit), with converted false.
local function gcra_convert(s_limit, limit, tat, frac, now)
  local wait = gcra_wait(s_limit, true, tat, frac, now)
  if wait == 0 then
    return tat, frac, false
  end
  local q, r = divmod(wait, limit)
  if W ~= nil and W.cmp(q, W.TWO62) >= 0 then
    q, r = W.add(W.TWO62, -1), 0
  end
  return add(now, q), r, true
end

-- gcra_until is gcraUntil: ceil(tat - now) µs for a tat after now.
local function gcra_until(tat, frac, now)
  if frac > 0 then
    return add(sub(tat, now), 1)
  end
  return sub(tat, now)
end

-- gcra_commit is the commit of a bucket's state (tat, frac) converted at now from another limit
-- by a decision that writes nothing else (a refusal, a peek): so that the use drains at the new
-- limit's rate from now on, as it would after an approval (algorithm.Decide converts in place).
local function gcra_commit(key, logkey, alg, limit, period, tat, frac, now)
  return function(ttl_slack)
    write_state(key, logkey, gcra_until(tat, frac, now), ttl_slack, alg, limit, period, tat, frac)
  end
end

-- decided is what a decider returned, as the entry scripts reply it: an int beyond 2^53 as its
-- decimal string, which the Go side parses as it parses an integer reply.
local function decided(allowed, capacity, remaining, retry, reset, delay, commit)
  if W ~= nil then
    local function out(x)
      if type(x) == 'table' then
        return W.fmt(x)
      end
      return x
    end
    capacity, remaining, retry, reset, delay = out(capacity), out(remaining), out(retry), out(reset), out(delay)
  end
  return allowed, capacity, remaining, retry, reset, delay, commit
end

-- reply_int is an int as a reply carries it: a number, or beyond 2^53 its decimal string (the
-- entry scripts' last reply element, the time, is now when no TIME was read: a virtual clock's).
local function reply_int(x)
  if type(x) == 'table' then
    return W.fmt(x)
  end
  return x
end
