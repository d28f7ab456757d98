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
-- Cost: on a managed service this script is what a call costs, so its steps
-- are counted (callgrind on Redis 7.0, instructions: the EVALSHA itself about
-- 11k, a redis.call 3-7k, a score read 12k since the server prints the double
-- and Lua parses it back, a string.format 2k). An admission makes 6 calls:
-- TIME, the trim, ZCARD, ZCOUNT of the entries at `now` or later (none: a new
-- millisecond, slot 0), ZADD and PTTL, and PEXPIREAT when the expiry is
-- re-armed; a key the trim left empty skips ZCOUNT and PTTL; an admission in
-- a millisecond that already has entries reads the newest one (and the last
-- at `now` if that one is newer). A rejection makes 3 (TIME, the trim,
-- ZCARD), and with DETAILS reads the blocking and the newest entry. TYPE is
-- never called: the trim is the first access, through redis.pcall, and its
-- WRONGTYPE error is the reply. The usual shape (`window limit [DETAILS]
-- [STAMP]`) is parsed without the general loop; every other shape, and every
-- error, goes through the general parser.
--
-- Lua numbers are doubles: every integer here stays below 2^53 and is exact,
-- and so is a member's integer (t mod 10^11) * 1000 + k < 10^14. Numbers are
-- passed to the server as strings made by string.format('%d'), never as Lua
-- numbers (the server would print them with %.17g) nor with tostring/.. .
-- Known limit: a retry/reset reply above 2^53 - 1 ms (an entry far in the
-- future of NOW with a window near 2^53) is rounded; the module's is exact.

-- Redis 7.0+ (which has REDIS_VERSION) always replicates effects.
if not redis.REDIS_VERSION and redis.replicate_commands then
  redis.replicate_commands()
end

local MAX_EXACT_MS = 9007199254740991 -- 2^53 - 1
local MAX_LIMIT = 1000000 -- the module's default MAX-LIMIT; keep them equal
local MAX_COST = 1000000
local MAX_TIERS = 16 -- the positional pair and up to 15 TIERs
local COMPACT_SLOTS = 1000 -- members s*1000+k while k < 1000, "s:kkkkkkkkkk" beyond,
local STAMP_CYCLE = 100000000000 -- with s = t mod 10^11 (as the module: at most 14 digits)
local ZADD_BATCH = 500

local format, find = string.format, string.find
local key = KEYS[1]
local nargs = #ARGV

-- window, limit: tier 0; tiers: every tier as {window, limit} when TIER is
-- given, else nil (one tier, the common case, has no table).
local window, limit, tiers
local cost, now, details, want_stamp = 1, nil, false, false

-- The usual shape: exactly one key, `window limit` and then nothing,
-- DETAILS, STAMP, or both (upper case, as the packages send them), with
-- both integers in Redis' syntax and in range. Anything else is left to
-- the general parser, which gives every error text.
local usual = false
if nargs >= 2 and nargs <= 4 and #KEYS == 1 then
  local o3, o4 = ARGV[3], ARGV[4]
  if o3 == nil then
    usual = true
  elseif o3 == 'DETAILS' then
    usual, details = o4 == nil or o4 == 'STAMP', true
    want_stamp = o4 == 'STAMP'
  elseif o3 == 'STAMP' then
    usual, want_stamp = o4 == nil or o4 == 'DETAILS', true
    details = o4 == 'DETAILS'
  end
  if usual then
    local a1, a2 = ARGV[1], ARGV[2]
    if find(a1, '^[1-9]%d*$') and (a2 == '0' or find(a2, '^[1-9]%d*$')) then
      window, limit = a1 + 0, a2 + 0
      usual = window <= MAX_EXACT_MS and limit <= MAX_LIMIT
    else
      usual = false
    end
  end
end

if not usual then
  details, want_stamp = false, false

  local function fail(message)
    return redis.error_reply('ERR ' .. message)
  end

  local function int(x)
    return format('%d', x)
  end

  -- Redis' string2ll syntax: "0", or an optional '-' then digits without a
  -- leading zero. Anything else (spaces, '+', decimals, hex, exponents) fails.
  -- An integer argument in [min, max], or nil. Doubles round monotonically, so a
  -- value beyond a bound of at most 2^53 - 1 still compares beyond it.
  local function in_range(text, min, max)
    if text ~= '0' and find(text, '^%-?[1-9]%d*$') == nil then
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

  -- Arguments, checked in the module's order; nothing is touched before.
  if #KEYS ~= 1 then
    return fail('xcloak_allow.lua takes exactly one key (EVALSHA sha 1 key window limit ...)')
  end
  if nargs < 2 then
    return fail("wrong number of arguments for 'xcloak.allow' command")
  end
  window = in_range(ARGV[1], 1, MAX_EXACT_MS)
  if not window then
    return range_error('window', 1, MAX_EXACT_MS, ' (milliseconds)')
  end
  limit = in_range(ARGV[2], 0, MAX_LIMIT)
  if not limit then
    return range_error('limit', 0, MAX_LIMIT, '')
  end
  -- Tier i (1-based here) is {window, limit}; errors number TIERs from 1, as the module.
  tiers = {{window, limit}}
  local seen = {}
  local i = 3
  while i <= nargs do
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
  if #tiers == 1 then
    tiers = nil
  end
