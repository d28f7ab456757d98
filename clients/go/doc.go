// Package xcloak is the Go client of xcloak, exact sliding-window rate
// limiting for Redis, on go-redis v9.
//
// The article behind xcloak counted requests in a sorted set with a
// pipeline, then added the request in a second round trip:
//
//	pipe := rdb.Pipeline()
//	pipe.ZRemRangeByScore(ctx, key, "-inf", windowStart)
//	pipe.ZCard(ctx, key)
//	cmds, _ := pipe.Exec(ctx)
//
//	count := cmds[1].(*redis.IntCmd).Val()
//	if count >= limit {
//	    return false // rejected
//	}
//
//	rdb.ZAdd(ctx, key, &redis.Z{Score: now, Member: now})
//	return true
//
// Every caller that counts before another one adds is admitted too: 24
// admitted for a limit of 10 under 100 concurrent clients. It fixed the race
// with a Lua script, whose key:seq counter never expires and lives in
// another cluster slot:
//
//	local key    = KEYS[1]
//	local now    = tonumber(ARGV[1])
//	local window = tonumber(ARGV[2])  -- milliseconds
//	local limit  = tonumber(ARGV[3])
//
//	redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
//	local count = redis.call('ZCARD', key)
//	if count >= limit then
//	  return 0
//	end
//	redis.call('ZADD', key, now, now .. '-' .. redis.call('INCR', key .. ':seq'))
//	redis.call('EXPIRE', key, math.ceil(window / 1000) + 1)
//	return 1
//
//	script := redis.NewScript(luaScript)
//	result, err := script.Run(ctx, rdb, []string{key}, nowMs, windowMs, limit).Int()
//	return result == 1, err
//
// One call replaces both, atomic, on one key, with the figures an HTTP
// response needs:
//
//	limiter, err := xcloak.NewLimiter(rdb, xcloak.Options{}) // an *Error names an option out of range
//	d, err := limiter.Allow(ctx, key, time.Minute, 10)      // XCLOAK.ALLOW key 60000 10 DETAILS
//	// d.Allowed, d.Remaining, d.RetryAfter, d.ResetAfter, d.Headers(xcloak.StyleIETF)
//
// Every duration is a time.Duration (windows, timeouts, maxWait), sent as
// whole milliseconds; the only bare milliseconds are unix-millisecond
// instants (WithNow, Decision.Stamp, Decision.Oldest).
//
// rdb is any redis.UniversalClient: a *redis.Client, a *redis.ClusterClient
// (every call goes straight to its key's node; Peek to a replica when the
// client reads from replicas), Sentinel's NewFailoverClient, or a
// *redis.Ring. Where the server has no module (a managed service), the
// same call runs the bundled Lua script, which keeps the same keys, replies
// and errors (Options.Fallback).
//
// A Limiter remembers its rejections (the block cache, Options.BlockCache,
// on by default): until the server's retry-after has passed on the local
// monotonic clock, the same request on the same key is rejected without a
// call (Via == ViaCache), so an attack on spent identities stays in the
// process. Refund and Reset drop the key's entry first; Limiter.Stats
// counts what it answered.
//
// Errors come in two kinds: *Error, the server refused the call (a bad
// argument, WRONGTYPE, NOPERM), returned whatever the error policy; and an
// outage or a timeout, which Options.OnError answers: an
// *UnavailableError, or a Decision with Via == ViaError that fails open or
// closed. No call is ever sent twice once it may have reached the server.
//
// The contract every xcloak client follows is docs/clients.md; the
// subpackages plug the Limiter into ulule/limiter (ulule) and net/http
// (nethttp).
package xcloak
