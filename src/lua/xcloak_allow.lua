-- xcloak_allow.lua: the portable fallback of XCLOAK.ALLOW, for servers that
-- cannot load the module (managed services). Same arguments after the key,
-- same replies, same error texts, same sorted-set layout and members, so a
-- deployment can switch between the script and the command on the same keys.
--
--   EVALSHA sha 1 key window limit [COST cost] [NOW unix-ms] [DETAILS]
--
-- Reply: 1 or 0; with DETAILS the array
--   {allowed, limit, remaining, retry_after_ms, reset_after_ms}.
--
-- One key only (Cluster-safe). Works on Redis 6.2+ and Valkey: it reads TIME,
-- so it replicates its effects (the default from Redis 7; asked for on 6.2),
-- and expires the key with an absolute PEXPIREAT that replicas apply as is.
--
-- Lua numbers are doubles: every integer here stays below 2^53 and is exact,
-- and so is a member's integer (t mod 10^11) * 1000 + k < 10^14. Numbers are
-- passed to the server with string.format('%d'), never with tostring/.. .
-- Known limit: a retry/reset reply above 2^53 - 1 ms (an entry far in the
-- future of NOW with a window near 2^53) is rounded; the module's is exact.

if redis.replicate_commands then
  redis.replicate_commands()
end

local MAX_EXACT_MS = 9007199254740991 -- 2^53 - 1
local MAX_LIMIT = 1000000 -- the module's default MAX-LIMIT; keep them equal
local MAX_COST = 1000000
local COMPACT_SLOTS = 1000 -- members s*1000+k while k < 1000, "s:kkkkkkkkkk" beyond,
local STAMP_CYCLE = 100000000000 -- with s = t mod 10^11 (as the module: at most 14 digits)
local ZADD_BATCH = 500

local function fail(message)
  return redis.error_reply('ERR ' .. message)
end

local function int(x)
  return string.format('%d', x)
end

-- Redis' string2ll syntax: "0", or an optional '-' then digits without a
-- leading zero. Anything else (spaces, '+', decimals, hex, exponents) fails.
local function is_integer(text)
  return text == '0' or string.find(text, '^%-?[1-9]%d*$') ~= nil
end

-- An integer argument in [min, max], or nil. Doubles round monotonically, so a
-- value beyond a bound of at most 2^53 - 1 still compares beyond it.
local function in_range(text, min, max)
  if not is_integer(text) then
    return nil
  end
  local value = tonumber(text)
  if value < min or value > max then
    return nil
  end
  return value
end

local function range_error(name, min, max, unit)
  return fail(name .. ' must be an integer from ' .. int(min) .. ' to ' .. int(max) .. unit)
end

-- A user token made safe to echo: printable ASCII, no quote, at most 32 bytes.
local function printable(token)
  local text = string.gsub(string.sub(token, 1, 32), "[^ -~]", '?')
  text = string.gsub(text, "'", '?')
  if #token > 32 then
    text = text .. '...'
  end
  return text
end

-- Exact decimal string of a + b (non-negative integers below 2^53 each),
-- which may exceed 2^53: the TTL deadline (server_ms + 1000) + window.
local function exact_sum(a, b)
  local base = 100000000
  local a_lo, b_lo = math.fmod(a, base), math.fmod(b, base)
  local a_hi, b_hi = (a - a_lo) / base, (b - b_lo) / base
  local lo = a_lo + b_lo
  local hi = a_hi + b_hi
  if lo >= base then
    lo = lo - base
    hi = hi + 1
  end
  if hi == 0 then
    return int(lo)
  end
  return int(hi) .. string.format('%08d', lo)
end

-- The member of slot k at a millisecond whose stamp (t mod 10^11) is `stamp`,
-- `stamp_text` its decimal, as the module writes it.
local function member(stamp_text, stamp, k)
  if k < COMPACT_SLOTS then
    if stamp == 0 then
      return int(k)
    end
    return stamp_text .. string.format('%03d', k)
  end
  return stamp_text .. ':' .. string.format('%010d', k)
end