end

-- The trim and the TTL follow the longest window.
local longest = window
if tiers then
  for t = 2, #tiers do
    if tiers[t][1] > longest then
      longest = tiers[t][1]
    end
  end
end

-- The server clock: the expiry always follows it (read first, as the module
-- reads it when the call starts), and the stamp too without NOW.
local time = redis.call('TIME')
local usec = time[2] + 0
local server_ms = time[1] * 1000 + (usec - usec % 1000) / 1000
if now == nil then
  now = server_ms
end

-- Trim (replicated only when it removed something; an emptied key is gone).
-- It is the first access to the key: a key of another type (or of the
-- module's compact type) answers WRONGTYPE here, returned as it is.
local trimmed = redis.pcall('ZREMRANGEBYSCORE', key, '-inf', format('%d', now - longest))
if trimmed ~= 0 and type(trimmed) == 'table' then
  return trimmed
end
local count = redis.call('ZCARD', key)

-- live[t] (with TIER): tier t's entries stamped after now - window_t. Without
-- DETAILS the first tier without room settles the verdict.
local allowed = count + cost <= limit
local live
if tiers then
  live = {}
  allowed = true
  for t, tier in ipairs(tiers) do
    if tier[1] == longest then
      live[t] = count
    else
      live[t] = redis.call('ZCOUNT', key, '(' .. format('%d', now - tier[1]), '+inf')
    end
    if live[t] + cost > tier[2] then
      allowed = false
      if not details then
        break
      end
    end
  end
end

-- The newest entry's score (whole ms, rounded up as the module rounds a
-- fractional score), once read: it is live in every tier where anything is.
local newest = nil

