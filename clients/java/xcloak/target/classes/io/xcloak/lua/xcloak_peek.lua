-- xcloak_peek.lua: the portable fallback of XCLOAK.PEEK, for servers that
-- cannot load the module (managed services). Same arguments after the key,
-- same reply, same error texts as the command; it writes nothing.
--
--   EVALSHA sha 1 key window limit [TIER window limit]... [COST cost] [NOW unix-ms] [OLDEST]
--   EVALSHA_RO sha 1 key ...   (Redis 7.0+: also on read-only replicas)
--
-- Reply: what xcloak_allow.lua (and XCLOAK.ALLOW) with the same arguments and
-- DETAILS would decide now, always as the details array
--   {allowed, limit, remaining, retry_after_ms, reset_after_ms}
-- of the binding tier, and with TIER a sixth element: one
--   {window, limit, remaining, retry_after_ms, reset_after_ms}
-- per tier, in the order given; with OLDEST, last, the stamp of the oldest
-- entry live in the binding tier's window (-1 if none). It trims nothing, records nothing, leaves the
-- TTL alone and never creates the key: the entries that have left the window
-- are counted out, not removed.
--
-- One key only (Cluster-safe). Read-only: no redis.replicate_commands(), no
-- write command, so it runs under EVALSHA_RO and on replicas.
--
-- Lua numbers are doubles: every integer here stays below 2^53 and is exact.
-- Numbers are passed to the server as strings (string.format('%d')), never
-- as Lua numbers (the server would print them with %.17g).

local MAX_EXACT_MS = 9007199254740991 -- 2^53 - 1
local MAX_LIMIT = 1000000 -- the module's default MAX-LIMIT; keep them equal
local MAX_COST = 1000000
local MAX_TIERS = 16 -- the positional pair and up to 15 TIERs

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

local function score_ms(text)
  return math.ceil(text + 0)
end

-- Arguments, checked in the module's order; nothing is read before.
if #KEYS ~= 1 then
  return fail('xcloak_peek.lua takes exactly one key (EVALSHA sha 1 key window limit ...)')
end
if #ARGV < 2 then
  return fail("wrong number of arguments for 'xcloak.peek' command")
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
local cost, now, oldest = 1, nil, false
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
  elseif option == 'OLDEST' then
    if oldest then
      return fail('syntax error, OLDEST is given more than once')
    end
    oldest = true
    i = i + 1
  else
    if option ~= 'COST' and option ~= 'NOW' then
      return fail("syntax error, unknown option '" .. printable(ARGV[i]) .. "' (expected TIER, COST, NOW or OLDEST)")
    end
    if seen[option] then
      return fail('syntax error, ' .. option .. ' is given more than once')
    end
    seen[option] = true
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
    i = i + 1
  end
end

if now == nil then
  local time = redis.call('TIME')
  local usec = time[2] + 0
  now = time[1] * 1000 + (usec - usec % 1000) / 1000
end

-- live[t]: tier t's entries stamped after now - window_t (entries that have
-- left the window are still stored until the next admission's trim). No
-- TYPE: through redis.pcall, a key of another type (or of the module's
-- compact type) answers WRONGTYPE at the first count, and that is the reply.
local live = {}
local allowed = true
for t, tier in ipairs(tiers) do
  local n = redis.pcall('ZCOUNT', key, '(' .. int(now - tier[1]), '+inf')
  if type(n) == 'table' then
    return n
  end
  live[t] = n
  if n + cost > tier[2] then
    allowed = false
  end
end

-- Per tier: {window, limit, remaining, retry_after_ms, reset_after_ms}, as
-- xcloak_allow.lua computes them with nothing added.
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
  local violated = not allowed and live[t] + cost > tier_limit
  local retry_after_ms = 0
  if violated then
    if cost > tier_limit then
      retry_after_ms = -1
    else
      -- With the tier's live entries oldest first, the (live + cost - limit)-th must leave.
      local blocking = live[t] + cost - tier_limit
      local entry = redis.call('ZRANGEBYSCORE', key, '(' .. int(now - tier_window), '+inf',
        'WITHSCORES', 'LIMIT', int(blocking - 1), '1')
      if entry[2] then
        retry_after_ms = (score_ms(entry[2]) - now) + tier_window
      end
    end
  end
  local reset_after_ms = 0
  if live[t] > 0 then
    if newest == nil then
      newest = score_ms(redis.call('ZRANGE', key, '-1', '-1', 'WITHSCORES')[2])
    end
    reset_after_ms = math.max((newest - now) + tier_window, 0)
  end
  fields[t] = {tier_window, tier_limit, math.max(tier_limit - live[t], 0), retry_after_ms, reset_after_ms}
  -- The binding tier: admissible, the fewest remaining; not, the violated
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
if oldest then
  -- Where the binding tier's moving window starts: its oldest live entry.
  local first = redis.call('ZRANGEBYSCORE', key, '(' .. int(now - b[1]), '+inf', 'WITHSCORES', 'LIMIT', '0', '1')
  reply[#reply + 1] = first[2] and score_ms(first[2]) or -1
end
return reply
