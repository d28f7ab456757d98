-- xcloak_refund.lua: the portable fallback of XCLOAK.REFUND, for servers that
-- cannot load the module. Same arguments after the key, same reply, same
-- error texts, same effect on the sorted set as the command:
--
--   EVALSHA sha 1 key stamp [COST cost]
--
-- Removes up to `cost` (default 1) entries scored exactly `stamp` (the STAMP
-- reply of xcloak_allow.lua or XCLOAK.ALLOW), the last members at that score
-- first, and replies how many it removed. It trims nothing and leaves the
-- TTL alone; a window left empty leaves no key (ZREM deletes it). A missing
-- key replies 0; a key of another type, WRONGTYPE.
--
-- One key only (Cluster-safe). Replicated as its effect, `ZREM key m1 m2 ...`
-- with the exact members (asked for on 6.2; the default from Redis 7).

if redis.replicate_commands then
  redis.replicate_commands()
end

local MAX_EXACT_MS = 9007199254740991 -- 2^53 - 1
local MAX_COST = 1000000
local ZREM_BATCH = 500

local function fail(message)
  return redis.error_reply('ERR ' .. message)
end

local function int(x)
  return string.format('%d', x)
end

-- Redis' string2ll syntax, as in xcloak_allow.lua.
local function in_range(text, min, max)
  if text ~= '0' and string.find(text, '^%-?[1-9]%d*$') == nil then
    return nil
  end
  local value = tonumber(text)
  if value < min or value > max then
    return nil
  end
  return value
end

local function printable(token)
  local text = string.gsub(string.sub(token, 1, 32), "[^ -~]", '?')
  text = string.gsub(text, "'", '?')
  if #token > 32 then
    text = text .. '...'
  end
  return text
end

if #KEYS ~= 1 then
  return fail('xcloak_refund.lua takes exactly one key (EVALSHA sha 1 key stamp [COST cost])')
end
if #ARGV < 1 then
  return fail("wrong number of arguments for 'xcloak.refund' command")
end
local key = KEYS[1]
local stamp = in_range(ARGV[1], 0, MAX_EXACT_MS)
if not stamp then
  return fail('stamp must be an integer from 0 to ' .. int(MAX_EXACT_MS) .. ' (unix time in milliseconds)')
end
local cost, seen_cost = 1, false
local i = 2
while i <= #ARGV do
  if string.upper(ARGV[i]) ~= 'COST' then
    return fail("syntax error, unknown option '" .. printable(ARGV[i]) .. "' (expected COST)")
  end
  if seen_cost then
    return fail('syntax error, COST is given more than once')
  end
  seen_cost = true
  if ARGV[i + 1] == nil then
    return fail('syntax error, COST needs a value')
  end
  cost = in_range(ARGV[i + 1], 1, MAX_COST)
  if not cost then
    return fail('COST must be an integer from 1 to ' .. int(MAX_COST))
  end
  i = i + 2
end

-- The last members at that score first (ZREVRANGEBYSCORE: 6.2 has no ZRANGE .. BYSCORE REV).
-- No TYPE: through redis.pcall, a key of another type (or of the module's
-- compact type) answers WRONGTYPE here, and that is the reply.
local stamp_text = int(stamp)
local members = redis.pcall('ZREVRANGEBYSCORE', key, stamp_text, stamp_text, 'LIMIT', '0', int(cost))
if members.err then
  return members
end
local removed = 0
while removed < #members do
  local batch = {}
  for j = removed + 1, math.min(removed + ZREM_BATCH, #members) do
    batch[#batch + 1] = members[j]
  end
  redis.call('ZREM', key, unpack(batch))
  removed = removed + #batch
end
return removed