if allowed then
  -- The next free slot at `now`: one past the last entry there, if it is ours.
  -- Nothing stamped `now` or later (ZCOUNT, an integer: the usual case) means a
  -- new millisecond, slot 0, and this entry the newest. Else the newest entry
  -- is read: it is the last one at `now`, or newer (a NOW in the past, a clock
  -- stepped back), and then the last one at `now` is read too. An empty key
  -- (count 0) has nothing to read.
  local stamp = math.fmod(now, STAMP_CYCLE) -- exact: now < 2^53
  local now_text = format('%d', now)
  local k = 0
  local last_here = nil
  if count > 0 and redis.call('ZCOUNT', key, now_text, '+inf') > 0 then
    local last = redis.call('ZRANGE', key, '-1', '-1', 'WITHSCORES')
    local score = last[2] + 0
    if score == now then
      last_here = last[1]
    else
      newest = math.ceil(score)
      last_here = redis.call('ZREVRANGEBYSCORE', key, now_text, now_text, 'LIMIT', '0', '1')[1]
    end
  end
  local stamp_text = nil
  if last_here then
    -- The slot k of a member written at this millisecond by the module or
    -- this script, or nil (the article's "now-seq" members and any foreign
    -- member are not ours): "s*1000+k" (k < 1000), or "s:kkkkkkkkkk".
    stamp_text = format('%d', stamp)
    local head, slot = string.match(last_here, '^(.-):(%d+)$')
    if head then
      if head == stamp_text then
        slot = tonumber(slot)
        if slot < 9223372036854775807 then
          k = slot + 1
        end
      end
    elseif find(last_here, '^[1-9]%d*$') or last_here == '0' then
      if stamp == 0 then
        if #last_here <= 3 then
          k = last_here + 1
        end
      elseif #last_here == #stamp_text + 3 and string.sub(last_here, 1, #stamp_text) == stamp_text then
        k = string.sub(last_here, -3) + 1
      end
    end
  end
  -- Take the first `cost` free slots from k on; NX skips a member that exists
  -- (one of another writer's, or of a stamp a cycle away). The member of slot
  -- j, as the module writes it: s*1000+j, or "s:jjjjjjjjjj" from j = 1000.
  local needed = cost
  if cost == 1 and k < COMPACT_SLOTS then
    needed = 1 - redis.call('ZADD', key, 'NX', now_text, format('%d', stamp * COMPACT_SLOTS + k))
    k = k + 1
  end
  if needed > 0 then
    -- From slot 1000 on, members "s:hhhhhhhddd" are made as the prefix of
    -- their thousand ("s:hhhhhhh", once per thousand) and one of 1000 suffixes
    -- ("000" to "999", made once): one concatenation per member, not a
    -- string.format (a COST of 10^6 makes 10^6 members).
    local suffixes, prefix, prefix_of = nil, nil, -1
    local function member(j)
      if j < COMPACT_SLOTS then
        return format('%d', stamp * COMPACT_SLOTS + j)
      end
      local low = j % 1000
      local thousand = (j - low) / 1000
      if thousand ~= prefix_of then
        if not suffixes then
          suffixes = {}
          for d = 0, 999 do
            suffixes[d] = format('%03d', d)
          end
        end
        prefix, prefix_of = format('%d:%07d', stamp, thousand), thousand
      end
      return prefix .. suffixes[low]
    end
    local args = {}
    while needed > 0 do
      local batch = needed < ZADD_BATCH and needed or ZADD_BATCH
      for j = 0, batch - 1 do
        args[2 * j + 1] = now_text
        args[2 * j + 2] = member(k + j)
      end
      k = k + batch
      needed = needed - redis.call('ZADD', key, 'NX', unpack(args, 1, 2 * batch))
    end
  end

  -- As the module: after an admission, re-arm only when the expiry is 500 ms or
  -- more below window + 1000 (a busy key re-arms at most every 500 ms), and never
  -- shorten it: after a server clock step back, entries stamped before the step
  -- must outlive the new, earlier deadline. A key the trim left empty (count 0)
  -- was created by this ZADD and has no expiry yet. An admission slower than
  -- window + 1 s (a COST of 10^6) gets a deadline that is already past, and
  -- PEXPIREAT deletes the key at once, as the module's does (its entries have
  -- all left the window by then): nothing below reads the key.
  local arm = count == 0
  if not arm then
    local ttl = redis.call('PTTL', key)
    arm = ttl < 0 or ttl - 500 <= longest
  end
  if arm then
    local deadline = server_ms + 1000 + longest
    if deadline < 9007199254740992 then
      deadline = format('%d', deadline)
    else
      -- Exact decimal of (server_ms + 1000) + longest, which exceeds 2^53.
      local a, b, base = server_ms + 1000, longest, 100000000
      local a_lo, b_lo = math.fmod(a, base), math.fmod(b, base)
      local lo, hi = a_lo + b_lo, (a - a_lo) / base + (b - b_lo) / base
      if lo >= base then
        lo, hi = lo - base, hi + 1
      end
      deadline = format('%d', hi) .. format('%08d', lo)
    end
    redis.call('PEXPIREAT', key, deadline)
  end
  -- After the add, the newest entry is this one, unless one is newer.
  if newest == nil then
    newest = now
  end
end

if not details then
  if want_stamp then
    return allowed and now or -1
  end
  return allowed and 1 or 0
end

if not tiers and allowed then
  -- One tier: every entry the trim left is live in it.
  local reply = {1, limit, limit - count - cost, 0, (newest - now) + window}
  if want_stamp then
    reply[6] = now
  end
  return reply
end

-- The score (whole ms) of the entry of rank `rank` (0 oldest, -1 newest).
local function score_at(rank)
  return math.ceil(redis.call('ZRANGE', key, rank, rank, 'WITHSCORES')[2] + 0)
end

if not tiers then
  -- One tier, rejected: every entry the trim left is live in it.
  local retry_after_ms, reset_after_ms = -1, 0
  if count > 0 then
    -- With the live entries oldest first, the (count + cost - limit)-th must leave.
    -- That is rank cost - limit - 1 from the newest (-limit for a cost of 1:
    -- ARGV[2], checked, is its decimal).
    if cost <= limit then
      local blocking = score_at(cost == 1 and '-' .. ARGV[2] or format('%d', cost - limit - 1))
      retry_after_ms = (blocking - now) + window
      if cost == limit then
        newest = blocking
      end
    end
    newest = newest or score_at('-1')
    reset_after_ms = (newest - now) + window
  end
  local remaining = limit - count
  local reply = {0, limit, remaining > 0 and remaining or 0, retry_after_ms, reset_after_ms}
  if want_stamp then
    reply[6] = -1
  end
  return reply
end

-- Per tier: {window, limit, remaining, retry_after_ms, reset_after_ms}.
local added = allowed and cost or 0
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
      local entry = redis.call('ZRANGEBYSCORE', key, '(' .. format('%d', now - tier_window), '+inf',
        'WITHSCORES', 'LIMIT', format('%d', blocking - 1), '1')
      if entry[2] then
        retry_after_ms = (math.ceil(entry[2] + 0) - now) + tier_window
      end
    end
  end
  local reset_after_ms = 0
  if live_after > 0 then
    newest = newest or score_at('-1')
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
reply[6] = fields
if want_stamp then
  reply[7] = allowed and now or -1
end
return reply