-- The slot k of a member written at a millisecond of stamp `stamp` by the
-- module or this script, or nil
-- (the article's "now-seq" members and any foreign member are not ours).
local function member_slot(text, stamp_text, stamp)
  local head, slot = string.match(text, '^(.-):(%d+)$')
  if head then
    if head ~= stamp_text then
      return nil
    end
    local k = tonumber(slot)
    if k >= 9223372036854775807 then
      return nil
    end
    return k
  end
  if not is_integer(text) or string.sub(text, 1, 1) == '-' then
    return nil
  end
  if stamp == 0 then
    if #text <= 3 then
      return tonumber(text)
    end
    return nil
  end
  if #text == #stamp_text + 3 and string.sub(text, 1, #stamp_text) == stamp_text then
    return tonumber(string.sub(text, -3))
  end
  return nil
end

local function score_ms(text)
  return math.ceil(tonumber(text))
end

-- Arguments, checked in the module's order; nothing is touched before.
if #KEYS ~= 1 then
  return fail('xcloak_allow.lua takes exactly one key (EVALSHA sha 1 key window limit ...)')
end
if #ARGV < 2 then
  return fail("wrong number of arguments for 'xcloak.allow' command")
end
local key = KEYS[1]
local window = in_range(ARGV[1], 1, MAX_EXACT_MS)
if not window then
  return range_error('window', 1, MAX_EXACT_MS, ' (milliseconds)')
end
local limit = in_range(ARGV[2], 0, MAX_LIMIT)
if not limit then
  return range_error('limit', 0, MAX_LIMIT, '')
end
local cost, now, details = 1, nil, false
local seen = {}
local i = 3
while i <= #ARGV do
  local option = string.upper(ARGV[i])
  if option ~= 'COST' and option ~= 'NOW' and option ~= 'DETAILS' then
    return fail("syntax error, unknown option '" .. printable(ARGV[i]) .. "' (expected COST, NOW or DETAILS)")
  end
  if seen[option] then
    return fail('syntax error, ' .. option .. ' is given more than once')
  end
  seen[option] = true
  if option == 'DETAILS' then
    details = true
  else
    i = i + 1
    local value = ARGV[i]
    if value == nil then
      return fail('syntax error, ' .. option .. ' needs a value')
    end
    if option == 'COST' then
      cost = in_range(value, 1, MAX_COST)
      if not cost then
        return range_error('COST', 1, MAX_COST, '')
      end
    else
      now = in_range(value, 0, MAX_EXACT_MS)
      if not now then
        return range_error('NOW', 0, MAX_EXACT_MS, ' (unix time in milliseconds)')
      end
    end
  end
  i = i + 1
end

local key_type = redis.call('TYPE', key)
key_type = key_type.ok or key_type
if key_type ~= 'none' and key_type ~= 'zset' then
  return redis.error_reply('WRONGTYPE Operation against a key holding the wrong kind of value')
end

local time = redis.call('TIME')
local server_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
if now == nil then
  now = server_ms
end
local now_text = int(now)
local stamp = math.fmod(now, STAMP_CYCLE) -- exact: now < 2^53
local stamp_text = int(stamp)
local cutoff = now - window -- both below 2^53 in magnitude: exact

-- Trim (replicated only when it removed something; an emptied key is gone).
redis.call('ZREMRANGEBYSCORE', key, '-inf', int(cutoff))
local live = redis.call('ZCARD', key)
local allowed = live + cost <= limit

if allowed then
  -- The next free slot at `now`: one past the last entry there, if it is ours.
  -- ZREVRANGEBYSCORE rather than ZRANGE .. BYSCORE REV, which 6.2 lacks.
  local k = 0
  local last = redis.call('ZREVRANGEBYSCORE', key, now_text, now_text, 'LIMIT', 0, 1)[1]
  if last then
    local slot = member_slot(last, stamp_text, stamp)
    if slot then
      k = slot + 1
    end
  end
  -- Take the first `cost` free slots from k on; NX skips a member that exists.
  local needed = cost
  while needed > 0 do
    local batch = math.min(needed, ZADD_BATCH)
    local args = {}
    for j = 0, batch - 1 do
      args[#args + 1] = now_text
      args[#args + 1] = member(stamp_text, stamp, k + j)
    end
    k = k + batch
    needed = needed - redis.call('ZADD', key, 'NX', unpack(args))
  end
  -- As the module: re-arm only when the expiry is 500 ms or more below
  -- window + 1000 (a busy key re-arms at most every 500 ms), and never shorten
  -- it: after a server clock step back, entries stamped before the step must
  -- outlive the new, earlier deadline.
  local ttl = redis.call('PTTL', key)
  if ttl < 0 or ttl - 500 <= window then
    redis.call('PEXPIREAT', key, exact_sum(server_ms + 1000, window))
  end
end

if not details then
  return allowed and 1 or 0
end

local live_after = allowed and (live + cost) or live
local remaining = math.max(limit - live_after, 0)
local retry_after_ms = 0
if not allowed then
  if cost > limit then
    retry_after_ms = -1
  else
    -- With live entries oldest first, the (live + cost - limit)-th must leave.
    local blocking = live + cost - limit
    local entry = redis.call('ZRANGE', key, blocking - 1, blocking - 1, 'WITHSCORES')
    if entry[2] then
      retry_after_ms = (score_ms(entry[2]) - now) + window
    end
  end
end
local reset_after_ms = 0
if live_after > 0 then
  local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if newest[2] then
    reset_after_ms = math.max((score_ms(newest[2]) - now) + window, 0)
  end
end
return {allowed and 1 or 0, limit, remaining, retry_after_ms, reset_after_ms}
