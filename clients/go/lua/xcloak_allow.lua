-- xcloak_allow.lua: the portable fallback of XCLOAK.ALLOW, for servers that
-- cannot load the module (managed services). Same arguments after the key,
-- same replies, same error texts, same sorted-set layout and members, so a
-- deployment can switch between the script and the command on the same keys.
--
--   EVALSHA sha 1 key window limit [TIER window limit]... [COST cost] [NOW unix-ms] [DETAILS] [STAMP]
--
-- Reply: 1 or 0; with DETAILS the array
--   {allowed, limit, remaining, retry_after_ms, reset_after_ms}
-- of the binding tier, and with TIER a sixth element: one
--   {window, limit, remaining, retry_after_ms, reset_after_ms}
-- per tier, in the order given (the positional window and limit first).
-- STAMP replies the admission's stamp (the millisecond it recorded, or -1 on
-- a rejection) instead of 1/0, or as the last element of the DETAILS array:
-- the handle xcloak_refund.lua (and XCLOAK.REFUND) takes.
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
local MAX_TIERS = 16 -- the positional pair and up to 15 TIERs
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
-- Tier i (1-based here) is {window, limit}; errors number TIERs from 1, as the module.
local tiers = {{window, limit}}
local cost, now, details, want_stamp = 1, nil, false, false
local seen = {}
local i = 3
while i <= #ARGV do
  local option = string.upper(ARGV[i])
  if option == 'TIER' then
    if ARGV[i + 1] == nil or ARGV[i + 2] == nil then
      return fail('syntax error, TIER needs a window and a limit')
    end
    local which = ' of TIER ' .. int(#tiers)
    local tier_window = in_range(ARGV[i + 1], 1, MAX_EXACT_MS)
    if not tier_window then
      return range_error('window' .. which, 1, MAX_EXACT_MS, ' (milliseconds)')
    end
    local tier_limit = in_range(ARGV[i + 2], 0, MAX_LIMIT)
    if not tier_limit then
      return range_error('limit' .. which, 0, MAX_LIMIT, '')
    end
    if #tiers == MAX_TIERS then
      return fail('syntax error, TIER is given more than ' .. int(MAX_TIERS - 1) ..
        ' times (at most ' .. int(MAX_TIERS) .. ' tiers in all)')
    end
    tiers[#tiers + 1] = {tier_window, tier_limit}
    i = i + 3
  else
    if option ~= 'COST' and option ~= 'NOW' and option ~= 'DETAILS' and option ~= 'STAMP' then
      return fail("syntax error, unknown option '" .. printable(ARGV[i]) .. "' (expected TIER, COST, NOW, DETAILS or STAMP)")
    end
    if seen[option] then
      return fail('syntax error, ' .. option .. ' is given more than once')
    end
    seen[option] = true
    if option == 'DETAILS' then
      details = true
    elseif option == 'STAMP' then
      want_stamp = true
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
end
-- The trim and the TTL follow the longest window.
local longest = 0
for _, tier in ipairs(tiers) do
  longest = math.max(longest, tier[1])
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
local cutoff = now - longest -- both below 2^53 in magnitude: exact

-- Trim (replicated only when it removed something; an emptied key is gone).
redis.call('ZREMRANGEBYSCORE', key, '-inf', int(cutoff))
local count = redis.call('ZCARD', key)
-- live[t]: tier t's entries stamped after now - window_t. Without DETAILS the
-- first tier without room settles the verdict.
local live = {}
local allowed = true
for t, tier in ipairs(tiers) do
  if tier[1] == longest then
    live[t] = count
  else
    live[t] = redis.call('ZCOUNT', key, '(' .. int(now - tier[1]), '+inf')
  end
  if live[t] + cost > tier[2] then
    allowed = false
    if not details then
      break
    end
  end
end

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
end

-- As the module: after an admission, re-arm only when the expiry is 500 ms or
-- more below window + 1000 (a busy key re-arms at most every 500 ms), and never
-- shorten it: after a server clock step back, entries stamped before the step
-- must outlive the new, earlier deadline. Armed last, once the reply is built:
-- an admission slower than window + 1 s (a COST of 10^6) gets a deadline that
-- is already past, and PEXPIREAT deletes the key at once, as the module's does
-- (its entries have all left the window by then); read after that, the key
-- would be missing.
local function arm_expiry()
  if not allowed then
    return
  end
  local ttl = redis.call('PTTL', key)
  if ttl < 0 or ttl - 500 <= longest then
    redis.call('PEXPIREAT', key, exact_sum(server_ms + 1000, longest))
  end
end

-- STAMP: the millisecond this admission recorded, or -1.
local stamp_reply = -1
if allowed then
  stamp_reply = now
end

if not details then
  arm_expiry()
  if want_stamp then
    return stamp_reply
  end
  return allowed and 1 or 0
end

-- Per tier: {window, limit, remaining, retry_after_ms, reset_after_ms}.
local added = allowed and cost or 0
local newest = nil -- the newest entry's score, read once: it is live in every tier where anything is
local fields = {}
local binding = nil
-- A wait of -1 (never) counts as the longest.
local function wait(retry_after_ms)
  if retry_after_ms < 0 then
    return math.huge
  end
  return retry_after_ms
end
for t, tier in ipairs(tiers) do
  local tier_window, tier_limit = tier[1], tier[2]
  local live_after = live[t] + added
  local violated = not allowed and live[t] + cost > tier_limit
  local retry_after_ms = 0
  if violated then
    if cost > tier_limit then
      retry_after_ms = -1
    else
      -- With the tier's live entries oldest first, the (live + cost - limit)-th must leave.
      local blocking = live[t] + cost - tier_limit
      local entry = redis.call('ZRANGEBYSCORE', key, '(' .. int(now - tier_window), '+inf',
        'WITHSCORES', 'LIMIT', int(blocking - 1), 1)
      if entry[2] then
        retry_after_ms = (score_ms(entry[2]) - now) + tier_window
      end
    end
  end
  local reset_after_ms = 0
  if live_after > 0 then
    if newest == nil then
      newest = score_ms(redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')[2])
    end
    reset_after_ms = math.max((newest - now) + tier_window, 0)
  end
  fields[t] = {tier_window, tier_limit, math.max(tier_limit - live_after, 0), retry_after_ms, reset_after_ms}
  -- The binding tier: admitted, the fewest remaining; rejected, the violated
  -- one with the longest wait; ties to the earliest.
  if binding == nil then
    if allowed or violated then
      binding = t
    end
  elseif allowed then
    if fields[t][3] < fields[binding][3] then
      binding = t
    end
  elseif violated and wait(retry_after_ms) > wait(fields[binding][4]) then
    binding = t
  end
end
local b = fields[binding or 1]
local reply = {allowed and 1 or 0, b[2], b[3], b[4], b[5]}
if #tiers > 1 then
  reply[#reply + 1] = fields
end
if want_stamp then
  reply[#reply + 1] = stamp_reply
end
arm_expiry()
return reply
